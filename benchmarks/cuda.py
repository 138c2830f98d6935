"""CUDA backend timings: cold compile, warm start from the disk cache, per-call overhead, and a
few kernels against PyTorch (as ratios). Needs a GPU and PyTorch.

    python benchmarks/cuda.py            # prints a table; targets: cold <= 300 ms, warm <= 5 ms,
                                         # per-call overhead <= 20 us
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# this file is named cuda.py: keep its folder off the path so that `cuda.bindings` resolves
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402

import tcc  # noqa: E402
from tcc.codegen_cuda import driver  # noqa: E402
from tcc.runtime import cache  # noqa: E402

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
    api = driver.api()
    stream = torch.cuda.current_stream().cuda_stream
    argv = launcher.argv_ptr
    t = time.perf_counter()
    for _ in range(n):
        api.cuLaunchKernel(launcher.fn, launcher.grid, 1, 1, launcher.block, 1, 1, 0, stream, argv, 0)
    torch.cuda.synchronize()
    bare = (time.perf_counter() - t) / n
    return [("axpy call with out= (per call)", f"{ours * 1e6:8.1f} us"),
            ("axpy call, new result tensor (per call)", f"{ours_new * 1e6:8.1f} us"),
            ("bare cuLaunchKernel (per call)", f"{bare * 1e6:8.1f} us"),
            ("overhead of a tcc call over a bare launch", f"{(ours - bare) * 1e6:8.1f} us")]


def _time_gpu(fn, reps: int = 50) -> float:
    """Median milliseconds of ``fn`` by CUDA events, after a warm-up."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernels_vs_torch() -> list[tuple[str, str]]:
    rows = []
    x = torch.randn(4096, 1024, device="cuda")
    g, b = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    a, bm = torch.randn(1024, 1024, device="cuda"), torch.randn(1024, 1024, device="cuda")
    v = torch.randn(1 << 24, device="cuda")
    w = torch.randn(1 << 24, device="cuda")
    cases = [
        ("axpy 16M", "axpy", (2.0, v, w), lambda: torch.add(w, v, alpha=2.0)),
        ("bias_relu 4096x1024", "bias_relu", (x, g), lambda: torch.relu(x + g)),
        ("softmax 4096x1024", "softmax", (x,), lambda: torch.softmax(x, dim=1)),
        ("layernorm 4096x1024", "layernorm", (x, g, b),
         lambda: torch.nn.functional.layer_norm(x, (1024,), g, b, 1e-5)),
        ("matmul 1024^3 (fp32, no TF32)", "matmul", (a, bm), lambda: a @ bm),
    ]
    torch.backends.cuda.matmul.allow_tf32 = False
    for label, name, args, ref in cases:
        op = getattr(tcc.compile(EXAMPLES / f"{name}.tc", target="cuda"), name)
        ours = _time_gpu(lambda op=op, args=args: op(*args))
        theirs = _time_gpu(ref)
        rows.append((f"{label}: tcc / torch", f"{ours:7.3f} ms / {theirs:7.3f} ms = {ours / theirs:6.2f}x"))
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
