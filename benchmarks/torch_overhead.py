"""Call overhead of a ``tcc.torch`` operator against a comparable built-in PyTorch op, on tiny
tensors (256 elements, so that the time is the call, not the work): ratios side / torch.add.

Sides, timed in interleaved rounds (see benchmarks/cpu.py; each ratio the median over rounds of
the two times in the same round):

- ``torch.add``: the anchor, a built-in op (C++ dispatch, result allocated by PyTorch).
- ``tcc.torch``: ``ops.add(a, b)`` for the tcc op ``C[i] = A[i] + B[i]``, the way users call it:
  on plain tensors that record no graph, no torch dispatch (``TorchOp.__call__``): the C++ eager
  path where it is built (``tcc/interop/torch_native.cpp``: checks, ``at::empty``, the kernel).
- ``tcc.torch py``: the same op registered under ``TCC_TORCH_NATIVE=0``: the Python eager path
  (``_Direct.run`` on the CPU, the CUDA op's ``Plan.run`` on the GPU).
- ``torch.ops``: ``torch.ops.NS.add(a, b)``, the same op through torch's dispatcher (what a
  ``torch.compile`` graph pays, and what an eager call that records a graph paid before it took
  the eager path's ``autograd.Function``): its autograd kernel (``torch.library.register_autograd``),
  then the Python CPU kernel.
- ``... grad`` sides: the same calls with ``a`` requiring a gradient (a graph recorded; its ratio
  against ``torch.add grad``, the built-in op recording its graph). ``tcc.torch grad``: the C++
  eager path runs the kernel and attaches its own autograd node (``torch_autograd.cpp``, whose
  backward calls the op's Python one); ``tcc.torch py grad``: the op of ``tcc.torch py``, all Python: its
  ``autograd.Function`` (``_Graph``) around ``_Direct.run`` (before the C++ node, a C++-path
  op's call that recorded a graph paid that Function around the C++ forward).
- ``tcc direct``: the tcc op called on NumPy views with ``out=`` (tcc's own call, the floor of
  the ``tcc.torch`` side); ``tcc direct torch``: the same with the torch tensors themselves.
- ``Library.impl noop`` / ``custom_op noop``: empty Python operators (``torch.empty_like`` only),
  registered with ``torch.library.Library.impl`` (a CPU kernel, no autograd) and with
  ``torch.library.custom_op`` (which adds autograd and more): what torch's dispatch to Python
  costs by itself.

With a GPU, the same sides on CUDA tensors (``tcc.torch``: the eager path's CUDA plan, kernels
on torch's current stream), each timed as 100 calls and one ``torch.cuda.synchronize()``, per call:
the host's cost of queuing the op, what the target (<= 1.5x ``torch.add``) is about.

    python benchmarks/torch_overhead.py [--runs 10] [--cuda]

``--cuda``: the CUDA rows only, and an error when no GPU is usable.
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
BATCH = 100  # CUDA calls per timed batch
ADD = "op add(A: f32[N], B: f32[N]) -> C: f32[N] {\n    C[i] = A[i] + B[i]\n}\n"


def sides(device: str) -> dict:
    import torch

    ns = f"bench_{device}"
    ops = tcc.torch.library(ADD, namespace=ns)
    a, b = torch.randn(256, device=device), torch.randn(256, device=device)
    switch = os.environ.get("TCC_TORCH_NATIVE")
    os.environ["TCC_TORCH_NATIVE"] = "0"  # while its first call learns the signature: Python's path for good
    python_ops = tcc.torch.library(ADD, namespace=f"{ns}_py")
    python_ops.add(a, b)
    if switch is None:
        del os.environ["TCC_TORCH_NATIVE"]
    else:
        os.environ["TCC_TORCH_NATIVE"] = switch
    lib = torch.library.Library(f"bench_empty_{device}", "FRAGMENT")
    KEEP.append(lib)
    lib.define("noop(Tensor a, Tensor b) -> Tensor")
    lib.impl("noop", lambda a, b: torch.empty_like(a), "CUDA" if device == "cuda" else "CPU")
    noop = getattr(torch.ops, f"bench_empty_{device}").noop.default

    custom = torch.library.custom_op(f"bench_custom_{device}::noop", lambda a, b: torch.empty_like(a),
                                     mutates_args=(), schema="(Tensor a, Tensor b) -> Tensor")

    dispatched = getattr(torch.ops, ns).add
    g = a.clone().requires_grad_()
    out = {"torch.add": lambda: torch.add(a, b), "tcc.torch": lambda: ops.add(a, b),
           "tcc.torch py": lambda: python_ops.add(a, b),
           "torch.ops": lambda: dispatched(a, b), "Library.impl noop": lambda: noop(a, b),
           "custom_op noop": lambda: custom(a, b), "torch.add grad": lambda: torch.add(g, b),
           "tcc.torch grad": lambda: ops.add(g, b), "tcc.torch py grad": lambda: python_ops.add(g, b),
           "torch.ops grad": lambda: dispatched(g, b)}
    if device == "cpu":
        c = torch.empty(256)
        an, bn, cn = a.numpy(), b.numpy(), c.numpy()
        direct = ops.add.op
        out["tcc direct"] = lambda: direct(an, bn, out=cn)
        out["tcc direct torch"] = lambda: direct(a, b, out=c)
    return out


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cuda", action="store_true", help="the CUDA rows only (a GPU required)")
    opts = parser.parse_args()
    gpu = torch.cuda.is_available() and tcc.cuda.is_available()
    if opts.cuda and not gpu:
        sys.exit("--cuda: no usable CUDA GPU (torch or tcc.cuda)")
    torch.set_num_threads(2)
    print(f"medians of {opts.runs} interleaved runs; PyTorch {torch.__version__}; 256 float32 elements\n")
    devices = ["cuda"] if opts.cuda else ["cpu"] + (["cuda"] if gpu else [])
    for device in devices:
        fns = sides(device)
        names = list(fns)
        for fn in fns.values():
            fn()  # compile and warm
        per = 1
        if device == "cuda":  # the host's cost of a call: BATCH calls queued, then one synchronize
            calls = list(fns.values())
            per = BATCH
            fns = {n: (lambda f=f: ([f() for _ in range(BATCH)], torch.cuda.synchronize()))
                   for n, f in zip(names, calls)}
        rounds = paired_rounds(list(fns.values()), opts.runs)
        for i, name in enumerate(names):
            us = statistics.median(r[i] for r in rounds) * 1e6 / per
            anchor = "torch.add grad" if name.endswith(" grad") else "torch.add"
            print(f"{device:5} {name:18} {us:8.2f} us   / {anchor:14} {ratio(rounds, i, names.index(anchor)):6.2f}")
    print(f"\neager path: {tcc.torch.native_status()}")


if __name__ == "__main__":
    main()
