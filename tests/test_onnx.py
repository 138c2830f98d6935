"""tcc.onnx against onnxruntime: each operator family on random inputs at odd sizes, whole
networks exported from PyTorch, and the errors for what tcc cannot import."""

from __future__ import annotations

import sys
from pathlib import Path

import gpu_sim
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tcc  # noqa: E402
from tcc.interop.onnx import OnnxImportError  # noqa: E402

F32 = TensorProto.FLOAT
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def make_model(nodes, inputs, outputs, initializers=(), opset=17):
    """A model from (name, elem type, shape) inputs/outputs; initializers are NumPy arrays by name."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(a, n) for n, a in dict(initializers).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def random_input(rng, elem, shape):
    if elem == TensorProto.BOOL:
        return rng.random(shape) > 0.5
    if elem == TensorProto.INT64:
        return rng.integers(-9, 10, shape).astype(np.int64)
    return (rng.standard_normal(shape) + 0.1).astype(np.float32)


def check_against_ort(model, rng, feeds=None, rtol=1e-4, atol=1e-5, **load_options):
    """Run tcc (outputs poisoned with NaN first) and onnxruntime on the same random inputs."""
    feeds = feeds or {n.name: random_input(rng, n.type.tensor_type.elem_type,
                                           [d.dim_value for d in n.type.tensor_type.shape.dim])
                      for n in model.graph.input if n.name not in {i.name for i in model.graph.initializer}}
    compiled = tcc.onnx.load(model, **load_options)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    outs = tuple(np.full(e.shape, np.nan if e.dtype.kind == "f" else 7, e.dtype) for e in expected)
    got = compiled(**feeds, out=outs[0] if len(outs) == 1 else outs)
    got = got if isinstance(got, tuple) else (got,)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    return compiled


def test_elementwise_chain_is_one_kernel(rng):
    """Sixteen elementwise nodes with broadcasting: one statement after fusion, matching ORT."""
    shape, row = [3, 7, 33], [1, 33]
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Mul", ["a", "x"], ["m"]),
             helper.make_node("Sub", ["m", "b"], ["s"]), helper.make_node("Abs", ["s"], ["ab"]),
             helper.make_node("Sqrt", ["ab"], ["sq"]), helper.make_node("Neg", ["sq"], ["ng"]),
             helper.make_node("Exp", ["ng"], ["e"]), helper.make_node("Log", ["e"], ["lg"]),
             helper.make_node("Erf", ["lg"], ["er"]), helper.make_node("Tanh", ["er"], ["th"]),
             helper.make_node("Sigmoid", ["th"], ["sg"]), helper.make_node("LeakyRelu", ["x"], ["lr"], alpha=0.2),
             helper.make_node("Gelu", ["lr"], ["ge"]), helper.make_node("Div", ["ge", "sg"], ["d"]),
             helper.make_node("Relu", ["d"], ["r"]), helper.make_node("Pow", ["sg", "b"], ["pw"]),
             helper.make_node("Sum", ["r", "pw", "x"], ["y"])]
    model = make_model(nodes, [("x", F32, shape), ("b", F32, row)], [("y", F32, shape)], opset=20)
    compiled = check_against_ort(model, rng, rtol=1e-4, atol=1e-5)
    te = compiled.lower("fused").split("fusion:")[0]
    # fusion's decision: 17 nodes, 3 loop nests (it keeps the two values an expensive expression reads twice)
    assert sum("] = " in line for line in te.splitlines()) == 3, te


def test_compare_where_clip_cast(rng):
    shape = [5, 1, 9]
    nodes = [helper.make_node("Less", ["x", "z"], ["lt"]), helper.make_node("Greater", ["x", "z"], ["gt"]),
             helper.make_node("Equal", ["lt", "gt"], ["eq"]), helper.make_node("Where", ["lt", "x", "z"], ["w"]),
             helper.make_node("Clip", ["w", "lo", "hi"], ["c"]), helper.make_node("Cast", ["c"], ["ci"], to=7),
             helper.make_node("Cast", ["ci"], ["y"], to=F32)]
    model = make_model(nodes, [("x", F32, shape), ("z", F32, [5, 4, 1])], [("y", F32, [5, 4, 9]),
                                                                           ("eq", TensorProto.BOOL, [5, 4, 9])],
                       {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)})
    feeds = {"x": rng.standard_normal(shape).astype(np.float32) * 3,
             "z": rng.standard_normal([5, 4, 1]).astype(np.float32)}
    check_against_ort(model, rng, feeds)


@pytest.mark.parametrize("a_shape,b_shape", [([7, 33], [33, 5]), ([2, 1, 3, 9], [4, 9, 7]), ([9], [9, 4]),
                                             ([3, 9], [9])])
def test_matmul_broadcast(rng, a_shape, b_shape):
    out = list(np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", F32, a_shape), ("b", F32, b_shape)],
                       [("y", F32, out)])
    check_against_ort(model, rng)


def test_gemm_transposed(rng):
    model = make_model([helper.make_node("Gemm", ["a", "w", "c"], ["y"], transA=1, transB=1, alpha=0.5, beta=2.0)],
                       [("a", F32, [33, 7])], [("y", F32, [7, 5])],
                       {"w": rng.standard_normal([5, 33]).astype(np.float32),
                        "c": rng.standard_normal([5]).astype(np.float32)})
    check_against_ort(model, rng)


CONVS = [  # (x shape, w shape, attributes)
    ([1, 3, 17], [4, 3, 3], {"pads": [1, 2], "strides": [2]}),
    ([2, 4, 9, 11], [6, 2, 3, 3], {"group": 2, "dilations": [2, 1], "pads": [2, 0, 1, 2]}),
    ([1, 5, 7, 9], [5, 1, 3, 3], {"group": 5, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ([1, 2, 5, 6, 7], [3, 2, 2, 3, 2], {"auto_pad": "SAME_LOWER", "strides": [1, 2, 1]}),
    ([2, 3, 8, 9], [4, 3, 2, 3], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", CONVS)
def test_conv(rng, x_shape, w_shape, attrs):
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[:1]).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    y_shape = ort.InferenceSession(make_model([node], [("x", F32, x_shape)], [("y", F32, None)],
                                              {"w": w, "b": b}).SerializeToString()).run(
        None, {"x": np.zeros(x_shape, np.float32)})[0].shape
    check_against_ort(make_model([node], [("x", F32, x_shape)], [("y", F32, list(y_shape))], {"w": w, "b": b}), rng)


def test_conv_batchnorm_relu_fold_into_one_kernel(rng):
    c, f = 3, 5
    init = {"w": rng.standard_normal([f, c, 3, 3]).astype(np.float32), "b": rng.standard_normal([f]).astype(np.float32),
            "s": rng.uniform(0.5, 1.5, [f]).astype(np.float32), "t": rng.standard_normal([f]).astype(np.float32),
            "mu": rng.standard_normal([f]).astype(np.float32), "var": rng.uniform(0.5, 2, [f]).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "s", "t", "mu", "var"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["y"])]
    model = make_model(nodes, [("x", F32, [2, c, 13, 11])], [("y", F32, [2, f, 13, 11])], init)
    compiled = check_against_ort(model, rng)
    assert any("bn folded" in note for note in compiled.notes())
    fused = compiled.lower("fused")
    assert "inline n: reduction, read once by" in fused  # conv + bn (folded) computed inside the relu


@pytest.mark.parametrize("conv_attrs", [{"strides": [2, 2], "pads": [1, 0, 1, 1]},
                                        {"strides": [3, 2], "output_padding": [1, 0], "group": 2}])
def test_conv_transpose(rng, conv_attrs):
    w = rng.standard_normal([4, 3, 3, 2]).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **conv_attrs)
    shape = ort.InferenceSession(make_model([node], [("x", F32, [1, 4, 5, 7])], [("y", F32, None)],
                                            {"w": w}).SerializeToString()).run(
        None, {"x": np.zeros([1, 4, 5, 7], np.float32)})[0].shape
    check_against_ort(make_model([node], [("x", F32, [1, 4, 5, 7])], [("y", F32, list(shape))], {"w": w}), rng)


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 3], "ceil_mode": 1, "strides": [2, 2], "dilations": [2, 1]}),
    # separable (rows, then columns): ceil_mode windows past the pads, asymmetric pads and strides
    ("MaxPool", {"kernel_shape": [3, 2], "ceil_mode": 1, "strides": [2, 3], "pads": [0, 1, 1, 0]}),
    ("MaxPool", {"kernel_shape": [4, 3], "strides": [1, 2], "auto_pad": "SAME_UPPER"}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "count_include_pad": 1, "ceil_mode": 1,
                     "strides": [2, 2]}),
    ("GlobalAveragePool", {}),
])
def test_pooling(rng, op, attrs):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    shape = ort.InferenceSession(make_model([node], [("x", F32, [2, 3, 9, 11])], [("y", F32, None)])
                                 .SerializeToString()).run(None, {"x": np.zeros([2, 3, 9, 11], np.float32)})[0].shape
    check_against_ort(make_model([node], [("x", F32, [2, 3, 9, 11])], [("y", F32, list(shape))]), rng)


def test_normalisation_softmax_reductions(rng):
    shape = [3, 7, 33]
    init = {"g": rng.standard_normal([33]).astype(np.float32), "b": rng.standard_normal([33]).astype(np.float32),
            "axes": np.array([0, 2], np.int64)}
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], epsilon=1e-3),
             helper.make_node("Softmax", ["ln"], ["sm"], axis=1), helper.make_node("LogSoftmax", ["x"], ["ls"]),
             helper.make_node("ReduceSum", ["sm", "axes"], ["rs"], keepdims=0),
             helper.make_node("ReduceMean", ["ls"], ["rm"], axes=[1]), helper.make_node("ReduceMax", ["x"], ["rx"],
                                                                                       axes=[2], keepdims=0)]
    model = make_model(nodes, [("x", F32, shape)], [("rs", F32, [7]), ("rm", F32, [3, 1, 33]), ("sm", F32, shape),
                                                    ("rx", F32, [3, 7])], init, opset=17)
    check_against_ort(model, rng)


def test_shape_nodes_become_views_and_constants(rng):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, Transpose, Slice, Squeeze, Flatten, Split,
    ConstantOfShape, Gather: folded at import or index expressions; one pass over x."""
    i64 = TensorProto.INT64
    nodes = [helper.make_node("Shape", ["x"], ["shp"]),
             helper.make_node("Gather", ["shp", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["newshape"], axis=0),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["xt", "newshape"], ["r"]),
             helper.make_node("Slice", ["r", "starts", "ends", "axes", "steps"], ["sl"]),
             helper.make_node("Flatten", ["x"], ["fl"], axis=2),
             helper.make_node("Unsqueeze", ["sl", "zero1"], ["us"]),
             helper.make_node("Squeeze", ["us", "zero1"], ["sq"]),
             helper.make_node("ConstantOfShape", ["newshape2"], ["ones"],
                              value=numpy_helper.from_array(np.array([2.0], np.float32))),
             helper.make_node("Gather", ["fl", "idx"], ["g"], axis=1),
             helper.make_node("Concat", ["sq", "ones"], ["y"], axis=1),
             helper.make_node("Gather", ["x", "dyn"], ["gd"], axis=1)]
    init = {"zero": np.array(0, np.int64), "zero1": np.array([0], np.int64), "minus1": np.array([-1], np.int64),
            "starts": np.array([-2], np.int64), "ends": np.array([-100], np.int64), "axes": np.array([1], np.int64),
            "steps": np.array([-3], np.int64), "newshape2": np.array([3, 4], np.int64),
            "idx": np.array([[2, 0], [1, 1]], np.int64)}
    model = make_model(nodes, [("x", F32, [3, 5, 7, 3]), ("dyn", i64, [2])],
                       [("y", F32, [3, 37]), ("g", F32, [3, 2, 2, 21]), ("gd", F32, [3, 2, 7, 3])], init)
    feeds = {"x": rng.standard_normal([3, 5, 7, 3]).astype(np.float32), "dyn": np.array([-1, 3], np.int64)}
    check_against_ort(model, rng, feeds)


def _networks():
    sys.path.insert(0, str(EXAMPLES))
    import onnx_models

    return onnx_models


@pytest.mark.parametrize("batch", [1, 3])
def test_resnet_style_cnn_matches_ort_and_torch(rng, batch):
    torch = pytest.importorskip("torch")
    nets = _networks()
    model = nets.randomized(nets.ResNet(width=8, blocks=(1, 1), classes=11))
    x = torch.from_numpy(rng.standard_normal([batch, 3, 33, 35]).astype(np.float32))
    data = nets.export(model, x)
    compiled = check_against_ort(onnx.load_from_string(data), rng, {"x": x.numpy()}, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x), model(x).numpy(), rtol=1e-4, atol=1e-4)  # a torch tensor in


def test_transformer_encoder_block_matches_ort_and_torch(rng):
    torch = pytest.importorskip("torch")
    nets = _networks()
    model = nets.randomized(nets.EncoderBlock(dim=32, heads=4, hidden=65))
    x = torch.from_numpy(rng.standard_normal([2, 7, 32]).astype(np.float32))
    compiled = check_against_ort(onnx.load_from_string(nets.export(model, x)), rng, {"x": x.numpy()},
                                 rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x.numpy()), model(x).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_cuda_matches_cpu(rng):
    if not tcc.cuda.is_available():
        pytest.skip("no CUDA GPU")
    torch = pytest.importorskip("torch")
    nets = _networks()
    model = nets.randomized(nets.ResNet(width=8, blocks=(1, 1), classes=11))
    x = rng.standard_normal([2, 3, 33, 35]).astype(np.float32)
    data = nets.export(model, torch.from_numpy(x))
    got = tcc.onnx.load(data, target="cuda")(x)
    got = got.to_numpy() if hasattr(got, "to_numpy") else np.asarray(got)
    np.testing.assert_allclose(got, tcc.onnx.load(data)(x), rtol=1e-3, atol=1e-3)


def test_unsupported_operators_are_listed_at_once():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Hardmax", ["r"], ["h"], name="hm"),
             helper.make_node("LpNormalization", ["h"], ["l"], name="lp"),
             helper.make_node("Hardmax", ["l"], ["y"], name="hm2")]
    model = make_model(nodes, [("x", F32, [2, 3])], [("y", F32, [2, 3])])
    with pytest.raises(OnnxImportError, match=r"operators not supported by tcc: Hardmax \(2 nodes: hm, hm2\); "
                                              r"LpNormalization \(1 node: lp\)"):
        tcc.onnx.load(model)


def test_unsupported_attribute_and_type_are_errors():
    gelu = make_model([helper.make_node("Gelu", ["x"], ["y"], approximate="erfc", name="g")],
                      [("x", F32, [2])], [("y", F32, [2])], opset=20)
    with pytest.raises(OnnxImportError, match=r"node g \(Gelu\): approximate='erfc'"):
        tcc.onnx.load(gelu)
    uint8 = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.UINT8, [2])],
                       [("y", TensorProto.UINT8, [2])])
    with pytest.raises(OnnxImportError, match="uint8, which tcc does not have"):
        tcc.onnx.load(uint8)


def test_symbolic_dims_translate_for_given_shapes_and_load_shape_generic(rng):
    """``translate`` needs every shape; ``load`` keeps a symbolic dim a shape symbol (CPU) unless
    ``input_shapes`` fixes it (tests/test_onnx_dynamic.py runs the shape-generic models)."""
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F32, ["N", 5])], [("y", F32, ["N", 5])])
    with pytest.raises(OnnxImportError, match="dimension 0 is N"):
        tcc.onnx.translate(model)
    x = rng.standard_normal([7, 5]).astype(np.float32)
    np.testing.assert_array_equal(tcc.onnx.load(model, input_shapes={"x": (7, 5)})(x), np.maximum(x, 0))
    np.testing.assert_array_equal(tcc.onnx.load(model)(x), np.maximum(x, 0))


def test_runtime_shape_input_is_refused_until_given():
    model = make_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")],
                       [("x", F32, [2, 6]), ("s", TensorProto.INT64, [2])], [("y", F32, [3, 4])])
    with pytest.raises(OnnxImportError, match=r"node r \(Reshape\): input shape \('s'\) must be known at import"):
        tcc.onnx.load(model)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    compiled = tcc.onnx.load(model, constants={"s": np.array([3, 4])})
    np.testing.assert_array_equal(compiled(x), x.reshape(3, 4))


def test_cli_prints_fused_stage_and_checks_against_ort(tmp_path, rng, capsys):
    from tcc.cli import main

    w = rng.standard_normal([4, 3, 3, 3]).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    path = tmp_path / "m.onnx"
    onnx.save(make_model(nodes, [("x", F32, [1, 3, 9, 7])], [("y", F32, [1, 4, 9, 7])], {"w": w}), path)
    assert main(["onnx", str(path), "--stage", "fused"]) == 0
    assert "inline t_c: reduction, read once by y" in capsys.readouterr().out  # conv + relu: one kernel
    assert main(["onnx", str(path), "--run", "--check", "--seed", "3"]) == 0
    assert "vs onnxruntime: ok" in capsys.readouterr().out


def test_docs_example_runs():
    """The Python example of docs/onnx.md, as written."""
    text = (EXAMPLES.parent / "docs" / "onnx.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "docs/onnx.md", "exec"), namespace)  # noqa: S102 - the documentation's own example
    x, w = namespace["x"], namespace["w"]
    model = namespace["model"]
    model.ir_version = 8  # helper.make_model writes onnx 1.23's IR version 14; onnxruntime 1.31 reads up to 13
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(namespace["y"], session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert w.shape == (8, 3, 3, 3)


def test_malformed_node_is_an_import_error():
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], name="mp")], [("x", F32, [1, 1, 4, 4])],
                       [("y", F32, [1, 1, 2, 2])])  # no kernel_shape
    with pytest.raises(OnnxImportError, match=r"node mp \(MaxPool\): malformed node"):
        tcc.onnx.load(model)
    missing = make_model([helper.make_node("Add", ["x"], ["y"], name="add")], [("x", F32, [3])], [("y", F32, [3])])
    with pytest.raises(OnnxImportError, match=r"node add \(Add\): malformed node"):
        tcc.onnx.load(missing)
    with pytest.raises(tcc.TccError, match="not an ONNX model"):
        tcc.onnx.load(b"\x00not a model")


def test_cuda_code_generates_without_a_gpu(rng):
    """target="cuda" goes through the same import; its CUDA C builds here (running needs a GPU)."""
    torch = pytest.importorskip("torch")
    nets = _networks()
    model = nets.randomized(nets.EncoderBlock(dim=32, heads=4, hidden=65))
    data = nets.export(model, torch.from_numpy(rng.standard_normal([2, 7, 32]).astype(np.float32)))
    assert "__global__" in tcc.onnx.load(data, target="cuda", compile_now=False).lower("cuda")


@pytest.mark.parametrize("net, shape", [("encoder", [1, 16, 33]), ("resnet", [1, 3, 9, 11])])
def test_cuda_schedule_matches_torch_in_the_simulator(rng, net, shape):
    """The whole graph's CUDA schedule (every kernel: tiled GEMMs, block all-reductions) run by
    the CPU simulator of scheduled CUDA loop IR (tests/gpu_sim.py) against PyTorch. The encoder's
    fc1 is large enough to be a GEMM, which fusion must not group with LayerNorm on CUDA."""
    torch = pytest.importorskip("torch")
    nets = _networks()
    model = nets.randomized(nets.EncoderBlock(dim=33, heads=3, hidden=65) if net == "encoder"
                            else nets.ResNet(width=8, blocks=(1, 1), classes=11))
    x = rng.standard_normal(shape).astype(np.float32)
    compiled = tcc.onnx.load(nets.export(model, torch.from_numpy(x)), target="cuda", compile_now=False)
    func = compiled.op.lowered({}).scheduled
    arrays = {p.name: x.copy() if p.name in compiled.input_names else np.ascontiguousarray(compiled._weights[p.name])
              if p.name in compiled._weights else np.full(p.shape, np.nan, np.float32) for p in func.params}
    (out,) = [name for name, a in arrays.items() if np.isnan(a).all()]  # the result, poisoned
    gpu_sim.run(func, arrays)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(arrays[out].reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad", [123, "/nonexistent/model.onnx", "/dev/zero", __file__])
def test_what_is_not_a_model_is_an_argument_error(bad):
    with pytest.raises(tcc.TccError, match="tcc.onnx.load takes|cannot read ONNX model"):
        tcc.onnx.load(bad)


def test_float16_and_int_graphs(rng):
    f16, i32 = TensorProto.FLOAT16, TensorProto.INT32
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"]),
             helper.make_node("Div", ["p", "q"], ["d"]), helper.make_node("ReduceSum", ["d"], ["s"], keepdims=0)]
    model = make_model(nodes, [("a", f16, [7, 33]), ("b", f16, [33, 5]), ("p", i32, [3, 9]), ("q", i32, [3, 9])],
                       [("y", f16, [7, 5]), ("s", i32, [])], opset=12)
    q = rng.integers(1, 5, [3, 9]).astype(np.int32) * rng.choice([-1, 1], [3, 9]).astype(np.int32)
    feeds = {"a": rng.standard_normal([7, 33]).astype(np.float16), "b": rng.standard_normal([33, 5]).astype(np.float16),
             "p": rng.integers(-20, 20, [3, 9]).astype(np.int32), "q": q}
    check_against_ort(model, rng, feeds, rtol=1e-2, atol=1e-3)  # Div on ints rounds toward zero, as in ONNX


def test_a_strided_constant_is_read_as_its_values(rng):
    """A constant given as a strided view (``constants={"w": a[:, ::2]}``, or a transposed array)
    is the values the view shows: the kernel was handed the view's buffer as if contiguous."""
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                       [("x", TensorProto.FLOAT, [65, 97]), ("w", TensorProto.FLOAT, [97, 33])],
                       [("y", TensorProto.FLOAT, [65, 33])])  # a GEMM: its constant weights are packed once
    w = rng.standard_normal((33, 194)).astype(np.float32).T[::2]  # (97, 33), neither C- nor F-contiguous
    x = rng.standard_normal((65, 97)).astype(np.float32)
    got = tcc.onnx.load(model, constants={"w": w})(x)
    np.testing.assert_allclose(got, x @ w, rtol=1e-4, atol=1e-4)
