"""Call overhead of a ``tcc.torch`` operator against a comparable built-in PyTorch op, on tiny
tensors (256 elements, so that the time is the call, not the work): ratios tcc.torch / anchor.

Sides, timed in interleaved rounds (see benchmarks/cpu.py; each ratio the median over rounds of
the two times in the same round): ``torch.add`` (the anchor); the tcc op ``C[i] = A[i] + B[i]``
through ``tcc.torch`` (torch dispatch, autograd check, ``torch.empty`` result, tcc's call); the
same tcc op called directly on NumPy views with ``out=`` (tcc's own call); and an empty Python
operator registered the same way (what torch's dispatch to a Python kernel costs by itself).
With a GPU, the same on CUDA tensors.

    python benchmarks/torch_overhead.py [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu import paired_rounds, ratio  # noqa: E402

import tcc  # noqa: E402

KEEP = []  # torch.library.Library objects own their registrations: keep them alive
ADD = "op add(A: f32[N], B: f32[N]) -> C: f32[N] {\n    C[i] = A[i] + B[i]\n}\n"


def sides(device: str) -> dict:
    import torch

    ops = tcc.torch.library(ADD, namespace=f"bench_{device}")
    lib = torch.library.Library(f"bench_empty_{device}", "FRAGMENT")
    KEEP.append(lib)
    lib.define("noop(Tensor a, Tensor b) -> Tensor")
    lib.impl("noop", lambda a, b: torch.empty_like(a), "CUDA" if device == "cuda" else "CPU")
    noop = torch.ops.__getattr__(f"bench_empty_{device}").noop.default
    a, b = torch.randn(256, device=device), torch.randn(256, device=device)
    out = {"torch.add": lambda: torch.add(a, b), "tcc.torch": lambda: ops.add(a, b),
           "torch python op": lambda: noop(a, b)}
    if device == "cpu":
        an, bn, cn = a.numpy(), b.numpy(), torch.empty(256).numpy()
        direct = ops.add.op
        out["tcc direct"] = lambda: direct(an, bn, out=cn)
    return out


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    opts = parser.parse_args()
    torch.set_num_threads(2)
    print(f"medians of {opts.runs} interleaved runs; PyTorch {torch.__version__}; 256 float32 elements\n")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and tcc.cuda.is_available() else [])
    for device in devices:
        fns = sides(device)
        names = list(fns)
        for fn in fns.values():
            fn()  # compile and warm
        if device == "cuda":
            calls = list(fns.values())
            fns = {n: (lambda f=f: (f(), torch.cuda.synchronize())) for n, f in zip(names, calls)}
        rounds = paired_rounds(list(fns.values()), opts.runs)
        for i, name in enumerate(names):
            us = statistics.median(r[i] for r in rounds) * 1e6
            print(f"{device:5} {name:16} {us:8.2f} us   / torch.add {ratio(rounds, i, 0):6.2f}")


if __name__ == "__main__":
    main()
