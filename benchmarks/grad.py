"""Conv forward and gradients side by side with PyTorch's (2 threads): ratios tcc / torch.

Per layer: the forward (``examples/conv2d.tc``), the data gradient and the weight gradient
derived by ``tcc.grad(conv2d, ["X"])`` / ``["Wt"]``, each against PyTorch's own kernel on the
same data (``F.conv2d``; ``torch.ops.aten.convolution_backward`` with one output mask), and the
hand-written ops of ``examples/conv2d_grad.tc`` as a second anchor for the gradients; ``bwd`` is
data + weight gradient (the issue's target: <= 1.25x PyTorch). Timing as in benchmarks/cpu.py:
interleaved rounds of warm back-to-back calls, each ratio the median over ``--runs`` rounds of
the two times in the same round.

With ``--cuda``, the same on the GPU: the tcc ops compiled for target ``cuda`` on PyTorch CUDA
tensors (what ``tcc.torch`` runs, results allocated by PyTorch) against PyTorch's (cuDNN) kernels,
each call followed by ``torch.cuda.synchronize()`` (target for ``bwd``: <= 1.5x PyTorch). TF32 is
off on both sides (cuDNN's default allows it for convolutions; tcc's f32 is f32), so both compute
the same f32 products; ``--tf32`` compares tcc's default against cuDNN with TF32 allowed instead.

    python benchmarks/grad.py [--runs 10] [--quick] [--layer 3x3/2] [--cuda]
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


def sides(layer: tuple, rng: np.random.Generator, device: str = "cpu") -> dict[str, list]:
    """For "fwd", "dX" and "dW": [tcc, torch, hand-written (gradients only)] callables on the same
    data: NumPy arrays and CPU tensors, or CUDA tensors for both (each call then synchronizes)."""
    import torch
    import torch.nn.functional as F

    n, c, h, w, f, k, s, p = layer
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((f, c, k, k), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    conv = tcc.compile(EXAMPLES / "conv2d.tc").conv2d
    hand = tcc.compile(EXAMPLES / "conv2d_grad.tc")
    out = F.conv2d(torch.from_numpy(x), torch.from_numpy(wt), stride=s, padding=p).shape
    dy = rng.standard_normal(tuple(out), dtype=np.float32)
    gx, gw = tcc.grad(conv, ["X"]), tcc.grad(conv, ["Wt"])
    tx, tw, tb, tdy = (torch.from_numpy(a).to(device) for a in (x, wt, b, dy))
    if device == "cuda":  # the same ops for the GPU, on the CUDA tensors
        conv, gx, gw = (tcc.compile(o.te.source.text, target="cuda")[o.name] for o in (conv, gx, gw))
        hand = tcc.compile(EXAMPLES / "conv2d_grad.tc", target="cuda")
        x, wt, b, dy = tx, tw, tb, tdy

    def torch_grad(mask):
        return lambda: torch.ops.aten.convolution_backward(tdy, tx, tw, None, [s, s], [p, p], [1, 1], False, [0, 0],
                                                           1, mask)

    fns = {
        "fwd": [lambda: conv(x, wt, b, S=s, P=p), lambda: F.conv2d(tx, tw, tb, stride=s, padding=p)],
        "dX": [lambda: gx(x, wt, b, dy, S=s, P=p), torch_grad([True, False, False]),
               lambda: hand.conv2d_grad_x(x, wt, dy, S=s, P=p)],
        "dW": [lambda: gw(x, wt, b, dy, S=s, P=p), torch_grad([False, True, False]),
               lambda: hand.conv2d_grad_w(x, wt, dy, S=s, P=p)],
    }
    if device == "cuda":
        sync = torch.cuda.synchronize
        fns = {which: [lambda fn=fn: (fn(), sync()) for fn in side] for which, side in fns.items()}
    return fns


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="one small layer, for a smoke test")
    parser.add_argument("--layer", default="", help="only the layers whose name contains this")
    parser.add_argument("--cuda", action="store_true", help="on the GPU (tcc target cuda against cuDNN)")
    parser.add_argument("--tf32", action="store_true", help="let cuDNN use TF32 (its default; tcc stays f32)")
    opts = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = opts.tf32
    if opts.cuda and not (torch.cuda.is_available() and tcc.cuda.is_available()):
        sys.exit("--cuda: no usable CUDA GPU (torch or tcc.cuda)")
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    where = f"on {torch.cuda.get_device_name()}, cuDNN TF32 {'on' if opts.tf32 else 'off'}" if opts.cuda \
        else "with 2 threads"
    print(f"medians of {opts.runs} interleaved runs; PyTorch {torch.__version__} {where}\n")
    print(f"{'layer':26} {'pass':4} {'tcc ms':>8} {'torch ms':>8} {'/ torch':>8} {'/ hand':>7}")
    layers = {k: v for k, v in (QUICK if opts.quick else LAYERS).items() if opts.layer in k}
    for name, layer in layers.items():
        ms: dict[str, tuple[float, float]] = {}
        for which, fns in sides(layer, rng, "cuda" if opts.cuda else "cpu").items():
            for fn in fns:
                fn()  # compile and warm
            rounds = paired_rounds(fns, opts.runs)
            ms[which] = tuple(statistics.median(r[i] for r in rounds) * 1e3 for i in (0, 1))
            hand = f"{ratio(rounds, 0, 2):7.2f}" if len(fns) > 2 else ""
            print(f"{name:26} {which:4} {ms[which][0]:8.2f} {ms[which][1]:8.2f} {ratio(rounds, 0, 1):8.2f} {hand}",
                  flush=True)
        ours, theirs = ms["dX"][0] + ms["dW"][0], ms["dX"][1] + ms["dW"][1]
        print(f"{name:26} {'bwd':4} {ours:8.2f} {theirs:8.2f} {ours / theirs:8.2f}   (dX + dW, of the medians)")


if __name__ == "__main__":
    main()
