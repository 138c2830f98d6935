"""The index checks of a CUDA call, run as the first step of the call and of its fast plan.

An op that reads indices from data has an :class:`~tcc.runtime.index_checks.IndexGuard`: the
kernel(s) of a guard op (``tcc.index_ranges``) compiled by NVRTC like any op, a parallel pass
over the index tensors that counts the checks out of range into one i64 on the device.

Before this, every call ran one separately compiled min/max op per check through its own call
(binding, a new result tensor) and copied the result over with ``.cpu()``, and a checked call
never took a fast plan (5.6x torch's time for an embedding lookup on an H200). Now, per call:
the guard's kernels are launched from an argument block of their own (built once; its slots
copied from the main kernels' block, slot to slot), the count is copied into page-locked host
memory (8 bytes, both buffers allocated once per device), the stream is synchronised, and the
main kernels are launched only when the count is zero, so an index out of range writes nothing
(neither a result nor ``out=``) and is a ``TccIndexError`` at the call, as on the CPU.

That is one synchronisation a call, which an asynchronous operator such as torch's embedding (a
device-side assert) does not pay. The weighed alternative, guarding the main kernels themselves
(each reading the device count first and writing nothing when it is not zero) so that they are
queued before the host waits, would overlap the wait with their work; it needs a parameter in
every generated kernel and is left for when the wait shows in a profile of a whole model.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

from tcc.codegen_cuda import driver
from tcc.runtime.index_checks import IndexGuard


class CudaGuard:
    """A guard op's kernels on one device, with their argument block, the device count and its
    page-locked host copy; a lock makes one call at a time use them (threads wait, briefly)."""

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
        self.count = driver.alloc_workspace(8, f"the index checks of {kernel.name}")
        self.host = driver.alloc_pinned(8, f"the index checks of {kernel.name}")
        self.block.words[self.slots[guard.result]] = self.count
        self.lock = threading.Lock()
        weakref.finalize(self, _free, device, self.count, self.host)

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

    def passes_words(self, words: Any, copies: list[tuple[int, int]], stream: int, op: str) -> bool:
        """Whether every index is in range, given the main kernels' argument words (a plan's)."""
        with self.lock:
            mine = self.block.words
            for slot, source in copies:
                mine[slot] = words[source]
            return self._run(stream, op)

    def passes_values(self, values: dict[str, Any], stream: int, op: str) -> bool:
        """Whether every index is in range, given the call's values by name (device pointers for
        tensors, Python numbers for scalars): the checked call's."""
        with self.lock:
            for name in self.params:
                if name not in self.codes:
                    continue  # (a parameter no guard kernel reads)
                view, index = self.block.setter(self.codes[name], self.slots[name])
                view[index] = values[name]
            return self._run(stream, op)

    def _run(self, stream: int, op: str) -> bool:
        what = f"op {op}: checking its indices"
        if self.temp_slots:
            with self.kernel.lock:
                for slot, ptr in zip(self.temp_slots, self.kernel.workspace(self.device, stream, op)):
                    self.block.words[slot] = ptr
                self.block.launch(stream, op, 15)
        else:
            self.block.launch(stream, op, 15)
        driver.copy_dtoh(self.host, self.count, 8, stream, what)
        driver.synchronize(stream, what)
        return ctypes.c_int64.from_address(self.host).value == 0


def _free(device: int, count: int, host: int) -> None:
    try:
        driver.free_workspace(device, count, 8)
        driver.free_pinned(host)
    except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone
        pass
