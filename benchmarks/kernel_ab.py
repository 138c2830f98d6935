"""Two checkouts' CPU kernels side by side: build time and run time, for a code generator change.

Each checkout builds each workload's kernel (LLVM IR, O3, code generation) in its own process,
from its own tcc; the artifacts (self-describing object code) are then loaded into this process
and run alternately on the same inputs, timed in thread CPU time (``OMP_NUM_THREADS=1`` unless
set), so that other processes on a shared machine do not count. Results are compared between the
checkouts first. Ratios are medians over rounds of the two sides' times in the same round.

    python benchmarks/kernel_ab.py OTHER_CHECKOUT [--cases conv,mm256,...] [--rounds 25]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent

MATMUL = "op matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }"
GELU = ("op mlp_gelu(X: f32[T, D], W: f32[D, H], b: f32[H]) -> Y: f32[T, H] {\n"
        " h[t, j] = sum[k](X[t, k] * W[k, j]) + b[j]\n"
        " Y[t, j] = h[t, j] * 0.5 * (1.0 + erf(h[t, j] * 0.7071067811865476))\n}")
MAXPOOL = ("op maxpool(X: f32[N, C, H, W]) -> Y: f32[N, C, (H - 3) // 2 + 1, (W - 3) // 2 + 1] "
           "{ Y[n, c, y, x] = max[r: 3, s: 3](X[n, c, y*2 + r, x*2 + s]) }")
SOFTMAX = ("op softmax(X: f32[N, C]) -> Y: f32[N, C] {\n m[n] = max[c](X[n, c])\n"
           " e[n, c] = exp(X[n, c] - m[n])\n s[n] = sum[c](e[n, c])\n Y[n, c] = e[n, c] / s[n]\n}")
LAYERNORM = ("op layernorm(X: f32[N, D], g: f32[D], b: f32[D]) -> Y: f32[N, D] {\n"
             " mu[n] = sum[d](X[n, d]) / D\n var[n] = sum[d]((X[n, d] - mu[n]) ** 2) / D\n"
             " Y[n, d] = (X[n, d] - mu[n]) * rsqrt(var[n] + 1e-5) * g[d] + b[d]\n}")
PATCH = ("op patch[S = 2, P = 1](X: f32[C, H, W])\n"
         " -> Y: f32[C, 3, 3, (H + 2*P - 3) // S + 1, (W + 2*P - 3) // S + 1] {\n"
         " Xp = pad(X, [0, P, P])\n Y[c, r, s, y, x] = Xp[c, y*S + r, x*S + s]\n}")  # a stride-2 im2col alone
CONV = "examples/conv2d.tc"  # read from each checkout
CASES = {  # name: (source, op, input shapes, compile-time parameters)
    "conv": (CONV, "conv2d", [(1, 64, 56, 56), (64, 64, 3, 3), (64,)], {"P": 1}),
    "conv_s2": (CONV, "conv2d", [(2, 32, 57, 57), (48, 32, 3, 3), (48,)], {"P": 1, "S": 2}),
    "conv_s2r": (CONV, "conv2d", [(1, 128, 28, 28), (256, 128, 3, 3), (256,)], {"P": 1, "S": 2}),  # ResNet-18
    "conv_s1r": (CONV, "conv2d", [(1, 128, 14, 14), (256, 128, 3, 3), (256,)], {"P": 1}),  # conv_s2r's GEMM
    "mm_s2r": (MATMUL, "matmul", [(256, 1152), (1152, 196)], {}),  # conv_s2r's GEMM
    "conv_s2a": (CONV, "conv2d", [(1, 64, 56, 56), (128, 64, 3, 3), (128,)], {"P": 1, "S": 2}),  # ResNet-18
    "mm_s2a": (MATMUL, "matmul", [(128, 576), (576, 784)], {}),  # conv_s2a's GEMM
    "patch56": (PATCH, "patch", [(64, 56, 56)], {}),  # conv_s2a's patches
    "patch28": (PATCH, "patch", [(128, 28, 28)], {}),  # conv_s2r's patches
    "patch14": (PATCH, "patch", [(256, 14, 14)], {}),
    "conv7": (CONV, "conv2d", [(1, 3, 224, 224), (64, 3, 7, 7), (64,)], {"P": 3, "S": 2}),
    "conv512": (CONV, "conv2d", [(1, 512, 7, 7), (512, 512, 3, 3), (512,)], {"P": 1}),  # ResNet-18 layer4: 49 columns
    "conv512b8": (CONV, "conv2d", [(8, 512, 7, 7), (512, 512, 3, 3), (512,)], {"P": 1}),  # the same at batch 8
    "mm24": (MATMUL, "matmul", [(512, 2304), (2304, 24)], {}),  # a 24-column tile row (AVX-512: 16 + 8)
    "mm256": (MATMUL, "matmul", [(256, 256), (256, 256)], {}),
    "mm1024": (MATMUL, "matmul", [(1024, 1024), (1024, 1024)], {}),
    "mm257": (MATMUL, "matmul", [(257, 129), (129, 263)], {}),
    "gelu": (GELU, "mlp_gelu", [(128, 256), (256, 1024), (1024,)], {}),
    "maxpool": (MAXPOOL, "maxpool", [(8, 64, 112, 112)], {}),
    "softmax": (SOFTMAX, "softmax", [(4096, 1024)], {}),
    "layernorm": (LAYERNORM, "layernorm", [(4096, 1024), (1024,), (1024,)], {}),
}


def _op(case: str, root: Path):
    import numpy as np

    import tcc

    src, name, shapes, cparams = CASES[case]
    if src == CONV:
        src = (root / CONV).read_text()
    op = getattr(tcc.compile(src), name)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return op, args, cparams


def build(case: str, out: str) -> None:
    """Child: build ``case`` with the tcc on PYTHONPATH, write the artifact, print the build time."""
    from tcc.runtime import cpu

    op, args, cparams = _op(case, Path.cwd())
    func = op.lowered(op.bindings_for(tuple(args), cparams)).scheduled
    times = []
    for _ in range(3):
        start = time.thread_time()
        artifact = cpu.build(func, op.target)
        times.append(time.thread_time() - start)
    Path(out).write_bytes(artifact)
    print(json.dumps({"build": statistics.median(times)}))


def compare(case: str, roots: dict[str, Path], rounds: int, scratch: str) -> None:
    import numpy as np

    from tcc.runtime import cpu

    builds, kernels = {}, {}
    for label, root in roots.items():
        path = f"{scratch}/{case}.{label}"
        env = {**os.environ, "PYTHONPATH": str(root), "TCC_CACHE_DIR": ""}
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--build", case, path], env=env,
                              cwd=root, capture_output=True, text=True, check=True)
        builds[label] = json.loads(done.stdout)["build"]
        kernels[label] = cpu.load(CASES[case][1], Path(path).read_bytes())
    op, args, cparams = _op(case, ROOT)
    bound = op.bind(tuple(args), cparams)
    results = {label: cpu.invoke(k, op.te, bound, None)[0] for label, k in kernels.items()}
    first, *_ = results.values()
    for label, r in results.items():
        np.testing.assert_allclose(r, first, rtol=1e-4, atol=1e-4 * float(np.abs(first).max()), err_msg=label)
    values = {**bound.scalars, **{n: np.ascontiguousarray(a) for n, a in bound.arrays.items()}}
    values[op.te.results[0]] = np.empty_like(first)
    labels = list(kernels)
    start = time.thread_time()
    kernels[labels[0]](values)
    reps = max(3, int(0.03 / max(time.thread_time() - start, 1e-6)))
    times: dict[str, list[float]] = {label: [] for label in labels}
    for i in range(rounds):
        for label in labels if i % 2 == 0 else labels[::-1]:
            kernels[label](values)  # warm
            start = time.thread_time()
            for _ in range(reps):
                kernels[label](values)
            times[label].append((time.thread_time() - start) / reps)
    this, other = labels
    ratio = statistics.median(a / b for a, b in zip(times[this], times[other]))
    print(f"| {case} | {statistics.median(times[this]) * 1e6:.1f} us | {statistics.median(times[other]) * 1e6:.1f} us "
          f"| {ratio:.3f} | {builds[this] * 1e3:.0f} ms | {builds[other] * 1e3:.0f} ms |", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--build"]:
        return build(sys.argv[2], sys.argv[3])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (e.g. a `git archive` of main)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    roots = {"this": ROOT, "other": args.other.resolve()}
    print(f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, thread CPU time, medians of {args.rounds} rounds\n")
    print("| kernel | run, this | run, other | this / other | build, this | build, other |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as scratch:
        for case in args.cases.split(","):
            compare(case, roots, args.rounds, scratch)


if __name__ == "__main__":
    main()
