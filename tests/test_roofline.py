"""``tcc bench --roofline``: FLOPs and bytes counted from the TE, the machine's peaks measured once
and cached, the table and the plot; and the counts checked against the formulas they stand for."""

import time

import numpy as np
import pytest

import tcc
from tcc import roofline
from tcc.cli import main
from tcc.passes.te.specialize import specialize
from tcc.target import CpuTarget, CudaTarget

MATMUL = "op matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }"
SOFTMAX = """op softmax(X: f32[N, C]) -> Y: f32[N, C] {
    m[n] = max[c](X[n, c])
    e[n, c] = exp(X[n, c] - m[n])
    s[n] = sum[c](e[n, c])
    Y[n, c] = e[n, c] / s[n]
}"""
HGEMM = "op h(A: f16[M, K], B: f16[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j])) }"


CPU = CpuTarget()


def _cost(src, bindings, target=CPU):
    op = next(iter(tcc.compile(src)))
    return roofline.cost(specialize(op.te, bindings), target)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 33, 5), (64, 64, 64)])
def test_matmul_counts(m, k, n):
    c = _cost(MATMUL, dict(M=m, K=k, N=n))
    assert c.flops == 2 * m * n * k and c.nbytes == 4 * (m * k + k * n + m * n) and c.arith == "f32"


def test_softmax_counts():
    c = _cost(SOFTMAX, dict(N=7, C=33))
    # max combine, sub + exp, sum combine, div: five operations per element; X read, Y written
    assert c.flops == 5 * 7 * 33 and c.nbytes == 2 * 4 * 7 * 33


def test_half_operands_are_bound_by_tensor_cores_on_cuda():
    assert _cost(HGEMM, dict(M=8, K=8, N=8), CudaTarget()).arith == "f16"
    assert _cost(HGEMM, dict(M=8, K=8, N=8)).arith == "f32"


def test_floor_and_fraction():
    c = roofline.Cost(flops=2_000_000, nbytes=1_000_000, arith="f32")
    peak = {"bytes": 1e9, "f32": 1e12}
    p = roofline.place("k", c, 2e-3, peak)
    assert p.bound == "memory" and p.floor == pytest.approx(1e-3) and p.fraction == pytest.approx(0.5)
    compute_bound = roofline.place("k", roofline.Cost(10**12, 10, "f32"), 2.0, peak)
    assert compute_bound.bound == "f32 math" and compute_bound.fraction == pytest.approx(0.5)


def fake_peaks(monkeypatch, *results: dict[str, float]) -> list[int]:
    """Measurements of the CPU's peaks return ``results`` in turn (the last one after them);
    the list returned counts them."""
    measured: list[int] = []

    def measure():
        measured.append(1)
        return dict(results[min(len(measured), len(results)) - 1])
    monkeypatch.setattr(roofline, "_cpu_peaks", measure)
    return measured


def test_bench_roofline_on_the_cpu(fresh_cache, tmp_path, capsys, monkeypatch):
    path = tmp_path / "ops.tc"
    path.write_text(MATMUL + "\n" + SOFTMAX)
    measured = fake_peaks(monkeypatch, {"bytes": 2e10, "f32": 1e12})
    png = tmp_path / "r.png"
    argv = ["bench", str(path), "-D", "M=64", "-D", "K=33", "-D", "N=48", "-D", "C=65", "--repeat", "3",
            "--roofline", "--png", str(png)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| matmul | 0.0002028 |" in out and "| softmax |" in out  # 2 * 64 * 48 * 33 FLOPs
    row = next(line for line in out.splitlines() if line.startswith("| matmul"))
    fraction = float(row.split("|")[-2])
    assert 0 < fraction < 10  # measured: positive, and not absurdly above the ceiling
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(argv) == 0 and len(measured) == 1  # the peaks are measured once per machine, then cached
    other = tmp_path / "add.tc"
    other.write_text("op add(X: f32[N], Y: f32[N]) -> Z: f32[N] { Z[i] = X[i] + Y[i] }")
    assert main(["bench", str(other), "-D", "N=1000", "--repeat", "2", "--roofline", "--png", str(png)]) == 0
    assert len(measured) == 1  # another file, the same machine


def test_bench_argument_errors(tmp_path, capsys):
    path = tmp_path / "mm.tc"
    path.write_text(MATMUL)
    assert main(["bench", str(path), "--op", "nope"]) == 1
    assert "no op 'nope'" in capsys.readouterr().err
    assert main(["bench", str(path), "-D", "M=4", "-D", "K=4"]) == 1
    assert "no size for N" in capsys.readouterr().err
    assert main(["bench", str(path), "--repeat", "0", "-D", "M=4", "-D", "K=4", "-D", "N=4"]) == 1


def test_cost_needs_sizes():
    op = tcc.compile(MATMUL).matmul
    with pytest.raises(tcc.TccError, match="concrete sizes"):
        roofline.cost(op.te, CpuTarget())
    assert np.isinf(roofline.Cost(0, 0, "f32").intensity)


BUSY = {"bytes": 1e9, "f32": 3e9}  # what a measurement on a machine busy with other work may give
IDLE = {"bytes": 2e10, "f32": 2e11}
HOST = CpuTarget(cores=2)  # expects about 2 cores x 16 lanes x 2 FMA pipes x 2 flop x 2 GHz


def test_an_implausible_peak_is_measured_again(fresh_cache, monkeypatch):
    assert BUSY["f32"] < roofline.expected_f32(HOST) / roofline.FAR_BELOW < IDLE["f32"]
    measured = fake_peaks(monkeypatch, BUSY, IDLE)
    assert roofline.peaks(HOST, "host") == IDLE and len(measured) == 2
    assert roofline.peaks(HOST, "host") == IDLE and len(measured) == 2  # stored, plausible: kept


def test_a_peak_that_stays_implausible_is_kept(fresh_cache, monkeypatch):
    """A machine that never reaches the expected order is measured ATTEMPTS times, not at each use."""
    measured = fake_peaks(monkeypatch, BUSY)
    assert roofline.peaks(HOST, "host") == BUSY and len(measured) == roofline.ATTEMPTS
    assert roofline.peaks(HOST, "host") == BUSY and len(measured) == roofline.ATTEMPTS


def test_a_kernel_faster_than_the_peak_has_it_measured_again(fresh_cache, monkeypatch):
    """The stored f32 peak below a rate a kernel reached: measured again, and the ceiling is at
    least that rate, so no kernel is placed above 100% of its compute floor."""
    measured = fake_peaks(monkeypatch, IDLE, {"bytes": 2e10, "f32": 1e11})
    roofline.peaks(HOST, "host")
    kernel = roofline.Cost(flops=6 * 10**11, nbytes=10**6, arith="f32")  # 3e11 FLOP/s in 2 s
    peak = roofline.peaks(HOST, "host", at_least=roofline.reached([(kernel, 2.0)]))
    assert len(measured) == 2 and peak["f32"] == 3e11 and peak["bytes"] == 2e10
    assert roofline.place("k", kernel, 2.0, peak).fraction == pytest.approx(1.0)
    assert roofline.peaks(HOST, "host") == peak and len(measured) == 2  # stored


def test_peaks_are_kept_per_target(fresh_cache, monkeypatch):
    measured = fake_peaks(monkeypatch, IDLE)
    roofline.peaks(HOST, "host")
    roofline.peaks(CpuTarget(cores=4), "host")
    roofline.peaks(HOST, "host")
    assert len(measured) == 2


def test_measure_peaks_measures_anew(fresh_cache, monkeypatch, tmp_path, capsys):
    measured = fake_peaks(monkeypatch, IDLE, {"bytes": 3e10, "f32": 1.5e11})
    path = tmp_path / "mm.tc"
    path.write_text(MATMUL)
    argv = ["bench", str(path), "-D", "M=8", "-D", "K=8", "-D", "N=8", "--repeat", "1",
            "--png", str(tmp_path / "r.png")]
    assert main([*argv, "--roofline"]) == 0 and len(measured) == 1
    assert main([*argv, "--measure-peaks"]) == 0 and len(measured) == 2
    assert "bandwidth 30.0 GB/s, f32 0.15 TFLOP/s" in capsys.readouterr().out  # the new measurement, not a max


def test_the_best_burst_counts(monkeypatch):
    """A probe slowed by other work in its first bursts is timed at its best burst."""
    monkeypatch.setattr(roofline, "PAUSE_S", 0.0)
    delays = iter([0.05] * 4 + [0.001] * 100)  # the warm-up and the first burst's three runs are slow
    best = roofline._best(lambda: time.sleep(next(delays)), 3)
    assert best < 0.02


def test_the_cpu_probes_measure(fresh_cache):
    """The real probes: positive numbers, the caller's thread count left as it was."""
    tcc.set_num_threads(1)
    try:
        peak = roofline._cpu_peaks()
        assert tcc.get_num_threads() == 1
    finally:
        tcc.set_num_threads(None)
    assert peak["bytes"] > 1e8 and peak["f32"] > 1e8
