"""Autotuning: the search stores its winner in the disk cache, and later processes use it without
searching again (asserted through the cache, never through timings)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import TWO_CORE_HOST, check_op, child_pythonpath
from test_schedule import MATMUL

import tcc
import tcc.tune
from tcc.cli import main
from tcc.errors import TccArgumentError
from tcc.runtime import cache
from tcc.testing import assert_matches, random_args, reference_results

ROOT = Path(__file__).resolve().parent.parent
BINDINGS = dict(M=64, K=48, N=40)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TCC_CACHE_DIR", str(tmp_path / "cache"))
    cache.MEMORY.clear()
    return tmp_path / "cache"


def _forbid_search(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("searched again")
    monkeypatch.setattr(tcc.tune, "search", refuse)


def _stored(op):
    return tcc.tune.stored_tuning(op, op.lowered(BINDINGS))


def test_tune_stores_its_winner_and_reuses_it(fresh_cache, monkeypatch, rng):
    op = tcc.compile(MATMUL, tune=3).matmul
    a, b = rng.standard_normal((64, 48), np.float32), rng.standard_normal((48, 40), np.float32)
    np.testing.assert_allclose(op(a, b), a @ b, rtol=1e-4, atol=1e-4)
    winner = _stored(op)
    assert winner is not None and set(winner.tiles) == {"C"} and winner.unroll >= 1
    assert op.lowered(BINDINGS).tuning == winner
    _forbid_search(monkeypatch)
    cache.MEMORY.clear()
    again = tcc.compile(MATMUL, tune=True).matmul
    np.testing.assert_allclose(again(a, b), a @ b, rtol=1e-4, atol=1e-4)
    # the tuned kernel is keyed apart from the untuned one
    plain = tcc.compile(MATMUL).matmul
    assert again.cache_key(BINDINGS, again.lowered(BINDINGS)) != plain.cache_key(BINDINGS)


def test_cli_tune_then_a_second_process_uses_the_winner(fresh_cache):
    path = fresh_cache.parent / "mm.tc"
    path.write_text(MATMUL)
    env = {**os.environ, "PYTHONPATH": child_pythonpath(ROOT)}
    # both processes fresh: state an earlier test left in this one cannot move the tuning's key
    tune = TWO_CORE_HOST + ("from tcc.cli import main\n"
                            f"raise SystemExit(main(['tune', {str(path)!r}, '-D', 'M=64', '-D', 'K=48', '-D', "
                            "'N=40', '--trials', '2']))\n")
    done = subprocess.run([sys.executable, "-c", tune], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "2 candidates" in done.stdout and "best: C: kc=" in done.stdout, done.stdout
    script = TWO_CORE_HOST + (
        "import numpy as np, tcc, tcc.tune\n"
        "def refuse(*a, **k): raise SystemExit('searched again')\n"
        "tcc.tune.search = refuse\n"
        f"op = tcc.compile({str(path)!r}, tune=True).matmul\n"
        "a, b = np.ones((64, 48), np.float32), np.ones((48, 40), np.float32)\n"
        "assert op.lowered(dict(M=64, K=48, N=40)).tuning is not None\n"
        "assert (op(a, b) == 48).all()\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


def test_a_corrupt_entry_is_a_miss(fresh_cache):
    op = tcc.compile(MATMUL, tune=2).matmul
    low = op.lowered(BINDINGS)
    key = tcc.tune.tuning_key(op, low)
    cache.DiskCache(fresh_cache).put(key, b"{not json", ".json")
    assert tcc.tune.stored_tuning(op, low) is None
    cache.DiskCache(fresh_cache).put_json(key, {"tiles": "nonsense"})
    assert tcc.tune.stored_tuning(op, low) is None


@pytest.mark.parametrize("size", [1, 7, 33])
def test_tuned_matmul_matches_reference(size, fresh_cache, rng):
    op = tcc.compile(MATMUL, tune=2).matmul
    bindings = dict(M=size, K=size + 2, N=size)
    args = random_args(op.te, bindings, rng)
    expected = reference_results(op.te, args, bindings)
    out = np.full(expected[0].shape, np.nan, np.float32)
    op(*args, out=out)
    assert_matches(out, expected[0], op.te.tensors["C"].dtype, "C")
    assert (op.lowered(bindings).tuning is not None) == (size == 33)  # 1 and 7 are below the GEMM threshold


def test_ops_without_a_gemm_are_not_tuned(fresh_cache, monkeypatch, rng):
    _forbid_search(monkeypatch)
    check_op("op add(X: f32[N], Y: f32[N]) -> Z: f32[N] { Z[i] = X[i] + Y[i] }", "add", dict(N=7), rng)
    src = "op add(X: f32[N], Y: f32[N]) -> Z: f32[N] { Z[i] = X[i] + Y[i] }"
    assert tcc.compile(src, tune=True).add.lowered(dict(N=7)).tuning is None


def test_user_schedule_is_not_tuned(fresh_cache, monkeypatch):
    _forbid_search(monkeypatch)
    op = tcc.compile(MATMUL, tune=True).matmul.schedule("split(i, 4)")
    assert op.lowered(BINDINGS).tuning is None


def test_tune_argument_errors(tmp_path, capsys):
    with pytest.raises(TccArgumentError, match="number of trials"):
        tcc.compile(MATMUL, tune="fast")
    path = tmp_path / "mm.tc"
    path.write_text(MATMUL)
    assert main(["tune", str(path), "-D", "M=64", "-D", "K=64", "-D", "N=64", "--trials", "0"]) == 1
    assert "--trials 0" in capsys.readouterr().err
    assert main(["tune", str(path), "-D", "M=2", "-D", "K=2", "-D", "N=2"]) == 0
    assert "no matrix multiply" in capsys.readouterr().out


def test_a_dynamic_kernel_is_tuned_for_the_sizes_given(fresh_cache, monkeypatch, rng):
    """tune={"M": sizes}: the one dynamic kernel is searched once, each candidate timed at every
    size (the other symbols at the call's), and the winner is stored under those sizes."""
    seen = []
    real = tcc.tune.search

    def spy(op, lowered, trials, progress=True, points=()):
        seen.append([dict(p) for p in points])
        return real(op, lowered, 3, progress=False, points=points)

    monkeypatch.setattr(tcc.tune, "search", spy)
    op = tcc.compile(MATMUL, dynamic=("M",), tune={"M": (7, 64, 200)}).matmul
    b = rng.standard_normal((48, 40), np.float32)
    for m in (7, 33, 200, 1):
        a = rng.standard_normal((m, 48), np.float32)
        np.testing.assert_allclose(op(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert op.compiles == 1
    assert seen == [[{"M": m, "K": 48, "N": 40} for m in (7, 64, 200)]]
    _forbid_search(monkeypatch)
    cache.MEMORY.clear()
    again = tcc.compile(MATMUL, dynamic=("M",), tune={"M": (7, 64, 200)}).matmul
    np.testing.assert_allclose(again(a, b), a @ b, rtol=1e-4, atol=1e-4)  # the stored winner
    with pytest.raises(AssertionError, match="searched again"):  # other sizes: another search
        tcc.compile(MATMUL, dynamic=("M",), tune={"M": (8, 512)}).matmul(a, b)


def test_the_winner_over_several_sizes_is_best_on_the_mean_ratio(monkeypatch):
    """A candidate much faster at one size but slower at another loses to one a little faster
    at every size (times are fed in, not measured)."""
    op = tcc.compile(MATMUL, dynamic=("M",)).matmul
    lowered = op.lowered({**BINDINGS}, dynamic=frozenset({"M"}))
    times = iter([[1.0, 1.0, 1.0], [0.2, 3.0, 0.2], [0.9, 0.9, 0.9], [1.5, 1.5, 1.5]])
    monkeypatch.setattr(tcc.tune, "_timer", lambda *args: lambda tuning: next(times, [2.0, 2.0, 2.0]))
    points = [{**BINDINGS, "M": m} for m in (8, 64, 512)]
    result = tcc.tune.search(op, lowered, trials=4, progress=False, points=points)
    assert result.best == tcc.tune.candidates(lowered)[2]
    assert result.best_time == pytest.approx(2.7) and result.default_time == pytest.approx(3.0)


def test_tune_sizes_are_checked():
    with pytest.raises(TccArgumentError, match="tune= maps a shape symbol to its sizes"):
        tcc.compile(MATMUL, tune={"Q": (8, 16)})
    with pytest.raises(TccArgumentError, match="pair up position by position"):
        tcc.compile(MATMUL, tune={"M": (8, 16), "N": (1, 2, 3)})
