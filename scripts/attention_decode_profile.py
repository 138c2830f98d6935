"""Where a decoding call's time goes, on a GPU: tcc's attention op for one query and 8192 keys
(B8 H16 D128, f16) against SDPA, ten queued calls between synchronisations, then the op's kernels
under torch.profiler (the split-KV kernel and the merge of its partial results).

    python3 scripts/attention_decode_profile.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_attention import ATTENTION  # noqa: E402

import tcc  # noqa: E402


def per_call(fn, calls: int = 10, trials: int = 9) -> float:
    """Median seconds a call over ``trials`` runs of ``calls`` queued calls."""
    times = []
    for _ in range(trials):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def main() -> None:
    B, H, L, D = 8, 16, 8192, 128
    op = tcc.compile(ATTENTION, target="cuda").attention.bound(T="f16")
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.float16) for _ in range(2))
    out, scale = torch.empty_like(q), D ** -0.5

    def ours() -> None:
        op(q, k, v, scale, out=out)

    def sdpa() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
    ours()
    print(f"max error {float((out.float() - sdpa().float()).abs().max()):.2e}")
    mine, theirs = per_call(ours), per_call(sdpa)
    print(f"tcc {mine * 1e6:.1f} us a call, SDPA {theirs * 1e6:.1f} us: tcc/SDPA throughput {theirs / mine:.2f}")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            ours()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))


if __name__ == "__main__":
    main()
