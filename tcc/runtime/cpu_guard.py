"""The index checks of a CPU call, run as the first step of the call and of its fast plan.

An op that reads indices from data has an :class:`~tcc.runtime.index_checks.IndexGuard`: the
kernel of a guard op (``tcc.index_guard``), compiled by LLVM like any op: one vectorised pass
over the index tensors that counts the checks out of range. A plan runs it on its own argument
array: the guard's slots are filled from the main kernel's (the same tensors' pointers, the same
scalar cells), one foreign call, one number read, and the main kernel is not called when it is
not zero. That is a few hundred nanoseconds of Python on top of the pass itself, where the host
pass of the checked call (NumPy over a copy of the indices, through the reference's evaluator)
cost tens of microseconds: more than a label pick's whole kernel.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from tcc.runtime.index_checks import IndexGuard


class CpuGuard:
    """A guard kernel's call on the pointers of a main kernel's argument array (slot to slot).
    Its own argument arrays are pooled, so that threads calling the same plan never share one."""

    def __init__(self, guard: IndexGuard, copies: list[tuple[int, int]], result: int):
        self.fn = guard.kernel.fn
        self.nparams = len(guard.kernel.params)
        self.copies = copies  # (guard slot, main slot)
        self.result = result  # the guard slot of its count
        self.pool: list[tuple[Any, ctypes.c_int64, int]] = []

    @classmethod
    def for_slots(cls, guard: IndexGuard, slots: dict[str, int]) -> CpuGuard | None:
        """The guard on a main kernel whose argument slots are ``slots`` (by name); None when that
        kernel does not take every tensor and scalar the checks read (no plan then)."""
        names = [name for name, _ in guard.kernel.params]
        if any(name not in slots for name in guard.params):
            return None
        return cls(guard, [(i, slots[n]) for i, n in enumerate(names) if n != guard.result],
                   names.index(guard.result))

    def native(self) -> tuple[int, int, list[tuple[int, int]], int]:
        """This guard for a caller outside Python (the torch C++ eager path): the kernel's entry
        point, its argument slots, the (its slot, main slot) copies and the slot of its count."""
        return int(ctypes.cast(self.fn, ctypes.c_void_p).value or 0), self.nparams, list(self.copies), self.result

    def _new(self) -> tuple[Any, ctypes.c_int64, int]:
        ptrs = (ctypes.c_void_p * self.nparams)()
        count = ctypes.c_int64()
        ptrs[self.result] = ctypes.addressof(count)
        return ptrs, count, ctypes.addressof(ptrs)

    def __call__(self, main: Any) -> bool:
        """Whether every index is in range, given the main kernel's argument array ``main`` (its
        inputs' pointers and scalar cells set)."""
        try:
            entry = self.pool.pop()
        except IndexError:  # none free: the first call, or other threads hold them all
            entry = self._new()
        ptrs, count, address = entry
        try:
            for slot, source in self.copies:
                ptrs[slot] = main[source]
            return self.fn(address) == 0 and count.value == 0
        finally:
            self.pool.append(entry)


def passes(guard: IndexGuard, values: dict[str, Any]) -> bool:
    """Whether every index is in range in a checked call, given its values by name (C-contiguous
    arrays, Python numbers for scalars)."""
    count = np.ones(1, np.int64)
    guard.kernel({**{name: values[name] for name in guard.params}, guard.result: count})
    return int(count[0]) == 0
