"""GPU autotuning without a GPU: the search space of the CUDA auto-scheduler, every candidate
compiled through NVRTC, the winner's round trip through the disk cache, and a clean error where
a search would need a device to time on. (The timed search itself runs on the GPU machine.)"""

from dataclasses import replace

import numpy as np
import pytest

import tcc
import tcc.cli
import tcc.tune
from tcc.passes.autoschedule_cuda.gemm import fits
from tcc.passes.autoschedule_cuda.schedule import CudaTuning
from tcc.passes.pipeline import Tuning
from tcc.runtime import cache
from tcc.runtime import cuda as cuda_backend

pytest.importorskip("cuda.bindings.nvrtc")

MATMUL = "op matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }"
ADD = "op add(X: f32[N], Y: f32[N]) -> Z: f32[N] { Z[i] = X[i] + Y[i] }"
BINDINGS = dict(M=67, K=33, N=129)


def test_search_space_of_a_gemm():
    lowered = tcc.compile(MATMUL, target="cuda").matmul.lowered(BINDINGS)
    found = tcc.tune.candidates(lowered, trials=100)
    knobs = [t.cuda for t in found]
    assert knobs[0] == CudaTuning()  # the auto-scheduler's own choice first
    assert len(set(knobs)) == len(knobs) and all(k is not None for k in knobs)
    assert all(fits(k.tile) for k in knobs if k.tile is not None)
    assert {k.stages for k in knobs} == {1, 2} and {k.warps for k in knobs} >= {4, 8, 16}
    assert len(tcc.tune.candidates(lowered, trials=5)) == 5
    default = [t.cuda for t in tcc.tune.candidates(lowered)]  # the default 12 trials reach every knob
    assert {k.stages for k in default} == {1, 2} and {k.warps for k in default} >= {2, 4, 16}


def test_an_elementwise_op_tunes_block_size_only():
    lowered = tcc.compile(ADD, target="cuda").add.lowered(dict(N=1000))
    assert tcc.tune.tunable(lowered) and tcc.tune.kernel_kinds(lowered) == {"flat"}
    knobs = [t.cuda for t in tcc.tune.candidates(lowered)]
    assert {k.tile for k in knobs} == {None} and len({k.warps for k in knobs}) == len(knobs)


def test_every_candidate_compiles_through_nvrtc():
    op = tcc.compile(MATMUL, target="cuda").matmul
    lowered = op.lowered(BINDINGS)
    shapes = set()
    for tuning in tcc.tune.candidates(lowered):
        scheduled = replace(lowered, tuning=tuning, _scheduled=None).scheduled
        artifact = cuda_backend.build(scheduled, op.target)
        assert artifact.startswith(b"TCC-CUBIN")
        tiles = {b.shape for b in scheduled.buffers().values() if b.scope == "shared"}
        shapes.add(frozenset(tiles))
    assert len(shapes) > 3  # the tiles and pipeline depths really change the kernel


def test_the_winner_round_trips_through_the_cache(fresh_cache, monkeypatch):
    op = tcc.compile(MATMUL, target="cuda", tune=True).matmul
    plain = tcc.compile(MATMUL, target="cuda").matmul.lowered(BINDINGS)
    winner = Tuning(cuda=CudaTuning((64, 64, 32), 1, 4))
    result = tcc.tune.TuneResult(winner, 1e-3, 2e-3, [(winner, 1e-3)])
    tcc.tune.store_tuning(op, plain, result)
    assert tcc.tune.stored_tuning(op, plain) == winner

    def refuse(*args, **kwargs):
        raise AssertionError("searched again")
    monkeypatch.setattr(tcc.tune, "search", refuse)
    lowered = op.lowered(BINDINGS)
    assert lowered.tuning == winner
    shared = {b.shape for b in lowered.scheduled.buffers().values() if b.scope == "shared"}
    assert shared == {(1, 32, 64 + 4)}  # one stage of BK x (BM + pad): the stored tile, single-buffered
    cache.DiskCache(fresh_cache).put_json(tcc.tune.tuning_key(op, plain), {"tiles": {}, "unroll": 1,
                                                                           "cuda": {"tile": "x"}})
    assert tcc.tune.stored_tuning(op, plain) is None  # a malformed entry is a miss


@pytest.mark.skipif(tcc.cuda.is_available(), reason="checks the no-GPU path")
def test_searching_without_a_gpu_is_a_clean_error(fresh_cache, capsys, tmp_path):
    op = tcc.compile(MATMUL, target="cuda", tune=True).matmul
    with pytest.raises(tcc.TccError, match="times its candidates on a GPU"):
        op.lowered(BINDINGS)
    path = tmp_path / "mm.tc"
    path.write_text(MATMUL)
    assert tcc.cli.main(["tune", str(path), "--target", "cuda", "-D", "M=64", "-D", "K=64", "-D", "N=64"]) == 1
    assert "times its candidates on a GPU" in capsys.readouterr().err


@pytest.mark.cuda
def test_tuned_gemm_on_the_gpu_matches_numpy(fresh_cache, rng):
    if not tcc.cuda.is_available():
        pytest.skip("needs a GPU")
    op = tcc.compile(MATMUL, target="cuda", tune=4).matmul
    a, b = rng.standard_normal((67, 33), np.float32), rng.standard_normal((33, 129), np.float32)
    out = tcc.cuda.to_device(np.full((67, 129), np.nan, np.float32))  # device inputs and outputs alike
    op(tcc.cuda.to_device(a), tcc.cuda.to_device(b), out=out)
    np.testing.assert_allclose(out.to_numpy(), a @ b, rtol=1e-4, atol=1e-4)
    assert tcc.tune.stored_tuning(op, tcc.compile(MATMUL, target="cuda").matmul.lowered(BINDINGS)) is not None
