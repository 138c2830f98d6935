"""``tcc bench --roofline``: FLOPs and bytes counted from the TE, the machine's peaks measured once
and cached, the table and the plot; and the counts checked against the formulas they stand for."""

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


def test_bench_roofline_on_the_cpu(fresh_cache, tmp_path, capsys, monkeypatch):
    path = tmp_path / "ops.tc"
    path.write_text(MATMUL + "\n" + SOFTMAX)
    measured = []
    real = roofline._cpu_peaks

    def counted():
        measured.append(1)
        return real()
    monkeypatch.setattr(roofline, "_cpu_peaks", counted)
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
