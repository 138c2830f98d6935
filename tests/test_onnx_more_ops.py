"""ONNX operators of transformers and detection heads beyond the basic set: RMSNormalization and
RotaryEmbedding (opset 23), against onnxruntime on random inputs at odd sizes."""

from __future__ import annotations

import numpy as np
import pytest
from test_onnx import check_against_ort, make_model

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


@pytest.mark.parametrize("axis,shape", [(-1, [3, 7, 33]), (1, [2, 5, 7]), (0, [1, 1000])])
def test_rms_normalization(rng, axis, shape):
    scale = rng.standard_normal(shape[axis % len(shape):]).astype(np.float32)
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=axis, epsilon=1e-3)
    model = make_model([node], [("x", F32, shape)], [("y", F32, shape)], {"s": scale}, opset=23)
    check_against_ort(model, rng, rtol=1e-4, atol=1e-5)


def _rotary_inputs(rng, x_shape, batch, seq, half, with_ids):
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    positions = 11 if with_ids else None
    cache_shape = [positions, half] if with_ids else [batch, seq, half]
    angles = rng.standard_normal(cache_shape).astype(np.float32)
    feeds["cos"], feeds["sin"] = np.cos(angles), np.sin(angles)
    if with_ids:
        feeds["ids"] = rng.integers(0, positions, [batch, seq]).astype(np.int64)
    return feeds


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rank,rotary,with_ids", [(4, 0, True), (4, 6, False), (3, 0, False), (3, 4, True)])
def test_rotary_embedding(rng, interleaved, rank, rotary, with_ids):
    batch, heads, seq, head = 2, 3, 7, 10
    x_shape = [batch, heads, seq, head] if rank == 4 else [batch, seq, heads * head]
    half = (rotary or head) // 2
    feeds = _rotary_inputs(rng, x_shape, batch, seq, half, with_ids)
    names = ["x", "cos", "sin", *(["ids"] if with_ids else [])]
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rotary, **({"num_heads": heads} if rank == 3 else {})}
    node = helper.make_node("RotaryEmbedding", names, ["y"], **attrs)
    inputs = [(n, I64 if n == "ids" else F32, list(feeds[n].shape)) for n in names]
    model = make_model([node], inputs, [("y", F32, x_shape)], opset=23)
    check_against_ort(model, rng, feeds=feeds, rtol=1e-5, atol=1e-5)


def test_rotary_position_out_of_range_is_an_index_error(rng):
    import tcc
    from tcc.errors import TccIndexError

    feeds = _rotary_inputs(rng, [1, 2, 5, 4], 1, 5, 2, True)
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "ids"], ["y"])
    inputs = [(n, I64 if n == "ids" else F32, list(feeds[n].shape)) for n in feeds]
    compiled = tcc.onnx.load(make_model([node], inputs, [("y", F32, [1, 2, 5, 4])], opset=23))
    for bad in (11, -1):  # position ids do not count from the end (onnxruntime refuses them too)
        feeds["ids"][0, 3] = bad
        with pytest.raises(TccIndexError):
            compiled(**feeds)


@pytest.mark.parametrize("equation,shapes", [
    ("bij,bjk->bik", [[3, 7, 5], [3, 5, 33]]),
    ("...ij,...jk->...ik", [[2, 3, 7, 5], [2, 3, 5, 4]]),
    ("ii->i", [[7, 7]]), ("bii->b", [[3, 5, 5]]),  # diagonals
    ("ij,kj", [[7, 5], [3, 5]]),  # implicit output: ik
    ("i,i->", [[1000], [1000]]), ("bhsd->bshd", [[2, 3, 7, 5]]),
])
def test_einsum(rng, equation, shapes):
    names = [f"x{n}" for n in range(len(shapes))]
    expected = np.einsum(equation, *[np.zeros(s, np.float32) for s in shapes]).shape
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    model = make_model([node], [(n, F32, s) for n, s in zip(names, shapes)], [("y", F32, list(expected))], opset=18)
    check_against_ort(model, rng, rtol=1e-4, atol=1e-4)


def test_einsum_of_integers(rng):
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik")
    model = make_model([node], [("a", I64, [3, 7]), ("b", I64, [7, 5])], [("y", I64, [3, 5])], opset=18)
    check_against_ort(model, rng)


def test_einsum_ellipsis_broadcasts_as_numpy_does(rng):
    """onnxruntime refuses ellipses of different sizes; ONNX (and NumPy) broadcast them."""
    import tcc

    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation="...ij,...jk->...ik")
    model = make_model([node], [("a", F32, [2, 1, 7, 5]), ("b", F32, [3, 5, 4])], [("y", F32, [2, 3, 7, 4])], opset=18)
    a, b = rng.standard_normal([2, 1, 7, 5]).astype(np.float32), rng.standard_normal([3, 5, 4]).astype(np.float32)
    np.testing.assert_allclose(tcc.onnx.load(model)(a, b), np.einsum("...ij,...jk->...ik", a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("shape,axis,k", [([3, 33], -1, 5), ([7, 4], 0, 7), ([1, 1000], 1, 1), ([2, 5, 3], 1, 2)])
def test_top_k(rng, largest, shape, axis, k):
    out = [k if d == axis % len(shape) else n for d, n in enumerate(shape)]
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    model = make_model([node], [("x", F32, shape)], [("v", F32, out), ("i", I64, out)],
                       {"k": np.array([k], np.int64)}, opset=18)
    check_against_ort(model, rng)


def test_top_k_ties_go_to_the_lower_index(rng):
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    model = make_model([node], [("x", I64, [5, 33])], [("v", I64, [5, 9]), ("i", I64, [5, 9])],
                       {"k": np.array([9], np.int64)}, opset=18)
    check_against_ort(model, rng, feeds={"x": rng.integers(0, 4, [5, 33]).astype(np.int64)})


@pytest.mark.parametrize("mode,transform,nearest", [
    ("nearest", "asymmetric", "floor"), ("nearest", "half_pixel", "round_prefer_ceil"),
    ("linear", "half_pixel", None), ("linear", "pytorch_half_pixel", None), ("linear", "align_corners", None),
    ("cubic", "half_pixel", None), ("cubic", "asymmetric", None)])
@pytest.mark.parametrize("scales", [(1.0, 1.0, 2.0, 2.0), (1.0, 1.0, 0.5, 1.75), (1.0, 1.0, 3.0, 1.0)])
def test_resize_by_scales(rng, mode, transform, nearest, scales):
    """Scales that are binary fractions and sizes they scale to whole ones: onnxruntime rounds
    some source positions across a nearest tie, and reads align_corners by the rounded size,
    where ONNX's reference (and tcc) do not."""
    shape = [2, 3, 8, 4]
    out = [int(s * n) for s, n in zip(scales, shape)]
    attrs = {"mode": mode, "coordinate_transformation_mode": transform}
    attrs |= {"nearest_mode": nearest} if nearest else {}
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    model = make_model([node], [("x", F32, shape)], [("y", F32, out)],
                       {"scales": np.array(scales, np.float32)}, opset=19)
    check_against_ort(model, rng, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("antialias", [0, 1])
def test_resize_by_sizes(rng, antialias):
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear", antialias=antialias)
    model = make_model([node], [("x", F32, [1, 2, 33, 8])], [("y", F32, [1, 2, 7, 13])],
                       {"sizes": np.array([1, 2, 7, 13], np.int64)}, opset=19)
    check_against_ort(model, rng, rtol=1e-4, atol=1e-5)


def test_resize_nearest_of_integers(rng):
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    model = make_model([node], [("x", TensorProto.INT32, [1, 1, 3, 5])], [("y", TensorProto.INT32, [1, 1, 6, 10])],
                       {"scales": np.array([1, 1, 2, 2], np.float32)}, opset=19)
    check_against_ort(model, rng, feeds={"x": rng.integers(-9, 9, [1, 1, 3, 5]).astype(np.int32)})


def _attention_model(q_shape, kv_shape, past=0, mask_shape=None, mask_bool=False, outputs=1, **attrs):
    names = ["q", "k", "v"]
    inputs = [("q", F32, q_shape), ("k", F32, kv_shape), ("v", F32, kv_shape)]
    if mask_shape or past:
        names.append("mask" if mask_shape else "")
        if mask_shape:
            inputs.append(("mask", TensorProto.BOOL if mask_bool else F32, mask_shape))
    if past:
        b, h = kv_shape[0], attrs.get("kv_num_heads") or kv_shape[1]
        d = kv_shape[-1] // h if len(kv_shape) == 3 else kv_shape[-1]
        names += ["past_k", "past_v"]
        inputs += [("past_k", F32, [b, h, past, d]), ("past_v", F32, [b, h, past, d])]
    out_names = ["y", "present_k", "present_v", "qk"][:outputs]
    node = helper.make_node("Attention", names, out_names, **attrs)
    session_outputs = [(n, F32, None) for n in out_names]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in session_outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("case", [
    dict(q_shape=[2, 4, 7, 8], kv_shape=[2, 2, 7, 8], is_causal=1),  # grouped-query, causal
    dict(q_shape=[1, 3, 5, 8], kv_shape=[1, 3, 33, 8], mask_shape=[5, 33], scale=0.3),
    dict(q_shape=[2, 7, 12], kv_shape=[2, 9, 6], q_num_heads=2, kv_num_heads=1, mask_shape=[2, 1, 7, 9],
         mask_bool=True),
    dict(q_shape=[1, 2, 3, 4], kv_shape=[1, 2, 3, 4], past=5, mask_shape=[3, 8], outputs=3, is_causal=1),
    dict(q_shape=[1, 2, 3, 4], kv_shape=[1, 2, 3, 4], past=2, mask_shape=[3, 5], outputs=4, softcap=2.0,
         qk_matmul_output_mode=2),
])
def test_attention(rng, case):
    model = _attention_model(**case)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.random(shape) > 0.3 if vi.type.tensor_type.elem_type == TensorProto.BOOL else \
            rng.standard_normal(shape).astype(np.float32)
    check_against_ort(model, rng, feeds=feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("exponent", [2.0, 3.0, 0.5, 1.0, 4.0, 2.5])
def test_pow_by_a_known_exponent(rng, exponent):
    """GELU's tanh form cubes, variances square: products (and sqrt), not a pow call per element."""
    node = helper.make_node("Pow", ["x", "e"], ["y"])
    model = make_model([node], [("x", F32, [3, 33])], [("y", F32, [3, 33])], {"e": np.array(exponent, np.float32)})
    feeds = {"x": np.abs(rng.standard_normal([3, 33])).astype(np.float32) * 3}
    check_against_ort(model, rng, feeds=feeds, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_without_a_mask_streams(rng, causal):
    """Without a mask (causality keeps key 0 in every row) Attention is the language's plain
    chain, which the compiler streams over the keys (a running max and sums): no score matrix."""
    model = _attention_model(q_shape=[1, 2, 65, 16], kv_shape=[1, 2, 65, 16], is_causal=causal)
    compiled = check_against_ort(model, rng, rtol=1e-4, atol=1e-5)
    assert "stream over" in compiled.lower("fused")
