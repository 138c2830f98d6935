"""Whole ONNX models: tcc.onnx against onnxruntime and PyTorch on the CPU, or eager PyTorch on CUDA.

    python benchmarks/onnx_networks.py [--models resnet18 encoder] [--batches 1 8] [--repeat 20] [--threads N]
    python benchmarks/onnx_networks.py --cuda [--models ...] [--batches ...] [--repeat 50]

For each model and batch: import + compile time cold (an empty cache directory) and warm (the
same directory again, as a new process would find it), then run times measured side by side,
interleaved, as medians, with ratios to onnxruntime (its threads not spinning between runs; with
more than one thread, onnxruntime as it comes, spinning, is also timed on its own: ``ort spinning``).
Models come from examples/onnx_models.py (random weights, exported with torch.onnx).

``--cuda``: ``tcc.onnx.load(..., target="cuda")`` against the same model in eager PyTorch on the
GPU: the largest difference of the outputs, medians of interleaved calls each ended by
``torch.cuda.synchronize()``, the ratio to PyTorch, and where each call's time goes: the sum of
its GPU kernels' times (torch.profiler, which sees tcc's driver-API launches too) against the
wall time, the rest being launches and host work.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# PyTorch's OpenMP threads spin for ~3 ms after each call (libgomp's default), holding the cores
# that the next runner in the interleaved loop needs: on 2 cores that made tcc and onnxruntime
# 10-35x slower after torch ran (the encoder block, batch 1: tcc 171 ms and onnxruntime 46 ms
# spinning, 4.8 ms and 3.7 ms passive). So torch's libgomp loads with the short spin of tcc's own
# pool (tcc.codegen_cpu.pool.SPIN_COUNT), set before torch loads it. (onnxruntime's threads spin
# too: see ort_session.)
from tcc.codegen_cpu.pool import SPIN_COUNT  # before torch; loads no OpenMP runtime

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import onnx_models  # noqa: E402

import tcc  # noqa: E402
from tcc.runtime import cache  # noqa: E402

MODELS = {
    "resnet18": (lambda: onnx_models.ResNet(), lambda b: (b, 3, 224, 224)),
    "encoder": (lambda: onnx_models.EncoderBlock(), lambda b: (b, 128, 256)),
}


def wait_policy() -> str:
    """The OpenMP wait settings libgomp (torch's, shared with tcc) loaded with."""
    chosen = [f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ]
    return ", ".join(chosen) or "libgomp's default"


def interleaved(runs: dict, repeat: int, clock=time.perf_counter) -> dict[str, tuple[float, float, float]]:
    """(median, first quartile, third quartile) seconds of each callable by ``clock``, calls
    interleaved round-robin."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():
        fn()  # warm up
    for _ in range(repeat):
        for name, fn in runs.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: (statistics.median(t), *np.percentile(t, [25, 75])) for name, t in times.items()}


def report(medians: dict[str, tuple[float, float, float]], anchor: str, what: str = "") -> None:
    base = medians[anchor][0]
    for run, (seconds, q1, q3) in medians.items():
        print(f"  {run:12s} {seconds * 1e3:9.3f} ms  {seconds / base:5.2f}x {anchor}{what}  "
              f"(quartiles {q1 * 1e3:.3f}-{q3 * 1e3:.3f} ms)")


def compile_model(name: str, batch: int, target: str) -> tuple[Any, torch.Tensor, bytes, Any, float, float]:
    """The model with random weights, an input, its ONNX export, tcc's compiled callable, and the
    cold (empty cache) and warm (disk cache only, as a new process finds it) import+compile times."""
    make, shape = MODELS[name]
    model = onnx_models.randomized(make())
    x = torch.randn(shape(batch))
    data = onnx_models.export(model, x)
    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["TCC_CACHE_DIR"] = cache_dir
        start = time.perf_counter()
        compiled = tcc.onnx.load(data, target=target)
        cold = time.perf_counter() - start
        cache.MEMORY.clear()  # a new process: only the disk cache is warm
        start = time.perf_counter()
        compiled = tcc.onnx.load(data, target=target)
        warm = time.perf_counter() - start
    return model, x, data, compiled, cold, warm


def bench(name: str, batch: int, repeat: int, threads: int | None) -> None:
    model, x, data, compiled, cold, warm = compile_model(name, batch, "cpu")
    xn = x.numpy()
    session = ort_session(data, threads, spinning=False)
    runs = {"tcc": lambda: compiled(xn), "onnxruntime": lambda: session.run(None, {"x": xn})}
    with torch.no_grad():
        runs["torch-cpu"] = lambda: model(x)
        err = float(np.abs(compiled(xn) - runs["onnxruntime"]()[0]).max())
        medians = interleaved(runs, repeat)
        # one thread each: each call runs on this thread, whose CPU time leaves out the time the
        # OS gave other processes (the shared VM's load), unlike the wall clock
        cpu = interleaved(runs, repeat, time.thread_time) if threads == 1 else None
    if threads != 1:  # onnxruntime as it comes (its threads spin between runs), on its own
        spinning = ort_session(data, threads, spinning=True)
        medians["ort spinning"] = interleaved({"alone": lambda: spinning.run(None, {"x": xn})}, repeat)["alone"]
    print(f"{name} batch {batch}: import+compile cold {cold:.2f} s, warm {warm:.3f} s; max |tcc - ort| {err:.2g}; "
          f"load average {os.getloadavg()[0]:.1f}")
    report(medians, "onnxruntime")
    if cpu is not None:
        report(cpu, "onnxruntime", ", thread CPU time")


def ort_session(data: bytes, threads: int | None, spinning: bool) -> ort.InferenceSession:
    """An onnxruntime CPU session. Its intra-op threads spin after each run by default, holding
    the cores the next runner of the interleaved loop needs (on 2 cores, the encoder block at
    batch 8: tcc 20.6 ms right after onnxruntime, 11.4 ms on its own); without spinning its own
    time was unchanged (12.6-12.7 ms), and the spinning session is timed on its own besides."""
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def gpu_kernel_ms(fn, calls: int) -> tuple[float, int]:
    """The GPU kernel time per call (ms) and kernels per call, from torch.profiler's CUDA events."""
    from torch.profiler import ProfilerActivity, profile  # only the --cuda rows profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / calls, round(len(kernels) / calls)


def bench_cuda(name: str, batch: int, repeat: int) -> None:
    """tcc on CUDA against eager PyTorch on CUDA (see the module docstring)."""
    model, x, _, compiled, cold, warm = compile_model(name, batch, "cuda")
    gpu_model, xg = model.cuda().eval(), x.cuda()
    with torch.no_grad():
        expected = gpu_model(xg)
        got = torch.from_dlpack(compiled(xg))
        torch.cuda.synchronize()
        err = float((got - expected).abs().max())
        scale = float(expected.abs().max())

        def tcc_cuda():
            compiled(xg)
            torch.cuda.synchronize()

        def torch_cuda():
            gpu_model(xg)
            torch.cuda.synchronize()

        runs = {"tcc-cuda": tcc_cuda, "torch-cuda": torch_cuda}
        medians = interleaved(runs, repeat)
        try:
            kernels = {run: gpu_kernel_ms(fn, 10) for run, fn in runs.items()}
        except Exception as exc:  # (a profiler that cannot see the GPU: the timings stand without it)
            print(f"  torch.profiler failed: {type(exc).__name__}: {exc}")
            kernels = {run: (float("nan"), 0) for run in runs}
    print(f"{name} batch {batch} (cuda): import+compile cold {cold:.2f} s, warm {warm:.3f} s; "
          f"max |tcc - torch| {err:.2g} (max |torch| {scale:.2g})")
    report(medians, "torch-cuda")
    for run, (gpu_ms, count) in kernels.items():
        print(f"  {run:12s} GPU kernels {gpu_ms:.3f} ms in {count} launches per call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--cuda", action="store_true", help="tcc on CUDA against eager PyTorch on CUDA")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for all three (tcc schedules for the CPUs this process may use)")
    args = parser.parse_args()
    if args.cuda:
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
        for name in args.models:
            for batch in args.batches:
                bench_cuda(name, batch, args.repeat)
        return
    if args.threads:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.threads])
        torch.set_num_threads(args.threads)
    print(f"threads: torch {torch.get_num_threads()}, tcc {len(os.sched_getaffinity(0))}, cpus {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.1f}, OpenMP wait: {wait_policy()}")
    for name in args.models:
        for batch in args.batches:
            bench(name, batch, args.repeat, args.threads)


if __name__ == "__main__":
    main()
