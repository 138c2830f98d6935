"""Standalone check and timing of FlashAttention-2's backward template (tcc/codegen_cuda/flash_backward.py)
against torch: dQ, dK, dV of every case against autograd of the attention in f32, then the time of the
whole backward (Delta, the main kernel, dQ's conversion) against torch SDPA's backward, interleaved.

    python3 scripts/flash_bwd_probe.py            # on the GPU machine: PASS/FAIL table, then timings
    python3 scripts/flash_bwd_probe.py --report   # no GPU needed: ptxas registers/spills per instantiation

The kernels and their launches are written out here (the template's integration into the CUDA
schedule is a later step): a thread block of 16 * WARPS keys per (batch x head, key tile).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tcc.codegen_cuda import nvrtc  # noqa: E402
from tcc.codegen_cuda.flash_backward import DELTA_THREADS, TILES, shared_bytes, standalone_kernels  # noqa: E402

ARCH = "sm_90"
TIMED = (4, 16, (2048, 8192))  # batch, heads, sequence lengths of the timings
# (BM, WARPS) by head dimension: the tile of queries a step, the warps of a block (16 keys each); the
# template's spill-free TILES, then shapes ptxas spills a few bytes in (or only in f16), timed to compare
CONFIGS = {d: TILES[d] + extra for d, extra in ((64, ((32, 4), (128, 8))), (128, ((64, 8),)))}


def report() -> int:
    """ptxas's registers and spills of every instantiation (compiled here, no GPU); 1 if one of TILES spills."""
    bad = 0
    for d, configs in CONFIGS.items():
        for bm, warps in configs:
            for bf16 in (False, True):
                t0 = time.perf_counter()
                log = nvrtc.ptxas_report(standalone_kernels(d, bm, warps, bf16), ARCH)
                took = time.perf_counter() - t0
                for name in ("bwd_k", "delta_k", "dq_k"):
                    block = log[log.find(f"'{name}'"):]
                    regs = re.search(r"Used (\d+) registers", block)
                    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
                    stores, loads = (int(spill.group(1)), int(spill.group(2))) if spill else (-1, -1)
                    tile = (bm, warps) in TILES[d]
                    bad |= tile and (stores != 0 or loads != 0)
                    if name == "bwd_k" or stores or loads:
                        kind = f"{'bf16' if bf16 else 'f16 '} {'TILES' if tile else 'extra'}"
                        print(f"D{d} BM{bm} W{warps} {kind} {name}: "
                              f"{regs.group(1) if regs else '?'} registers, spills {stores}/{loads} B, "
                              f"smem {shared_bytes(d, bm, warps)} B, compiled in {took:.1f} s", flush=True)
    return int(bad)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", action="store_true", help="ptxas registers/spills only (no GPU)")
    if parser.parse_args().report:
        return report()
    return device_main()


def device_main() -> int:
    import torch

    from tcc.codegen_cuda import driver

    torch.zeros(1, device="cuda")
    ctx = driver.context(torch.cuda.current_device())
    ctx.activate()
    stream = torch.cuda.current_stream().cuda_stream
    t_start = time.perf_counter()
    jobs = {(d, bm, w, bf16): standalone_kernels(d, bm, w, bf16) for d, cs in CONFIGS.items() for bm, w in cs
            for bf16 in (False, True)}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        cubins = dict(zip(jobs, pool.map(lambda s: nvrtc.compile_cubin(s, ARCH), jobs.values())))
    modules = {key: driver.load_module(c, "flash backward") for key, c in cubins.items()}
    print(f"compiled {len(modules)} instantiations in {time.perf_counter() - t_start:.1f} s", flush=True)

    def backward(key, q, k, v, o, do, lse, causal, scale):
        """(run, (dq, dk, dv)): the launches of one call, outputs poisoned with NaN."""
        d, bm, warps, _ = key
        mod = modules[key]
        B, H, S, L = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        for t in (q, k, v, o, do):
            assert t.is_contiguous() and t.data_ptr() % 16 == 0
        delta = torch.empty(B * H * S, device="cuda", dtype=torch.float32)
        dqa = torch.empty(B, H, S, d, device="cuda", dtype=torch.float32)
        dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
        rows_a_block = DELTA_THREADS // (d // 8)
        kd = driver.Launcher(mod, "delta_k", -(-B * H * S // rows_a_block), DELTA_THREADS,
                             [("O", "p"), ("dO", "p"), ("Delta", "p"), ("n", "i64")])
        kb = driver.Launcher(mod, "bwd_k", B * H * -(-L // (16 * warps)), 32 * warps,
                             [("Q", "p"), ("K", "p"), ("V", "p"), ("dO", "p"), ("Lse", "p"), ("Delta", "p"),
                              ("DQA", "p"), ("DK", "p"), ("DV", "p"), ("scale", "f32"), ("S", "i64"), ("L", "i64"),
                              ("causal", "i32")], shared_bytes(d, bm, warps))
        kc = driver.Launcher(mod, "dq_k", -(-B * H * S * d // 256), 256,
                             [("DQA", "p"), ("DQ", "p"), ("scale", "f32"), ("n", "i64")])
        vals = dict(Q=q.data_ptr(), K=k.data_ptr(), V=v.data_ptr(), O=o.data_ptr(), dO=do.data_ptr(),
                    Lse=lse.data_ptr(), Delta=delta.data_ptr(), DQA=dqa.data_ptr(), DQ=dq.data_ptr(),
                    DK=dk.data_ptr(), DV=dv.data_ptr(), scale=scale, S=S, L=L, n=B * H * S, causal=int(causal))

        def run():
            dqa.zero_()
            kd.launch(vals, stream, "delta")
            kb.launch(vals, stream, "flash backward")
            kc.launch(dict(vals, n=B * H * S * d), stream, "dq")
        return run, (dq, dk, dv)

    failures = check(torch, backward)
    print(f"CHECKS: {'PASS' if not failures else f'FAIL ({failures} failed)'} after "
          f"{time.perf_counter() - t_start:.1f} s", flush=True)
    timings(torch, backward)
    print(f"total {time.perf_counter() - t_start:.1f} s", flush=True)
    print("RESULT: " + ("PASS (every check)" if not failures else f"FAIL ({failures} checks failed)"))
    return 1 if failures else 0


def mask_of(torch, S: int, L: int, causal: bool):
    """torch's causal convention (is_causal: key j seen by query i where j <= i, top-left)."""
    return torch.ones(S, L, dtype=torch.bool, device="cuda").tril() if causal else None


def check(torch, backward) -> int:
    """Every case against f32 autograd; torch's own error in the same precision is the yardstick."""
    F = torch.nn.functional
    cases = [(2, 4, s, s) for s in (7, 33, 1000, 2048)] + [(2, 4, 33, 1000), (2, 4, 1000, 33), (1, 2, 1, 1),
                                                            (1, 3, 257, 130)]
    failures = 0
    print(f"{'case':<40} {'cfg':<7} " + " ".join(f"{g + ' err (torch)':>20}" for g in ("dQ", "dK", "dV"))
          + "  verdict")
    for d, configs in CONFIGS.items():
        for dtype in (torch.float16, torch.bfloat16):
            for B, H, S, L in cases:
                for causal in (False, True):
                    gen = torch.Generator(device="cuda").manual_seed(S * 7919 + L * 31 + d + causal)
                    q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=dtype, generator=gen)
                               for n in (S, L, L))
                    do = torch.randn(B, H, S, d, device="cuda", dtype=dtype, generator=gen)
                    scale = d ** -0.5
                    mask = mask_of(torch, S, L, causal)
                    qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
                    s = (qf @ kf.transpose(-1, -2)) * scale
                    if mask is not None:
                        s = s.masked_fill(~mask, float("-inf"))
                    lse = torch.logsumexp(s, -1).detach().contiguous()
                    of = torch.softmax(s, -1) @ vf
                    refs = torch.autograd.grad(of, (qf, kf, vf), do.float())
                    ql, kl, vl = (x.clone().requires_grad_() for x in (q, k, v))
                    ol = F.scaled_dot_product_attention(ql, kl, vl, attn_mask=mask, scale=scale)
                    lows = torch.autograd.grad(ol, (ql, kl, vl), do)
                    o = of.detach().to(dtype).contiguous()
                    case = f"B{B} H{H} S{S} L{L} D{d} {str(dtype)[6:]} {'causal' if causal else 'full'}"
                    for bm, warps in configs:
                        run, outs = backward((d, bm, warps, dtype == torch.bfloat16), q, k, v, o, do, lse,
                                             causal, scale)
                        run()
                        torch.cuda.synchronize()
                        cells, ok = [], True
                        for out, ref, low in zip(outs, refs, lows):
                            err = (out.float() - ref).abs().max().item()
                            terr = (low.float() - ref).abs().max().item()
                            top = ref.abs().max().item()
                            # torch's error in the same precision is the yardstick; 1 % of the largest
                            # gradient the floor (a wrong pair or a lost tile is of the order of it)
                            ok &= math.isfinite(err) and err <= max(4 * terr, 1e-2 * top, 1e-5)
                            cells.append(f"{err:9.2e} ({terr:8.2e})")
                        failures += not ok
                        print(f"{case:<40} {bm}x{16 * warps:<4} " + " ".join(f"{c:>20}" for c in cells)
                              + f"  {'PASS' if ok else 'FAIL'}", flush=True)
    return failures


def lse_of(torch, q, k, scale: float, causal: bool):
    """The rows' log-sum-exp in f32, a chunk of queries at a time (the S x L scores never whole)."""
    S, L = q.shape[2], k.shape[2]
    out = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
    kf = k.float()
    for i0 in range(0, S, 1024):
        s = (q[:, :, i0:i0 + 1024].float() @ kf.transpose(-1, -2)) * scale
        if causal:
            rows = torch.arange(i0, min(S, i0 + 1024), device="cuda")[:, None]
            s.masked_fill_(torch.arange(L, device="cuda")[None, :] > rows, float("-inf"))
        out[:, :, i0:i0 + 1024] = torch.logsumexp(s, -1)
        del s
    return out


def timings(torch, backward) -> None:
    """tcc's backward against torch SDPA's (CUDA events, interleaved, medians of 11)."""
    print(f"\n{'shape':<36} {'cfg':<8} {'tcc ms':>8} {'sdpa ms':>8} {'tcc TF/s':>9} {'sdpa TF/s':>9} "
          f"{'tcc/sdpa':>8}")
    for dtype in (torch.float16, torch.bfloat16):
        for d in CONFIGS:
            for S in TIMED[2]:
                for causal in (False, True):
                    if dtype == torch.float16 or S == TIMED[2][-1]:
                        _time_shape(torch, backward, dtype, d, S, causal)


def _time_shape(torch, backward, dtype, d: int, S: int, causal: bool) -> None:
    """One shape: every configuration of ``d`` against SDPA."""
    B, H = TIMED[:2]
    q, k, v, do = (torch.randn(B, H, S, d, device="cuda", dtype=dtype) for _ in range(4))
    scale = d ** -0.5
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    og = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, scale=scale)
    o = og.detach().contiguous()
    lse = lse_of(torch, q, k, scale, causal)
    flops = 2.5 * 4 * B * H * S * S * d / (2 if causal else 1)

    def sdpa():
        torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True)
    for bm, warps in CONFIGS[d]:
        run, _ = backward((d, bm, warps, dtype == torch.bfloat16), q, k, v, o, do, lse, causal, scale)
        a, b = _interleaved(torch, run, sdpa)
        print(f"B{B} H{H} S{S} D{d} {str(dtype)[6:]} {'causal' if causal else 'full':<7} "
              f"{bm}x{16 * warps:<5} {a:8.3f} {b:8.3f} {flops / a / 1e9:9.1f} {flops / b / 1e9:9.1f} "
              f"{b / a:8.3f}", flush=True)


def _interleaved(torch, f1, f2, reps: int = 11, inner: int = 2) -> tuple[float, float]:
    """Median milliseconds a call of f1 and of f2, measured in alternation."""
    for f in (f1, f2):
        f()
        f()
    times: list[list[float]] = [[], []]
    for _ in range(reps):
        for slot, f in enumerate((f1, f2)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                f()
            end.record()
            end.synchronize()
            times[slot].append(start.elapsed_time(end) / inner)
    return statistics.median(times[0]), statistics.median(times[1])


if __name__ == "__main__":
    sys.exit(main())
