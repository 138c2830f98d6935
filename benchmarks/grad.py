"""Conv gradients from ``tcc.grad`` side by side with the hand-written ones in
``examples/conv2d_grad.tc`` and with PyTorch's (2 threads): ratios derived / anchor.

Per layer, the data and the weight gradient separately: tcc.grad(conv2d, ["X"]) and
tcc.grad(conv2d, ["Wt"]) against conv2d_grad_x / conv2d_grad_w and against
``torch.ops.aten.convolution_backward`` with one output mask. Timing as in benchmarks/cpu.py:
interleaved rounds of warm back-to-back calls, each ratio the median over ``--runs`` rounds of
the two times in the same round.

    python benchmarks/grad.py [--runs 10] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu import paired_rounds, ratio  # noqa: E402

import tcc  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# name: (N, C, H, W, F, K, S, P)
LAYERS = {
    "3x3 64->64 56x56 b8": (8, 64, 56, 56, 64, 3, 1, 1),
    "3x3/2 128->128 28x28 b8": (8, 128, 28, 28, 128, 3, 2, 1),
}
QUICK = {"3x3 32->32 28x28 b2": (2, 32, 28, 28, 32, 3, 1, 1)}


def sides(layer: tuple, rng: np.random.Generator) -> dict[str, list]:
    """For "dX" and "dW": [derived, hand-written, torch] callables on the same data."""
    import torch

    n, c, h, w, f, k, s, p = layer
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((f, c, k, k), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    conv = tcc.compile(EXAMPLES / "conv2d.tc").conv2d
    hand = tcc.compile(EXAMPLES / "conv2d_grad.tc")
    dy = rng.standard_normal(conv(x, wt, b, S=s, P=p).shape, dtype=np.float32)
    gx, gw = tcc.grad(conv, ["X"]), tcc.grad(conv, ["Wt"])
    tx, tw, tdy = torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(dy)

    def torch_grad(mask):
        return lambda: torch.ops.aten.convolution_backward(tdy, tx, tw, None, [s, s], [p, p], [1, 1], False, [0, 0],
                                                           1, mask)

    return {
        "dX": [lambda: gx(x, wt, b, dy, S=s, P=p), lambda: hand.conv2d_grad_x(x, wt, dy, S=s, P=p),
               torch_grad([True, False, False])],
        "dW": [lambda: gw(x, wt, b, dy, S=s, P=p), lambda: hand.conv2d_grad_w(x, wt, dy, S=s, P=p),
               torch_grad([False, True, False])],
    }


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="one small layer, for a smoke test")
    opts = parser.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    print(f"medians of {opts.runs} interleaved runs; PyTorch {torch.__version__} with 2 threads\n")
    print(f"{'layer':26} {'grad':4} {'derived ms':>10} {'/ hand':>8} {'/ torch':>8}")
    for name, layer in (QUICK if opts.quick else LAYERS).items():
        for which, fns in sides(layer, rng).items():
            for fn in fns:
                fn()  # compile and warm
            rounds = paired_rounds(fns, opts.runs)
            ms = statistics.median(r[0] for r in rounds) * 1e3
            print(f"{name:26} {which:4} {ms:10.2f} {ratio(rounds, 0, 1):8.2f} {ratio(rounds, 0, 2):8.2f}", flush=True)


if __name__ == "__main__":
    main()
