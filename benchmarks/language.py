"""The language's newer constructs on the CPU, side by side with PyTorch (eager) in one process:
embedding lookup, label pick, dropout, RMSNorm in f32 and f16, and the copy of the same output
bytes (NumPy's ``copyto``), the floor of a memory-bound op.

Each workload times tcc and its anchor in interleaved rounds (the order swapping every round);
a round's figure is the median of a burst of warm calls, and a ratio is the median over rounds of
tcc's time / the anchor's time in the same round (lower is better for tcc). Checks the answers
first (dropout: the same keep fraction, since the two generators differ).
Usage: python benchmarks/language.py [--runs 7]
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
op embedding(E: f32[V, D], idx: i64[N]) -> Y: f32[N, D] {
    Y[n, d] = E[idx[n], d]
}
op pick(X: f32[N, C], lab: i64[N]) -> Y: f32[N] {
    Y[n] = X[n, lab[n]]
}
op dropout(X: f32[N, D], p: f32, seed: i64) -> Y: f32[N, D] {
    Y[n, d] = select(rand(seed, n, d) < p, 0.0, X[n, d] / (1.0 - p))
}
op rmsnorm[T: float](X: T[N, D], g: T[D]) -> Y: T[N, D] {
    r[n] = rsqrt(sum[d](f32(X[n, d]) * f32(X[n, d])) / D + 1e-6)
    Y[n, d] = T(f32(X[n, d]) * r[n] * f32(g[d]))
}
"""
BURST = 0.05  # seconds of calls per side and round


def burst(fn: Callable[[], object]) -> float:
    """The median time of warm calls, at least three and at least BURST seconds of them."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < BURST:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare(tcc_fn: Callable[[], object], anchor: Callable[[], object], runs: int) -> tuple[float, float, float]:
    """(tcc median s, anchor median s, median ratio), interleaved rounds."""
    ours, theirs, ratios = [], [], []
    for r in range(runs):
        pair = [burst(tcc_fn), burst(anchor)] if r % 2 == 0 else list(reversed([burst(anchor), burst(tcc_fn)]))
        ours.append(pair[0])
        theirs.append(pair[1])
        ratios.append(pair[0] / pair[1])
    return statistics.median(ours), statistics.median(theirs), statistics.median(ratios)


def workloads(lib: tcc.Library, rng: np.random.Generator):
    """(name, tcc call, torch call, output bytes, check)."""
    E = rng.standard_normal((30000, 128)).astype(np.float32)
    idx = rng.integers(0, 30000, 512)
    Et, idxt = torch.from_numpy(E), torch.from_numpy(idx)
    yield ("embedding 30000x128, 512 ids", lambda: lib.embedding(E, idx), lambda: torch.nn.functional.embedding(
        idxt, Et), 512 * 128 * 4, lambda: np.array_equal(lib.embedding(E, idx), E[idx]))
    E2, idx2 = rng.standard_normal((50000, 768)).astype(np.float32), rng.integers(0, 50000, 4096)
    E2t, idx2t = torch.from_numpy(E2), torch.from_numpy(idx2)
    yield ("embedding 50000x768, 4096 ids", lambda: lib.embedding(E2, idx2),
           lambda: torch.nn.functional.embedding(idx2t, E2t), 4096 * 768 * 4, lambda: True)
    X, lab = rng.standard_normal((4096, 32000)).astype(np.float32), rng.integers(0, 32000, 4096)
    Xt, labt = torch.from_numpy(X), torch.from_numpy(lab)
    rows = torch.arange(4096)
    yield ("label pick 4096x32000", lambda: lib.pick(X, lab), lambda: Xt[rows, labt], 4096 * 4,
           lambda: np.array_equal(lib.pick(X, lab), X[np.arange(4096), lab]))
    D = rng.standard_normal((4096, 4096)).astype(np.float32)
    Dt = torch.from_numpy(D)
    yield ("dropout 4096x4096 p=0.1", lambda: lib.dropout(D, np.float32(0.1), 7),
           lambda: torch.nn.functional.dropout(Dt, 0.1, training=True), D.nbytes,
           lambda: abs((lib.dropout(D, np.float32(0.1), 7) != 0).mean() - 0.9) < 0.01)
    for dtype, name in ((np.float32, "f32"), (np.float16, "f16")):
        R, g = rng.standard_normal((4096, 1024)).astype(dtype), rng.standard_normal(1024).astype(dtype)
        Rt, gt = torch.from_numpy(R), torch.from_numpy(g)
        yield (f"rmsnorm 4096x1024 {name}", lambda R=R, g=g: lib.rmsnorm(R, g),
               lambda Rt=Rt, gt=gt: torch.nn.functional.rms_norm(Rt, (1024,), gt, 1e-6), R.nbytes,
               lambda R=R, g=g, Rt=Rt, gt=gt: np.allclose(lib.rmsnorm(R, g).astype(np.float32),
                                                          torch.nn.functional.rms_norm(Rt.float(), (1024,), gt.float(),
                                                                                       1e-6).numpy(), atol=3e-2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    lib = tcc.compile(SOURCE)
    rng = np.random.default_rng(0)
    threads = tcc.get_num_threads() or "default"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; tcc threads {threads}")
    print(f"{'workload':32s} {'tcc ms':>9s} {'torch ms':>9s} {'tcc/torch':>9s} {'copy ms':>8s} {'tcc/copy':>8s}")
    for name, ours, theirs, nbytes, check in workloads(lib, rng):
        assert check(), f"{name}: tcc's answer is wrong"
        src, dst = np.empty(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
        src.fill(1.0)
        copy = burst(lambda src=src, dst=dst: np.copyto(dst, src))
        t, a, ratio = compare(ours, theirs, args.runs)
        print(f"{name:32s} {t * 1e3:9.3f} {a * 1e3:9.3f} {ratio:9.2f} {copy * 1e3:8.3f} {t / copy:8.2f}")


if __name__ == "__main__":
    main()
