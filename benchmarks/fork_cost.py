"""When a parallel loop pays on this host: an elementwise op over N f32 elements, its loop split
into chunks of 256 and run on tcc's thread pool, against the same loop serial.

    python benchmarks/fork_cost.py [N ...] [--repeat 400] [--gap-us 20]

Calls are interleaved (serial, parallel on 1 thread, parallel on 2), with a busy-wait of
``--gap-us`` between calls, about the Python time between the kernels of a model's call, so that
the pool's workers are as awake as they are there. Printed per N: the median of each and the ratio
of two threads to serial; the N where it drops below 1 is the work a fork must save
(``PARALLEL_MIN_WORK`` in tcc/passes/autoschedule_cpu/gemm.py is that in loop iterations).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import tcc

BODY = "op f(A: f32[N], B: f32[N]) -> C: f32[N] { C[i] = A[i] * B[i] + A[i] }"


def median_us(runs: dict, args: tuple, out: np.ndarray, repeat: int, gap: float) -> dict[str, float]:
    times: dict[str, list[int]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, (fn, threads) in runs.items():
            tcc.set_num_threads(threads)
            start = time.perf_counter_ns()
            fn(*args, out=out)
            times[name].append(time.perf_counter_ns() - start)
            until = time.perf_counter() + gap
            while time.perf_counter() < until:
                pass
    return {name: statistics.median(t) / 1e3 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sizes", nargs="*", type=int, default=[4096, 16384, 32768, 65536, 131072, 262144])
    parser.add_argument("--repeat", type=int, default=400)
    parser.add_argument("--gap-us", type=float, default=20.0)
    a = parser.parse_args()
    parallel = tcc.compile(BODY + "\nschedule f cpu { split(i, 256, io, ii); vectorize(ii); parallel(io) }")["f"]
    serial = tcc.compile(BODY + "\nschedule f cpu { split(i, 256, io, ii); vectorize(ii) }")["f"]
    warm = np.ones(1 << 12, np.float32)
    median_us({"warm": (parallel, 2)}, (warm, warm), np.empty_like(warm), a.repeat, a.gap_us * 1e-6)  # workers up
    for n in a.sizes:
        x, y = np.random.rand(n).astype(np.float32), np.random.rand(n).astype(np.float32)
        out = np.empty_like(x)
        m = median_us({"serial": (serial, 1), "1": (parallel, 1), "2": (parallel, 2)},
                      (x, y), out, a.repeat, a.gap_us * 1e-6)
        print(f"N {n:8d}: serial {m['serial']:8.2f} us, parallel on 1 thread {m['1']:8.2f} us, on 2 {m['2']:8.2f} us;"
              f" 2 threads / serial {m['2'] / m['serial']:5.2f}; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
