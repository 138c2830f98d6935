"""Convolutions and fusion side by side with PyTorch (2 threads) and NumPy: ratios tcc / anchor.

For each ResNet-like layer: conv + bias + relu (fused epilogue) against PyTorch's conv2d + relu,
the bare conv against PyTorch's bare conv, and the epilogue's cost (fused / bare, both tcc); then
a 4-operator elementwise chain against NumPy. tcc and the anchor are timed in interleaved rounds
of warm back-to-back calls (see benchmarks/cpu.py); each ratio is the median over ``--runs``
rounds of the two times in the same round (GFLOP/s and times: medians over rounds). Peak memory:
in a fresh process, after a warm-up call, the peak RSS is reset and
its growth during one call measured (im2col's patch buffers plus the new output array).

    python benchmarks/conv.py [--runs 10] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CONV = """
op conv_bias_relu[S = 1, P = 1](X: f32[N, C, H, W], Wt: f32[F, C, KH, KW], b: f32[F])
    -> Y: f32[N, F, (H + 2*P - KH) // S + 1, (W + 2*P - KW) // S + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, f, y, x] = max(sum[c, r, s](Xp[n, c, y*S + r, x*S + s] * Wt[f, c, r, s]) + b[f], 0.0)
}

op conv[S = 1, P = 1](X: f32[N, C, H, W], Wt: f32[F, C, KH, KW])
    -> Y: f32[N, F, (H + 2*P - KH) // S + 1, (W + 2*P - KW) // S + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, f, y, x] = sum[c, r, s](Xp[n, c, y*S + r, x*S + s] * Wt[f, c, r, s])
}

op depthwise_bias_relu[S = 1, P = 1](X: f32[N, C, H, W], Wt: f32[C, KH, KW], b: f32[C])
    -> Y: f32[N, C, (H + 2*P - KH) // S + 1, (W + 2*P - KW) // S + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, c, y, x] = max(sum[r, s](Xp[n, c, y*S + r, x*S + s] * Wt[c, r, s]) + b[c], 0.0)
}

op depthwise[S = 1, P = 1](X: f32[N, C, H, W], Wt: f32[C, KH, KW])
    -> Y: f32[N, C, (H + 2*P - KH) // S + 1, (W + 2*P - KW) // S + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, c, y, x] = sum[r, s](Xp[n, c, y*S + r, x*S + s] * Wt[c, r, s])
}

op chain(A: f32[L], B: f32[L], C: f32[L]) -> Y: f32[L] {
    Y[i] = max(A[i] * B[i] + C[i], 0.0) * 0.5
}
"""

# name: (N, C, H, W, F, K, S, P, depthwise)
LAYERS = {
    "3x3 64->64 56x56 b8": (8, 64, 56, 56, 64, 3, 1, 1, False),
    "1x1 256->64 56x56 b8": (8, 256, 56, 56, 64, 1, 1, 0, False),
    "3x3/2 128->128 28x28 b8": (8, 128, 28, 28, 128, 3, 2, 1, False),
    "7x7/2 3->64 224x224 b1": (1, 3, 224, 224, 64, 7, 2, 3, False),
    "dw 3x3 32x112x112 b1": (1, 32, 112, 112, 32, 3, 1, 1, True),
}


def inputs(layer, rng):
    import numpy as np

    n, c, h, w, f, k, _, _, dw = layer
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((c, k, k) if dw else (f, c, k, k), dtype=np.float32)
    b = rng.standard_normal(c if dw else f, dtype=np.float32)
    return x, wt, b


def interleaved(fns: list, runs: int) -> list[list[float]]:
    """Per interleaved round, the median seconds per call of each of ``fns`` (see benchmarks/cpu.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cpu import paired_rounds

    for fn in fns:
        fn()  # compile
    return paired_rounds(fns, runs)


def _ratio(rounds: list[list[float]], a: int, b: int) -> float:
    from cpu import ratio

    return ratio(rounds, a, b)


def _median(rounds: list[list[float]], k: int) -> float:
    return statistics.median(r[k] for r in rounds)


def conv_rows(runs: int, quick: bool) -> list[str]:
    import numpy as np
    import torch

    import tcc

    torch.set_num_threads(2)
    lib = tcc.compile(CONV)
    rng = np.random.default_rng(0)
    rows = []
    for name, layer in LAYERS.items():
        if quick:
            layer = (1, *layer[1:])
        rounds = time_layer(lib, torch, layer, rng, runs)  # fused, torch fused, bare, torch bare
        n, c, h, w, f, k, s, p, dw = layer
        oh = (h + 2 * p - k) // s + 1
        flops = 2 * n * f * oh * oh * (1 if dw else c) * k * k
        rows.append(f"| {name if not quick else name + ' (b1)'} | {flops / _median(rounds, 0) / 1e9:.1f} | "
                    f"{flops / _median(rounds, 1) / 1e9:.1f} | {_ratio(rounds, 0, 1):.2f} | "
                    f"{_ratio(rounds, 2, 3):.2f} | {_ratio(rounds, 0, 2):.3f} | {peak_rss_mib(name, quick):.1f} |")
    return rows


def time_layer(lib, torch, layer, rng, runs: int) -> list[list[float]]:
    """Per round: tcc fused, torch fused, tcc bare, torch bare."""
    x, wt, b = inputs(layer, rng)
    n, c, h, w, f, k, s, p, dw = layer
    tx, tw, tb = (torch.from_numpy(a) for a in (x, wt, b))
    tw4 = tw.reshape(c, 1, k, k) if dw else tw
    groups = c if dw else 1
    fused_op = lib.depthwise_bias_relu if dw else lib.conv_bias_relu
    bare_op = lib.depthwise if dw else lib.conv
    conv2d = torch.nn.functional.conv2d
    return interleaved([lambda: fused_op(x, wt, b, S=s, P=p),
                        lambda: torch.relu(conv2d(tx, tw4, tb, stride=s, padding=p, groups=groups)),
                        lambda: bare_op(x, wt, S=s, P=p),
                        lambda: conv2d(tx, tw4, None, stride=s, padding=p, groups=groups)], runs)


RSS_CHILD = r"""
import ctypes, json, sys
import numpy as np
sys.path.insert(0, sys.argv[3])
import conv as bench
import tcc

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))

layer = bench.LAYERS[sys.argv[1]]
if sys.argv[2] == "1":
    layer = (1, *layer[1:])
x, wt, b = bench.inputs(layer, np.random.default_rng(0))
op = tcc.compile(bench.CONV).depthwise_bias_relu if layer[8] else tcc.compile(bench.CONV).conv_bias_relu
op(x, wt, b, S=layer[6], P=layer[7])  # compile and warm up: JIT memory is not the run's
ctypes.CDLL(None).malloc_trim(0)  # give freed heap back: the call below must fault its buffers in again
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current RSS
before = status("VmRSS:")
out = op(x, wt, b, S=layer[6], P=layer[7])
print(json.dumps({"growth_kib": status("VmHWM:") - before, "out_kib": out.nbytes // 1024}))
"""


def peak_rss_mib(name: str, quick: bool) -> float:
    """Peak RSS growth during one call (after a warm-up call), output included, in MiB."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.path.dirname(here)}
    run = subprocess.run([sys.executable, "-c", RSS_CHILD, name, "1" if quick else "0", here], env=env,
                         capture_output=True, text=True)
    if run.returncode != 0:
        return float("nan")
    return json.loads(run.stdout)["growth_kib"] / 1024


def chain_row(runs: int) -> str:
    import numpy as np

    import tcc

    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(1 << 24, dtype=np.float32) for _ in range(3))
    op = tcc.compile(CONV).chain
    rounds = interleaved([lambda: op(a, b, c), lambda: np.maximum(a * b + c, 0) * np.float32(0.5)], runs)
    return (f"| 4-op chain max(a*b+c, 0)*0.5, 2^24 | {_median(rounds, 0) * 1e3:.1f} ms | "
            f"{_median(rounds, 1) * 1e3:.1f} ms | {_ratio(rounds, 0, 1):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="batch 1 and 3 runs: a smoke test")
    args = parser.parse_args()
    runs = 3 if args.quick else args.runs
    print(f"medians of {runs} interleaved runs; PyTorch {__import__('torch').__version__} with 2 threads\n")
    print("| layer | tcc GFLOP/s (conv+bias+relu) | torch GFLOP/s | fused ratio tcc/torch | bare ratio tcc/torch | "
          "epilogue cost tcc fused/bare | tcc peak RSS growth MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in conv_rows(runs, args.quick):
        print(row, flush=True)
    print("\n| elementwise | tcc | NumPy | ratio |\n|---|---:|---:|---:|")
    print(chain_row(runs))


if __name__ == "__main__":
    main()
