"""Buffers a kernel's prepare function made from constant parameters, kept with the kernel.

``tcc.compile(..., constant_params=[...])`` lets the pipeline move work on those parameters
alone (the packing of a GEMM's weight operand) out of the kernel into a prepare function
(``tcc.passes.loops.hoist_constants``); the kernel then reads the prepared buffers as extra
parameters. :class:`Prepared` runs the prepare function once per set of constant arguments and
hands the kernel the same buffers at every later call with those arguments.

A set of arguments is recognised by identity (the objects the caller passed), which is what
``constant_params`` promises: an array passed there keeps its values between calls. An entry
holds weak references to its arguments and goes when one of them is collected, so that an id
cannot come back as another array's while its entry lives, and memory does not grow with the
arrays a program drops.
"""

from __future__ import annotations

import ctypes
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

ALIGN = 64  # bytes: prepared panels start on a cache line
MAX_STRONG = 64  # entries kept for arguments that take no weak reference (the oldest go first)


def aligned_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed array whose data starts on a cache line."""
    dtype = np.dtype(dtype)
    nbytes = max(1, math.prod(shape)) * dtype.itemsize
    raw = np.zeros(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)


class Prepared:
    """A kernel's prepare function (``fn(void **args)``: the ``sources``, then the buffers) and
    the buffers it made, per set of source arguments."""

    def __init__(self, fn: Callable[[Any], int], sources: Sequence[str],
                 buffers: Sequence[tuple[str, np.dtype, tuple[int, ...]]]):
        self.fn = fn
        self.sources = tuple(sources)
        self.buffers = tuple(buffers)
        self.names = tuple(name for name, _, _ in buffers)
        self._made: dict[tuple[int, ...], tuple[tuple[Any, ...], list[np.ndarray], list[int]]] = {}
        self._lock = threading.Lock()

    def pointers(self, objects: tuple[Any, ...]) -> list[int] | None:
        """The prepared buffers' addresses for these source arguments, if made before."""
        entry = self._made.get(tuple(map(id, objects)))
        if entry is None or not all(ref() is obj for ref, obj in zip(entry[0], objects)):
            return None
        return entry[2]

    def arrays(self, objects: tuple[Any, ...], source_pointers: Sequence[int]) -> list[np.ndarray]:
        """The prepared buffers for these source arguments (``source_pointers``: their data, C-
        contiguous), made now unless they were before."""
        with self._lock:
            key = tuple(map(id, objects))
            entry = self._made.get(key)
            if entry is not None and all(ref() is obj for ref, obj in zip(entry[0], objects)):
                return entry[1]
            made = [aligned_zeros(shape, dtype) for _, dtype, shape in self.buffers]
            ptrs = (ctypes.c_void_p * (len(source_pointers) + len(made)))(
                *source_pointers, *(a.ctypes.data for a in made))
            if self.fn(ptrs) != 0:
                raise MemoryError("the prepare function could not allocate its buffers")
            refs = tuple(_reference(obj, lambda _, k=key: self._made.pop(k, None)) for obj in objects)
            if any(isinstance(r, _Strong) for r in refs) and len(self._made) >= MAX_STRONG:
                self._made.pop(next(iter(self._made)))
            self._made[key] = (refs, made, [a.ctypes.data for a in made])
            return made


class _Strong:
    """A plain reference, for an argument that takes no weak one."""

    def __init__(self, obj: Any):
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


def _reference(obj: Any, dropped: Callable[[Any], None]) -> Any:
    try:
        return weakref.ref(obj, dropped)
    except TypeError:
        return _Strong(obj)
