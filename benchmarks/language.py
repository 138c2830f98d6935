"""The language's newer constructs side by side with PyTorch (eager) in one process: embedding
lookup (and the same with its ids clamped, which needs no index check: the check's cost) and its
gradient (a scatter-add), label pick, dropout, RMSNorm (one generic op for f32, f16
and bf16), cumsum (a scan) and a linear recurrence, on the CPU or CUDA; each also against the copy
of its output bytes (the floor of a memory-bound op).

Each workload times tcc and its anchor in interleaved rounds (the order swapping every round); a
round's figure is the median of a burst of warm calls (CUDA: CUDA events around each call), and a
ratio is the median over rounds of tcc's time / the anchor's time in the same round (lower is
better for tcc). The answers are checked first (dropout: the keep fraction, as the generators
differ). The linear recurrence has no PyTorch operator: its anchor column is a Python loop over
time steps of vectorised PyTorch ops, what a user would write.
Usage: python benchmarks/language.py [--device cpu|cuda] [--runs 7] [--only embedding pick ...]
(``--only``: the workloads whose name starts with one of the words).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

import tcc

SOURCE = """
op embedding(E: f32[V, D], idx: i64[N]) -> Y: f32[N, D] {
    Y[n, d] = E[idx[n], d]
}
op embedding_clamped(E: f32[V, D], idx: i64[N]) -> Y: f32[N, D] {
    Y[n, d] = E[min(max(idx[n], 0), V - 1), d]
}
op embedding_grad[V = 1](dY: f32[N, D], idx: i64[N]) -> dE: f32[V, D] {
    dE[v, d] = 0.0
    dE[idx[n], d] += dY[n, d]
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
op cumsum(X: f32[B, L]) -> Y: f32[B, L] {
    Y[b, i] = sum[j: i + 1](X[b, j])
}
op linear_recurrence(A: f32[T, D], X: f32[T, D]) -> H: f32[T, D] {
    H[t, d] = select(t == 0, X[t, d], A[t, d] * H[t - 1, d] + X[t, d])
}
"""
BURST = 0.05  # seconds of calls per side and round


CALLS_CUDA = 10  # queued calls between a CUDA timing's two events


class Timer:
    """Times one call: wall clock on the CPU; on the GPU CUDA events around CALLS_CUDA queued calls
    (a call's GPU time, as events around a stream of calls give it; with one call between the
    events, the host's dispatch before the launch counted as the kernel's time)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def once(self, fn: Callable[[], object]) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CALLS_CUDA):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / CALLS_CUDA

    def burst(self, fn: Callable[[], object]) -> float:
        """The median time of warm calls, at least three and at least BURST seconds of them."""
        fn()
        times: list[float] = []
        begin = time.perf_counter()
        while len(times) < 3 or time.perf_counter() - begin < BURST:
            times.append(self.once(fn))
        return statistics.median(times)

    def compare(self, ours: Callable[[], object], theirs: Callable[[], object], runs: int
                ) -> tuple[float, float, float]:
        """(tcc median s, anchor median s, median ratio) over interleaved rounds."""
        mine, anchor, ratios = [], [], []
        for r in range(runs):
            if r % 2 == 0:
                a, b = self.burst(ours), self.burst(theirs)
            else:
                b, a = self.burst(theirs), self.burst(ours)
            mine.append(a)
            anchor.append(b)
            ratios.append(a / b)
        return statistics.median(mine), statistics.median(anchor), statistics.median(ratios)


def _recurrence_loop(A: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    H = torch.empty_like(X)
    H[0] = X[0]
    for t in range(1, X.shape[0]):
        H[t] = A[t] * H[t - 1] + X[t]
    return H


def workloads(lib: tcc.Library, device: str, rng: np.random.Generator) -> Iterator[tuple]:
    """(name, tcc call, torch call, output bytes, check)."""
    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(device)

    E, idx = t(rng.standard_normal((50000, 768)).astype(np.float32)), t(rng.integers(0, 50000, 4096))
    yield ("embedding 50000x768, 4096 ids", lambda: lib.embedding(E, idx),
           lambda: torch.nn.functional.embedding(idx, E), 4096 * 768 * 4,
           lambda: torch.equal(torch.as_tensor(lib.embedding(E, idx)), E[idx]))
    yield ("embedding, ids clamped (no check)", lambda: lib.embedding_clamped(E, idx),  # what the check costs
           lambda: torch.nn.functional.embedding(idx, E), 4096 * 768 * 4,
           lambda: torch.equal(torch.as_tensor(lib.embedding_clamped(E, idx)), E[idx]))
    dY, ids = t(rng.standard_normal((4096, 768)).astype(np.float32)), t(rng.integers(0, 30000, 4096))
    zeros = torch.zeros(30000, 768, device=device)
    yield ("embedding grad 4096 ids -> 30000x768", lambda: lib.embedding_grad(dY, ids, V=30000),
           lambda: zeros.clone().index_add_(0, ids, dY), 30000 * 768 * 4,
           lambda: torch.allclose(torch.as_tensor(lib.embedding_grad(dY, ids, V=30000)),
                                  zeros.clone().index_add_(0, ids, dY), atol=1e-4))
    X, lab = t(rng.standard_normal((4096, 32000)).astype(np.float32)), t(rng.integers(0, 32000, 4096))
    rows = torch.arange(4096, device=device)
    yield ("label pick 4096x32000", lambda: lib.pick(X, lab), lambda: X[rows, lab], 4096 * 4,
           lambda: torch.equal(torch.as_tensor(lib.pick(X, lab)), X[rows, lab]))
    D = t(rng.standard_normal((4096, 4096)).astype(np.float32))
    yield ("dropout 4096x4096 p=0.1", lambda: lib.dropout(D, 0.1, 7),
           lambda: torch.nn.functional.dropout(D, 0.1, training=True), 4096 * 4096 * 4,
           lambda: abs(float((torch.as_tensor(lib.dropout(D, 0.1, 7)) != 0).float().mean()) - 0.9) < 0.01)
    kinds = [(torch.float32, "f32"), (torch.float16, "f16")] + ([(torch.bfloat16, "bf16")] if device == "cuda" else [])
    for dtype, name in kinds:
        R, g = t(rng.standard_normal((8192, 1024)).astype(np.float32)).to(dtype), t(rng.standard_normal(1024).astype(
            np.float32)).to(dtype)
        yield (f"rmsnorm 8192x1024 {name}", lambda R=R, g=g: lib.rmsnorm(R, g),
               lambda R=R, g=g: torch.nn.functional.rms_norm(R, (1024,), g, 1e-6), R.numel() * R.element_size(),
               lambda R=R, g=g: torch.allclose(torch.as_tensor(lib.rmsnorm(R, g)).float(), torch.nn.functional.rms_norm(
                   R.float(), (1024,), g.float(), 1e-6), rtol=2e-2, atol=3e-2))
    C = t(rng.standard_normal((64, 65536)).astype(np.float32))
    yield ("cumsum 64x65536", lambda: lib.cumsum(C), lambda: torch.cumsum(C, 1), C.numel() * 4,
           lambda: torch.allclose(torch.as_tensor(lib.cumsum(C)), torch.cumsum(C, 1), rtol=1e-3, atol=1e-2))
    A, Xr = t(rng.uniform(0.5, 1.0, (1024, 1024)).astype(np.float32)), t(rng.standard_normal((1024, 1024)).astype(
        np.float32))
    yield ("linear recurrence 1024x1024", lambda: lib.linear_recurrence(A, Xr), lambda: _recurrence_loop(A, Xr),
           A.numel() * 4, lambda: torch.allclose(torch.as_tensor(lib.linear_recurrence(A, Xr)),
                                                 _recurrence_loop(A, Xr), rtol=1e-3, atol=1e-3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--only", nargs="+", metavar="WORD", help="the workloads whose name starts with a WORD")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    lib = tcc.compile(SOURCE, target=args.device)
    timer = Timer(cuda)
    rng = np.random.default_rng(0)
    where = torch.cuda.get_device_name() if cuda else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__} on {args.device} ({where})")
    print(f"{'workload':38s} {'tcc ms':>9s} {'torch ms':>9s} {'tcc/torch':>9s} {'copy ms':>8s} {'tcc/copy':>8s}")
    for name, ours, theirs, nbytes, check in workloads(lib, args.device, rng):
        if args.only and not any(name.startswith(word) for word in args.only):
            continue
        assert check(), f"{name}: tcc's answer is wrong"
        src = torch.ones(nbytes // 4, device=args.device)
        dst = torch.empty_like(src)
        copy = timer.burst(lambda src=src, dst=dst: dst.copy_(src))
        mine, anchor, ratio = timer.compare(ours, theirs, args.runs)
        print(f"{name:38s} {mine * 1e3:9.3f} {anchor * 1e3:9.3f} {ratio:9.2f} {copy * 1e3:8.3f} {mine / copy:8.2f}",
              flush=True)


if __name__ == "__main__":
    main()
