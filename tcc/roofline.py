"""The roofline of an op: its work and traffic against the machine's measured ceilings.

:func:`cost` counts what the algorithm needs, from the specialised TE (before fusion, so a
schedule cannot change it): FLOPs (every arithmetic node once per point it is evaluated at, a
reduction's combine included, so a multiply-add is 2) and the fewest bytes it must move (each
input read once, each result written once). :func:`peaks` measures the machine once with a small
probe and keeps the numbers in the disk cache under the machine's key: on the CPU the copy
bandwidth of a tcc copy kernel on every core and NumPy's (BLAS) f32 matrix product; on CUDA a
device-to-device copy and PyTorch's f32 and f16 (tensor core) products. The floor time of an
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

from tcc.compiler import Op
from tcc.compiler import compile as tcc_compile
from tcc.errors import TccError
from tcc.ir.expr import Binary, Call, Expr, IterVar, Read, Reduce, Select, Unary
from tcc.ir.te import OpTE
from tcc.passes.simplify import evaluate_int
from tcc.runtime import cache
from tcc.target import Target

PEAKS_KEY = "peaks-v1"
HALF = ("f16", "bf16")


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

def peaks(target: Target, machine_key: str) -> dict[str, float]:
    """The ceilings of this machine (``bytes`` per second; ``f32``, ``f16`` FLOP/s): from the disk
    cache under ``machine_key``, else measured once and stored."""
    disk = cache.DiskCache(cache.cache_dir())
    key = cache.make_key(PEAKS_KEY, machine_key)
    stored = disk.get_json(key)
    if isinstance(stored, dict) and all(isinstance(stored.get(k), float) for k in ("bytes", "f32")):
        return stored
    measured = _cuda_peaks() if target.is_gpu else _cpu_peaks()
    disk.put_json(key, measured)
    return measured


def _best(fn: Callable[[], object], runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _cpu_peaks() -> dict[str, float]:
    """Copy bandwidth (bytes read + written) of tcc's own copy kernel on every core, over 64 MiB,
    and NumPy's f32 matrix product at 1024^3 (its BLAS: vectorised, threaded)."""
    copy: Op = tcc_compile("op copy(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] }").copy
    src = np.random.default_rng(0).standard_normal(1 << 24, dtype=np.float32)
    dst = np.empty_like(src)
    bandwidth = 2 * src.nbytes / _best(lambda: copy(src, out=dst), 5)
    a = np.random.default_rng(1).standard_normal((1024, 1024), dtype=np.float32)
    f32 = 2 * 1024**3 / _best(lambda: a @ a, 3)
    return {"bytes": bandwidth, "f32": f32}


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

    copy = min(gpu(lambda: dst.copy_(src), 10) for _ in range(2))
    f32 = min(gpu(lambda: a @ a, 3) for _ in range(2))
    f16 = min(gpu(lambda: h @ h, 10) for _ in range(2))
    return {"bytes": 2 * src.numel() * 4 / copy, "f32": 2 * 8192**3 / f32, "f16": 2 * 8192**3 / f16}
