"""A fused linear cross-entropy (the loss of a language model's head over a large vocabulary)
against eager PyTorch (``F.cross_entropy(X @ W.T, lab, reduction="none")``) and torch.compile of
the same, side by side in one process: interleaved trials, medians, printed as ratios (tcc's time
/ theirs; at or below 1: tcc is as fast or faster), with each one's extra memory per call. Every
row first checks tcc's losses against eager's.

    python benchmarks/xent.py --device cpu                          # f32, N 1024, K 768, C 32000
    python benchmarks/xent.py --device cuda                         # f32/f16/bf16, N 4096, K 768/4096, C 32k/128k
    python benchmarks/xent.py --device cpu -N 4096 -K 768 -C 32000 --trials 5 --no-compile

tcc runs one program (the issue's, in any float dtype, its math in f32): the logits are never
stored, each block of the vocabulary folds into running maxima and sums per row. Extra memory:
on CUDA torch's peak allocation above the inputs and output, tcc's from its loop IR (the buffers
it allocates, global memory); on the CPU, tcc's from the loop IR and eager's as the N x C f32
logits plus their log-softmax that ``cross_entropy`` materialises.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from attention import interleaved, tcc_extra_bytes, timed, torch_extra_bytes  # (this folder's)

import tcc

SOURCE = """
op linear_xent[T: float](X: T[N, K], W: T[C, K], lab: i64[N]) -> loss: f32[N] {
    z[n, c] = sum[k](f32(X[n, k]) * f32(W[c, k]))
    m[n] = max[c](z[n, c])
    lse[n] = m[n] + log(sum[c](exp(z[n, c] - m[n])))
    loss[n] = lse[n] - z[n, lab[n]]
}
"""
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def eager(x: torch.Tensor, w: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
    """What a model's training step writes: the logits, then the loss per row."""
    return F.cross_entropy(x @ w.T, lab, reduction="none")


def row(op, device: str, dtype: str, N: int, K: int, C: int, trials: int, compile_too: bool, budget: float) -> str:
    cuda = device == "cuda"
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(N, K, generator=g).to(device, DTYPES[dtype])
    w = (torch.randn(C, K, generator=g) / K ** 0.5).to(device, DTYPES[dtype])
    lab = torch.randint(0, C, (N,), generator=g).to(device)
    bound = op.bound(T=dtype)
    args = (x, w, lab) if cuda else (x.numpy(), w.numpy(), lab.numpy())

    def ours():
        return bound(*args)

    fns: dict[str, Callable[[], object]] = {"tcc": ours, "eager": lambda: eager(x, w, lab)}
    if compile_too:
        compiled = torch.compile(eager)
        fns["compiled"] = lambda: compiled(x, w, lab)
    expected = eager(x.float(), w.float(), lab)
    got = torch.as_tensor(ours()).to(device)
    err = float((got - expected).abs().max() / expected.abs().max())
    once = timed(ours, cuda)  # a slow kernel (the GPU's generic schedule) gets fewer trials: the run stays short
    fits = min(trials, int(budget / once))
    if fits:
        times = interleaved(fns, fits, cuda)
    else:  # (one call over the budget: that call is tcc's time, the others' trials run without it)
        times = interleaved({k: f for k, f in fns.items() if k != "tcc"}, trials, cuda) | {"tcc": once}
    mib = 1 << 20
    ours_mem = tcc_extra_bytes(bound, {"N": N, "K": K, "C": C}) / mib
    if cuda:
        eager_mem = torch_extra_bytes(lambda: eager(x, w, lab)) / mib
        compiled_mem = torch_extra_bytes(lambda: compiled(x, w, lab)) / mib if compile_too else float("nan")
    else:
        eager_mem, compiled_mem = 2 * N * C * 4 / mib, float("nan")  # logits and their log-softmax
    flops = 2 * N * K * C
    text = (f"{dtype:4} N{N:<5} K{K:<5} C{C:<6} tcc {flops / times['tcc'] / 1e9:8.1f} GFLOP/s  "
            f"tcc/eager {times['tcc'] / times['eager']:5.2f}")
    if "compiled" in times:
        text += f"  tcc/compile {times['tcc'] / times['compiled']:5.2f}"
    text += f"  extra MiB: tcc {ours_mem:.2f} eager {eager_mem:.1f}"
    if compile_too and cuda:
        text += f" compiled {compiled_mem:.1f}"
    return text + f"  max rel.err {err:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("-N", type=int, nargs="*", help="rows (tokens); default by device")
    parser.add_argument("-K", type=int, nargs="*", help="hidden size; default by device")
    parser.add_argument("-C", type=int, nargs="*", help="vocabulary size; default by device")
    parser.add_argument("--dtype", nargs="*", choices=sorted(DTYPES), help="input dtypes; default by device")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--budget", type=float, default=5.0,
                        help="seconds of tcc's timed calls per row at most: fewer trials where one call is slow")
    a = parser.parse_args()
    op = tcc.compile(SOURCE, target=a.device).linear_xent
    cuda = a.device == "cuda"
    for dtype in a.dtype or (["f32", "bf16", "f16"] if cuda else ["f32"]):
        for K in a.K or ([768, 4096] if cuda else [768]):
            for C in a.C or ([32000, 128000] if cuda else [32000]):
                for N in a.N or ([4096] if cuda else [1024]):
                    print(row(op, a.device, dtype, N, K, C, a.trials, not a.no_compile, a.budget), flush=True)


if __name__ == "__main__":
    main()
