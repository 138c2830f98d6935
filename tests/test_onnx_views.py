"""Views composed with views, windows and shared operands: the importer builds their index
expressions as trees, so a composition cannot change what an index means. Each case was a silent
wrong answer or a bounds error on a valid graph while the importer glued index text together."""

from __future__ import annotations

import numpy as np
import pytest
from test_onnx import check_against_ort, make_model

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import tcc  # noqa: E402

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


def run_tcc(model, **feeds):
    return tcc.onnx.load(model)(**feeds)


def test_reshape_of_reshape_reads_the_flat_index():
    """arange(12) -> [4, 3] -> [2, 2, 3]: the second reshape's index is a product of the first's."""
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Reshape", ["a", "s2"], ["y"])]
    model = make_model(nodes, [("x", F32, [12])], [("y", F32, [2, 2, 3])], {"s1": np.array([4, 3], np.int64),
                                                                        "s2": np.array([2, 2, 3], np.int64)})
    x = np.arange(12, dtype=np.float32)
    np.testing.assert_array_equal(run_tcc(model, x=x), x.reshape(2, 2, 3))


def test_reshape_chain_into_a_convolution(rng):
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]),
             helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0]),
             helper.make_node("Reshape", ["b", "s2"], ["c"]),
             helper.make_node("Conv", ["c", "w"], ["y"], pads=[1, 1, 1, 1])]
    w = rng.standard_normal([2, 3, 3, 3]).astype(np.float32)
    model = make_model(nodes, [("x", F32, [7, 15])], [("y", F32, [1, 2, 5, 7])],
                       {"s1": np.array([15, 7], np.int64), "s2": np.array([1, 3, 5, 7], np.int64), "w": w})
    check_against_ort(model, rng)


def test_strided_slice_then_reshape():
    """arange(8)[::2] -> [2, 2] is [[0, 2], [4, 6]]."""
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["a"]),
             helper.make_node("Reshape", ["a", "s"], ["y"])]
    model = make_model(nodes, [("x", F32, [8])], [("y", F32, [2, 2])],
                       {"st": np.array([0], np.int64), "en": np.array([8], np.int64), "ax": np.array([0], np.int64),
                        "sp": np.array([2], np.int64), "s": np.array([2, 2], np.int64)})
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(run_tcc(model, x=x), x[::2].reshape(2, 2))


@pytest.mark.parametrize("start,end,step", [(7, -9, -1), (6, -9, -3), (-1, 0, -2)])
def test_reversed_slice_then_reshape(rng, start, end, step):
    x = rng.standard_normal(8).astype(np.float32)
    want = x[slice(start, None if end == -9 else end, step)]
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["a"]),
             helper.make_node("Reshape", ["a", "s"], ["y"])]
    model = make_model(nodes, [("x", F32, [8])], [("y", F32, [1, want.size])],
                       {"st": np.array([start], np.int64), "en": np.array([end], np.int64),
                        "ax": np.array([0], np.int64), "sp": np.array([step], np.int64),
                        "s": np.array([1, want.size], np.int64)})
    np.testing.assert_array_equal(run_tcc(model, x=x), want.reshape(1, -1))
    check_against_ort(model, rng)


def test_constant_gather_then_split(rng):
    nodes = [helper.make_node("Gather", ["x", "idx"], ["a"], axis=1),
             helper.make_node("Split", ["a", "sizes"], ["y0", "y1"], axis=1)]
    model = make_model(nodes, [("x", F32, [3, 9])], [("y0", F32, [3, 1]), ("y1", F32, [3, 3])],
                       {"idx": np.array([7, 5, 3, 1], np.int64), "sizes": np.array([1, 3], np.int64)})
    check_against_ort(model, rng)


def test_reversed_slice_into_max_pool(rng):
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["a"]),
             helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[2, 2], strides=[2, 1])]
    model = make_model(nodes, [("x", F32, [1, 2, 7, 5])], [("y", F32, [1, 2, 3, 4])],
                       {"st": np.array([-1, 4], np.int64), "en": np.array([-9, -9], np.int64),
                        "ax": np.array([2, 3], np.int64), "sp": np.array([-1, -1], np.int64)})
    check_against_ort(model, rng)


def test_matmul_of_a_vector_with_itself():
    """MatMul(x, x) of a 1-D x is the dot product (14 for [1, 2, 3])."""
    model = make_model([helper.make_node("MatMul", ["x", "x"], ["y"])], [("x", F32, [3])], [("y", F32, [])])
    assert float(run_tcc(model, x=np.array([1, 2, 3], np.float32))) == 14.0


def test_matmul_of_a_matrix_with_itself(rng):
    model = make_model([helper.make_node("MatMul", ["x", "x"], ["y"])], [("x", F32, [7, 7])], [("y", F32, [7, 7])])
    check_against_ort(model, rng)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax"])
@pytest.mark.parametrize("elem", [F32, I64])
def test_reduce_of_a_rank0_tensor(rng, op, elem):
    node = helper.make_node(op, ["x"], ["y"], keepdims=0)
    model = make_model([node], [("x", elem, [])], [("y", elem, [])], opset=18)
    x = np.array(rng.integers(-9, 10), np.int64) if elem == I64 else np.array(rng.standard_normal() + 0.1, np.float32)
    check_against_ort(model, rng, feeds={"x": x})


def test_views_on_views_with_shared_operand(rng):
    """One input read through two different view chains and multiplied with itself."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("Reshape", ["t", "s"], ["r"]),
             helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["sl"]),
             helper.make_node("Reshape", ["sl", "s"], ["r2"]),
             helper.make_node("Mul", ["r", "r2"], ["y"])]
    model = make_model(nodes, [("x", F32, [6, 5])], [("y", F32, [3, 10])],
                       {"s": np.array([3, 10], np.int64), "st": np.array([5, 4], np.int64),
                        "en": np.array([-7, -6], np.int64), "ax": np.array([0, 1], np.int64),
                        "sp": np.array([-1, -1], np.int64)})
    check_against_ort(model, rng)


def test_reduce_sum_of_empty_axes_list_is_the_input(rng):
    """ReduceSum with an explicit empty axes input and noop_with_empty_axes=0 reduces everything."""
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)
    model = make_model([node], [("x", F32, [7, 3])], [("y", F32, [1, 1])], {"axes": np.array([], np.int64)},
                       opset=18)
    check_against_ort(model, rng)


def test_gather_constant_index_reshape(rng):
    nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=0),
             helper.make_node("Reshape", ["g", "s"], ["y"])]
    model = make_model(nodes, [("x", F32, [9, 4])], [("y", F32, [2, 8])],
                       {"idx": np.array([8, 6, 4, 2], np.int64), "s": np.array([2, 8], np.int64)})
    check_against_ort(model, rng)


def test_the_public_modules_import_by_name():
    """``import tcc.onnx`` and ``import tcc.torch`` work, not only attribute access after ``import tcc``."""
    import importlib

    assert importlib.import_module("tcc.onnx").load is tcc.onnx.load
    pytest.importorskip("torch")
    assert callable(importlib.import_module("tcc.torch").library)


def test_grouped_heads_reshapes_read_whole_digits(rng):
    """Llama's grouped value heads: x @ W split into 2 heads (Reshape, Transpose), each repeated
    twice (Unsqueeze, Expand, Reshape). Where a reshape's strides line up with the result's dims,
    its index is the matching loop indices alone: no ``%`` (a GEMM's row index that moves with one
    loop). Checked against onnxruntime at an odd row count."""
    rows, heads, d = 7, 2, 3
    nodes = [helper.make_node("MatMul", ["x", "w"], ["v"]),
             helper.make_node("Reshape", ["v", "s1"], ["a"]),  # [1, rows, heads, d]
             helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1, 3]),  # [1, heads, rows, d]
             helper.make_node("Unsqueeze", ["b", "ax"], ["e"]),  # [1, heads, 1, rows, d]
             helper.make_node("Expand", ["e", "s4"], ["f"]),  # [1, heads, 2, rows, d]
             helper.make_node("Reshape", ["f", "s5"], ["g"]),  # [1, 2 * heads, rows, d]
             helper.make_node("MatMul", ["g", "u"], ["y"])]
    consts = {"w": rng.standard_normal([5, heads * d]).astype(np.float32),
              "u": rng.standard_normal([d, 4]).astype(np.float32),
              "s1": np.array([1, rows, heads, d], np.int64), "ax": np.array([2], np.int64),
              "s4": np.array([1, heads, 2, rows, d], np.int64), "s5": np.array([1, 2 * heads, rows, d], np.int64)}
    model = make_model(nodes, [("x", F32, [rows, 5])], [("y", F32, [1, 2 * heads, rows, 4])], consts)
    check_against_ort(model, rng)
    source = tcc.onnx.load(model).source
    assert "%" not in source, source
