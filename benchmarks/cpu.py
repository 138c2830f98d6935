"""CPU kernels side by side with their anchors: ratios tcc time / anchor time (lower is better).

Each anchor configuration runs in its own process (OpenBLAS reads OPENBLAS_CORETYPE when NumPy
loads), and in it tcc and the anchor are timed in interleaved rounds (``--runs``). In a round each
side sleeps ``SETTLE`` seconds, makes one warm-up call, then times calls back to back (at least
three, at least ``BURST`` seconds of them; the round's figure is their median): each
side is timed warm, as in a network's steady state, and never while the other library's idle
thread pool is still spinning on a core (OpenBLAS and libgomp spin for a while after a call;
interleaving single calls timed each side on one core and a half). The sides swap order every
other round; a ratio is the median over rounds of the two sides' times in the same round (the
VM drifts 10-30% over minutes), the times shown are medians over rounds.
Usage: python benchmarks/cpu.py [--runs 10] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

SETTLE = 0.2  # seconds of quiet before each round: see the module docstring
BURST = 0.02  # seconds of timed calls per side and round, at least (3 calls at least)
MAX_CALLS = 200
ANCHORS = {"numpy-avx512": {"OPENBLAS_CORETYPE": "SkylakeX"}, "numpy": {}, "torch": {}}
SOURCES = {
    "matmul": "op matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }",
    "bmm": "op bmm(A: f32[Bt, M, K], B: f32[Bt, K, N]) -> C: f32[Bt, M, N] "
           "{ C[b, i, j] = sum[k](A[b, i, k] * B[b, k, j]) }",
    "softmax": "op softmax(X: f32[N, C]) -> Y: f32[N, C] {\n m[n] = max[c](X[n, c])\n"
               " e[n, c] = exp(X[n, c] - m[n])\n s[n] = sum[c](e[n, c])\n Y[n, c] = e[n, c] / s[n]\n}",
    "layernorm": "op layernorm(X: f32[N, D], g: f32[D], b: f32[D]) -> Y: f32[N, D] {\n"
                 " mu[n] = sum[d](X[n, d]) / D\n var[n] = sum[d]((X[n, d] - mu[n]) ** 2) / D\n"
                 " Y[n, d] = (X[n, d] - mu[n]) * rsqrt(var[n] + 1e-5) * g[d] + b[d]\n}",
    "fma_relu": "op fma_relu(A: f32[N], B: f32[N], C: f32[N]) -> Y: f32[N] { Y[i] = max(A[i] * B[i] + C[i], 0.0) }",
    "gemm_bias": "op gemm_bias(X: f32[T, D], W: f32[D, H], b: f32[H]) -> Y: f32[T, H] "
                 "{ Y[t, j] = sum[k](X[t, k] * W[k, j]) + b[j] }",
    "mlp_gelu": "op mlp_gelu(X: f32[T, D], W: f32[D, H], b: f32[H]) -> Y: f32[T, H] {\n"
                " h[t, j] = sum[k](X[t, k] * W[k, j]) + b[j]\n"
                " Y[t, j] = h[t, j] * 0.5 * (1.0 + erf(h[t, j] * 0.7071067811865476))\n}",
    "maxpool": "op maxpool(X: f32[N, C, H, W]) -> Y: f32[N, C, (H - 3) // 2 + 1, (W - 3) // 2 + 1] "
               "{ Y[n, c, y, x] = max[r: 3, s: 3](X[n, c, y*2 + r, x*2 + s]) }",
}
WORKLOADS = [("matmul 256", "matmul", [(256, 256), (256, 256)]),
             ("matmul 1000", "matmul", [(1000, 1000), (1000, 1000)]),
             ("matmul 1024", "matmul", [(1024, 1024), (1024, 1024)]),
             ("matmul 2048", "matmul", [(2048, 2048), (2048, 2048)]),
             ("bmm 16x256", "bmm", [(16, 256, 256), (16, 256, 256)]),
             ("softmax 4096x1024", "softmax", [(4096, 1024)]),
             ("layernorm 4096x1024", "layernorm", [(4096, 1024), (1024,), (1024,)]),
             ("relu(a*b+c) 2^24", "fma_relu", [(1 << 24,)] * 3),
             ("maxpool 3x3/2 8x64x112x112", "maxpool", [(8, 64, 112, 112)]),
             # a transformer MLP's first layer (benchmarks/onnx_networks.py's encoder): the GEMM alone, then with GELU
             ("x@w+b 128x256x1024", "gemm_bias", [(128, 256), (256, 1024), (1024,)]),
             ("gelu(x@w+b) 128x256x1024", "mlp_gelu", [(128, 256), (256, 1024), (1024,)])]


def anchor_fn(anchor: str, op: str, args):
    import numpy as np

    if anchor == "torch":
        import torch

        torch.set_num_threads(2)
        t = [torch.from_numpy(a) for a in args]
        fns = {"matmul": lambda: t[0] @ t[1], "bmm": lambda: torch.bmm(t[0], t[1]),
               "softmax": lambda: torch.softmax(t[0], 1),
               "layernorm": lambda: torch.nn.functional.layer_norm(t[0], (t[0].shape[1],), t[1], t[2]),
               "fma_relu": lambda: torch.relu(t[0] * t[1] + t[2]),
               "maxpool": lambda: torch.nn.functional.max_pool2d(t[0], 3, 2),
               "gemm_bias": lambda: t[0] @ t[1] + t[2],
               "mlp_gelu": lambda: torch.nn.functional.gelu(t[0] @ t[1] + t[2])}
        return fns[op]
    fns = {"matmul": lambda: args[0] @ args[1], "bmm": lambda: np.matmul(args[0], args[1]),
           "softmax": lambda: _np_softmax(args[0]), "layernorm": lambda: _np_layernorm(*args),
           "fma_relu": lambda: np.maximum(args[0] * args[1] + args[2], 0),
           "gemm_bias": lambda: args[0] @ args[1] + args[2], "mlp_gelu": lambda: _np_gelu(args[0] @ args[1] + args[2])}
    return fns.get(op)


def _np_softmax(x):
    import numpy as np

    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _np_gelu(h):
    """NumPy has no erf: GELU's tanh form, one transcendental per element like the exact one."""
    import numpy as np

    return h * 0.5 * (1.0 + np.tanh(0.7978845608028654 * (h + 0.044715 * h * h * h)))


def _np_layernorm(x, g, b):
    mu = x.mean(1, keepdims=True)
    return (x - mu) / (((x - mu) ** 2).mean(1, keepdims=True) + 1e-5) ** 0.5 * g + b


def measure(anchor: str, runs: int, names: list[str]) -> dict:
    """In this process: tcc and one anchor, interleaved; median seconds of each."""
    import numpy as np

    import tcc

    rng = np.random.default_rng(0)
    out = {}
    for label, op, shapes in WORKLOADS:
        if label not in names:
            continue
        args = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
        kernel = tcc.compile(SOURCES[op])[op]
        fn = anchor_fn(anchor, op, args)
        if fn is None:
            continue
        kernel(*args)
        fn()
        rounds = paired_rounds([functools.partial(kernel, *args), fn], runs)
        out[label] = (statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds),
                      ratio(rounds, 0, 1))
    return out


def paired_rounds(fns: list, runs: int) -> list[list[float]]:
    """Per round, the median seconds of each of ``fns`` (each a ``timed_burst``), the order of
    ``fns`` reversed every other round so that no side always goes first."""
    rounds = []
    for i in range(runs):
        order = list(range(len(fns))) if i % 2 == 0 else list(range(len(fns)))[::-1]
        medians = [0.0] * len(fns)
        for k in order:
            medians[k] = statistics.median(timed_burst(fns[k]))
        rounds.append(medians)
    return rounds


def ratio(rounds: list[list[float]], a: int, b: int) -> float:
    """Median over rounds of ``fns[a] / fns[b]`` measured in the same round: the VM's speed drifts
    by 10-30% over minutes, and a ratio within one round is far steadier than one of medians."""
    return statistics.median(r[a] / r[b] for r in rounds)


def timed_burst(fn, calls: int = 3) -> list[float]:
    """After ``SETTLE`` seconds of quiet, one warm-up call, then at least ``calls`` timed back to
    back, and enough of them to fill ``BURST`` seconds (a 0.2 ms call is timed ~100 times, so
    one interruption does not decide a round)."""
    time.sleep(SETTLE)
    start = time.perf_counter()
    fn()
    warm = time.perf_counter() - start
    times = []
    for _ in range(max(calls, min(MAX_CALLS, int(BURST / max(warm, 1e-6))))):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--anchor", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="*", default=[w[0] for w in WORKLOADS])
    opts = parser.parse_args()
    if opts.anchor:
        print(json.dumps(measure(opts.anchor, opts.runs, opts.only)))
        return
    results = {}
    for anchor, env in ANCHORS.items():
        proc = subprocess.run([sys.executable, __file__, "--anchor", anchor, "--runs", str(opts.runs),
                               "--only", *opts.only], env={**os.environ, **env}, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"# {anchor}: unavailable ({proc.stderr.strip().splitlines()[-1:]})", file=sys.stderr)
            continue
        results[anchor] = json.loads(proc.stdout.strip().splitlines()[-1])
    print("| workload | tcc ms | " + " | ".join(f"tcc / {a}" for a in ANCHORS) + " |")
    print("|---|---:|" + "---:|" * len(ANCHORS))
    for label, _, _ in WORKLOADS:
        if label not in opts.only:
            continue
        times = [results[a][label] for a in ANCHORS if a in results and label in results[a]]
        tcc_ms = min(t[0] for t in times) * 1e3 if times else float("nan")
        cells = []
        for a in ANCHORS:
            r = results.get(a, {}).get(label)
            cells.append(f"{r[2]:.2f}x ({r[1] * 1e3:.2f} ms)" if r else "-")
        print(f"| {label} | {tcc_ms:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
