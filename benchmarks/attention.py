"""Attention as the language writes it (one streaming kernel) against PyTorch's
``scaled_dot_product_attention`` and torch.compile of the same math, side by side in one
process: interleaved trials, medians, printed as ratios (tcc's time / theirs; below 1: tcc is
faster), with each one's extra memory per call. Every row first checks tcc's answer against SDPA.

    python benchmarks/attention.py --device cpu                     # f32, B1 H8 D64, S 1024..4096
    python benchmarks/attention.py --device cuda                    # f16/bf16, D 64/128, S 512..16k, decode
    python benchmarks/attention.py --device cpu --seq 1024 --no-compile --trials 5
    python benchmarks/attention.py --device cpu --no-forward         # the backward rows alone
    python benchmarks/attention.py --device cuda --no-forward --dtypes f16 --seq 2048 8192

Backward rows: ``tcc.grad`` of the same op against ``torch.autograd.grad`` through SDPA's
forward (its saved output and log-sum-exp), both given the forward's saved values: tcc's
gradient op takes the row maxima, sums and output that ``tcc.saving``'s forward returned
(``saved``), and computes no forward again; the ``recompute`` ratio is ``tcc.grad(op)`` with
nothing saved (the forward's stream runs first in the same op). In 16 bits (CUDA: B4 H16, S 2048
and 8192) the saved output is the f32 one before its rounding (the program spells it as a
statement of its own, ``o``), which the gradient's ``rowsum(dO * o)`` reads; SDPA saves its 16-bit
output.

Extra memory: on CUDA torch's peak allocation above the inputs and output (tcc's are counted
from its loop IR: the buffers it allocates); on the CPU, from the loop IR for tcc and the
S x S scores for the math.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

import tcc

SOURCE = """
op attention[T: float](Q: T[B, H, S, D], K: T[B, H, L, D], V: T[B, H, L, D], scale: f32) -> O: T[B, H, S, D] {
    s[b, h, i, j] = sum[d](f32(Q[b, h, i, d]) * f32(K[b, h, j, d])) * scale
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    l[b, h, i] = sum[j](e[b, h, i, j])
    O[b, h, i, d] = T(sum[j](e[b, h, i, j] * f32(V[b, h, j, d])) / l[b, h, i])
}

op causal_attention[T: float](Q: T[B, H, S, D], K: T[B, H, S, D], V: T[B, H, S, D], scale: f32) -> O: T[B, H, S, D] {
    s[b, h, i, j] = select(j <= i, sum[d](f32(Q[b, h, i, d]) * f32(K[b, h, j, d])) * scale, -inf)
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    l[b, h, i] = sum[j](e[b, h, i, j])
    O[b, h, i, d] = T(sum[j](e[b, h, i, j] * f32(V[b, h, j, d])) / l[b, h, i])
}
"""
# the same programs with the f32 output a statement of its own, for a 16-bit training step on CUDA to
# save it (a 16-bit O rounds away what the backward's rowsum(dO * O) reads)
SAVED_SOURCE = SOURCE.replace("op attention[", "op attention_o[").replace(
    "op causal_attention[", "op causal_o[").replace(
    "    O[b, h, i, d] = T(sum[j](e[b, h, i, j] * f32(V[b, h, j, d])) / l[b, h, i])",
    "    o[b, h, i, d] = sum[j](e[b, h, i, j] * f32(V[b, h, j, d])) / l[b, h, i]\n    O[b, h, i, d] = T(o[b, h, i, d])")
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """The same program in PyTorch operations (what torch.compile is given)."""
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


CALLS_CUDA = 10  # back-to-back calls a CUDA trial: the GPU's time a call, not one call's host latency


def timed(fn: Callable[[], object], cuda: bool) -> float:
    """Seconds a call: one call on the CPU; on CUDA the mean of CALLS_CUDA queued calls between two
    synchronisations (as CUDA events around them would measure: a decoding call's 0.15 ms kernel
    is otherwise half host latency)."""
    calls = CALLS_CUDA if cuda else 1
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls


def interleaved(fns: dict[str, Callable[[], object]], trials: int, cuda: bool) -> dict[str, float]:
    """Median seconds of each, its trials alternating with the others' (after a warm-up call)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(trials):
        for name, fn in fns.items():
            times[name].append(timed(fn, cuda))
    return {name: statistics.median(t) for name, t in times.items()}


def tcc_extra_bytes(op, bindings: dict) -> int:
    """What tcc's kernel allocates beyond its arguments, from the loop IR (its global buffers)."""
    func = op.lowered(bindings).scheduled
    params = {p.name for p in func.params}
    return sum(b.size * b.dtype.itemsize for name, b in func.buffers().items()
               if name not in params and b.scope == "global")


def torch_extra_bytes(fn: Callable[[], object]) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base - out.numel() * out.element_size()


def row(lib, device: str, dtype: str, B: int, H: int, S: int, L: int, D: int, causal: bool, trials: int,
        compile_math: bool) -> str:
    cuda = device == "cuda"
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(device, DTYPES[dtype]) for n in (S, L, L))
    scale = 1.0 / D ** 0.5
    op = (lib.causal_attention if causal else lib.attention).bound(T=dtype)
    args = (q, k, v) if cuda else tuple(t.numpy() for t in (q, k, v))

    def ours():
        return op(*args, np.float32(scale))

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    fns: dict[str, Callable[[], object]] = {"tcc": ours, "sdpa": sdpa}
    if compile_math:
        compiled = torch.compile(lambda: math_attention(q, k, v, scale, causal))
        fns["compiled"] = compiled
    got = torch.as_tensor(ours()).to(device).float()
    err = float((got - sdpa().float()).norm() / sdpa().float().norm())
    times = interleaved(fns, trials, cuda)
    bindings = {"B": B, "H": H, "S": S, "D": D} | ({} if causal else {"L": L})
    mib = 1 << 20
    ours_mem = tcc_extra_bytes(op, bindings) / mib
    math_mem = B * H * S * L * 4 * 2 / mib  # scores and probabilities, f32
    their_mem = torch_extra_bytes(sdpa) / mib if cuda else float("nan")
    flops = 4 * B * H * S * L * D / (2 if causal else 1)
    text = (f"{dtype:4} B{B} H{H} S{S:<5} L{L:<5} D{D:<3} {'causal' if causal else 'full  ':6} "
            f"tcc {flops / times['tcc'] / 1e9:8.1f} GFLOP/s  tcc/sdpa {times['tcc'] / times['sdpa']:5.2f}")
    if "compiled" in times:
        text += f"  tcc/compile {times['tcc'] / times['compiled']:5.2f}"
    text += f"  extra MiB: tcc {ours_mem:.2f} sdpa {their_mem:.2f} math {math_mem:.1f}  rel.err {err:.1e}"
    return text


def backward_row(lib, device: str, dtype: str, B: int, H: int, S: int, D: int, causal: bool, trials: int) -> str:
    """tcc's gradient op (given the forward's saved rows) against SDPA's backward (given its saved
    output and log-sum-exp)."""
    cuda = device == "cuda"
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, S, D, generator=g).to(device, DTYPES[dtype]) for _ in range(4))
    scale = 1.0 / D ** 0.5
    half = dtype != "f32"
    name = ("causal_o" if causal else "attention_o") if half else ("causal_attention" if causal else "attention")
    plain = (lib.causal_attention if causal else lib.attention).bound(T=dtype)
    op = lib[name].bound(T=dtype)
    saved = ["m", "l", "o" if half else "O"]
    forward, grad, again = tcc.saving(op, saved), tcc.grad(op, saved=saved), tcc.grad(plain)
    args = [t if cuda else t.numpy() for t in (q, k, v)] + [np.float32(scale)]
    dO = do if cuda else do.numpy()
    results = dict(zip(forward.te.results, forward(*args)))
    rows = [results[n] for n in saved]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    sdpa = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)

    def ours():
        return grad(*args, dO, *rows)

    def theirs():
        return torch.autograd.grad(sdpa, leaves, do, retain_graph=True)

    def recompute():
        return again(*args, dO)

    expected = theirs()
    err = max(float((torch.as_tensor(a).to(device).float() - b.float()).norm() / b.float().norm())
              for a, b in zip(ours(), expected))
    times = interleaved({"tcc": ours, "sdpa": theirs, "recompute": recompute}, trials, cuda)
    bindings = {"B": B, "H": H, "S": S, "D": D} | ({} if causal else {"L": S})
    mib = 1 << 20
    flops = 10 * B * H * S * S * D / (2 if causal else 1)  # (five products of S x S x D)
    return (f"{dtype:4} B{B} H{H} S{S:<5} D{D:<3} {'causal' if causal else 'full  ':6} backward "
            f"tcc {flops / times['tcc'] / 1e9:8.1f} GFLOP/s  tcc/sdpa {times['tcc'] / times['sdpa']:5.2f}  "
            f"recompute/sdpa {times['recompute'] / times['sdpa']:5.2f}  extra MiB: tcc "
            f"{tcc_extra_bytes(grad, bindings) / mib:.2f} math {B * H * S * S * 4 * 3 / mib:.1f}  rel.err {err:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--seq", type=int, nargs="*", help="sequence lengths (default: by device)")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--no-forward", action="store_true", help="the backward rows alone")
    parser.add_argument("--no-backward", action="store_true", help="the forward rows alone")
    parser.add_argument("--dtypes", nargs="*", default=["f16", "bf16"], help="CUDA: the 16-bit types")
    parser.add_argument("--depths", type=int, nargs="*", default=[64, 128], help="CUDA: the row lengths D")
    a = parser.parse_args()
    lib = tcc.compile(SOURCE + SAVED_SOURCE, target=a.device)
    compile_math = not a.no_compile
    if a.device == "cpu":
        for S in a.seq or [1024, 2048, 4096] if not a.no_forward else ():
            for causal in (False, True):
                print(row(lib, "cpu", "f32", 1, 8, S, S, 64, causal, a.trials, compile_math), flush=True)
        for S in a.seq or [1024, 2048, 4096] if not a.no_backward else ():
            for causal in (False, True):
                print(backward_row(lib, "cpu", "f32", 1, 8, S, 64, causal, a.trials), flush=True)
        return
    for dtype in a.dtypes:
        for D in a.depths:
            for S in a.seq or [512, 2048, 4096, 16384] if not a.no_forward else ():
                B, H = max(1, 16384 // S), 16
                for causal in (False, True):
                    print(row(lib, "cuda", dtype, B, H, S, S, D, causal, a.trials, compile_math), flush=True)
            for S in a.seq or [2048, 8192] if not a.no_backward else ():
                for causal in (False, True):
                    print(backward_row(lib, "cuda", dtype, 4, 16, S, D, causal, a.trials), flush=True)
        if not a.no_forward:
            print(row(lib, "cuda", dtype, 8, 16, 1, 8192, 128, False, a.trials, compile_math), flush=True)  # decode


if __name__ == "__main__":
    main()
