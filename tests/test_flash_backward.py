"""FlashAttention-2's backward template (tcc/codegen_cuda/flash_backward.py): it compiles through
NVRTC for every tile shape it offers, within the registers (no spills) and the shared memory of a
block, and its numbers agree with NumPy on a host emulator of the matrix units (tests/flash_emulator.py,
itself checked on the forward template the device runs). scripts/flash_bwd_probe.py checks it on the
device against torch autograd."""

import re

import numpy as np
import pytest

from tcc.codegen_cuda import nvrtc
from tcc.codegen_cuda.flash_backward import TILES, shared_bytes, standalone_kernels
from tests import flash_emulator

H100_SHARED_PER_BLOCK = 227 * 1024


@pytest.mark.parametrize("d,bm,warps", [(d, bm, w) for d, tiles in TILES.items() for bm, w in tiles])
@pytest.mark.parametrize("bf16", [False, True])
def test_backward_fits_registers_without_spills(d, bm, warps, bf16):
    pytest.importorskip("cuda.bindings.nvrtc")
    log = nvrtc.ptxas_report(standalone_kernels(d, bm, warps, bf16), "sm_90")
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert len(spills) == 3, log  # the three kernels
    assert all(s == ("0", "0") for s in spills), log
    assert shared_bytes(d, bm, warps) <= H100_SHARED_PER_BLOCK


def test_backward_compiles_for_sm80():
    """Without sm_90's vector reductions the dQ accumulator takes scalar atomics."""
    pytest.importorskip("cuda.bindings.nvrtc")
    d, (bm, warps) = 64, TILES[64][0]
    assert nvrtc.compile_cubin(standalone_kernels(d, bm, warps, False), "sm_80")


def _attention_grads(q, k, v, do, causal, scale, o_rounded):
    """float64 reference: (dq, dk, dv, lse, delta) of softmax(q k^T * scale) v (top-left causal)."""
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if causal:
        s = np.where(np.arange(k.shape[2])[None, :] <= np.arange(q.shape[2])[:, None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]
    p = np.exp(s - lse[..., None])
    delta = (do * o_rounded(p @ v)).sum(-1)
    ds = p * (np.einsum("bhid,bhjd->bhij", do, v) - delta[..., None])
    return ds @ k * scale, np.einsum("bhij,bhid->bhjd", ds, q) * scale, np.einsum("bhij,bhid->bhjd", p, do), lse, delta


def test_emulator_runs_the_device_verified_forward():
    """The emulator's ldmatrix / mma.sync fragments, on the forward template the device checks."""
    if not flash_emulator.available():
        pytest.skip("no g++")
    rng = np.random.default_rng(5)
    S, L, d = 40, 70, 64
    q, k, v = (flash_emulator.to16(rng.standard_normal((2, n, d)), False) for n in (S, L, L))
    out = flash_emulator.from16(flash_emulator.forward(d, 64, 4, 1, True, q, k, v, True, d ** -0.5), False)
    qf, kf, vf = (flash_emulator.from16(x, False).astype(np.float64) for x in (q, k, v))
    s = np.where(np.arange(L)[None, :] <= np.arange(S)[:, None], qf @ kf.transpose(0, 2, 1) * d ** -0.5, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (p / p.sum(-1, keepdims=True)) @ vf, atol=3e-3)


@pytest.mark.parametrize("d,tile,bf16,causal,S,L", [
    (64, 0, False, True, 33, 70),
    (64, 1, True, False, 7, 7),
    (128, 1, True, True, 70, 33),
    (128, 0, False, False, 1, 1),
])
def test_emulated_backward_matches_numpy(d, tile, bf16, causal, S, L):
    """dQ, dK, dV and Delta of the standalone kernels on the host emulator, at ragged lengths."""
    if not flash_emulator.available():
        pytest.skip("no g++")
    bm, warps = TILES[d][tile]
    rng = np.random.default_rng(S * 1000 + L)
    q16, k16, v16, do16 = (flash_emulator.to16(rng.standard_normal((1, 2, n, d)), bf16) for n in (S, L, L, S))
    q, k, v, do = (flash_emulator.from16(x, bf16).astype(np.float64) for x in (q16, k16, v16, do16))

    def rounded(o):
        return flash_emulator.from16(flash_emulator.to16(o, bf16), bf16).astype(np.float64)
    scale = d ** -0.5
    dq, dk, dv, lse, delta = _attention_grads(q, k, v, do, causal, scale, rounded)
    o16 = flash_emulator.to16(rounded(np.einsum("bhij,bhjd->bhid", _probabilities(q, k, causal, scale), v)), bf16)
    got = flash_emulator.backward(d, bm, warps, bf16, q16, k16, v16, o16, do16, lse.astype(np.float32), causal, scale)
    tol = 2e-2 if bf16 else 3e-3
    for name, out, ref in zip(("dq", "dk", "dv"), got, (dq, dk, dv)):
        np.testing.assert_allclose(flash_emulator.from16(out, bf16), ref, atol=tol * max(1.0, np.abs(ref).max()),
                                   err_msg=name)
    np.testing.assert_allclose(got[3], delta, rtol=1e-5, atol=1e-4)


def _probabilities(q, k, causal, scale):
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if causal:
        s = np.where(np.arange(k.shape[2])[None, :] <= np.arange(q.shape[2])[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)
