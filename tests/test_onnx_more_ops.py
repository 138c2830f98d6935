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
    feeds["ids"][0, 3] = 11
    with pytest.raises(TccIndexError):
        compiled(**feeds)
