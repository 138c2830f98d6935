"""``tcc.grad`` of 16-bit attention as FlashAttention-2's backward on the matrix units, without a GPU:
the sweep's matrix form (:mod:`tcc.passes.te.matrix_sweep`) found where it holds and refused (with
the fused stage's reason) where it does not; the scheduled program's CUDA C compiles through NVRTC
for sm_90 and sm_80; and its backward kernel, run by the host emulator (tests/flash_emulator.py)
on the program's own row statistics, gives the reference's gradients. The device runs are in
tests/test_attention_grad_gpu.py."""

from __future__ import annotations

import flash_emulator
import numpy as np
import pytest
from test_attention import ATTENTION, CAUSAL, half_variant

import tcc
from tcc.codegen_cuda import cuda_c, nvrtc
from tcc.ir.loops import MatrixSweep, walk_stmts
from tcc.testing import assert_matches, random_args, reference_results


@pytest.fixture(scope="module")
def lib():
    return tcc.compile(ATTENTION + CAUSAL, target="cuda", arch="sm_90")


def _grad(lib, causal: bool, T: str):
    return tcc.grad((lib.causal_attention if causal else lib.attention).bound(T=T))


def _sweeps(lowered) -> list[MatrixSweep]:
    return [s for s in walk_stmts(lowered.scheduled.body) if isinstance(s, MatrixSweep)]


@pytest.mark.parametrize("causal", [False, True])
def test_the_fused_stage_says_which_sweeps_take_the_matrix_units(lib, causal):
    """16-bit rows of 64 take the matrix form; f32 (no 16-bit operands) and a soft cap (its
    score's derivative varies with the pair) keep the generic schedule, and the notes say why."""
    bindings = {"B": 1, "H": 2, "S": 33, "D": 64} | ({} if causal else {"L": 70})
    half = _grad(lib, causal, "f16").lowered(bindings)
    assert any("FlashAttention-2's backward" in n for n in half.te.fusion_notes), half.te.fusion_notes
    assert len(_sweeps(half)) == 2  # the kernel and its unaligned fallback
    func = half.scheduled
    temps = {n for n, b in func.buffers().items() if b.scope == "global"} - {p.name for p in func.params}
    assert "dO_sum" not in temps and "dl" in temps  # (dO / l, which only the generic sweep read, is not stored)
    single = _grad(lib, causal, "f32").lowered(bindings)
    assert any("no matrix form" in n for n in single.te.fusion_notes) and not _sweeps(single)
    other = _grad(lib, causal, "f16").lowered(bindings | {"D": 32})
    assert any("no matrix form (rows of 32" in n for n in other.te.fusion_notes) and not _sweeps(other)


def test_a_soft_cap_keeps_the_generic_schedule():
    op = tcc.compile(half_variant("softcap"), target="cuda", arch="sm_90").softcap.bound(T="f16")
    grad = tcc.grad(op, ["Q", "K", "V"])
    lowered = grad.lowered({"B": 1, "H": 2, "S": 33, "L": 40, "D": 64})
    assert lowered.te.sweeps, lowered.te.fusion_notes
    assert any("no matrix form" in n for n in lowered.te.fusion_notes) and not _sweeps(lowered)


@pytest.mark.parametrize("arch,T,causal,D", [("sm_90", "f16", True, 64), ("sm_80", "bf16", False, 128)])
def test_the_backward_compiles_through_nvrtc(arch, T, causal, D):
    pytest.importorskip("cuda.bindings.nvrtc")
    lib = tcc.compile(ATTENTION + CAUSAL, target="cuda", arch=arch)
    grad = _grad(lib, causal, T)
    lowered = grad.lowered({"B": 2, "H": 3, "S": 1000, "D": D} | ({} if causal else {"L": 33}))
    assert _sweeps(lowered)
    program = cuda_c.generate(lowered.scheduled, grad.target)
    nvrtc.compile_cubin(program.source, arch + ("a" if program.arch_specific else ""))


def _row_statistics(q, k, v, do, scale: float, causal: bool) -> dict[str, np.ndarray]:
    """What the program's forward stores before the sweep: the shift m, the sum l and the row
    term dl = -sum(dO * O) / l, from the 16-bit values in f64."""
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    m = s.max(-1)
    e = np.exp(s - m[..., None])
    l_ = e.sum(-1)
    o = np.einsum("bhij,bhjd->bhid", e, v) / l_[..., None]
    return {"m": m.astype(np.float32), "l": l_.astype(np.float32), "dl": (-(do * o).sum(-1) / l_).astype(np.float32)}


@pytest.mark.skipif(not flash_emulator.available(), reason="no g++ for the host emulator")
@pytest.mark.parametrize("T,causal,D,S,L,wrt", [("f16", False, 64, 33, 70, None), ("bf16", True, 64, 40, 40, None),
                                                ("f16", True, 64, 33, 33, ["Q"]),
                                                ("f16", False, 64, 7, 40, ["K", "V"])])
def test_the_generated_backward_kernel_on_the_emulator(lib, rng, T, causal, D, S, L, wrt):
    """The generated kernel's lambdas (rows, score, key limit, lse = m + log(l), Delta = -dl * l,
    the dQ accumulator, the stores) give the reference's dK, dV and (scaled from the accumulator)
    dQ; with some of the gradients (what tcc.torch derives, one op per input), those."""
    grad = tcc.grad((lib.causal_attention if causal else lib.attention).bound(T=T), wrt)
    bindings = {"B": 1, "H": 2, "S": S, "D": D} | ({} if causal else {"L": L})
    program = cuda_c.generate(grad.lowered(bindings).scheduled, grad.target)
    at = next(i for i, t in enumerate(program.kernel_texts) if "tcc_flash_bwd<" in t)
    info = program.kernels[at]
    bf16 = T == "bf16"
    args = random_args(grad.te, bindings, rng)
    scale = np.float32(1.0 / np.sqrt(D))
    values = [flash_emulator.from16(flash_emulator.to16(args[i], bf16), bf16) for i in (0, 1, 2, 4)]
    bits = {name: flash_emulator.to16(x, bf16) for name, x in zip(("Q", "K", "V", "dO"), values)}
    wide = [x.astype(np.float64) for x in values]
    inputs: dict = bits | _row_statistics(*wide, float(scale), causal) | {"scale": float(scale)}
    inputs |= {name: np.full(bits["K"].shape, 0x7E7E, np.uint16) for name in ("dK", "dV")}
    acc = next(name for name, _ in info.params if name.startswith("dq_acc"))
    inputs[acc] = np.zeros((2, S, D), np.float32)
    got = flash_emulator.generated(program.kernel_texts[at], info.grid, info.block, info.shared, inputs)
    got["dQ"] = flash_emulator.to16(got[acc].reshape(1, 2, S, D) * scale, bf16)
    expected = reference_results(grad.te, [values[0], values[1], values[2], scale, values[3]], bindings)
    assert len(expected) == (3 if wrt is None else len(wrt))
    for name, e in zip(grad.te.results, expected):
        assert_matches(flash_emulator.from16(got[name], bf16), e, grad.te.tensors[name].dtype, name)
