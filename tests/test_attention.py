"""Attention as one streaming pass (tcc.passes.te.streaming): DSL.md's attention and causal
attention as written, and masks, ALiBi biases, soft-capping, cross attention and a fused linear
cross-entropy, against the reference (which runs the unfused program) on random data at odd
sizes with poisoned outputs; the fused nest stores nothing S x L, skips the causal mask's upper
tiles, and runs on the CUDA simulator."""

from __future__ import annotations

import math

import gpu_sim
import numpy as np
import pytest
from test_dsl_contract import step11_ops

import tcc
from tcc import dtypes
from tcc.codegen_cuda import cuda_c, nvrtc
from tcc.dtypes import DType
from tcc.ir.expr import const, substitute
from tcc.ir.loops import For, is_sequential, walk_stmts
from tcc.ir.matrix_loops import MatrixStream
from tcc.passes.simplify import evaluate_int
from tcc.passes.te.streaming import CPU_ROW_TILE, CPU_TILE
from tcc.testing import assert_matches, random_args, reference_results

ATTENTION = """
op attention[T: float](Q: T[B, H, S, D], K: T[B, H, L, D], V: T[B, H, L, D], scale: f32) -> O: T[B, H, S, D] {
    s[b, h, i, j] = sum[d](f32(Q[b, h, i, d]) * f32(K[b, h, j, d])) * scale
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    l[b, h, i] = sum[j](e[b, h, i, j])
    O[b, h, i, d] = T(sum[j](e[b, h, i, j] * f32(V[b, h, j, d])) / l[b, h, i])
}
"""
CAUSAL = """
op causal_attention[T: float](Q: T[B, H, S, D], K: T[B, H, S, D], V: T[B, H, S, D], scale: f32) -> O: T[B, H, S, D] {
    s[b, h, i, j] = select(j <= i, sum[d](f32(Q[b, h, i, d]) * f32(K[b, h, j, d])) * scale, -inf)
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    l[b, h, i] = sum[j](e[b, h, i, j])
    O[b, h, i, d] = T(sum[j](e[b, h, i, j] * f32(V[b, h, j, d])) / l[b, h, i])
}
"""
# the chain in other spellings: a key mask read from data, ALiBi with a causal mask, a soft cap
# with the exponentials written out, and the sums in one statement
VARIANTS = {
    "masked": """
op masked(Q: f32[B, H, S, D], K: f32[B, H, L, D], V: f32[B, H, L, D], keep: i64[B, L]) -> O: f32[B, H, S, D] {
    s[b, h, i, j] = select(keep[b, j] != 0, sum[d](Q[b, h, i, d] * K[b, h, j, d]) * 0.125, -inf)
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    O[b, h, i, d] = sum[j](e[b, h, i, j] * V[b, h, j, d]) / sum[j](e[b, h, i, j])
}
""",
    "alibi": """
op alibi(Q: f32[B, H, S, D], K: f32[B, H, S, D], V: f32[B, H, S, D], slope: f32[H]) -> O: f32[B, H, S, D] {
    s[b, h, i, j] = select(j <= i, sum[d](Q[b, h, i, d] * K[b, h, j, d]) * 0.3 - slope[h] * f32(i - j), -inf)
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    l[b, h, i] = sum[j](e[b, h, i, j])
    O[b, h, i, d] = sum[j](e[b, h, i, j] * V[b, h, j, d]) / l[b, h, i]
}
""",
    "softcap": """
op softcap(Q: f32[B, H, S, D], K: f32[B, H, L, D], V: f32[B, H, L, D], cap: f32) -> O: f32[B, H, S, D] {
    s[b, h, i, j] = cap * tanh(sum[d](Q[b, h, i, d] * K[b, h, j, d]) / cap)
    m[b, h, i] = max[j](s[b, h, i, j])
    l[b, h, i] = sum[j](exp(s[b, h, i, j] - m[b, h, i]))
    O[b, h, i, d] = sum[j](V[b, h, j, d] * exp(s[b, h, i, j] - m[b, h, i])) / l[b, h, i]
}
""",
}
XENT = """
op linear_xent(X: f32[N, K], W: f32[C, K], lab: i64[N]) -> loss: f32[N] {
    z[n, c] = sum[k](X[n, k] * W[c, k])
    m[n] = max[c](z[n, c])
    lse[n] = m[n] + log(sum[c](exp(z[n, c] - m[n])))
    loss[n] = lse[n] - z[n, lab[n]]
}
"""


def _dsl(name: str, fallback: str) -> str:
    return step11_ops().get(name, fallback)


def _run(op, bindings: dict, args: list, within: DType | None = None) -> tuple:
    """``op`` on ``args`` with poisoned outputs, each result checked against the reference
    (within its dtype's tolerance, or ``within``'s: an f64 result of f32 math)."""
    expected = reference_results(op.te, args, bindings)
    outs = tuple(np.full(e.shape, np.nan, e.dtype) for e in expected)
    got = op(*args, out=outs[0] if len(outs) == 1 else outs)
    got = got if isinstance(got, tuple) else (got,)
    for r, g, e in zip(op.te.results, got, expected):
        assert_matches(g, e, within or op.te.tensors[r].dtype, f"{op.te.name}.{r}")
    return got


def _streamed(op, bindings: dict, most: int, depth: int) -> None:
    """The op fused into a stream, and no buffer its loops allocate holds more than ``most``
    elements, or a tile (of scores, or of keys ``depth`` long): O(B·H·S·D) for attention, never
    S x L."""
    lowered = op.lowered(bindings)
    assert lowered.te.streams, lowered.te.fusion_notes
    func = lowered.scheduled
    params = {p.name for p in func.params}
    sizes = {name: b.size for name, b in func.buffers().items() if name not in params}
    assert max(sizes.values()) <= max(most, CPU_TILE * CPU_ROW_TILE, CPU_TILE * depth), sizes


SIZES = [(1, 1, 8), (7, 7, 8), (33, 33, 64), (7, 33, 8), (33, 1, 64), (130, 70, 64)]


@pytest.mark.parametrize("S,L,D", SIZES)
def test_attention_as_written(rng, S, L, D):
    op = tcc.compile(_dsl("attention", ATTENTION)).attention.bound(T="f32")
    bindings = {"B": 1, "H": 2, "S": S, "L": L, "D": D}
    _run(op, bindings, random_args(op.te, bindings, rng))
    _streamed(op, bindings, most=2 * S * D, depth=D)
    func = op.lowered(bindings).scheduled  # the normalisation runs as rows finish: no tensor in memory
    assert not [b for b in func.buffers().values() if b.scope == "global" and b not in func.params]


@pytest.mark.parametrize("S,D", [(1, 8), (7, 8), (33, 64), (130, 64)])
def test_causal_attention_as_written(rng, S, D):
    op = tcc.compile(_dsl("causal_attention", CAUSAL)).causal_attention.bound(T="f32")
    bindings = {"B": 2, "H": 1, "S": S, "D": D}
    _run(op, bindings, random_args(op.te, bindings, rng))


@pytest.mark.parametrize("T", ["f64", "f16"])
@pytest.mark.parametrize("causal", [False, True])
def test_other_dtypes(rng, T, causal):
    lib = tcc.compile(_dsl("causal_attention", CAUSAL) if causal else _dsl("attention", ATTENTION))
    op = (lib.causal_attention if causal else lib.attention).bound(T=T)
    bindings = {"B": 1, "H": 2, "S": 33, "D": 8} | ({} if causal else {"L": 7})
    _run(op, bindings, random_args(op.te, bindings, rng), within=dtypes.f32 if T == "f64" else None)
    assert op.lowered(bindings).te.streams


@pytest.mark.parametrize("S,L,D", [(1, 1, 8), (7, 33, 8), (33, 7, 64), (70, 70, 8)])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variants(rng, variant, S, L, D):
    op = tcc.compile(VARIANTS[variant])[variant]
    if variant == "alibi":
        L = S
    bindings = {"B": 2, "H": 3, "S": S, "L": L, "D": D}
    args = random_args(op.te, bindings, rng)
    if variant == "masked":
        args[3] = (rng.random((2, L)) < 0.6).astype(np.int64)
        args[3][:, 0] = 1  # a row with every key masked is NaN, in the reference as here
    if variant == "softcap":
        args[3] = np.float32(5.0)
    _run(op, bindings, args)
    _streamed(op, bindings, most=2 * 3 * S * D, depth=D)


@pytest.mark.parametrize("N,K,C", [(1, 1, 1), (7, 33, 70), (33, 8, 1000)])
def test_linear_cross_entropy_without_logits(rng, N, K, C):
    op = tcc.compile(XENT).linear_xent
    bindings = {"N": N, "K": K, "C": C}
    X = rng.standard_normal((N, K)).astype(np.float32)
    W = rng.standard_normal((C, K)).astype(np.float32)
    lab = rng.integers(0, C, N).astype(np.int64)
    (loss,) = _run(op, bindings, [X, W, lab])
    z = X.astype(np.float64) @ W.astype(np.float64).T
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    np.testing.assert_allclose(loss, lse - z[np.arange(N), lab], rtol=1e-4, atol=1e-4)
    if C > 1:
        _streamed(op, bindings, most=N, depth=K)
    with pytest.raises(tcc.TccError):
        op(X, W, np.full(N, C, np.int64))  # the label pick keeps its index check


def test_fused_stage_explains_the_stream():
    text = tcc.compile(CAUSAL).causal_attention.lower(*_zeros(1, 2, 33, 8), np.float32(1), stage="fused")
    notes = text.split("fusion:")[1]
    assert "stream over j: m (running max) and l, O_sum" in notes and "tiles of j at or past i + 1 skipped" in notes
    assert "O as each row ends (m, l, O_sum never stored)" in notes


def _zeros(B: int, H: int, S: int, D: int) -> list[np.ndarray]:
    return [np.zeros((B, H, S, D), np.float32) for _ in range(3)]


def test_softmax_of_an_input_is_left_alone():
    """Nothing large would be saved: the chain stays as it was, and the notes say why."""
    src = """
op softmax(X: f32[N, C]) -> Y: f32[N, C] {
    m[n] = max[c](X[n, c])
    e[n, c] = exp(X[n, c] - m[n])
    s[n] = sum[c](e[n, c])
    Y[n, c] = e[n, c] / s[n]
}
"""
    te = tcc.compile(src).softmax.lowered({"N": 7, "C": 33}).te
    assert not te.streams
    assert any(n.startswith("no stream over m: its scores are computed without a reduction") for n in te.fusion_notes)


def test_causal_skips_the_tiles_above_the_diagonal():
    """The tile loop's trip count per block of queries, evaluated from the loop IR: the upper
    triangle of tiles is never entered (not computed and masked)."""
    S = 4 * CPU_TILE
    op = tcc.compile(CAUSAL).causal_attention.bound(T="f32")
    loops = op.lowered({"B": 1, "H": 1, "S": S, "D": 8}).loops
    (tiles,) = [f for f in walk_stmts(loops.body) if isinstance(f, For) and is_sequential(f)]
    (blocks,) = [f for f in walk_stmts(loops.body) if isinstance(f, For) and f.var.name.startswith("i_o")]
    counts = [evaluate_int(substitute(tiles.extent, {blocks.var.name: const(b)}))
              for b in range(evaluate_int(blocks.extent))]
    assert counts == [math.ceil((b + 1) * CPU_ROW_TILE / CPU_TILE) for b in range(S // CPU_ROW_TILE)]
    assert sum(counts) < 0.7 * (S // CPU_ROW_TILE) * (S // CPU_TILE)


@pytest.mark.parametrize("causal", [False, True])
def test_on_the_cuda_simulator(rng, causal):
    """The fused nest on the GPU (a thread per query row): its CUDA C compiles, and the simulator
    runs it to the reference's answer."""
    pytest.importorskip("cuda.bindings.nvrtc")
    source = CAUSAL if causal else ATTENTION
    lib = tcc.compile(source, target="cuda", arch="sm_90")
    op = (lib.causal_attention if causal else lib.attention).bound(T="f32")
    S, L, D = 33, (33 if causal else 45), 8
    bindings = {"B": 1, "H": 2, "S": S, "D": D} | ({} if causal else {"L": L})
    lowered = op.lowered(bindings)
    assert lowered.te.streams
    nvrtc.compile_cubin(cuda_c.generate(lowered.scheduled, op.target).source, "sm_90")
    Q, K, V = (rng.standard_normal((1, 2, n, D)).astype(np.float32) for n in (S, L, L))
    scale = np.float32(0.3)
    arrays = {"Q": Q, "K": K, "V": V, "O": np.full((1, 2, S, D), np.nan, np.float32)}
    gpu_sim.run(lowered.scheduled, arrays, scalars={"scale": scale})
    (expected,) = reference_results(op.te, [Q, K, V, scale], bindings)
    assert_matches(arrays["O"], expected, op.te.tensors["O"].dtype, "O")


@pytest.mark.parametrize("variant", ["masked", "softcap", "xent"])
def test_variants_on_the_cuda_simulator(rng, variant):
    pytest.importorskip("cuda.bindings.nvrtc")
    source = XENT if variant == "xent" else VARIANTS[variant]
    name = "linear_xent" if variant == "xent" else variant
    op = tcc.compile(source, target="cuda", arch="sm_90")[name]
    bindings = {"N": 7, "K": 8, "C": 45} if variant == "xent" else {"B": 1, "H": 2, "S": 7, "L": 33, "D": 8}
    args = random_args(op.te, bindings, rng)
    if variant == "xent":
        args[2] = rng.integers(0, 45, 7).astype(np.int64)
    if variant == "masked":
        args[3] = (rng.random((1, 33)) < 0.6).astype(np.int64)
        args[3][:, 0] = 1
    lowered = op.lowered(bindings)
    assert lowered.te.streams
    nvrtc.compile_cubin(cuda_c.generate(lowered.scheduled, op.target).source, "sm_90")
    (expected,) = reference_results(op.te, args, bindings)
    result = op.te.results[0]
    arrays = {p: a for p, a in zip(op.te.params, args) if p in op.te.tensors}
    arrays[result] = np.full(expected.shape, np.nan, expected.dtype)
    scalars = {p: a for p, a in zip(op.te.params, args) if p in op.te.scalars}
    gpu_sim.run(lowered.scheduled, arrays, scalars=scalars)
    assert_matches(arrays[result], expected, op.te.tensors[result].dtype, result)


@pytest.mark.parametrize("name,T,bindings", [
    ("attention", "f16", {"B": 2, "H": 16, "S": 512, "L": 512, "D": 64}),
    ("causal_attention", "bf16", {"B": 1, "H": 16, "S": 2048, "D": 128}),
    ("attention", "bf16", {"B": 8, "H": 16, "S": 1, "L": 8192, "D": 128}),  # decoding: one query
])
def test_benchmark_shapes_compile_for_cuda(name, T, bindings):
    """benchmarks/attention.py's GPU workloads: their CUDA C compiles for sm_90."""
    pytest.importorskip("cuda.bindings.nvrtc")
    op = tcc.compile(ATTENTION + CAUSAL, target="cuda", arch="sm_90")[name].bound(T=T)
    lowered = op.lowered(bindings)
    assert lowered.te.streams
    program = cuda_c.generate(lowered.scheduled, op.target)
    nvrtc.compile_cubin(program.source, "sm_90a" if program.arch_specific else "sm_90")


def test_attention_with_its_log_sum_exp(rng):
    """The output and the row log-sum-exp that a backward pass keeps: both finish the stream's
    rows, so neither m nor l is stored; the lse is the reference's."""
    src = """
op attn_lse(Q: f32[B, S, D], K: f32[B, L, D], V: f32[B, L, D]) -> (O: f32[B, S, D], LSE: f32[B, S]) {
    s[b, i, j] = select(j <= i + 3, sum[d](Q[b, i, d] * K[b, j, d]) * 0.25, -inf)
    m[b, i] = max[j](s[b, i, j])
    e[b, i, j] = exp(s[b, i, j] - m[b, i])
    l[b, i] = sum[j](e[b, i, j])
    O[b, i, d] = sum[j](e[b, i, j] * V[b, j, d]) / l[b, i]
    LSE[b, i] = m[b, i] + log(l[b, i])
}
"""
    op = tcc.compile(src).attn_lse
    bindings = {"B": 2, "S": 33, "L": 70, "D": 8}
    _run(op, bindings, random_args(op.te, bindings, rng))
    (stream,) = op.lowered(bindings).te.streams
    assert stream.epilogues == ("O", "LSE") and set(stream.internal) == {"m", "l", "O_sum"}
    assert stream.limit is not None  # j <= i + 3: the tiles past each block's last row + 3 skipped


def test_the_automatic_dynamic_policy_keeps_attention_streamed(rng):
    """Called at a third sequence length, a shape symbol would turn dynamic; the stream needs
    constant extents, so the automatic policy keeps attention's symbols specialised: every length
    is a stream again (never the S x L scores), each compiled once."""
    op = tcc.compile(_dsl("attention", ATTENTION)).attention.bound(T="f32")
    for S in (5, 11, 9):  # (lengths no other test compiles: a kernel found in memory counts as neither)
        bindings = {"B": 1, "H": 3, "S": S, "L": S, "D": 3}
        _run(op, bindings, random_args(op.te, bindings, rng))
    assert op.compiles + op.loads == 3  # a kernel per length (a dynamic one would serve the third)
    assert op.lowered({"B": 1, "H": 3, "S": 9, "L": 9, "D": 3}).te.streams


# attention in 16-bit with the products widened to f32: the matrix units' form (FlashAttention's)
HALF_VARIANTS = {
    "masked": """
op masked(Q: T[B, H, S, D], K: T[B, H, L, D], V: T[B, H, L, D], keep: i64[B, L]) -> O: T[B, H, S, D] {
    s[b, h, i, j] = select(keep[b, j] != 0, sum[d](f32(Q[b, h, i, d]) * f32(K[b, h, j, d])) * 0.125, -inf)
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    O[b, h, i, d] = T(sum[j](e[b, h, i, j] * f32(V[b, h, j, d])) / sum[j](e[b, h, i, j]))
}
""",
    "alibi": """
op alibi(Q: T[B, H, S, D], K: T[B, H, S, D], V: T[B, H, S, D], slope: f32[H]) -> O: T[B, H, S, D] {
    s[b, h, i, j] = select(j <= i, sum[d](f32(Q[b, h, i, d]) * f32(K[b, h, j, d])) * 0.1 - slope[h] * f32(i - j), -inf)
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    l[b, h, i] = sum[j](e[b, h, i, j])
    O[b, h, i, d] = T(sum[j](e[b, h, i, j] * f32(V[b, h, j, d])) / l[b, h, i])
}
""",
    "softcap": """
op softcap(Q: T[B, H, S, D], K: T[B, H, L, D], V: T[B, H, L, D], cap: f32) -> O: T[B, H, S, D] {
    s[b, h, i, j] = cap * tanh(sum[d](f32(Q[b, h, i, d]) * f32(K[b, h, j, d])) / cap)
    m[b, h, i] = max[j](s[b, h, i, j])
    l[b, h, i] = sum[j](exp(s[b, h, i, j] - m[b, h, i]))
    O[b, h, i, d] = T(sum[j](f32(V[b, h, j, d]) * exp(s[b, h, i, j] - m[b, h, i])) / l[b, h, i])
}
""",
    "grouped": """
op grouped(Q: T[B, H, S, D], K: T[B, G, L, D], V: T[B, G, L, D]) -> O: T[B, H, S, D] {
    s[b, h, i, j] = sum[d](f32(Q[b, h, i, d]) * f32(K[b, h // 2, j, d])) * 0.125
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    O[b, h, i, d] = T(sum[j](e[b, h, i, j] * f32(V[b, h // 2, j, d])) / sum[j](e[b, h, i, j]))
}
""",
    "lse": """
op lse(Q: T[B, S, D], K: T[B, L, D], V: T[B, L, D]) -> (O: T[B, S, D], LSE: f32[B, S]) {
    s[b, i, j] = select(j <= i + 3, sum[d](f32(Q[b, i, d]) * f32(K[b, j, d])) * 0.25, -inf)
    m[b, i] = max[j](s[b, i, j])
    e[b, i, j] = exp(s[b, i, j] - m[b, i])
    l[b, i] = sum[j](e[b, i, j])
    O[b, i, d] = T(sum[j](e[b, i, j] * f32(V[b, j, d])) / l[b, i])
    LSE[b, i] = m[b, i] + log(l[b, i])
}
""",
}


def half_variant(name: str) -> str:
    """The variant's source with its dtype parameter ``T`` declared."""
    return HALF_VARIANTS[name].replace(f"op {name}(", f"op {name}[T: float](")


def half_bindings(name: str, S: int, L: int, D: int) -> dict[str, int]:
    if name == "lse":
        return {"B": 2, "S": S, "L": L, "D": D}
    return {"B": 2, "H": 4, "S": S, "D": D} | ({"G": 2} if name == "grouped" else {}) | (
        {} if name == "alibi" else {"L": L})


@pytest.mark.parametrize("name", [*sorted(HALF_VARIANTS), "attention", "causal_attention"])
@pytest.mark.parametrize("T,D,arch", [("f16", 64, "sm_90"), ("bf16", 128, "sm_90"), ("bf16", 64, "sm_80"),
                                      ("f16", 128, "sm_80")])
def test_half_attention_takes_the_matrix_units(name, T, D, arch):
    """16-bit attention with widened products, in every variant, is one FlashAttention kernel
    (warpgroup MMA on sm_90, mma.sync on sm_80) in two variants (16-byte aligned operands or
    not, the launcher picks) and nothing else; the CUDA C compiles. (Its answers:
    tests/test_attention_gpu.py.)"""
    pytest.importorskip("cuda.bindings.nvrtc")
    source = ATTENTION + CAUSAL if name in ("attention", "causal_attention") else half_variant(name)
    op = tcc.compile(source, target="cuda", arch=arch)[name].bound(T=T)
    lowered = op.lowered(half_bindings(name, 33, 70, D))
    kernels = [s for s in walk_stmts(lowered.scheduled.body) if isinstance(s, For) and s.kind == "block.x"]
    assert len(kernels) == 2 and all(any(isinstance(s, MatrixStream) for s in walk_stmts(k)) for k in kernels)
    assert [dict(k.annotations).get("aligned", False) for k in kernels] == [True, False]  # then its fallback
    program = cuda_c.generate(lowered.scheduled, op.target)
    assert ("tcc_flash_wg<" if arch == "sm_90" else "tcc_flash<") in program.source
    nvrtc.compile_cubin(program.source, arch + ("a" if program.arch_specific else ""))


def test_no_matrix_units_below_sm80_or_for_odd_depths():
    """The FlashAttention kernel needs sm_80's 16-bit mma and rows of 64 or 128: elsewhere the
    stream keeps its one-score-at-a-time kernel."""
    for arch, D in (("sm_75", 64), ("sm_90", 8), ("sm_90", 96)):
        op = tcc.compile(ATTENTION, target="cuda", arch=arch).attention.bound(T="f16")
        lowered = op.lowered({"B": 1, "H": 2, "S": 33, "L": 40, "D": D})
        assert not any(isinstance(s, MatrixStream) for s in walk_stmts(lowered.scheduled.body))


@pytest.mark.parametrize("name,bindings,splits", [
    ("attention", {"B": 8, "H": 16, "S": 1, "L": 8192, "D": 128}, 2),  # decoding: 128 blocks for 132 SMs
    ("lse", {"B": 2, "S": 7, "L": 1000, "D": 128}, 5),  # splits of at least four 48-key steps
    ("attention", {"B": 8, "H": 16, "S": 2048, "L": 2048, "D": 128}, 1),  # 4096 blocks: no split
])
def test_decoding_splits_the_keys(name, bindings, splits):
    """Too few query tiles for the machine: the keys split among blocks, partial results in
    O(B H S) scratch, merged by the nests after the kernel (one for the elements, one for the
    rows' own stores); the merged program compiles."""
    pytest.importorskip("cuda.bindings.nvrtc")
    source = ATTENTION if name == "attention" else half_variant(name)
    op = tcc.compile(source, target="cuda", arch="sm_90")[name].bound(T="bf16")
    lowered = op.lowered(bindings)
    scratch = [b for b in lowered.scheduled.buffers().values() if b.name.startswith("flash_partial")]
    kernels = [s for s in walk_stmts(lowered.scheduled.body) if isinstance(s, For) and s.kind == "block.x"]
    if splits == 1:
        assert not scratch and len(kernels) == 2
        return
    (partial,) = scratch
    queries = math.prod(lowered.te.tensors["Q"].concrete_shape())
    assert partial.shape[1] == splits and math.prod(partial.shape) == splits * queries  # O(B H S D) a split, no S x L
    (stream,) = [s for s in walk_stmts(kernels[0]) if isinstance(s, MatrixStream)]
    assert stream.key_begin is not None
    program = cuda_c.generate(lowered.scheduled, op.target)
    nvrtc.compile_cubin(program.source, "sm_90a")
