"""CUDA backend timings: cold compile, warm start from the disk cache, per-call overhead (host
time of a tcc call against a bare cuLaunchKernel), and kernels against PyTorch as ratios of GPU
time (CUDA events around back-to-back calls queued behind a sleep kernel). Needs a GPU and PyTorch.

    python benchmarks/cuda_kernels.py            # prints a table; targets: cold <= 300 ms, warm <= 5 ms,
                                         # per-call overhead <= 20 us
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from cuda.bindings import driver as bindings  # cuda-python's own launch, beside ctypes'

import tcc
from tcc.codegen_cuda import driver
from tcc.runtime import cache

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f} ms"


def compile_times() -> list[tuple[str, str]]:
    """Cold: a fresh cache and process state. Warm: a new library over the filled disk cache."""
    rows = []
    os.environ["TCC_CACHE_DIR"] = tempfile.mkdtemp(prefix="tcc-bench-")
    x = torch.randn(4096, 1024, device="cuda")
    for name in ("softmax", "axpy"):
        args = (x,) if name == "softmax" else (2.0, x.view(-1), x.view(-1))
        cache.MEMORY.clear()
        lib = tcc.compile(EXAMPLES / f"{name}.tc", target="cuda")
        t = time.perf_counter()
        getattr(lib, name)(*args)
        torch.cuda.synchronize()
        cold = time.perf_counter() - t
        warm = []
        for _ in range(5):
            cache.MEMORY.clear()
            lib = tcc.compile(EXAMPLES / f"{name}.tc", target="cuda")
            t = time.perf_counter()
            getattr(lib, name)(*args)
            torch.cuda.synchronize()
            warm.append(time.perf_counter() - t)
        rows.append((f"{name}: cold compile (first call, empty caches)", _ms(cold)))
        rows.append((f"{name}: warm start (new process state, disk cache)", _ms(statistics.median(warm))))
    return rows


def call_overhead() -> list[tuple[str, str]]:
    """Host time per call of a tiny op from Python, against a bare cuLaunchKernel of its kernel."""
    lib = tcc.compile(EXAMPLES / "axpy.tc", target="cuda")
    x = torch.randn(256, device="cuda")
    y = torch.randn(256, device="cuda")
    z = torch.empty(256, device="cuda")
    n = 5000
    for _ in range(100):
        lib.axpy(2.0, x, y, out=z)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        lib.axpy(2.0, x, y, out=z)
    torch.cuda.synchronize()
    ours = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        lib.axpy(2.0, x, y)
    torch.cuda.synchronize()
    ours_new = (time.perf_counter() - t) / n
    launcher = lib.axpy.kernel({"N": 256}).launchers(0)[0]
    values = {"a": 2.0, "X": x.data_ptr(), "Y": y.data_ptr(), "Z": z.data_ptr()}
    for slot, name in zip(launcher.slots, launcher.names):
        slot.value = values[name]
    stream = torch.cuda.current_stream().cuda_stream
    argv = launcher.argv_ptr
    t = time.perf_counter()
    for _ in range(n):
        bindings.cuLaunchKernel(launcher.fn, launcher.grid, 1, 1, launcher.block, 1, 1, 0, stream, argv, 0)
    torch.cuda.synchronize()
    bare = (time.perf_counter() - t) / n
    lib_cuda = driver.libcuda()
    t = time.perf_counter()
    for _ in range(n):
        lib_cuda.cuLaunchKernel(int(launcher.fn), launcher.grid, 1, 1, launcher.block, 1, 1, 0, stream, argv, None)
    torch.cuda.synchronize()
    bare_ctypes = (time.perf_counter() - t) / n
    return [("bare cuLaunchKernel through ctypes (per call)", f"{bare_ctypes * 1e6:8.1f} us"),
            ("axpy call with out= (per call)", f"{ours * 1e6:8.1f} us"),
            ("axpy call, new result tensor (per call)", f"{ours_new * 1e6:8.1f} us"),
            ("bare cuLaunchKernel (per call)", f"{bare * 1e6:8.1f} us"),
            ("overhead of a tcc call over a bare launch", f"{(ours - bare) * 1e6:8.1f} us")]


def gpu_ms(fn, reps: int) -> float:
    """Milliseconds per call of ``fn`` on the GPU alone: the stream first sleeps while the host
    queues ``reps`` back-to-back calls, and CUDA events bracket the calls, so host time between
    launches is not counted."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(2e6 + reps * 1e5))  # ~1 ms + 50 us of GPU cycles per queued call
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def _time_gpu(fn, trials: int = 7) -> float:
    """Median over trials of :func:`_gpu_ms`, after a warm-up; enough calls for ~20 ms a trial."""
    fn()
    torch.cuda.synchronize()
    once = gpu_ms(fn, 1)
    reps = max(3, min(200, int(20.0 / max(once, 1e-3))))
    return statistics.median(gpu_ms(fn, reps) for _ in range(trials))


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def _f16_matmul_f32_out(a: torch.Tensor, b: torch.Tensor) -> tuple[str, object]:
    """PyTorch's f16 tensor-core matmul with an f32 result: ``torch.mm(out_dtype=)`` where this
    PyTorch has it, else an f16 matmul then a cast."""
    try:
        torch.mm(a[:16, :16], b[:16, :16], out_dtype=torch.float32)
        return "torch.mm(out_dtype=f32)", lambda: torch.mm(a, b, out_dtype=torch.float32)
    except (TypeError, RuntimeError):
        return "(a @ b).float()", lambda: (a @ b).float()


def _cases() -> list[tuple]:
    """(label, example, tcc arguments, compile-time parameters, PyTorch anchor, flops or 0)."""
    x = torch.randn(4096, 1024, device="cuda")
    g, b = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    v, w = torch.randn(1 << 24, device="cuda"), torch.randn(1 << 24, device="cuda")
    mats = {n: (torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")) for n in (1024, 4096)}
    h1, h2 = (torch.randn(4096, 4096, device="cuda").half() for _ in range(2))
    xc, wc, bc = torch.randn(8, 64, 56, 56, device="cuda"), torch.randn(64, 64, 3, 3, device="cuda") * 0.1, \
        torch.randn(64, device="cuda")
    fn = torch.nn.functional
    cases = [
        ("axpy 16M", "axpy", (2.0, v, w), {}, lambda: torch.add(w, v, alpha=2.0), 0),
        ("bias_relu 4096x1024", "bias_relu", (x, g), {}, lambda: torch.relu(x + g), 0),
        ("softmax 4096x1024", "softmax", (x,), {}, lambda: torch.softmax(x, dim=1), 0),
        ("layernorm 4096x1024", "layernorm", (x, g, b), {}, lambda: fn.layer_norm(x, (1024,), g, b, 1e-5), 0),
    ]
    for n, (a, bm) in mats.items():
        cases.append((f"matmul {n} f32", "matmul", (a, bm), {}, lambda a=a, bm=bm: a @ bm, 2 * n**3))
    anchor, hmm_ref = _f16_matmul_f32_out(h1, h2)
    cases.append((f"hmm 4096 (f16 in, f32 out; torch: {anchor})", "hmm", (h1, h2), {}, hmm_ref, 2 * 4096**3))
    cases.append(("conv2d_relu 3x3 64->64 56x56 b8", "conv2d_relu", (xc, wc, bc), {"P": 1},
                  lambda: torch.relu(fn.conv2d(xc, wc, bc, padding=1)), 2 * 8 * 64 * 56 * 56 * 64 * 9))
    return cases


def kernels_vs_torch() -> list[tuple[str, str]]:
    """GPU time per call (events around back-to-back calls), tcc against PyTorch, as ratios."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for label, name, args, cparams, ref, flops in _cases():
        op = getattr(tcc.compile(EXAMPLES / f"{name}.tc", target="cuda"), name)
        err = _rel_err(op(*args, **cparams), ref())
        ours = _time_gpu(lambda op=op, args=args, cparams=cparams: op(*args, **cparams))
        theirs = _time_gpu(ref)
        rate = f", {flops / ours / 1e9:7.1f} TFLOP/s" if flops else ""
        rows.append((f"{label}: tcc / torch", f"{ours:8.3f} ms / {theirs:8.3f} ms = {ours / theirs:6.2f}x"
                                              f"{rate}  (rel err {err:.1e})"))
    return rows


def main() -> None:
    torch.cuda.init()
    rows = compile_times() + call_overhead() + kernels_vs_torch()
    print(f"device: {torch.cuda.get_device_name()}")
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


if __name__ == "__main__":
    main()
