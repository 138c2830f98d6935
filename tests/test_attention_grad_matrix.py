"""``tcc.grad`` of 16-bit attention as FlashAttention-2's backward on the matrix units, without a GPU:
the sweep's matrix form (:mod:`tcc.passes.te.matrix_sweep`) found where it holds and refused (with
the fused stage's reason) where it does not; the scheduled program's CUDA C compiles through NVRTC
for sm_90 and sm_80; and its backward kernel, run by the host emulator (tests/flash_emulator.py)
on the program's own row statistics, gives the reference's gradients. The device runs are in
tests/test_attention_grad_gpu.py."""

from __future__ import annotations

import re

import flash_emulator
import numpy as np
import pytest
from test_attention import ATTENTION, CAUSAL, half_bindings, half_variant

import tcc
from tcc import dtypes
from tcc.codegen_cuda import cuda_c, nvrtc
from tcc.ir.expr import Const, substitute
from tcc.ir.loops import walk_stmts
from tcc.ir.matrix_loops import MatrixSweep
from tcc.passes.simplify import simplify
from tcc.passes.te.grad import saving
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


@pytest.mark.parametrize("variant", ["softcap", "masked"])
def test_soft_caps_and_masks_from_data_keep_the_generic_schedule(variant):
    op = tcc.compile(half_variant(variant), target="cuda", arch="sm_90")[variant].bound(T="f16")
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
    log = nvrtc.ptxas_report(program.source, arch + ("a" if program.arch_specific else ""))
    most = 0 if D == 64 else 64  # (D 128: 64 x 128 spills a few bytes, 44 on sm_80 in bf16; still the fastest)
    for info, text in zip(program.kernels, program.kernel_texts):  # the lambdas cost the template no registers
        if "tcc_flash_bwd<" in text:
            found = re.search(r"(\d+) bytes spill stores", log[log.index(f"'{info.name}'"):])
            assert found and int(found.group(1)) <= most, log


HALF = ("f16", "bf16")


def _emulated(grad, bindings: dict, rng) -> None:
    """Run the generated backward kernel of ``grad`` on the host emulator, on the row tensors it
    reads (m, l, dl: from the reference, which computes every statement), and check each
    gradient the program stores against the reference; dQ from the kernel's accumulator times
    the statement's scale."""
    lowered = grad.lowered(bindings)
    program = cuda_c.generate(lowered.scheduled, grad.target)
    at = next(i for i, t in enumerate(program.kernel_texts) if "tcc_flash_bwd<" in t)
    info, te = program.kernels[at], grad.te
    (sweep, *_) = _sweeps(lowered)
    bf16 = sweep.q.dtype.name == "bf16"
    args = random_args(te, bindings, rng)
    for k, p in enumerate(te.params):  # (16-bit values exactly; scales of a usual size)
        if p in te.tensors and te.tensors[p].dtype.name in HALF:
            args[k] = flash_emulator.from16(flash_emulator.to16(args[k], bf16), bf16)
        elif p == "scale":
            args[k] = np.float32(0.125)
    params = [name for name, _ in info.params]
    read = [n for n in params if n in te.tensors and te.tensors[n].kind == "temp"]
    full = saving(te, read)
    values = dict(zip(full.results, reference_results(full, args, bindings)))
    inputs: dict = {}
    for p, a in zip(te.params, args):
        half = p in te.tensors and te.tensors[p].dtype.name in HALF
        inputs[p] = flash_emulator.to16(a, bf16) if half else a if p in te.tensors else float(a)
    inputs |= {n: np.ascontiguousarray(values[n], np.float32) for n in read}
    inputs |= {r: np.full(values[r].shape, 0x7E7E, np.uint16) for r in te.results}
    acc = next(n for n in params if n.startswith("dq_acc"))
    inputs[acc] = np.zeros(lowered.scheduled.buffers()[acc].shape, np.float32)
    got = flash_emulator.generated(program.kernel_texts[at], info.grid, info.block, info.shared, inputs)
    scalars = {p: Const(float(a), dtypes.f32) for p, a in zip(te.params, args) if p not in te.tensors}
    scale = simplify(substitute(sweep.scale, scalars))
    assert isinstance(scale, Const), scale
    for r in te.results:
        value = flash_emulator.to16(got[acc].reshape(values[r].shape) * scale.value, bf16) if r not in got else got[r]
        assert_matches(flash_emulator.from16(value, bf16), values[r], te.tensors[r].dtype, r)


@pytest.mark.skipif(not flash_emulator.available(), reason="no g++ for the host emulator")
@pytest.mark.parametrize("T,causal,S,L,wrt", [("f16", False, 33, 70, None), ("bf16", True, 40, 40, None),
                                              ("f16", True, 33, 33, ["Q"]), ("f16", False, 7, 40, ["K", "V"])])
def test_the_generated_backward_kernel_on_the_emulator(lib, rng, T, causal, S, L, wrt):
    """The generated kernel's lambdas (rows, score, key limit, lse = m + log(l), Delta = -dl * l,
    the dQ accumulator, the stores) give the reference's dK, dV and (scaled from the accumulator)
    dQ; with some of the gradients (what tcc.torch derives, one op per input), those."""
    grad = tcc.grad((lib.causal_attention if causal else lib.attention).bound(T=T), wrt)
    _emulated(grad, {"B": 1, "H": 2, "S": S, "D": 64} | ({} if causal else {"L": L}), rng)


@pytest.mark.skipif(not flash_emulator.available(), reason="no g++ for the host emulator")
@pytest.mark.parametrize("name,wrt", [("alibi", ["K"]), ("grouped", ["Q"]), ("lse", None)])
def test_variant_backward_kernels_on_the_emulator(rng, name, wrt):
    """ALiBi (a bias in the score, a causal limit), grouped heads (K and V shared by two heads)
    and a row log-sum-exp result (its gradient in the row term) on the same kernel."""
    op = tcc.compile(half_variant(name), target="cuda", arch="sm_90")[name].bound(T="f16")
    grad = tcc.grad(op, wrt)
    bindings = {k: min(v, 2) if k in ("B", "H", "G") else v for k, v in half_bindings(name, 33, 40, 64).items()}
    _emulated(grad, bindings, rng)
