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
                                "Mish", "Elu", "Celu", "Selu", "ThresholdedRelu"])
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
