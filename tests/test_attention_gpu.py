"""Attention's stream on a CUDA device (skipped without one): DSL.md's attention and causal
attention in f32, f16 and bf16 at odd sizes and D 8, 64, 128, and the variants, against the
reference with poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest
from test_attention import ATTENTION, CAUSAL, HALF_VARIANTS, VARIANTS, XENT, half_bindings, half_variant

import tcc
from tcc.errors import TccError
from tcc.ir.loops import walk_stmts
from tcc.ir.matrix_loops import MatrixStream
from tcc.target import CudaTarget
from tcc.testing import assert_matches, random_args, reference_results

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module", autouse=True)
def gpu():
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")


def _check(op, bindings: dict, args: list) -> None:
    if any(op.te.tensors[p].dtype.name == "bf16" for p in op.te.params if p in op.te.tensors):
        _check_bf16(op, bindings, args)
        return
    expected = reference_results(op.te, args, bindings)
    outs = tuple(np.full(e.shape, np.nan, e.dtype) for e in expected)
    got = op(*args, out=outs[0] if len(outs) == 1 else outs)
    got = got if isinstance(got, tuple) else (got,)
    for r, g, e in zip(op.te.results, got, expected):
        assert_matches(g, e, op.te.tensors[r].dtype, f"{op.te.name}.{r}")


def _check_bf16(op, bindings: dict, args: list) -> None:
    """bf16 has no NumPy type: the inputs go in as torch bf16 CUDA tensors, the reference sees
    the same values (rounded to bf16, held in f32), the results come back as f32."""
    torch = pytest.importorskip("torch")
    bf16 = {p for p in op.te.params if p in op.te.tensors and op.te.tensors[p].dtype.name == "bf16"}
    device = [torch.from_numpy(np.ascontiguousarray(a)).cuda().bfloat16() if p in bf16 else a
              for p, a in zip(op.te.params, args)]
    rounded = [t.float().cpu().numpy() if p in bf16 else a for p, t, a in zip(op.te.params, device, args)]
    expected = reference_results(op.te, rounded, bindings)
    got = op(*device)
    got = got if isinstance(got, tuple) else (got,)
    for r, g, e in zip(op.te.results, got, expected):
        value = torch.as_tensor(g).float().cpu().numpy() if not isinstance(g, np.ndarray) else g
        assert_matches(value, e, op.te.tensors[r].dtype, f"{op.te.name}.{r}")


@pytest.mark.parametrize("S,L,D", [(1, 1, 8), (7, 33, 64), (33, 7, 128), (1000, 1000, 64), (1, 1000, 128)])
@pytest.mark.parametrize("T", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_on_the_device(rng, S, L, D, T, causal):
    lib = tcc.compile(ATTENTION + CAUSAL, target="cuda")
    op = (lib.causal_attention if causal else lib.attention).bound(T=T)
    bindings = {"B": 1, "H": 2, "S": S, "D": D} | ({} if causal else {"L": L})
    _check(op, bindings, random_args(op.te, bindings, rng))


@pytest.mark.parametrize("variant", [*sorted(VARIANTS), "xent"])
def test_variants_on_the_device(rng, variant):
    source = XENT if variant == "xent" else VARIANTS[variant]
    op = tcc.compile(source, target="cuda")["linear_xent" if variant == "xent" else variant]
    bindings = {"N": 33, "K": 64, "C": 1000} if variant == "xent" else {"B": 2, "H": 3, "S": 33, "L": 70, "D": 64}
    args = random_args(op.te, bindings, rng)
    if variant == "xent":
        args[2] = rng.integers(0, 1000, 33).astype(np.int64)
    if variant == "masked":
        args[3] = (rng.random((2, 70)) < 0.6).astype(np.int64)
        args[3][:, 0] = 1
    if variant == "softcap":
        args[3] = np.float32(5.0)
    _check(op, bindings, args)


@pytest.mark.parametrize("name", sorted(HALF_VARIANTS))
@pytest.mark.parametrize("T,D,S,L", [("f16", 64, 33, 70), ("bf16", 128, 7, 1000), ("f16", 128, 1000, 33),
                                     ("bf16", 64, 1, 1)])
def test_half_variants_on_the_matrix_units(rng, name, T, D, S, L):
    """The FlashAttention kernel of every variant (masks read from data, ALiBi, soft caps,
    grouped heads, a row log-sum-exp) agrees with the reference at odd sizes."""
    op = tcc.compile(half_variant(name), target="cuda")[name].bound(T=T)
    bindings = half_bindings(name, S, L, D)
    args = random_args(op.te, bindings, rng)
    if name == "masked":
        keep = args[3]
        keep[...] = rng.random(keep.shape) < 0.6
        keep[:, 0] = 1
    _check(op, bindings, args)


def test_unaligned_attention(rng):
    """Q starting 2 bytes into its storage cannot take 16-byte copies: the launcher runs the
    kernel's other variant, which copies two bytes at a time, with the same answer."""
    torch = pytest.importorskip("torch")
    op = tcc.compile(ATTENTION, target="cuda").attention.bound(T="f16")
    shape = (1, 2, 33, 64)
    q = torch.randn(1 + 2 * 33 * 64, dtype=torch.float16, device="cuda")[1:].view(shape)
    k, v = (torch.randn(shape, dtype=torch.float16, device="cuda") for _ in range(2))
    got = op(q, k, v, 0.125).float().cpu().numpy()
    bindings = {"B": 1, "H": 2, "S": 33, "L": 33, "D": 64}
    (expected,) = reference_results(op.te, [t.cpu().numpy() for t in (q, k, v)] + [np.float32(0.125)], bindings)
    assert_matches(got, expected, op.te.tensors["O"].dtype, "O")


@pytest.mark.parametrize("T,D,causal", [("f16", 64, True), ("bf16", 128, False), ("f16", 128, True)])
def test_mma_sync_attention_on_the_device(rng, monkeypatch, T, D, causal):
    """The warp-level kernel (what GPUs before sm_90 run) on this GPU: its schedule chosen as if
    the target had no warpgroup MMA."""
    monkeypatch.setattr(CudaTarget, "warpgroup_mma", property(lambda self: False))
    lib = tcc.compile(ATTENTION + CAUSAL, target="cuda")
    op = (lib.causal_attention if causal else lib.attention).bound(T=T)
    bindings = {"B": 2, "H": 3, "S": 1000, "D": D} | ({} if causal else {"L": 333})
    streams = [s for s in walk_stmts(op.lowered(bindings).scheduled.body) if isinstance(s, MatrixStream)]
    assert streams and not any(s.warpgroups for s in streams)
    _check(op, bindings, random_args(op.te, bindings, rng))
