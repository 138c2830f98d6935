"""A prefix sum of 4x the length takes about 4x the time: ``sum[j: i + 1]`` is a scan (linear
work), never a quadratic loop. Times DSL.md's cumsum at length L and 4L (same rows), prints both
and their ratio; with --triangle also the triangular loop the scan replaces (a reduction whose
body uses ``i``, which the scans pass leaves alone), to show what quadratic looks like.

    python benchmarks/scan.py [--rows 64] [--length 4096] [--triangle] [--device cpu|cuda]

On CUDA the inputs are torch tensors on the GPU and each call is timed to its completion.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import tcc

CUMSUM = "op cumsum(X: f32[B, L]) -> Y: f32[B, L] {\n    Y[b, i] = sum[j: i + 1](X[b, j])\n}\n"
TRIANGLE = "op tri(X: f32[B, L], W: f32[L]) -> Y: f32[B, L] {\n    Y[b, i] = sum[j: i + 1](X[b, j] * W[i])\n}\n"


def best(fn, *args, repeat: int = 20, sync=lambda: None) -> float:
    """The fastest of ``repeat`` calls, in seconds (after one warm-up call that compiles)."""
    fn(*args)
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def ratio(fn, rows: int, length: int, extra: bool, device: str) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    put, sync = (lambda a: a), (lambda: None)
    if device == "cuda":
        import torch

        put, sync = (lambda a: torch.from_numpy(a).cuda()), torch.cuda.synchronize
    out = []
    for n in (length, 4 * length):
        args = [put(rng.standard_normal((rows, n)).astype(np.float32))]
        if extra:
            args.append(put(np.ones(n, np.float32)))
        out.append(best(fn, *args, sync=sync))
    return out[0], out[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--triangle", action="store_true")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = parser.parse_args()
    short, long = ratio(tcc.compile(CUMSUM, target=a.device).cumsum, a.rows, a.length, False, a.device)
    print(f"cumsum {a.rows}x{a.length}: {short * 1e6:.1f} us; {a.rows}x{4 * a.length}: {long * 1e6:.1f} us; "
          f"ratio {long / short:.2f} (linear: ~4)")
    if a.triangle:
        short, long = ratio(tcc.compile(TRIANGLE, target=a.device).tri, a.rows, a.length // 8, True,
                            a.device)
        print(f"triangle {a.rows}x{a.length // 8}: {short * 1e6:.1f} us; {a.rows}x{a.length // 2}: "
              f"{long * 1e6:.1f} us; ratio {long / short:.2f} (quadratic: ~16)")


if __name__ == "__main__":
    main()
