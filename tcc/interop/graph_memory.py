"""The buffers a compiled model's kernels write their intermediates into, reused from call to call.

Allocating every intermediate afresh on each call left its pages to the allocator between calls:
where other code ran in between (PyTorch and onnxruntime in the benchmark's loop), glibc had
handed them on or back to the OS, and ResNet-18 at batch 8 page-faulted ~7000 times a call, 167
ms against 142 ms alone. onnxruntime plans its memory once per session the same way.

A :class:`BufferPlan` gives each intermediate a slot from the order of the kernels: a slot is
free again once the last kernel reading its value has run, and an intermediate of the same shape
and dtype produced later takes it. A call checks out an :class:`Arena` (one array per slot,
made on its first use) and gives it back when it ends, so calls on several threads at once each
write their own buffers. The model's results are never in a slot: the caller keeps them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

Call = tuple[Sequence[str], Sequence[str]]  # (parameters read, results written) of one kernel
Layout = tuple[tuple[int, ...], np.dtype]


class BufferPlan:
    """Slots for the intermediates of a sequence of kernels (see the module docstring)."""

    def __init__(self, calls: Sequence[Call], layouts: dict[str, Layout], results: Sequence[str]):
        last_read = {name: n for n, (params, _) in enumerate(calls) for name in params}
        free: dict[Layout, list[int]] = {}
        freed_after: dict[int, list[str]] = {}
        self.slot_of: dict[str, int] = {}
        self.layouts: list[Layout] = []
        for n, (_, written) in enumerate(calls):
            for name in written:
                if name in results:
                    continue
                spare = free.get(layouts[name])
                self.slot_of[name] = spare.pop() if spare else self._new_slot(layouts[name])
                freed_after.setdefault(last_read.get(name, n), []).append(name)  # unread: free at once
            for name in freed_after.pop(n, []):
                free.setdefault(layouts[name], []).append(self.slot_of[name])

    def _new_slot(self, layout: Layout) -> int:
        self.layouts.append(layout)
        return len(self.layouts) - 1


class Arena:
    """One set of slot arrays, made on first use."""

    def __init__(self, plan: BufferPlan):
        self.plan = plan
        self.arrays: list[np.ndarray | None] = [None] * len(plan.layouts)

    def outputs(self, written: Sequence[str]) -> list[np.ndarray] | None:
        """``out=`` for a kernel writing ``written``: its slots' arrays, or None (the kernel then
        allocates) where one of them is a model result or a slot not made yet."""
        outs = [self._array(name) for name in written]
        return None if any(o is None for o in outs) else outs

    def keep(self, written: Sequence[str], arrays: Sequence[np.ndarray]) -> None:
        """Adopt the arrays a kernel allocated for slots not made yet."""
        for name, array in zip(written, arrays):
            slot = self.plan.slot_of.get(name)
            if slot is not None and self.arrays[slot] is None and isinstance(array, np.ndarray):
                self.arrays[slot] = array

    def _array(self, name: str) -> np.ndarray | None:
        slot = self.plan.slot_of.get(name)
        return None if slot is None else self.arrays[slot]


class Arenas:
    """The arenas of one model not in use by a call; a call takes one and gives it back."""

    def __init__(self, plan: BufferPlan):
        self.plan = plan
        self._idle: list[Arena] = []
        self._lock = threading.Lock()

    def take(self) -> Arena:
        with self._lock:
            return self._idle.pop() if self._idle else Arena(self.plan)

    def give_back(self, arena: Arena) -> None:
        with self._lock:
            self._idle.append(arena)
