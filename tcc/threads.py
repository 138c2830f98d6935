"""How many threads a CPU kernel's parallel loops run on: ``tcc.set_num_threads(n)``.

Parallel loops run on tcc's own thread pool (:mod:`tcc.codegen_cpu.pool`). The generated code
reads the team's size from one process-wide cell, ``tcc_num_threads``, before each parallel loop
(0 there: the default, ``OMP_NUM_THREADS`` else every CPU the process may use), so a count set
from any Python thread applies to every later call, and changing it recompiles nothing;
:func:`set_num_threads` writes the cell and has the pool start the workers a larger team needs.
"""

from __future__ import annotations

import ctypes
import operator
import os
from collections.abc import Callable

from tcc.errors import TccArgumentError

SYMBOL = "tcc_num_threads"  # the cell's name in the generated code, resolved to CELL when an object links
CELL = ctypes.c_int32(0)
MAX_THREADS = 4096  # beyond any machine's cores: a larger request is a typo, not a plan


def set_num_threads(n: int | None) -> None:
    """Run the parallel loops of every later CPU kernel call (any thread's) on ``n`` threads;
    ``None`` restores the default (``OMP_NUM_THREADS``, else every CPU)."""
    if n is None:
        CELL.value = 0
        _resize(None)
        return
    try:
        count = operator.index(n)
    except TypeError:
        raise TccArgumentError(f"set_num_threads takes a whole number of threads, got {n!r}",
                               hint="e.g. tcc.set_num_threads(4), or None for the default") from None
    if not 1 <= count <= MAX_THREADS:
        raise TccArgumentError(f"set_num_threads({count}): the number of threads must be 1 to {MAX_THREADS}",
                               hint="None restores the default (OMP_NUM_THREADS, else every CPU)")
    CELL.value = count
    _resize(count)


def requested_threads() -> int | None:
    """The count :func:`set_num_threads` gave, or None for the default."""
    return CELL.value or None


def address() -> int:
    """Where the cell lives, for the linker of CPU kernels."""
    return ctypes.addressof(CELL)


_POOL: list[tuple[Callable[[], int], Callable[[int | None], None]]] = []  # registered by codegen_cpu.pool


def use_pool(default: Callable[[], int], resize: Callable[[int | None], None]) -> None:
    """The thread pool's default team (what :func:`get_num_threads` reports without a request) and
    how it grows to a requested team: the CPU backend registers them when it loads (this module
    sits below it and imports no code generator)."""
    _POOL[:] = [(default, resize)]


def _resize(count: int | None) -> None:
    if _POOL:
        _POOL[0][1](count)


def get_num_threads() -> int:
    """The threads the parallel loops of the next CPU kernel call run on."""
    requested = requested_threads()
    if requested is not None:
        return requested
    if _POOL:
        return _POOL[0][0]()
    return environment_default()


def environment_default() -> int:
    """The default team: ``OMP_NUM_THREADS``'s first value (the variable OpenMP runtimes read),
    else every CPU this process may run on."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if first.isdigit() and int(first) > 0:
        return int(first)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
