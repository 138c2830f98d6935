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


def get_num_threads() -> int:
    """The threads the parallel loops of the next CPU kernel call run on."""
    requested = requested_threads()
    if requested is not None:
        return requested
    from tcc.codegen_cpu.jit import default_threads  # LLVM and libgomp load on first use, not with ``import tcc``

    return default_threads()
