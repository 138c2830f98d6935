"""Autotuning, opt-in: a small search over the knobs of the target's auto-scheduler.

The auto-schedulers' heuristics are good on the machines they were measured on; the tuner checks
them on this one. It walks a few stages, each trying a handful of values around the best so far
and timing every candidate on random inputs (the median of a few runs), so it stays small: about
a dozen builds, with a progress bar.

* CPU (:func:`tcc.passes.autoschedule_cpu.gemm.gemm_params`): register tile, k block, cache
  blocks, then the micro-kernel's k-loop unroll.
* CUDA (:class:`tcc.passes.autoschedule_cuda.schedule.CudaTuning`): the FMA GEMM's tile, then its
  pipeline depth, then the warps of the flat and row kernels.

The winner is stored as a JSON entry in the disk cache under the op's specialisation key, so
later processes (``tcc.compile(..., tune=True)``) use it at once.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from tcc import cuda
from tcc.errors import TccError, TccRuntimeError
from tcc.ir.te import OpTE
from tcc.passes.autoschedule_cpu.gemm import GemmNest, contractions, gemm_params
from tcc.passes.autoschedule_cuda.gemm import SEARCH_TILES, fits
from tcc.passes.autoschedule_cuda.schedule import KERNEL_KINDS, CudaTuning
from tcc.passes.pipeline import Lowered, Tuning
from tcc.passes.te.fusion import GEMM_MIN_FLOPS
from tcc.passes.trace import Trace
from tcc.runtime import cache
from tcc.runtime.backend import Backend
from tcc.runtime.binding import BoundCall
from tcc.testing import random_args


class Op(Protocol):
    """What the tuner needs of an op (``tcc.compiler.Op`` is one; the compiler calls the tuner)."""

    name: str
    te: OpTE
    tune: bool | int
    backend: Backend
    target: Any

    def base_key(self, lowered: Lowered) -> str: ...

    def bind(self, args: tuple[Any, ...], cparams: dict[str, Any]) -> BoundCall: ...

    def index_guard(self, bindings: dict[str, int | float]) -> Any: ...

DEFAULT_TRIALS = 12
RUNS = 5  # timed runs per candidate; the median is kept
TUNE_KEY = "tune-v2"
WARPS = (4, 8, 2, 16)  # block sizes of the CUDA flat and row kernels to try, in warps
CUDA_TILES = 6  # GEMM tiles to try (with the default and the other stage, 12 trials reach every knob)


@dataclass
class TuneResult:
    best: Tuning
    best_time: float
    default_time: float
    timings: list[tuple[Tuning, float]]  # every candidate that built, in the order tried


# ---------------------------------------------------------------- the stored winner

def tuning_key(op: Op, lowered: Lowered) -> str:
    return cache.make_key(op.base_key(lowered), TUNE_KEY)


def stored_tuning(op: Op, lowered: Lowered) -> Tuning | None:
    """The winner a previous search stored for this specialisation, if any."""
    entry = cache.DiskCache(cache.cache_dir()).get_json(tuning_key(op, lowered))
    if entry is None:
        return None
    try:
        tiles = {str(t): {str(k): int(v) for k, v in p.items()} for t, p in entry["tiles"].items()}
        gpu = entry.get("cuda")
        knobs = None if gpu is None else CudaTuning(tuple(int(v) for v in gpu["tile"]) if gpu["tile"] else None,
                                                    int(gpu["stages"]), int(gpu["warps"]))
        return Tuning(tiles, int(entry["unroll"]), knobs)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # a malformed entry is a miss


def store_tuning(op: Op, lowered: Lowered, result: TuneResult) -> None:
    gpu = result.best.cuda
    entry = {"tiles": result.best.tiles, "unroll": result.best.unroll,
             "cuda": None if gpu is None else {"tile": gpu.tile, "stages": gpu.stages, "warps": gpu.warps},
             "best_s": result.best_time, "default_s": result.default_time}
    cache.DiskCache(cache.cache_dir()).put_json(tuning_key(op, lowered), entry)


def tuning_for(op: Op, lowered: Lowered) -> Tuning | None:
    """For ``tune=True``: the stored winner, else a search (stored); None when there is no GEMM."""
    if not tunable(lowered):
        return None
    found = stored_tuning(op, lowered)
    if found is not None:
        return found
    result = search(op, lowered, DEFAULT_TRIALS if op.tune is True else int(op.tune))
    store_tuning(op, lowered, result)
    return result.best


def tunable(lowered: Lowered) -> bool:
    """CPU: a contraction large enough for the GEMM schedule; GPU: any kernel (block sizes)."""
    if lowered.target.is_gpu:
        return bool(kernel_kinds(lowered))
    return any(info.flops >= GEMM_MIN_FLOPS for info in contractions(lowered.loops).values())


def kernel_kinds(lowered: Lowered) -> set[str]:
    """Which of the CUDA auto-scheduler's kernels the op gets (``gemm``, ``flat``, ``row``, ...),
    as its default schedule records them; the user's own kernels leave nothing to vary."""
    default = replace(lowered, tuning=None, trace=Trace(), _scheduled=None).scheduled
    return set(default.attrs.get(KERNEL_KINDS, ())) - {"bound by the user"}  # type: ignore[arg-type]


# ---------------------------------------------------------------- the search

def search(op: Op, lowered: Lowered, trials: int = DEFAULT_TRIALS, progress: bool = True) -> TuneResult:
    """Time up to ``trials`` candidates stage by stage, keeping the fastest (the default first)."""
    from tqdm import tqdm  # imported when tuning, not by every ``import tcc``

    if lowered.target.is_gpu and not cuda.is_available():
        raise TccRuntimeError(f"tuning {op.name} for cuda times its candidates on a GPU, and there is none here",
                              op.te.span, "tune on the machine that runs the op: the winner is kept in the disk "
                                          "cache (TCC_CACHE_DIR) for later processes")
    best, stages, make = _space(lowered)
    measure = _timer(op, lowered)
    timings: list[tuple[Tuning, float]] = []
    best_time = float("inf")
    tried: set[tuple] = set()
    bar = tqdm(total=max(1, trials), desc=f"tuning {op.name}", unit="build", disable=not progress, leave=False)
    with bar:
        for stage in stages:
            for candidate in stage(best):
                ident = tuple(sorted(candidate.items()))
                if ident in tried or len(tried) >= trials:
                    continue
                tried.add(ident)
                tuning = make(candidate)
                seconds = measure(tuning)
                bar.update(1)
                if seconds is None:
                    continue
                timings.append((tuning, seconds))
                if seconds < best_time:
                    best, best_time = candidate, seconds
                bar.set_postfix_str(f"best {best_time * 1e3:.3g} ms")
        bar.total = bar.n  # candidates that coincided were skipped
        bar.refresh()
    if not timings:
        raise TccError(f"tuning {op.name}: no candidate schedule could be built", op.te.span,
                       "compile without tune=True")
    return TuneResult(make(best), best_time, timings[0][1], timings)


Stage = Callable[[dict[str, int]], Iterator[dict[str, int]]]


def _space(lowered: Lowered) -> tuple[dict[str, int], tuple[Stage, ...], Callable[[dict[str, int]], Tuning]]:
    """(the default candidate, the stages that vary it, candidate -> Tuning) for the op's target."""
    if lowered.target.is_gpu:
        default = CudaTuning()
        stages: tuple[Stage, ...] = (_cuda_tiles, _cuda_stages) if "gemm" in kernel_kinds(lowered) else ()
        return {"bm": 0, "bn": 0, "bk": 0, "stages": default.stages, "warps": default.warps}, \
            (*stages, _cuda_warps), _cuda_tuning
    infos = [i for i in contractions(lowered.loops).values() if i.flops >= GEMM_MIN_FLOPS]
    largest = max(infos, key=lambda i: i.flops)
    base = gemm_params(largest.m, largest.n, largest.k, largest.itemsize, lowered.target)
    return {**base, "unroll": 1}, CPU_STAGES, lambda candidate: _tuning(candidate, infos)


def candidates(lowered: Lowered, trials: int = DEFAULT_TRIALS) -> list[Tuning]:
    """Every candidate a search would try if each were no faster than the default (the search
    space, default first, at most ``trials``): what the tests build without timing."""
    best, stages, make = _space(lowered)
    seen: dict[tuple, Tuning] = {}
    for stage in stages:
        for candidate in stage(best):
            seen.setdefault(tuple(sorted(candidate.items())), make(candidate))
    return list(seen.values())[:trials]


def _tuning(candidate: dict[str, int], infos: list[GemmNest]) -> Tuning:
    tiles = {k: v for k, v in candidate.items() if k != "unroll"}
    return Tuning({info.tensor: dict(tiles) for info in infos}, candidate["unroll"])


def _register_tiles(best: dict[str, int]) -> Iterator[dict[str, int]]:
    mr, nr = best["mr"], best["nr"]
    yield best
    for m, n in ((8, nr), (mr // 2, nr), (4, 2 * nr), (mr, nr // 2)):
        if m >= 1 and n >= 8:
            yield {**best, "mr": m, "nr": n, "mc": max(m, best["mc"] // m * m), "nc": max(n, best["nc"] // n * n)}


def _k_blocks(best: dict[str, int]) -> Iterator[dict[str, int]]:
    for kc in (best["kc"] // 2, best["kc"] * 2):
        if 16 <= kc <= 1024:
            yield {**best, "kc": kc}


def _cache_blocks(best: dict[str, int]) -> Iterator[dict[str, int]]:
    mr, nr = best["mr"], best["nr"]
    yield {**best, "mc": max(mr, best["mc"] // 2 // mr * mr)}
    yield {**best, "nc": max(nr, best["nc"] * 2 // nr * nr)}


def _unrolls(best: dict[str, int]) -> Iterator[dict[str, int]]:
    for u in (2, 4):
        yield {**best, "unroll": u}


CPU_STAGES: tuple[Stage, ...] = (_register_tiles, _k_blocks, _cache_blocks, _unrolls)


def _cuda_tiles(best: dict[str, int]) -> Iterator[dict[str, int]]:
    """The default, then the largest tiles first, at most ``CUDA_TILES`` of them: the trials left
    go to the pipeline depth and the block size."""
    yield best
    tiles = sorted((t for t in SEARCH_TILES if fits(t)), key=lambda t: -t[0] * t[1] * t[2])
    for bm, bn, bk in tiles[:CUDA_TILES]:
        yield {**best, "bm": bm, "bn": bn, "bk": bk}


def _cuda_stages(best: dict[str, int]) -> Iterator[dict[str, int]]:
    yield {**best, "stages": 3 - best["stages"]}  # the other of single- and double-buffered


def _cuda_warps(best: dict[str, int]) -> Iterator[dict[str, int]]:
    for warps in WARPS:
        yield {**best, "warps": warps}


def _cuda_tuning(candidate: dict[str, int]) -> Tuning:
    tile = (candidate["bm"], candidate["bn"], candidate["bk"]) if candidate["bm"] else None
    return Tuning(cuda=CudaTuning(tile, candidate["stages"], candidate["warps"]))


def _timer(op: Op, lowered: Lowered) -> Callable[[Tuning], float | None]:
    """Build a candidate, run it on fixed random inputs, return the median time (None: no build).
    On CUDA the inputs live on the device and each run ends with a synchronisation."""
    on_gpu = lowered.target.is_gpu
    bindings = dict(lowered.te.bindings)
    args = random_args(op.te, bindings, np.random.default_rng(0))
    if on_gpu:
        args = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    cparams = {k: v for k, v in bindings.items() if k in op.te.cparams}
    bound = op.bind(tuple(args), cparams)
    backend = op.backend
    guard = op.index_guard(bound.bindings)

    def run(kernel) -> None:
        backend.invoke(kernel, op.te, bound, None, guard)  # (random ids may be out of range: then nothing runs)
        if on_gpu:
            cuda.synchronize()

    def measure(tuning: Tuning) -> float | None:
        candidate = replace(lowered, tuning=tuning, trace=Trace(), _scheduled=None)
        try:
            kernel = backend.load(op.name, backend.build(candidate.scheduled, op.target))
        except TccError:
            return None  # e.g. an unroll the nest does not allow
        run(kernel)  # warm-up: caches, page faults, thread team, module load
        times = []
        for _ in range(RUNS):
            start = time.perf_counter()
            run(kernel)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return measure
