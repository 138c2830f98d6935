"""Autotuning, opt-in: a small search over the CPU auto-scheduler's GEMM tiles and k-loop unroll.

The heuristics of :func:`tcc.passes.autoschedule_cpu.schedule.gemm_params` are good on the hosts they were
measured on; the tuner checks them on this host. It walks a few stages (register tile, k block,
cache blocks, unroll), each trying a handful of values around the best so far, timing every
candidate on random inputs (the median of a few runs), so it stays small: about a dozen builds.
The winner is stored as a JSON entry in the disk cache under the op's specialisation key, so
later processes (``tcc.compile(..., tune=True)``) use it at once.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from tcc.errors import TccError
from tcc.passes.autoschedule_cpu.schedule import GEMM_MIN_FLOPS, contractions, gemm_params
from tcc.passes.pipeline import Lowered, Tuning
from tcc.runtime import cache

if TYPE_CHECKING:
    from tcc.compiler import Op

DEFAULT_TRIALS = 12
RUNS = 5  # timed runs per candidate; the median is kept
TUNE_KEY = "tune-v1"


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
        return Tuning(tiles, int(entry["unroll"]))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # a malformed entry is a miss


def store_tuning(op: Op, lowered: Lowered, result: TuneResult) -> None:
    entry = {"tiles": result.best.tiles, "unroll": result.best.unroll,
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
    return any(info["flops"] >= GEMM_MIN_FLOPS for info in contractions(lowered.loops).values())


# ---------------------------------------------------------------- the search

def search(op: Op, lowered: Lowered, trials: int = DEFAULT_TRIALS, progress: bool = True) -> TuneResult:
    """Time up to ``trials`` candidates stage by stage, keeping the fastest (the default first)."""
    from tqdm import tqdm

    infos = [i for i in contractions(lowered.loops).values() if i["flops"] >= GEMM_MIN_FLOPS]
    largest = max(infos, key=lambda i: i["flops"])
    base = gemm_params(largest["m"], largest["n"], largest["k"], largest["itemsize"])
    measure = _timer(op, lowered)
    timings: list[tuple[Tuning, float]] = []
    best: dict[str, int] = {**base, "unroll": 1}
    best_time = float("inf")
    tried: set[tuple] = set()
    bar = tqdm(total=max(1, trials), desc=f"tuning {op.name}", unit="build", disable=not progress,
               leave=False)
    with bar:
        for stage in STAGES:
            for candidate in stage(best):
                ident = tuple(sorted(candidate.items()))
                if ident in tried or len(tried) >= trials:
                    continue
                tried.add(ident)
                tuning = _tuning(candidate, infos)
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
    return TuneResult(_tuning(best, infos), best_time, timings[0][1], timings)


def _tuning(candidate: dict[str, int], infos: list[dict]) -> Tuning:
    tiles = {k: v for k, v in candidate.items() if k != "unroll"}
    return Tuning({info["tensor"]: dict(tiles) for info in infos}, candidate["unroll"])


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


STAGES: tuple[Callable[[dict[str, int]], Iterator[dict[str, int]]], ...] = (
    _register_tiles, _k_blocks, _cache_blocks, _unrolls)


def _timer(op: Op, lowered: Lowered) -> Callable[[Tuning], float | None]:
    """Build a candidate, run it on fixed random inputs, return the median time (None: no build)."""
    from tcc.testing import random_args

    bindings = dict(lowered.te.bindings)
    args = random_args(op.te, bindings, np.random.default_rng(0))
    cparams = {k: v for k, v in bindings.items() if k in op.te.cparams}
    bound = op._bind(tuple(args), cparams)
    backend = op._backend

    def measure(tuning: Tuning) -> float | None:
        candidate = replace(lowered, tuning=tuning, after_pass=None, _scheduled=None)
        try:
            kernel = backend.load(op.name, backend.build(candidate.scheduled, op.options))
        except TccError:
            return None  # e.g. an unroll the nest does not allow
        backend.invoke(kernel, op.te, bound, None)  # warm-up: caches, page faults, thread team
        times = []
        for _ in range(RUNS):
            start = time.perf_counter()
            backend.invoke(kernel, op.te, bound, None)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return measure
