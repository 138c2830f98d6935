"""How many threads a CPU kernel's parallel loops run on: ``tcc.set_num_threads(n)``.

Parallel loops run on libgomp's thread team. Its own default (every CPU the process may use, or
``OMP_NUM_THREADS``, read once when libgomp loads) is a per-thread setting of libgomp's, which
``omp_set_num_threads`` changes only for the calling thread: a kernel called from another Python
thread would not see it. So the generated code reads the team's size from one process-wide cell,
``tcc_num_threads``, before each parallel loop (0 there: libgomp's default), and
:func:`set_num_threads` writes that cell. Changing it recompiles nothing.
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
    ``None`` restores libgomp's default (``OMP_NUM_THREADS``, else every CPU)."""
    if n is None:
        CELL.value = 0
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


def requested_threads() -> int | None:
    """The count :func:`set_num_threads` gave, or None for libgomp's default."""
    return CELL.value or None


def address() -> int:
    """Where the cell lives, for the linker of CPU kernels."""
    return ctypes.addressof(CELL)


_DEFAULT: list[Callable[[], int]] = []  # libgomp's default, registered by the CPU backend (codegen_cpu.jit)


def use_default(provider: Callable[[], int]) -> None:
    """Where :func:`get_num_threads` reads the default from: the CPU backend registers libgomp's
    when it loads (this module sits below it and imports no code generator)."""
    _DEFAULT[:] = [provider]


def get_num_threads() -> int:
    """The threads the parallel loops of the next CPU kernel call run on."""
    requested = requested_threads()
    if requested is not None:
        return requested
    if _DEFAULT:
        return _DEFAULT[0]()
    return _environment_default()


def _environment_default() -> int:
    """libgomp's default before it is loaded: ``OMP_NUM_THREADS``'s first value, else every CPU
    this process may run on."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if first.isdigit() and int(first) > 0:
        return int(first)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
