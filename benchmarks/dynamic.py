"""Shape-generic kernels against specialised ones, and what a sequence of lengths costs to compile.

Part 1: for each workload and each size along its dynamic axis ``S``, the kernel compiled with
its shape symbols dynamic (``dynamic=True``, or the symbols a case names: one kernel for all
sizes) and the one specialised for that size (``dynamic=False``) run alternately on the same
inputs; the ratio is the specialised kernel's median time over the dynamic one's (its
throughput relative to the specialised kernel: 1.0 is as fast, the target is >= 0.9), in
thread CPU time with one thread (``OMP_NUM_THREADS=1`` unless set). With ``--target cuda`` the
inputs are PyTorch CUDA tensors and the time is the GPU's (CUDA events around back-to-back
calls, benchmarks/cuda_kernels.py), trials of the two kernels alternating; ``hmm_M`` (an f16
tensor-core GEMM with a dynamic M) runs there only.

Part 2: 20 calls of softmax at 20 distinct sequence lengths, from an empty disk cache, with
``dynamic=False``, ``dynamic=True`` and the automatic policy: kernels compiled and seconds spent
(compile seconds depend on the machine: compare the three, not across machines).

Part 3 (with torch, transformers and onnx installed): the same for whole models at 20 distinct
sequence lengths (batch 2), from an empty cache, counted by ``tcc.kernels_built()``: a small
GPT-2 exported to ONNX with symbolic batch and sequence, loaded once shape-generic
(``tcc.onnx.load(model)``) against loaded per length (``input_shapes=``); and a GPT block under
``torch.compile(backend="tcc")`` with ``dynamic=True``, Dynamo's default (automatic dynamic) and
``dynamic=False`` (one graph per length). Then the generic model's call time against the
specialised one's at a few lengths (interleaved medians: the specialised time over the
generic's, as in part 1).

    python benchmarks/dynamic.py [--sizes 1,7,33,128,1000,4096,8192] [--rounds 15] [--cases softmax,matmul]
                                 [--target cuda] [--parts kernels,lengths,models]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # thread CPU time below counts this thread's work only

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tcc  # noqa: E402
from tcc.runtime import cache  # noqa: E402

HMM = """op hmm(A: f16[M, K], B: f16[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]))
}"""
ATTENTION = """op attention(Q: f32[B, H, S, D], K: f32[B, H, L, D], V: f32[B, H, L, D], scale: f32)
    -> O: f32[B, H, S, D] {
    s[b, h, i, j] = sum[d](Q[b, h, i, d] * K[b, h, j, d]) * scale
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    l[b, h, i] = sum[j](e[b, h, i, j])
    O[b, h, i, d] = sum[j](e[b, h, i, j] * V[b, h, j, d]) / l[b, h, i]
}"""  # tests/test_attention.py's at T = f32
AXPB = "op axpb(A: f32[S, N], B: f32[S, N]) -> C: f32[S, N] { C[i, j] = A[i, j] * 2.0 + B[i, j] }"
SOFTMAX, LAYERNORM, MATMUL, CONV = ((ROOT / f"examples/{n}.tc").read_text()
                                    for n in ("softmax", "layernorm", "matmul", "conv2d"))


@dataclass(frozen=True)
class Case:
    source: str
    op: str
    shapes: Callable[[int], list[tuple[int, ...]]]  # the inputs' shapes for a size S
    dynamic: bool | tuple[str, ...]  # dynamic= of the shape-generic op
    cparams: dict[str, int] = field(default_factory=dict)
    sizes: tuple[int, ...] = ()  # its own sizes (else --sizes)
    dtype: str = "float32"  # of its inputs
    scalars: tuple[float, ...] = ()  # arguments after the tensors
    gpu_only: bool = False


CASES = {
    "elementwise": Case(AXPB, "axpb", lambda s: [(s, 1024), (s, 1024)], True),
    "softmax": Case(SOFTMAX, "softmax", lambda s: [(s, 1000)], True),
    "softmax_row": Case(SOFTMAX, "softmax", lambda s: [(64, s)], True),
    "layernorm": Case(LAYERNORM, "layernorm", lambda s: [(s, 768), (768,), (768,)], True),
    "matmul_M": Case(MATMUL, "matmul", lambda s: [(s, 512), (512, 512)], ("M",)),  # tokens x weights
    "matmul": Case(MATMUL, "matmul", lambda s: [(s, 512), (512, 512)], True),  # M, K and N all dynamic
    "conv_N": Case(CONV, "conv2d", lambda s: [(s, 32, 28, 28), (64, 32, 3, 3), (64,)], ("N",), {"P": 1},
                   (1, 2, 3, 8)),  # the batch
    "conv_HW": Case(CONV, "conv2d", lambda s: [(1, 32, s, s), (64, 32, 3, 3), (64,)], ("N", "H", "W"), {"P": 1},
                    (7, 14, 28, 56)),  # the image
    "attention": Case(ATTENTION, "attention", lambda s: [(1, 8, s, 64)] * 3, ("S", "L"),
                      sizes=(1, 7, 33, 128, 1000, 2048), scalars=(0.125,)),  # self-attention at length S
    "hmm_M": Case(HMM, "hmm", lambda s: [(s, 1024), (1024, 1024)], ("M",), dtype="float16", gpu_only=True),
}


def _time(fn, args, calls: int) -> float:
    """Seconds of this thread's CPU time per call (other processes on a shared machine do not count)."""
    start = time.thread_time()
    for _ in range(calls):
        fn(*args)
    return (time.thread_time() - start) / calls


def _host(x):
    return x.cpu().numpy() if hasattr(x, "cpu") else x


def _gpu_ratios(run_static, run_dynamic, args, rounds: int) -> list[float]:
    """Specialised over dynamic GPU time per call, trials alternating."""
    from cuda_kernels import gpu_ms  # (imports torch: CUDA runs only)

    for fn in (run_static, run_dynamic):
        fn(*args)
    once = gpu_ms(lambda: run_static(*args), 1)
    reps = max(3, min(200, int(20.0 / max(once, 1e-3))))  # ~20 ms a trial
    return [gpu_ms(lambda: run_static(*args), reps) / gpu_ms(lambda: run_dynamic(*args), reps)
            for _ in range(rounds)]


def compare(name: str, sizes: list[int], rounds: int, target: str = "cpu") -> None:
    case = CASES[name]
    if case.gpu_only and target != "cuda":
        return
    dynamic = tcc.compile(case.source, target=target, dynamic=case.dynamic)[case.op]
    rng = np.random.default_rng(0)
    for s in case.sizes or sizes:
        static = tcc.compile(case.source, target=target, dynamic=False)[case.op]
        args = [rng.standard_normal(shape).astype(case.dtype) for shape in case.shapes(s)]
        args += list(case.scalars)
        if target == "cuda":
            import torch

            args = [torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a for a in args]
        np.testing.assert_allclose(_host(dynamic(*args, **case.cparams)), _host(static(*args, **case.cparams)),
                                   rtol=1e-3, atol=1e-3)
        run_static = functools.partial(static, **case.cparams)
        run_dynamic = functools.partial(dynamic, **case.cparams)
        if target == "cuda":
            ratios = _gpu_ratios(run_static, run_dynamic, args, rounds)
            print(f"{name:12s} S={s:<6d} cuda dynamic/specialised throughput {statistics.median(ratios):5.2f}x "
                  f"(min {min(ratios):.2f}, max {max(ratios):.2f})")
            continue
        probe = _time(run_static, args, 3)
        calls = max(1, min(1000, int(0.02 / max(probe, 1e-7))))  # ~20 ms a sample
        ratios = []
        for _ in range(rounds):
            t_static = _time(run_static, args, calls)
            t_dynamic = _time(run_dynamic, args, calls)
            ratios.append(t_static / t_dynamic)
        print(f"{name:12s} S={s:<6d} dynamic/specialised throughput {statistics.median(ratios):5.2f}x "
              f"(min {min(ratios):.2f}, max {max(ratios):.2f})")
    print(f"{name:12s} kernels the dynamic op used: {dynamic.compiles + dynamic.loads}")


def lengths(rounds: int, target: str = "cpu") -> None:
    src = (ROOT / "examples/softmax.tc").read_text()
    rng = np.random.default_rng(1)
    seqs = [int(n) for n in rng.choice(np.arange(1, 2049), size=20, replace=False)]
    for label, option in (("dynamic=False", {"dynamic": False}), ("dynamic=True", {"dynamic": True}),
                          ("automatic", {})):
        with tempfile.TemporaryDirectory() as empty:
            os.environ["TCC_CACHE_DIR"] = empty
            cache.MEMORY.clear()
            op = tcc.compile(src, target=target, **option).softmax
            start = time.perf_counter()
            for n in seqs:
                op(rng.standard_normal((n, 256)).astype(np.float32))
            spent = time.perf_counter() - start
        print(f"20 lengths, {target}, {label:13s}: {op.compiles:2d} kernels compiled, {spent:6.2f} s for the 20 calls")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,7,33,128,1000,4096,8192")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--target", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--parts", default="kernels,lengths,models")
    args = parser.parse_args()
    parts = args.parts.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    if "kernels" in parts:
        for case in args.cases.split(","):
            compare(case, sizes, args.rounds, args.target)
    if "lengths" in parts:
        lengths(args.rounds, args.target)
    if "models" in parts and args.target == "cpu":
        from dynamic_models import models  # torch, transformers and onnx: only for this part

        models(args.rounds)


if __name__ == "__main__":
    main()
