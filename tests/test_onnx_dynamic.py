"""tcc.onnx.load of models with symbolic dims (no input_shapes): shape-generic kernels.

Each model is compared with onnxruntime at several sizes, outputs poisoned first, and the
kernels built are counted: the sizes after load compile nothing. A size the fitted kernels
do not serve (a Slice clamping at a constant) is compiled alone, said in the debug log.
"""

from __future__ import annotations

import io
import logging
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tcc  # noqa: E402
import tcc.compiler  # noqa: E402
from tcc.cli import main  # noqa: E402
from tcc.errors import TccCompileError  # noqa: E402
from tcc.interop.onnx import OnnxGenericModel  # noqa: E402

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(a, n) for n, a in dict(initializers).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _check(compiled, model, feeds, rtol=1e-4, atol=1e-5):
    """tcc (into NaN-poisoned outputs) against onnxruntime on ``feeds``."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)[0]
    out = np.full(expected.shape, np.nan, expected.dtype)
    compiled(**feeds, out=out)
    np.testing.assert_allclose(out, expected, rtol=rtol, atol=atol)
    np.testing.assert_allclose(compiled(**feeds), expected, rtol=rtol, atol=atol)  # (results allocated)


def _linear_softmax(rng):
    """Flatten [batch, seq, 16] to [batch * seq, 16], a linear layer, back by Shape (a shape
    computed at import, as exporters write it), softmax, and a mask of the first token's row."""
    w = rng.standard_normal((16, 24)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    nodes = [
        helper.make_node("Constant", [], ["flat"], value=numpy_helper.from_array(np.array([-1, 16], np.int64))),
        helper.make_node("Reshape", ["x", "flat"], ["x2"]),
        helper.make_node("Gemm", ["x2", "w", "b"], ["h"]),
        helper.make_node("Shape", ["x"], ["sx"], end=2),
        helper.make_node("Constant", [], ["last"], value=numpy_helper.from_array(np.array([24], np.int64))),
        helper.make_node("Concat", ["sx", "last"], ["s3"], axis=0),
        helper.make_node("Reshape", ["h", "s3"], ["h3"]),
        helper.make_node("Softmax", ["h3"], ["p"], axis=1),  # over the sequence
        helper.make_node("Mul", ["p", "m"], ["y"]),
    ]
    return _model(nodes, [("x", F32, ["batch", "seq", 16]), ("m", F32, ["batch", "seq", 1])],
                  [("y", F32, ["batch", "seq", 24])], {"w": w, "b": b})


def _feeds(rng, b, s):
    return {"x": rng.standard_normal((b, s, 16)).astype(np.float32),
            "m": (rng.random((b, s, 1)) > 0.3).astype(np.float32)}


def test_sizes_after_load_compile_nothing(fresh_cache, rng):
    model = _linear_softmax(rng)
    compiled = tcc.onnx.load(model)
    assert isinstance(compiled, OnnxGenericModel)
    assert compiled.shapes == {"x": ("batch", "seq", 16), "m": ("batch", "seq", 1)}
    built = compiled.compiles
    assert built >= 1
    for b, s in ((2, 7), (3, 33), (5, 2), (2, 1000)):
        _check(compiled, model, _feeds(rng, b, s))
    assert compiled.compiles == built and not compiled.graph.specialised
    text = compiled.lower("scheduled")
    assert "batch: i64" in text and "seq: i64" in text  # the kernels take the symbols as arguments


def test_a_symbol_at_one_is_a_family_of_its_own(fresh_cache, rng):
    """A dim of 1 broadcasts (its program differs beyond numbers): batch = 1 gets kernels of its
    own on its first call (seq still dynamic); every symbol at 1 is compiled for that size."""
    model = _linear_softmax(rng)
    compiled = tcc.onnx.load(model)
    _check(compiled, model, _feeds(rng, 1, 7))
    built = compiled.compiles
    for s in (5, 33, 2):
        _check(compiled, model, _feeds(rng, 1, s))
    assert compiled.compiles == built
    _check(compiled, model, _feeds(rng, 1, 1))
    assert compiled.graph.specialised == [{"batch": 1, "seq": 1}]


def test_a_size_the_kernels_do_not_fit_is_compiled_alone(fresh_cache, rng, caplog):
    """Slice to the first 24 positions: at sizes under 24 the result has seq rows (the fit), at
    30 it has 24; the fitted kernels do not serve 30, so that size compiles alone (a debug log
    says why), and the sizes the kernels serve still compile nothing."""
    model = _model([helper.make_node("Slice", ["x", "st", "en", "ax"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
                   [("x", F32, ["batch", "seq", 16])], [("y", F32, ["batch", "cut", 16])],
                   {"st": np.array([0], np.int64), "en": np.array([24], np.int64), "ax": np.array([1], np.int64)})
    compiled = tcc.onnx.load(model)
    built = compiled.compiles
    for b, s in ((2, 3), (3, 9)):
        _check(compiled, model, {"x": rng.standard_normal((b, s, 16)).astype(np.float32)})
    assert compiled.compiles == built
    with caplog.at_level(logging.DEBUG, logger="tcc.interop.graph_dynamic"):
        _check(compiled, model, {"x": rng.standard_normal((2, 30, 16)).astype(np.float32)})
    assert compiled.graph.specialised == [{"batch": 2, "seq": 30}]
    assert "compiled for batch=2, seq=30 alone" in caplog.text
    built = compiled.compiles
    _check(compiled, model, {"x": rng.standard_normal((4, 11, 16)).astype(np.float32)})
    assert compiled.compiles == built


def test_inputs_that_disagree_on_a_symbol(rng):
    compiled = tcc.onnx.load(_linear_softmax(rng))
    with pytest.raises(tcc.TccError, match="shape symbol seq is 7 in dim 1 of input x but 6 in dim 1 of input m"):
        compiled(np.zeros((2, 7, 16), np.float32), np.zeros((2, 6, 1), np.float32))
    with pytest.raises(tcc.TccError, match="input x has 15 in dim 2, the model takes 16"):
        compiled(np.zeros((2, 7, 15), np.float32), np.zeros((2, 7, 1), np.float32))


def _transformer(name):
    """A tiny BERT or GPT-2 exported with symbolic batch and sequence (TorchScript exporter)."""
    torch = pytest.importorskip("torch")
    t = pytest.importorskip("transformers")
    if name == "bert":
        config = t.BertConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=64)
        model, names = t.BertModel(config), ["input_ids", "attention_mask"]
    else:
        config = t.GPT2Config(vocab_size=101, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=0,
                              eos_token_id=0)
        model, names = t.GPT2Model(config), ["input_ids"]

    class FirstOutput(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model.eval()

        def forward(self, *args):
            return self.model(*args, return_dict=False)[0]

    args = (torch.randint(0, 101, (2, 7)), torch.ones(2, 7, dtype=torch.int64))[:len(names)]
    buffer = io.BytesIO()
    axes = {n: {0: "batch", 1: "seq"} for n in [*names, "out"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(FirstOutput(), args, buffer, dynamo=False, input_names=names, output_names=["out"],
                          opset_version=17, dynamic_axes=axes)
    return onnx.load_from_string(buffer.getvalue()), names


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_transformer_with_symbolic_batch_and_sequence_compiles_once(fresh_cache, rng, name):
    model, names = _transformer(name)
    compiled = tcc.onnx.load(model, progress=False)
    built = compiled.compiles
    for b, s in ((2, 7), (3, 5), (2, 30)):
        feeds = {"input_ids": rng.integers(0, 101, (b, s))}
        if "attention_mask" in names:
            feeds["attention_mask"] = np.ones((b, s), np.int64)
            feeds["attention_mask"][1, s - 2:] = 0  # a padded second sequence
        _check(compiled, model, feeds, rtol=1e-4, atol=1e-4)
    assert compiled.compiles == built and not compiled.graph.specialised


def test_cli_runs_a_model_with_symbolic_dims(tmp_path, rng, capsys):
    """``tcc onnx MODEL --run --check`` without --shape: random inputs at a probe size."""
    path = tmp_path / "m.onnx"
    onnx.save(_linear_softmax(rng), str(path))
    assert main(["onnx", str(path), "--run", "--check"]) == 0
    assert "vs onnxruntime: ok" in capsys.readouterr().out
    assert main(["onnx", str(path), "--stage", "loops"]) == 0
    assert "batch" in capsys.readouterr().out


def _causal_scores(rng):
    """Scores x [batch, seq, seq] plus a causal mask built from Shape (ConstantOfShape, Trilu,
    Equal, Where: the import folds it while it has at most 4096 elements, seq <= 64, and computes
    it in statements above), then softmax."""
    c = lambda name, *v: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(  # noqa: E731
        np.array(v, np.int64)))
    nodes = [
        helper.make_node("Shape", ["x"], ["sx"]), c("one", 1),
        helper.make_node("Gather", ["sx", "one"], ["s"]),  # [seq]
        helper.make_node("Concat", ["s", "s"], ["ss"], axis=0),
        helper.make_node("ConstantOfShape", ["ss"], ["ones"], value=numpy_helper.from_array(np.array([1], np.float32))),
        helper.make_node("Trilu", ["ones"], ["tri"], upper=0),
        helper.make_node("Constant", [], ["z"], value=numpy_helper.from_array(np.array(0, np.float32))),
        helper.make_node("Equal", ["tri", "z"], ["above"]),
        helper.make_node("Constant", [], ["ninf"], value=numpy_helper.from_array(np.array(-1e9, np.float32))),
        helper.make_node("Where", ["above", "ninf", "z"], ["mask"]),
        helper.make_node("Add", ["x", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["y"], axis=-1),
    ]
    return _model(nodes, [("x", F32, ["batch", "seq", "seq"])], [("y", F32, ["batch", "seq", "seq"])])


def test_a_fold_limited_by_size_is_a_family_of_its_own(fresh_cache, rng):
    """Past seq 64 the mask is no longer folded at import: the first such call probes around its
    size and compiles the kernels that differ; later lengths on either side compile nothing."""
    model = _causal_scores(rng)
    compiled = tcc.onnx.load(model)

    def run(b, s):
        _check(compiled, model, {"x": rng.standard_normal((b, s, s)).astype(np.float32)})

    run(2, 7)
    built = compiled.compiles
    run(3, 13)
    assert compiled.compiles == built
    run(2, 70)
    built = compiled.compiles
    for b, s in ((2, 75), (3, 90), (2, 33)):
        run(b, s)
    assert compiled.compiles == built and not compiled.graph.specialised


def test_a_kernel_that_cannot_be_dynamic_specialises_per_size(fresh_cache, rng, caplog, monkeypatch):
    """Where a pass cannot build a kernel with its symbols dynamic (here every build with a
    symbol fails), that kernel compiles per size, said in the debug log, and results stay right."""
    real = tcc.compiler.Op._build

    def no_dynamic(self, bindings, lowered, symbols):
        if symbols:
            raise TccCompileError("no dynamic extent here")
        return real(self, bindings, lowered, symbols)

    monkeypatch.setattr(tcc.compiler.Op, "_build", no_dynamic)
    model = _linear_softmax(rng)
    with caplog.at_level(logging.DEBUG, logger="tcc.interop.graph_dynamic"):
        compiled = tcc.onnx.load(model)
        for b, s in ((2, 7), (3, 5)):
            _check(compiled, model, _feeds(rng, b, s))
    assert "a kernel is specialised per size (TccCompileError" in caplog.text
    assert compiled.compiles >= 2
