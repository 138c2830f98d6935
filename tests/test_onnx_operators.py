"""The operators transformers and mobile networks need (logic, comparisons, rounding,
activations, Min/Max/Mean, the Reduce* family, ArgMax/ArgMin, Expand, Tile, Pad, Range, Trilu,
InstanceNormalization) against onnxruntime on random inputs at odd sizes."""

from __future__ import annotations

import numpy as np
import pytest
from test_onnx import check_against_ort, make_model

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
X = ("x", F32, [3, 7])


def one_node(op, inputs, out_elem=F32, out_shape=None, inits=None, opset=18, **attrs):
    names = [n for n, _, _ in inputs] + list((inits or {}).keys())
    node = helper.make_node(op, names, ["y"], **attrs)
    return make_model([node], inputs, [("y", out_elem, out_shape)], inits or {}, opset=opset)


def feeds_for(rng, inputs):
    feeds = {}
    for name, elem, shape in inputs:
        if elem == BOOL:
            feeds[name] = rng.random(shape) > 0.5
        elif elem == I64:
            feeds[name] = rng.integers(-9, 10, shape).astype(np.int64)
        else:
            feeds[name] = (rng.standard_normal(shape) * 2).astype(np.float32)
    return feeds


def run(model, rng, inputs, **kwargs):
    return check_against_ort(model, rng, feeds=feeds_for(rng, inputs), **kwargs)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(rng, op):
    inputs = [("a", BOOL, [3, 7]), ("b", BOOL, [7])]
    run(one_node(op, inputs, BOOL), rng, inputs)


@pytest.mark.parametrize("op", ["GreaterOrEqual", "LessOrEqual"])
def test_comparisons(rng, op):
    inputs = [("a", F32, [3, 7]), ("b", F32, [1, 7])]
    run(one_node(op, inputs, BOOL), rng, inputs)


def test_not_isnan_isinf(rng):
    inputs = [("a", BOOL, [5])]
    run(one_node("Not", inputs, BOOL), rng, inputs)
    model = one_node("IsNaN", [X], BOOL)
    x = np.array([[0.0, np.nan, np.inf, -np.inf, 1.0, -2.0, np.nan]] * 3, np.float32)
    check_against_ort(model, rng, feeds={"x": x})
    for attrs in ({}, {"detect_positive": 0}, {"detect_negative": 0}):
        check_against_ort(one_node("IsInf", [X], BOOL, **attrs), rng, feeds={"x": x})


@pytest.mark.parametrize("elem,fmod", [(I64, 0), (I64, 1), (F32, 1)])
def test_mod(rng, elem, fmod):
    inputs = [("a", elem, [3, 7]), ("b", elem, [7])]
    feeds = feeds_for(rng, inputs)
    feeds["b"] = np.where(feeds["b"] == 0, 3, feeds["b"]).astype(feeds["b"].dtype)
    check_against_ort(one_node("Mod", inputs, elem, fmod=fmod), rng, feeds=feeds)


@pytest.mark.parametrize("op", ["Sign", "Reciprocal", "Round", "HardSigmoid", "HardSwish", "Softplus", "Softsign",
                                "Mish", "Elu", "Celu", "Selu", "ThresholdedRelu", "Sin", "Cos", "Floor", "Ceil"])
def test_elementwise(rng, op):
    feeds = feeds_for(rng, [X])
    if op == "Round":  # halves, which round to even
        feeds["x"][0, :6] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5]
    check_against_ort(one_node(op, [X]), rng, feeds=feeds, rtol=1e-5, atol=1e-6)


def test_sign_of_integers_and_prelu(rng):
    inputs = [("a", I64, [4, 5])]
    run(one_node("Sign", inputs, I64), rng, inputs)
    slope = (rng.random([7]) + 0.1).astype(np.float32)
    run(one_node("PRelu", [X], inits={"slope": slope}), rng, [X])


@pytest.mark.parametrize("op", ["Min", "Max", "Mean"])
def test_variadic(rng, op):
    inputs = [("a", F32, [3, 7]), ("b", F32, [7]), ("c", F32, [3, 1])]
    run(one_node(op, inputs), rng, inputs)


@pytest.mark.parametrize("op", ["ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                                "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions(rng, op, keepdims):
    inputs = [("x", F32, [3, 7, 5])]
    feeds = feeds_for(rng, inputs)
    if op in ("ReduceLogSum", "ReduceProd"):
        feeds["x"] = np.abs(feeds["x"]) + 0.5
    model = one_node(op, inputs, inits={"axes": np.array([1, -1], np.int64)}, keepdims=keepdims)
    check_against_ort(model, rng, feeds=feeds, rtol=1e-4, atol=1e-5)


def test_integer_and_bool_reductions(rng):
    inputs = [("x", I64, [4, 6])]
    for op in ("ReduceMin", "ReduceProd", "ReduceL1"):
        run(one_node(op, inputs, I64, inits={"axes": np.array([0], np.int64)}, keepdims=0), rng, inputs)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{"axis": 1}, {"axis": 0, "keepdims": 0}, {"axis": -1, "select_last_index": 1}])
def test_arg_extremes(rng, op, attrs):
    inputs = [("x", I64, [5, 9])]  # small integers: ties, so the first/last index matters
    run(one_node(op, inputs, I64, **attrs), rng, inputs)


def test_expand_to_a_shape_computed_by_where(rng):
    """The exporters' -1 replacement (Where(Equal(shape, -1), ones, shape)) folds at import."""
    nodes = [helper.make_node("Equal", ["s", "m"], ["e"]), helper.make_node("Where", ["e", "one", "s"], ["t"]),
             helper.make_node("Expand", ["x", "t"], ["y"])]
    inits = {"s": np.array([4, -1, 7], np.int64), "m": np.array(-1, np.int64), "one": np.array([1, 1, 1], np.int64)}
    run(make_model(nodes, [("x", F32, [1, 3, 1])], [("y", F32, [4, 3, 7])], inits), rng, [("x", F32, [1, 3, 1])])


def test_expand_and_tile(rng):
    inputs = [("x", F32, [3, 1])]
    run(one_node("Expand", inputs, inits={"shape": np.array([2, 1, 7], np.int64)}), rng, inputs)
    run(one_node("Tile", [X], inits={"repeats": np.array([2, 3], np.int64)}), rng, [X])


@pytest.mark.parametrize("mode,pads", [("constant", [1, 2, 0, 3]), ("constant", [-1, 1, 0, -2]),
                                       ("edge", [2, 1, 1, 3]), ("reflect", [2, 1, 1, 3]),
                                       ("wrap", [2, 4, 1, 3])])
def test_pad(rng, mode, pads):
    inits = {"pads": np.array(pads, np.int64)}
    if mode == "constant":
        inits["value"] = np.array(1.5, np.float32)
    run(one_node("Pad", [X], inits=inits, mode=mode), rng, [X])


def test_range_and_trilu(rng):
    model = make_model([helper.make_node("Range", ["s", "l", "d"], ["r"]),
                        helper.make_node("Add", ["x", "r"], ["y"])],
                       [("x", F32, [4])], [("y", F32, [4])],
                       {"s": np.array(1.0, np.float32), "l": np.array(3.0, np.float32), "d": np.array(0.5, np.float32)})
    run(model, rng, [("x", F32, [4])])
    for upper, k in ((1, 0), (0, 1), (1, -2)):
        run(one_node("Trilu", [("x", F32, [2, 5, 7])], inits={"k": np.array(k, np.int64)}, upper=upper),
            rng, [("x", F32, [2, 5, 7])])


def test_instance_norm(rng):
    inputs = [("x", F32, [2, 3, 5, 7])]
    inits = {"s": rng.standard_normal(3).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}
    run(one_node("InstanceNormalization", inputs, inits=inits, epsilon=1e-3), rng, inputs, rtol=1e-4, atol=1e-4)


def _indices(rng, n, shape, negative=True):
    low = -n if negative else 0
    return rng.integers(low, n, shape).astype(np.int64)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_by_run_time_indices(rng, axis):
    """Indices given at the call: a data-indexed view, negative ones counting from the end."""
    inputs = [("x", F32, [7, 33, 5]), ("i", I64, [4, 3])]
    n = [7, 33, 5][axis]
    out = {0: [4, 3, 33, 5], 1: [7, 4, 3, 5], -1: [7, 33, 4, 3]}[axis]
    model = one_node("Gather", inputs, out_shape=out, axis=axis)
    feeds = {"x": rng.standard_normal([7, 33, 5]).astype(np.float32), "i": _indices(rng, n, [4, 3])}
    check_against_ort(model, rng, feeds=feeds)


def test_gather_out_of_range_is_an_index_error(rng):
    import tcc
    from tcc.errors import TccIndexError

    model = one_node("Gather", [("x", F32, [5, 3]), ("i", I64, [4])], out_shape=[4, 3])
    compiled = tcc.onnx.load(model)
    x = rng.standard_normal([5, 3]).astype(np.float32)
    with pytest.raises(TccIndexError):
        compiled(x, np.array([0, 5, 1, 2]))
    with pytest.raises(TccIndexError):
        compiled(x, np.array([0, -6, 1, 2]))


def test_gather_of_bools_and_an_embedding_table(rng):
    inputs = [("x", BOOL, [9, 4]), ("i", I64, [6])]
    run_feeds = {"x": rng.random([9, 4]) > 0.5, "i": _indices(rng, 9, [6])}
    check_against_ort(one_node("Gather", inputs, BOOL, [6, 4]), rng, feeds=run_feeds)
    table = rng.standard_normal([1000, 16]).astype(np.float32)
    model = make_model([helper.make_node("Gather", ["E", "ids"], ["y"])], [("ids", I64, [2, 33])],
                       [("y", F32, [2, 33, 16])], {"E": table})
    check_against_ort(model, rng, feeds={"ids": _indices(rng, 1000, [2, 33], negative=False)})


def test_gather_by_computed_indices(rng):
    """ArgMax then Gather: indices the model computes are clamped (they are in range here)."""
    nodes = [helper.make_node("ArgMax", ["s"], ["i"], axis=1, keepdims=0),
             helper.make_node("Gather", ["x", "i"], ["y"], axis=0)]
    model = make_model(nodes, [("s", F32, [6, 7]), ("x", F32, [7, 3])], [("y", F32, [6, 3])])
    run(model, rng, [("s", F32, [6, 7]), ("x", F32, [7, 3])])


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_elements(rng, axis):
    inputs = [("x", F32, [7, 33]), ("i", I64, [5, 33] if axis == 0 else [7, 4])]
    n = [7, 33][axis]
    feeds = {"x": rng.standard_normal([7, 33]).astype(np.float32), "i": _indices(rng, n, inputs[1][2])}
    check_against_ort(one_node("GatherElements", inputs, out_shape=inputs[1][2], axis=axis), rng, feeds=feeds)


@pytest.mark.parametrize("batch_dims,ishape,oshape", [(0, [4, 2], [4, 5]), (0, [2, 3, 3], [2, 3]),
                                                      (1, [7, 2, 1], [7, 2, 5])])
def test_gather_nd(rng, batch_dims, ishape, oshape):
    data = [7, 3, 5]
    inputs = [("x", F32, data), ("i", I64, ishape)]
    q = ishape[-1]
    idx = np.stack([_indices(rng, data[batch_dims + c], ishape[:-1]) for c in range(q)], axis=-1)
    feeds = {"x": rng.standard_normal(data).astype(np.float32), "i": idx}
    check_against_ort(one_node("GatherND", inputs, out_shape=oshape, batch_dims=batch_dims), rng, feeds=feeds)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis,elem", [(1, F32), (0, F32), (-1, I64)])
def test_cumsum(rng, exclusive, reverse, axis, elem):
    inputs = [("x", elem, [7, 33])]
    model = one_node("CumSum", inputs, elem, inits={"axis": np.array(axis, np.int64)},
                     exclusive=exclusive, reverse=reverse)
    run(model, rng, inputs, rtol=1e-5, atol=1e-5)


def test_cumsum_is_a_scan(rng):
    """The fused program holds a recurrence, not a quadratic sum."""
    import tcc

    model = one_node("CumSum", [("x", F32, [3, 1000])], inits={"axis": np.array(1, np.int64)})
    assert "in order along" in tcc.onnx.load(model).lower("fused")


@pytest.mark.parametrize("axis", [0, 1])
def test_cumsum_of_a_computed_value(rng, axis):
    """The kernel split's fusion analysis meets the prefix sum's moving extent, over a reshaped
    intermediate whose size-1 dim the read drops (fuzz seed 356: an internal error)."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["m"]), helper.make_node("Reshape", ["m", "s"], ["r"]),
             helper.make_node("CumSum", ["r", "axis"], ["y"], exclusive=1)]
    model = make_model(nodes, [("x", F32, [5, 3])], [("y", F32, [1, 15])],
                       {"s": np.array([1, 15], np.int64), "axis": np.array(axis, np.int64)})
    run(model, rng, [("x", F32, [5, 3])], rtol=1e-5, atol=1e-5)
