"""The index checks of a CUDA call, run as the first step of the call and of its fast plan.

An op that reads indices from data has an :class:`~tcc.runtime.index_checks.IndexGuard`: the
kernel(s) of a guard op (``tcc.index_guard``) compiled by NVRTC like any op, a parallel pass
over the index tensors that counts the checks out of range into one i64 on the device.

Before this, every call ran one separately compiled min/max op per check through its own call
(binding, a new result tensor) and copied the result over with ``.cpu()`` (a synchronisation
each), and a checked call never took a fast plan: 5.6x torch's time for an embedding lookup on
an H200. Now a call, checked or through its plan, queues on its stream:

1. the guard's kernels, from an argument block of their own (built once; a plan copies its
   slots from the main kernels' block, slot to slot: no binding, no dictionary);
2. a copy of the count into page-locked host memory (8 bytes), and an event after it;
3. the op's own kernels, which take the device count as a parameter (``GUARDED`` in the loop
   IR's attributes: the CUDA C generator adds it) and return at once when it is not zero, so
   an index out of range writes nothing, neither a result nor ``out=``;

and then waits for the event only, and reads the count: an index out of range is then a
``TccIndexError`` at the call, as on the CPU. The count (one per stream), its host copy and the
event are made once per device; nothing is allocated per call, and there is no extra op dispatch.

Why this shape. A check that waits for the count before queueing the kernels would leave the
GPU idle for a host round trip every call; here the wait overlaps the op's own kernels (queued
behind the guard), and the host returns about when they finish. An asynchronous check (an error
raised at a later call, like torch's device-side asserts) would save the wait itself, but the
contract is an error at the call with nothing written, so it is not offered. Folding the check
into the op's first kernel cannot keep that contract: its blocks would need the verdict of all
the others before writing.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Callable
from typing import Any

from tcc.codegen_cuda import driver
from tcc.runtime.index_checks import IndexGuard


class CudaGuard:
    """A guard op's kernels on one device, with their argument block, a device count per stream
    (calls on one stream are ordered by it; on two, one's guard must not overwrite the count that
    the other's kernels are about to read), its page-locked host copy and an event; a lock makes
    one call at a time use them (threads wait)."""

    def __init__(self, guard: IndexGuard, device: int):
        kernel = guard.kernel
        self.kernel = kernel
        self.device = device
        self.params = guard.params  # the op's tensors and scalars the checks read
        names = [*guard.params, guard.result, *(n for n, _ in kernel.temps)]
        self.slots = {n: i for i, n in enumerate(names)}
        self.codes = {n: code for k in kernel.meta["kernels"] for n, code in k["params"]}
        self.block = driver.ArgumentBlock(kernel.launchers(device), self.slots, driver.context(device))
        self.temp_slots = [self.slots[n] for n, _ in kernel.temps]
        self.result = self.slots[guard.result]
        self.what = f"the index checks of {kernel.name}"
        self.counts: dict[int, int] = {}  # stream -> the device count its calls' kernels read (GUARD_PARAM)
        self.host = driver.alloc_pinned(8, self.what)
        self.event = driver.event(self.what)
        self.lock = threading.Lock()
        weakref.finalize(self, _free, device, self.counts, self.host, self.event)

    @classmethod
    def on(cls, guard: IndexGuard, device: int) -> CudaGuard:
        """The guard's state on ``device``, made on first use."""
        found = guard.states.get(device)
        if found is None:
            found = guard.states[device] = cls(guard, device)
        return found

    def copies(self, slots: dict[str, int]) -> list[tuple[int, int]]:
        """(guard slot, main slot) of each tensor and scalar the checks read, for a plan whose
        argument block has ``slots`` (by name)."""
        return [(self.slots[n], slots[n]) for n in self.params if n in self.codes]

    def around_words(self, words: Any, copies: list[tuple[int, int]], stream: int, op: str,
                     launch: Callable[[int], None]) -> bool:
        """Check, ``launch`` the op's kernels behind the check, and say whether every index was in
        range, given the main kernels' argument words (a plan's)."""
        with self.lock:
            mine = self.block.words
            for slot, source in copies:
                mine[slot] = words[source]
            return self._around(stream, op, launch)

    def around_values(self, values: dict[str, Any], stream: int, op: str, launch: Callable[[int], None]) -> bool:
        """The same given the call's values by name (device pointers for tensors, Python numbers
        for scalars): the checked call's."""
        with self.lock:
            for name in self.params:
                if name not in self.codes:
                    continue  # (a parameter no guard kernel reads)
                view, index = self.block.setter(self.codes[name], self.slots[name])
                view[index] = values[name]
            return self._around(stream, op, launch)

    def _around(self, stream: int, op: str, launch: Callable[[int], None]) -> bool:
        """Queue the guard, the count's copy and the event, then ``launch(count)`` (the op's
        kernels, given the device count to read), and wait for the event."""
        what = f"op {op}: checking its indices"
        count = self.counts.get(stream)
        if count is None:  # (a plan's thread may not have the context current yet)
            driver.context(self.device).activate()
            count = self.counts[stream] = driver.alloc_workspace(8, self.what)
        self.block.words[self.result] = count
        if self.temp_slots:
            with self.kernel.lock:
                for slot, ptr in zip(self.temp_slots, self.kernel.workspace(self.device, stream, op)):
                    self.block.words[slot] = ptr
                self.block.launch(stream, op, 15)
        else:
            self.block.launch(stream, op, 15)
        driver.copy_dtoh(self.host, count, 8, stream, what)
        driver.record(self.event, stream, what)
        launch(count)  # each kernel returns at once if the count is not zero
        driver.wait(self.event, what)
        return ctypes.c_int64.from_address(self.host).value == 0


def _free(device: int, counts: dict[int, int], host: int, event: int) -> None:
    try:
        driver.destroy_event(event)
        for count in counts.values():
            driver.free_workspace(device, count, 8)
        driver.free_pinned(host)
    except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone
        pass
