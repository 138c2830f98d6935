"""Step 6's workloads, tcc against PyTorch (cuBLAS, cuDNN, its own kernels) in one process.

Each row times tcc and its anchor alternately (one trial of each, then again: ``--trials``
rounds), GPU time per call from CUDA events around back-to-back calls queued behind a sleep
kernel, and reports the medians. Inputs are random (never zeros); every row first checks tcc's
result against the anchor (relative error in f64). TF32 is off except in the rows that say TF32
(``TF32 GEMM``: tcc compiled with ``tf32=True`` against cuBLAS allowed TF32).
The ratio is tcc throughput over the anchor's (above 1: tcc is faster); for relu(a*b+c) the
anchor is a device-to-device copy and the ratio compares bytes moved per second. Rows that say
so are also timed against torch.compile (Inductor) of the anchor's code, the compiler a user
would pick instead (``--no-compile`` skips it): the last two columns.

    python benchmarks/gpu.py                 # every row
    python benchmarks/gpu.py -k sum -k GEMM  # rows whose label contains one of the words
    python benchmarks/gpu.py -k "user schedule"  # the hand-scheduled tensor-core GEMM (matmul_tc.tc)
    python benchmarks/gpu.py -k FP8 --no-compile  # the scaled FP8 GEMM against torch._scaled_mm (sm_89 on)
    python benchmarks/gpu.py --roofline --png roofline.png  # and each against the machine's ceilings
    TCC_BENCH_STAGED_STORES=off python benchmarks/gpu.py -k GEMM  # tcc.compile(..., staged_stores="off")

``TCC_BENCH_STAGED_STORES`` (auto, off or all; read by this script only) is passed to
``tcc.compile`` as ``staged_stores=``: which tensor-core GEMM results go through shared memory.
``TCC_BENCH_SHARED_KIB=113`` compiles for the device with that much shared memory a block (the
schedules then pick smaller GEMM tiles: 128 x 128 in 3 slots, two blocks a multiprocessor).
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from cuda_kernels import gpu_ms  # this folder's timing helper: CUDA events around queued calls

import tcc
from tcc import roofline as tcc_roofline
from tcc.runtime import cuda as cuda_backend
from tcc.target import CudaTarget

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SOURCE = """
op gemm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](A[i, k] * B[k, j])
}
op hgemm(A: f16[M, K], B: f16[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]))
}
op hgemm16(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] {
    C[i, j] = f16(sum[k](f32(A[i, k]) * f32(B[k, j])))
}
op bgemm(A: bf16[M, K], B: bf16[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]))
}
op fp8gemm(A: f8e4m3[M, K], B: f8e4m3[N, K], sa: f32, sb: f32) -> C: f16[M, N] {
    C[i, j] = f16(sa * sb * sum[k](f32(A[i, k]) * f32(B[j, k])))
}
op conv[P = 1](X: f32[N, C, H, W], Wt: f32[F, C, KH, KW], b: f32[F])
    -> Y: f32[N, F, H + 2*P - KH + 1, W + 2*P - KW + 1] {
    Xp = pad(X, [0, 0, P, P])
    Z[n, f, y, x] = sum[c, r, s](Xp[n, c, y + r, x + s] * Wt[f, c, r, s])
    Y[n, f, y, x] = max(Z[n, f, y, x] + b[f], 0.0)
}
op hconv[P = 1](X: f16[N, C, H, W], Wt: f16[F, C, KH, KW], b: f16[F])
    -> Y: f16[N, F, H + 2*P - KH + 1, W + 2*P - KW + 1] {
    Xp = pad(X, [0, 0, P, P])
    Z[n, f, y, x] = sum[c, r, s](f32(Xp[n, c, y + r, x + s]) * f32(Wt[f, c, r, s]))
    Y[n, f, y, x] = f16(max(Z[n, f, y, x] + f32(b[f]), 0.0))
}
op total(X: f32[M, N]) -> Y: f32[1] {
    Y[z] = sum[i, j](X[i, j])
}
op chansum(X: f32[N, C, H, W]) -> Y: f32[C] {
    Y[c] = sum[n, h, w](X[n, c, h, w])
}
op rowsum(X: f32[M, N]) -> Y: f32[M] {
    Y[i] = sum[j](X[i, j])
}
op fma_relu(A: f32[N], B: f32[N], C: f32[N]) -> Y: f32[N] {
    Y[i] = max(A[i] * B[i] + C[i], 0.0)
}
op softmax(X: f32[N, C]) -> Y: f32[N, C] {
    m[n] = max[c](X[n, c])
    e[n, c] = exp(X[n, c] - m[n])
    s[n] = sum[c](e[n, c])
    Y[n, c] = e[n, c] / s[n]
}
op rmsnorm(X: f32[N, D], g: f32[D]) -> Y: f32[N, D] {
    r[n] = rsqrt(sum[d](X[n, d] * X[n, d]) / D + 1e-6)
    Y[n, d] = X[n, d] * r[n] * g[d]
}
op linear_gelu(X: f16[M, K], W: f16[N, K], b: f16[N]) -> Y: f16[M, N] {
    Z[m, n] = sum[k](f32(X[m, k]) * f32(W[n, k])) + f32(b[n])
    Y[m, n] = f16(0.5 * Z[m, n] * (1.0 + erf(Z[m, n] * 0.7071067811865476)))
}
op layernorm(X: f32[N, D], g: f32[D], b: f32[D]) -> Y: f32[N, D] {
    mu[n] = sum[d](X[n, d]) / D
    var[n] = sum[d]((X[n, d] - mu[n]) ** 2) / D
    Y[n, d] = (X[n, d] - mu[n]) * rsqrt(var[n] + 1e-5) * g[d] + b[d]
}
"""


@dataclass
class Row:
    label: str
    ours: Callable[[], torch.Tensor]
    theirs: Callable[[], torch.Tensor]
    flops: float  # arithmetic the workload needs (a multiply-add is 2)
    nbytes: float  # the fewest bytes it must move: each input read once, each output written once
    unit: str = "TFLOP/s"  # the table's rate: FLOPs or, for "GB/s", bytes per second
    arith: str = "f32"  # the unit that does the arithmetic: "f32" (FMA pipes) or "f16" (tensor cores)
    their_bytes: float | None = None  # the anchor's bytes where it does other work (the copy)
    tf32: bool = False
    compiled: Callable[[], torch.Tensor] | None = None  # torch.compile of the anchor's code


def _reps(fn: Callable[[], object]) -> int:
    fn()
    torch.cuda.synchronize()
    once = gpu_ms(fn, 1)
    return max(3, min(200, int(25.0 / max(once, 1e-3))))


def _interleaved(a: Callable[[], object], b: Callable[[], object], trials: int) -> tuple[float, float]:
    """Medians of alternating trials of ``a`` and ``b``."""
    ra, rb = _reps(a), _reps(b)
    ta, tb = [], []
    for _ in range(trials):
        ta.append(gpu_ms(a, ra))
        tb.append(gpu_ms(b, rb))
    return statistics.median(ta), statistics.median(tb)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double().flatten(), want.double().flatten()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def _rows(lib: tcc.Library, lib_tf32: tcc.Library, only: list[str]) -> list[Row]:
    dev = "cuda"
    fn = torch.nn.functional
    rows: list[Row] = []

    def want(label: str) -> bool:
        return not only or any(word in label for word in only)

    for n in (4096, 8192):
        if want(f"f32 GEMM {n}"):
            a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
            rows.append(Row(f"f32 GEMM {n}", lambda a=a, b=b: lib.gemm(a, b), lambda a=a, b=b: a @ b,
                            2 * n**3, 12 * n**2))
    if want("f32 GEMM 128x128x65536"):  # one output tile: split-K's chunks fill the chip
        m, k = 128, 65536
        a, b = torch.randn(m, k, device=dev), torch.randn(k, m, device=dev)
        rows.append(Row("f32 GEMM 128x128x65536 (split-K)", lambda a=a, b=b: lib.gemm(a, b),
                        lambda a=a, b=b: torch.matmul(a, b), 2 * m * m * k, 4 * (2 * m * k + m * m)))
    if want("f32 GEMM 4096 vs cuBLAS TF32"):
        a, b = torch.randn(4096, 4096, device=dev), torch.randn(4096, 4096, device=dev)
        rows.append(Row("f32 GEMM 4096 vs cuBLAS TF32 (tcc: no TF32)", lambda a=a, b=b: lib.gemm(a, b),
                        lambda a=a, b=b: a @ b, 2 * 4096**3, 12 * 4096**2, tf32=True))
    for n in (4096, 8192):
        if want(f"TF32 GEMM {n}"):
            a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
            rows.append(Row(f"TF32 GEMM {n} (both TF32)", lambda a=a, b=b: lib_tf32.gemm(a, b),
                            lambda a=a, b=b: a @ b, 2 * n**3, 12 * n**2, arith="f16", tf32=True))
    for n in (4096, 8192):
        if want(f"f16 GEMM {n}"):
            a, b = torch.randn(n, n, device=dev).half(), torch.randn(n, n, device=dev).half()
            rows.append(Row(f"f16 GEMM {n} (f32 acc/out)", lambda a=a, b=b: lib.hgemm(a, b),
                            lambda a=a, b=b: torch.mm(a, b, out_dtype=torch.float32), 2 * n**3, 8 * n**2,
                            arith="f16"))
        if want(f"f16 GEMM {n} f16 out"):
            a, b = torch.randn(n, n, device=dev).half(), torch.randn(n, n, device=dev).half()
            rows.append(Row(f"f16 GEMM {n} f16 out", lambda a=a, b=b: lib.hgemm16(a, b),
                            lambda a=a, b=b: torch.mm(a, b), 2 * n**3, 6 * n**2, arith="f16"))
        if want(f"bf16 GEMM {n}"):
            a, b = torch.randn(n, n, device=dev).bfloat16(), torch.randn(n, n, device=dev).bfloat16()
            rows.append(Row(f"bf16 GEMM {n} (f32 acc/out)", lambda a=a, b=b: lib.bgemm(a, b),
                            lambda a=a, b=b: torch.mm(a, b, out_dtype=torch.float32), 2 * n**3, 8 * n**2,
                            arith="f16"))
        if want(f"f16 GEMM {n} user schedule"):  # examples/matmul_tc.tc: mma.sync from schedule steps
            user = tcc.compile(EXAMPLES / "matmul_tc.tc", target="cuda").matmul_tc
            a, b = torch.randn(n, n, device=dev).half(), torch.randn(n, n, device=dev).half()
            rows.append(Row(f"f16 GEMM {n} user schedule (matmul_tc.tc)", lambda a=a, b=b, op=user: op(a, b),
                            lambda a=a, b=b: torch.mm(a, b, out_dtype=torch.float32), 2 * n**3, 8 * n**2,
                            arith="f16"))
    for n in (4096, 8192):
        if want(f"FP8 GEMM {n}") and torch.cuda.get_device_capability() >= (8, 9):
            rows.append(_fp8_row(lib, n))
    conv_flops = 2 * 32 * 64 * 56 * 56 * 64 * 9
    x, w, bias = torch.randn(32, 64, 56, 56, device=dev), torch.randn(64, 64, 3, 3, device=dev) * 0.1, \
        torch.randn(64, device=dev)
    conv_elems = 2 * x.numel() + w.numel() + bias.numel()  # X and Y, the weights and the bias
    if want("f32 conv"):
        rows.append(Row("f32 conv 3x3 64->64 56x56 b32 +bias+relu", lambda: lib.conv(x, w, bias, P=1),
                        lambda: torch.relu(fn.conv2d(x, w, bias, padding=1)), conv_flops, 4 * conv_elems))
    if want("f16 conv"):
        xh, wh, bh = x.half(), w.half(), bias.half()
        rows.append(Row("f16 conv 3x3 64->64 56x56 b32 +bias+relu", lambda: lib.hconv(xh, wh, bh, P=1),
                        lambda: torch.relu(fn.conv2d(xh, wh, bh, padding=1)), conv_flops, 2 * conv_elems,
                        arith="f16"))
    big = torch.randn(8192, 8192, device=dev)
    nbytes, elems = big.numel() * 4, big.numel()
    if want("full sum"):
        rows.append(Row("full sum 8192x8192", lambda: lib.total(big), lambda: big.sum().reshape(1), elems, nbytes,
                        "GB/s"))
    if want("full sum odd"):
        odd = torch.randn(7001, 5003, device=dev)
        rows.append(Row("full sum odd 7001x5003", lambda: lib.total(odd), lambda: odd.sum().reshape(1),
                        odd.numel(), odd.numel() * 4, "GB/s"))
    if want("channel sum"):
        act = torch.randn(32, 64, 112, 112, device=dev)
        rows.append(Row("channel sum [n,h,w] 32x64x112x112", lambda: lib.chansum(act),
                        lambda: act.sum(dim=(0, 2, 3)), act.numel(), act.numel() * 4, "GB/s"))
    if want("row sum"):
        rows.append(Row("row sum 8192x8192", lambda: lib.rowsum(big), lambda: big.sum(dim=1), elems, nbytes, "GB/s"))
    if want("relu(a*b+c)"):
        v = [torch.randn(1 << 26, device=dev) for _ in range(3)]
        dst = torch.empty_like(v[0])
        n = v[0].numel()
        rows.append(Row("relu(a*b+c) 2^26 vs copy BW", lambda: lib.fma_relu(*v), lambda: dst.copy_(v[0]),
                        3 * n, 16 * n, "GB/s", their_bytes=8 * n))
    if want("softmax"):
        rows.append(Row("softmax 8192x8192", lambda: lib.softmax(big), lambda: torch.softmax(big, dim=1),
                        5 * elems, 2 * nbytes, "GB/s",  # max, subtract, exp, sum, divide
                        compiled=_compiled(lambda x: torch.softmax(x, dim=1), big)))
    g, b = torch.randn(8192, device=dev), torch.randn(8192, device=dev)
    if want("layernorm"):
        rows.append(Row("layernorm 8192x8192", lambda: lib.layernorm(big, g, b),
                        lambda: fn.layer_norm(big, (8192,), g, b, 1e-5), 8 * elems, 2 * nbytes, "GB/s",
                        compiled=_compiled(lambda x, g, b: fn.layer_norm(x, (8192,), g, b, 1e-5), big, g, b)))
    if want("rmsnorm"):
        rows.append(Row("rmsnorm 8192x8192", lambda: lib.rmsnorm(big, g),
                        lambda: fn.rms_norm(big, (8192,), g, 1e-6), 4 * elems, 2 * nbytes, "GB/s",
                        compiled=_compiled(lambda x, g: fn.rms_norm(x, (8192,), g, 1e-6), big, g)))
    rows += _backward_rows(lib, big, g, b, want)
    if want("linear + bias + GELU"):
        xs, ws, bs = (torch.randn(*s, device=dev).half() for s in ((4096, 4096), (4096, 4096), (4096,)))
        rows.append(Row("linear + bias + GELU f16 4096^3", lambda: lib.linear_gelu(xs, ws, bs),
                        lambda: fn.gelu(fn.linear(xs, ws, bs)), 2 * 4096**3, 8 * 4096**2, arith="f16",
                        compiled=_compiled(lambda x, w, b: fn.gelu(fn.linear(x, w, b)), xs, ws, bs)))
    return rows


def _backward_rows(lib: tcc.Library, x: torch.Tensor, g: torch.Tensor, b: torch.Tensor,
                   want: Callable[[str], bool]) -> list[Row]:
    """The row reductions' input gradients: ``tcc.grad`` of each op (it recomputes the forward's row
    statistics from X) against PyTorch's own backward kernel given what its forward saved (the
    output, or the mean and reciprocal deviation) and torch.compile of the same formula. Each reads
    X (or Y) and dY and writes dX: three passes over 8192 x 8192."""
    fn, rows = torch.nn.functional, []
    dy = torch.randn_like(x)
    elems, nbytes = x.numel(), 3 * x.numel() * 4
    if want("softmax backward"):
        y, sgrad = torch.softmax(x, dim=1), tcc.grad(lib.softmax)
        rows.append(Row("softmax backward 8192x8192", lambda: sgrad(x, dy),
                        lambda: torch._softmax_backward_data(dy, y, 1, torch.float32), 4 * elems, nbytes, "GB/s",
                        compiled=_compiled(lambda y, dy: y * (dy - (dy * y).sum(1, keepdim=True)), y, dy)))
    if want("layernorm backward"):
        lgrad = tcc.grad(lib.layernorm, ["X"])
        mean = x.mean(1, keepdim=True)
        rstd = (x.var(1, unbiased=False, keepdim=True) + 1e-5).rsqrt()

        def layernorm_dx(x: torch.Tensor, g: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
            mu, r = x.mean(1, keepdim=True), (x.var(1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
            xhat, wdy = (x - mu) * r, dy * g
            return r * (wdy - wdy.mean(1, keepdim=True) - xhat * (wdy * xhat).mean(1, keepdim=True))
        rows.append(Row("layernorm backward 8192x8192 (dX)", lambda: lgrad(x, g, b, dy),
                        lambda: torch.ops.aten.native_layer_norm_backward(
                            dy, x, [x.shape[1]], mean, rstd, g, b, [True, False, False])[0],
                        10 * elems, nbytes, "GB/s", compiled=_compiled(layernorm_dx, x, g, dy)))
    if want("rmsnorm backward"):
        rgrad = tcc.grad(lib.rmsnorm, ["X"])
        xr = x.detach().requires_grad_()
        yr = fn.rms_norm(xr, (x.shape[1],), g, 1e-6)

        def rmsnorm_dx(x: torch.Tensor, g: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
            r = ((x * x).mean(1, keepdim=True) + 1e-6).rsqrt()
            return r * g * dy - x * r**3 * (g * dy * x).mean(1, keepdim=True)
        rows.append(Row("rmsnorm backward 8192x8192 (dX)", lambda: rgrad(x, g, dy),
                        lambda: torch.autograd.grad(yr, xr, dy, retain_graph=True)[0], 6 * elems, nbytes, "GB/s",
                        compiled=_compiled(rmsnorm_dx, x, g, dy)))
    return rows


def _fp8_row(lib: tcc.Library, n: int) -> Row:
    """The scaled FP8 GEMM (e4m3 operands, B stored [N, K], per-tensor scales, f16 out) against
    torch._scaled_mm (cuBLASLt), which takes B column-major: ``b.t()`` of the same bytes."""
    dev = "cuda"
    a, b = (torch.randn(n, n, device=dev).to(torch.float8_e4m3fn) for _ in range(2))
    sa, sb = torch.tensor(0.5, device=dev), torch.tensor(2.0, device=dev)

    def theirs() -> torch.Tensor:
        out = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float16)
        return out[0] if isinstance(out, tuple) else out  # (PyTorch before 2.4: (out, amax))
    return Row(f"FP8 GEMM {n} e4m3, f16 out (vs torch._scaled_mm)", lambda: lib.fp8gemm(a, b, 0.5, 2.0), theirs,
               2 * n**3, 4 * n**2, arith="f16")  # (the roofline has no FP8 peak: it bounds it by f16's)


COMPILE = True  # --no-compile: no torch.compile column


def _compiled(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> Callable[[], torch.Tensor] | None:
    """torch.compile (Inductor) of ``fn`` on ``args``, compiled now (not inside a timing)."""
    if not COMPILE:
        return None
    compiled = torch.compile(fn)
    compiled(*args)
    return lambda: compiled(*args)


def measure(row: Row, trials: int) -> tuple[tuple[str, ...], float]:
    """The table's cells for ``row``, and tcc's milliseconds."""
    torch.backends.cuda.matmul.allow_tf32 = row.tf32
    torch.backends.cudnn.allow_tf32 = row.tf32
    err = "-" if row.their_bytes else f"{_rel_err(row.ours(), row.theirs()):.1e}"
    ours, theirs = _interleaved(row.ours, row.theirs, trials)
    if row.unit == "TFLOP/s":
        rate, their_rate = row.flops / ours / 1e9, row.flops / theirs / 1e9
    else:
        rate, their_rate = row.nbytes / ours / 1e6, (row.their_bytes or row.nbytes) / theirs / 1e6
    cells = (row.label, f"{ours:.3f}", f"{theirs:.3f}", f"{rate:.1f}", f"{their_rate:.1f}", row.unit,
             f"{rate / their_rate:.2f}", err)
    if row.compiled is None:
        return (*cells, "-", "-"), ours
    ours_again, inductor = _interleaved(row.ours, row.compiled, trials)
    return (*cells, f"{inductor:.3f}", f"{inductor / ours_again:.2f}"), ours


def roofline(rows: list[Row], times: list[float], png: str | None) -> None:
    """FLOPs, bytes, intensity, the floor time from the machine's measured ceilings and the
    fraction of it that tcc reaches (tcc.roofline, as ``tcc bench --roofline``); a log-log plot
    with a point per workload when ``png`` is given."""
    peak = tcc_roofline.peaks(cuda_backend.machine(), cuda_backend.cache_key(cuda_backend.machine()))
    points = [tcc_roofline.place(row.label, tcc_roofline.Cost(int(row.flops), int(row.nbytes), row.arith), ms / 1e3,
                                 peak) for row, ms in zip(rows, times)]
    print("\n" + tcc_roofline.report(points, peak))
    if png:
        tcc_roofline.plot(points, peak, png, "tcc on the GPU")
        print(f"wrote {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-k", action="append", default=[], help="run rows whose label contains this")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--roofline", action="store_true", help="also print each workload against the roofline")
    parser.add_argument("--png", default=None, help="with --roofline: write the plot here")
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile column")
    args = parser.parse_args()
    global COMPILE
    COMPILE = not args.no_compile
    torch.manual_seed(0)
    stores = os.environ.get("TCC_BENCH_STAGED_STORES", "auto")
    target: str | CudaTarget = "cuda"
    if os.environ.get("TCC_BENCH_SHARED_KIB"):  # a smaller shared-memory budget: other tiles
        kib = int(os.environ["TCC_BENCH_SHARED_KIB"])
        target = replace(cuda_backend.machine(), shared_per_block_optin=kib << 10)
    lib = tcc.compile(SOURCE, target=target, staged_stores=stores)
    lib_tf32 = tcc.compile(SOURCE, target=target, tf32=True, staged_stores=stores)
    header = ("workload", "tcc ms", "torch ms", "tcc", "torch", "unit", "ratio", "rel err", "compile ms",
              "ratio vs compile")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, staged_stores={stores}, "
          f"target: {target}")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header), flush=True)
    done, times = [], []
    for row in _rows(lib, lib_tf32, args.k):
        try:
            cells, ms = measure(row, args.trials)
            done.append(row)
            times.append(ms)
        except tcc.TccError as err:  # one failing kernel does not hide the other rows
            cells = (row.label, "error", str(err).splitlines()[0])
        print("| " + " | ".join(cells) + " |", flush=True)
    if args.roofline:
        roofline(done, times, args.png)


if __name__ == "__main__":
    main()
