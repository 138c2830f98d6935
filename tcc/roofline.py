"""The roofline of an op: its work and traffic against the machine's measured ceilings.

:func:`cost` counts what the algorithm needs, from the specialised TE (before fusion, so a
schedule cannot change it): FLOPs (every arithmetic node once per point it is evaluated at, a
reduction's combine included, so a multiply-add is 2) and the fewest bytes it must move (each
input read once, each result written once). :func:`peaks` measures the machine with small probes,
each the best of several bursts, and keeps the numbers in the disk cache under the target's key:
on the CPU the copy bandwidth of a tcc copy kernel on every core and the faster of NumPy's (BLAS)
and tcc's f32 matrix product; on CUDA a device-to-device copy and PyTorch's f32 and f16 (tensor
core) products. Peaks that are implausible (far below the target's expected order, or below what
a kernel reached) are measured again; ``tcc bench --measure-peaks`` measures them anew. The floor time of an
op is ``max(flops / peak FLOP/s, bytes / peak bandwidth)``; the fraction reached is the floor
over the measured time. ``tcc bench --roofline`` prints it and plots it (:func:`plot`);
``benchmarks/gpu.py --roofline`` does the same for its workloads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tcc import threads
from tcc.compiler import compile as tcc_compile
from tcc.errors import TccError
from tcc.ir.expr import Binary, Call, Expr, IterVar, Read, Reduce, Select, Unary
from tcc.ir.te import OpTE
from tcc.passes.simplify import evaluate_int
from tcc.runtime import cache
from tcc.target import Target

PEAKS_KEY = "peaks-v1"
# inputs that put the work on tensor cores; 8-bit floats run twice as fast there, but no FP8 peak is
# measured, so f16's bounds them (their fraction of the floor can exceed 1)
HALF = ("f16", "bf16", "f8e4m3", "f8e5m2")


@dataclass(frozen=True)
class Cost:
    flops: int
    nbytes: int
    arith: str  # the unit whose peak bounds it: "f32" (FMA pipes) or "f16" (tensor cores)

    @property
    def intensity(self) -> float:
        return self.flops / self.nbytes if self.nbytes else math.inf


@dataclass(frozen=True)
class Point:
    """One kernel (op) on the roofline."""

    label: str
    cost: Cost
    seconds: float
    floor: float  # seconds at the machine's ceilings
    bound: str  # "memory" or "f32 math" / "f16 math"

    @property
    def fraction(self) -> float:
        return self.floor / self.seconds


def cost(te: OpTE, target: Target) -> Cost:
    """FLOPs and bytes of a specialised op (see the module docstring)."""
    flops = sum(_points(c.axes) * _ops(c.body) for c in te.computes)
    nbytes = sum(math.prod(_int(d) for d in t.shape) * t.dtype.itemsize
                 for t in te.tensors.values() if t.kind in ("input", "result"))
    half = any(t.dtype.name in HALF for t in te.tensors.values() if t.kind == "input")
    return Cost(flops, nbytes, "f16" if half and target.is_gpu else "f32")


def _int(e: Expr) -> int:
    value = evaluate_int(e)
    if value is None:
        raise TccError("the roofline needs concrete sizes", hint="give every size with -D or --shape")
    return value


def _points(axes: tuple[IterVar, ...]) -> int:
    return math.prod(_int(ax.extent) for ax in axes)


def _ops(e: Expr) -> int:
    """Arithmetic nodes evaluated for one point of ``e`` (index arithmetic inside reads is free)."""
    if isinstance(e, Read):
        return 0
    if isinstance(e, Reduce):
        return _points(e.axes) * (_ops(e.body) + 1)
    own = 1 if isinstance(e, Binary | Unary | Call | Select) else 0
    return own + sum(_ops(c) for c in e.children())


def place(label: str, c: Cost, seconds: float, peak: dict[str, float]) -> Point:
    """``c`` measured at ``seconds`` against the ceilings ``peak``."""
    compute, memory = c.flops / peak[c.arith], c.nbytes / peak["bytes"]
    return Point(label, c, seconds, max(compute, memory), f"{c.arith} math" if compute > memory else "memory")


def report(points: list[Point], peak: dict[str, float]) -> str:
    """The roofline table (markdown)."""
    lines = [f"roofline: bandwidth {peak['bytes'] / 1e9:.1f} GB/s, f32 {peak['f32'] / 1e12:.2f} TFLOP/s"
             + (f", f16 {peak['f16'] / 1e12:.1f} TFLOP/s" if "f16" in peak else "") + " (measured on this machine)",
             "| kernel | GFLOP | MB | FLOP/byte | floor ms | bound | measured ms | of floor |",
             "|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p.label} | {p.cost.flops / 1e9:.4g} | {p.cost.nbytes / 1e6:.4g} | {p.cost.intensity:.3g} | "
                     f"{p.floor * 1e3:.4g} | {p.bound} | {p.seconds * 1e3:.4g} | {p.fraction:.2f} |")
    return "\n".join(lines)


def plot(points: list[Point], peak: dict[str, float], png: str, title: str) -> None:
    """A log-log roofline: the ceilings, and a point per kernel at its intensity and achieved FLOP/s."""
    import matplotlib  # for the plot only: a heavy import that compiling never needs

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    lo = min([p.cost.intensity for p in points if p.cost.flops] + [0.1]) / 4
    hi = max([p.cost.intensity for p in points if p.cost.flops] + [100.0]) * 4
    xs = np.geomspace(lo, hi, 200)
    for name, style in (("f32", "--"), ("f16", "-")):
        if name in peak:
            ax.plot(xs, np.minimum(peak[name], peak["bytes"] * xs), style, label=f"roof: {name} / bandwidth")
    for p in points:
        if p.cost.flops:
            ax.scatter([p.cost.intensity], [p.cost.flops / p.seconds])
            ax.annotate(f"{p.label} ({p.fraction:.0%})", (p.cost.intensity, p.cost.flops / p.seconds), fontsize=7,
                        xytext=(4, 2), textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="FLOP per byte", ylabel="FLOP/s", title=title)
    ax.legend()
    fig.savefig(png, dpi=120, bbox_inches="tight")
    plt.close(fig)


# ---------------------------------------------------------------- the machine's ceilings

PEAKS_KEY = "peaks-v2"  # v1 kept one burst's numbers, which a busy machine made far too low, for good
BURSTS = 5  # each probe is timed in this many bursts, PAUSE_S apart; the best burst is the ceiling
PAUSE_S = 0.05  # lets a moment's load from other processes pass between bursts
ATTEMPTS = 3  # measurements of an implausible f32 peak before the best of them is kept as it is
FAR_BELOW = 8  # an f32 peak under 1/FAR_BELOW of the machine's expected order was measured while busy


def peaks(target: Target, machine_key: str, measure: bool = False,
          at_least: dict[str, float] | None = None) -> dict[str, float]:
    """The ceilings of this target (``bytes`` per second; ``f32``, ``f16`` FLOP/s): from the disk
    cache under the target and ``machine_key``, else measured and stored. They are measured again
    when ``measure`` is set, and when the stored ones are implausible: an f32 peak far below the
    target's expected order (:func:`expected_f32`), or below a rate that a kernel reached
    (``at_least``, FLOP/s by unit, as :func:`reached` counts them: a kernel cannot compute faster
    than the machine). A rate a kernel reached is itself a lower bound of the ceiling."""
    disk = cache.DiskCache(cache.cache_dir())
    key = cache.make_key(PEAKS_KEY, target.key(), machine_key)
    stored = _stored(disk.get_json(key))
    floor = dict(at_least or {})
    if stored is not None and not measure and not _below(stored.peaks, floor) and (
            stored.settled or not _implausible(stored.peaks, target)):
        return stored.peaks
    previous = None if measure or stored is None else stored.peaks
    measured = _measure(target, _merged(previous, floor))
    disk.put_json(key, {"peaks": measured.peaks, "settled": measured.settled})
    return measured.peaks


@dataclass(frozen=True)
class Measured:
    peaks: dict[str, float]
    settled: bool  # measured ATTEMPTS times and still implausible: kept, not measured at each use


def _stored(entry: dict | None) -> Measured | None:
    peak = entry.get("peaks") if entry else None
    if not isinstance(peak, dict) or not all(isinstance(peak.get(k), float) for k in ("bytes", "f32")):
        return None
    return Measured(peak, bool(entry.get("settled")))


def _measure(target: Target, previous: dict[str, float]) -> Measured:
    """Measure until the f32 peak is plausible (at most ATTEMPTS times), each ceiling the best of
    every measurement and ``previous``."""
    best = dict(previous)
    for _ in range(ATTEMPTS):
        best = _merged(best, _cuda_peaks() if target.is_gpu else _cpu_peaks())
        if not _implausible(best, target):
            return Measured(best, False)
    return Measured(best, True)


def _merged(a: dict[str, float] | None, b: dict[str, float]) -> dict[str, float]:
    merged = dict(a or {})
    for name, value in b.items():
        merged[name] = max(value, merged.get(name, 0.0))
    return merged


def _below(peak: dict[str, float], floor: dict[str, float]) -> bool:
    return any(value > peak.get(name, 0.0) for name, value in floor.items())


def expected_f32(target: Target) -> float:
    """The order of the target's f32 FLOP/s: a fused multiply-add per vector lane on two pipes at
    2 GHz per core (CPU), or 128 lanes at 1.5 GHz per multiprocessor (CUDA). Real machines differ by
    a small factor either way; a measurement FAR_BELOW under it was disturbed."""
    if target.is_gpu:
        return target.sms * 128 * 2 * 1.5e9
    return target.cores * (target.vector_bytes // 4) * 2 * 2 * 2e9


def _implausible(peak: dict[str, float], target: Target) -> bool:
    return peak["f32"] < expected_f32(target) / FAR_BELOW


def reached(costs: list[tuple[Cost, float]]) -> dict[str, float]:
    """The highest FLOP/s per unit among kernels measured at ``(cost, seconds)``: what the ceilings
    are at least. (Bytes per second are not: a kernel whose data stays in cache may exceed the
    memory bandwidth.)"""
    rates: dict[str, float] = {}
    for c, seconds in costs:
        if c.flops and seconds > 0:
            rates[c.arith] = max(c.flops / seconds, rates.get(c.arith, 0.0))
    return rates


def _best(fn: Callable[[], object], runs: int) -> float:
    """The shortest of ``runs`` calls in each of BURSTS bursts, PAUSE_S apart, after a warm-up."""
    fn()
    best = math.inf
    for burst in range(BURSTS):
        if burst:
            time.sleep(PAUSE_S)
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
    return best


def _cpu_peaks() -> dict[str, float]:
    """Copy bandwidth (bytes read + written) of tcc's own copy kernel on every core, over 64 MiB,
    and the faster of NumPy's (BLAS) f32 matrix product and tcc's own at 1024^3."""
    requested = threads.requested_threads()
    threads.set_num_threads(None)  # the machine's ceiling: every core, whatever the caller chose
    try:
        lib = tcc_compile(PROBES)
        src = np.random.default_rng(0).standard_normal(1 << 24, dtype=np.float32)
        dst = np.empty_like(src)
        bandwidth = 2 * src.nbytes / _best(lambda: lib.copy(src, out=dst), 5)
        a = np.random.default_rng(1).standard_normal((1024, 1024), dtype=np.float32)
        c = lib.matmul(a, a)
        product = min(_best(lambda: a @ a, 3), _best(lambda: lib.matmul(a, a, out=c), 3))
    finally:
        threads.set_num_threads(requested)
    return {"bytes": bandwidth, "f32": 2 * 1024**3 / product}


PROBES = """
op copy(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] }
op matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }
"""


def _cuda_peaks() -> dict[str, float]:
    """Device copy bandwidth over 1 GiB and PyTorch's f32 (TF32 off) and f16 products at 8192^3."""
    try:
        import torch  # optional: the GPU ceilings come from PyTorch's copy and cuBLAS products
    except ImportError:
        raise TccError("measuring the GPU's ceilings needs PyTorch (with CUDA)", hint="pip install torch") from None
    torch.backends.cuda.matmul.allow_tf32 = False
    src = torch.randn(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, device="cuda")
    h = a.half()

    def gpu(fn: Callable[[], object], reps: int) -> float:
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    copy = min(gpu(lambda: dst.copy_(src), 10) for _ in range(BURSTS))
    f32 = min(gpu(lambda: a @ a, 3) for _ in range(BURSTS))
    f16 = min(gpu(lambda: h @ h, 10) for _ in range(BURSTS))
    return {"bytes": 2 * src.numel() * 4 / copy, "f32": 2 * 8192**3 / f32, "f16": 2 * 8192**3 / f16}
