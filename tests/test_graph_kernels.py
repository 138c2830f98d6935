"""tcc.onnx on the CPU runs a model as kernels (tcc.interop.graph_kernels): identical layers share
one, a warm load runs no pass, and graphs whose values are read by several kernels, left unread
or returned as well as read still match onnxruntime. Kernels built in worker processes land in
the disk cache."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from test_onnx import _networks, check_against_ort, make_model  # noqa: E402

import tcc  # noqa: E402
from tcc import compiler  # noqa: E402
from tcc.frontend.unparse import call, num, reduction, var  # noqa: E402
from tcc.interop import graph_build, graph_kernels, graph_model  # noqa: E402
from tcc.interop.graph import Program  # noqa: E402
from tcc.runtime import cache  # noqa: E402

F32 = TensorProto.FLOAT


def conv_stack(rng, depth: int, channels: int = 8, size: tuple[int, int] = (9, 7)):
    """``depth`` Conv + Relu layers of one shape (each its own weights), then a Softmax over rows."""
    nodes, init, x = [], {}, "x"
    for d in range(depth):
        init[f"w{d}"] = rng.standard_normal([channels, channels, 3, 3]).astype(np.float32) / 4
        init[f"b{d}"] = rng.standard_normal([channels]).astype(np.float32)
        nodes += [helper.make_node("Conv", [x, f"w{d}", f"b{d}"], [f"c{d}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{d}"], [f"r{d}"])]
        x = f"r{d}"
    nodes.append(helper.make_node("Softmax", [x], ["y"], axis=3))
    shape = [2, channels, *size]
    return make_model(nodes, [("x", F32, shape)], [("y", F32, shape)], init)


def test_identical_layers_share_one_kernel(rng, fresh_cache):
    compiled = check_against_ort(conv_stack(rng, depth=4), rng)
    sources = [k.source for k in compiled.kernels]
    # four conv + relu kernels of one code, then the softmax's statements as one more
    assert len(sources) == 5 and len(set(sources)) == 2, compiled.lower("fused")
    assert "kernels: 5, 2 distinct" in compiled.lower("fused")
    assert compiled.lower("scheduled").count("# kernel ") == 2
    # the weights' GEMM panels are packed once, at load: one set per layer, kept with the shared kernel
    conv = compiled._calls[0][0].kernel({})
    assert conv.prepared is not None and len(conv.prepared._made) == 4


def test_warm_load_runs_no_pass_and_no_split(rng, fresh_cache, monkeypatch):
    model = conv_stack(rng, depth=2)
    x = rng.standard_normal([2, 8, 9, 7]).astype(np.float32)
    expected = tcc.onnx.load(model, jobs=1)(x)
    cache.MEMORY.clear()  # as a new process finds it: only the disk cache

    def refuse(*args, **kwargs):
        raise AssertionError("a warm load ran the compiler")

    monkeypatch.setattr(compiler, "lower_op", refuse)
    monkeypatch.setattr(graph_kernels, "split", refuse)
    np.testing.assert_array_equal(tcc.onnx.load(model)(x), expected)


def test_values_read_by_several_kernels_unread_and_returned(rng, fresh_cache):
    """A value two kernels read, an expensive one read twice, a node nobody reads, an output that
    later nodes also read, and two outputs written through out=."""
    w = rng.standard_normal([24, 16, 1, 1]).astype(np.float32)
    nodes = [helper.make_node("Exp", ["x"], ["e"]),
             helper.make_node("Conv", ["e", "w"], ["c"]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Tanh", ["c"], ["dead"]),
             helper.make_node("ReduceMean", ["r"], ["m"], axes=[2, 3], keepdims=1),
             helper.make_node("Sub", ["r", "m"], ["s"]),
             helper.make_node("Mul", ["s", "e2"], ["y"]),
             helper.make_node("ReduceSum", ["e", "axes"], ["e2"], keepdims=1)]
    nodes = [*nodes[:6], nodes[7], nodes[6]]
    axes = np.array([1], np.int64)
    model = make_model(nodes, [("x", F32, [1, 16, 7, 33])], [("y", F32, [1, 24, 7, 33]), ("m", F32, [1, 24, 1, 1])],
                       {"w": w, "axes": axes}, opset=17)
    compiled = check_against_ort(model, rng, rtol=1e-4, atol=1e-3)  # results up to ~200 after a cancelling Sub
    assert len(compiled.kernels) == 3  # exp; the conv + relu; the mean, the sum of e and the rest
    assert not any("dead" in name for k in compiled.kernels for name in k.results)


def test_workers_build_kernels_into_the_disk_cache(rng, fresh_cache, monkeypatch):
    model = tcc.onnx.load(conv_stack(rng, depth=2, size=(5, 33)), compile_now=False)
    sources = list(dict.fromkeys(k.source for k in model.kernels))
    todo = [*((s, ()) for s in sources), ("op kernel(x: f32[3]) -> y: f32[3] { y[i] = nothing[i] }", ())]
    done = []
    workers = graph_build.Workers(todo, {}, 2, lambda: done.append(1))
    workers.join()  # the caller took nothing: the workers build everything
    assert len(done) == len(sources) + 1  # the bad source is reported done too: the caller raises its error
    assert len(list(fresh_cache.glob("*/*.bin"))) == len(sources)
    torch = pytest.importorskip("torch")
    nets = _networks()
    net = nets.randomized(nets.ResNet(width=8, blocks=(1, 1), classes=11))
    data = nets.export(net, torch.zeros(1, 3, 33, 35))
    monkeypatch.setattr(graph_model, "PARALLEL_AFTER_S", 0.0)  # a worker from the first kernel on
    started = []
    monkeypatch.setattr(graph_model, "Workers", lambda *args: started.append(1) or graph_build.Workers(*args))
    check_against_ort(onnx.load_from_string(data), rng, rtol=1e-4, atol=1e-4, jobs=2)
    assert started


def test_scalar_result_of_a_dot_product(rng):
    """MatMul of two vectors: a result of rank 0 (no loop for the partition to look at)."""
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", F32, [33]), ("b", F32, [33])],
                       [("y", F32, [])])
    check_against_ort(model, rng)


def test_a_tensor_added_into_and_read_by_a_later_kernel(rng):
    """A scatter-add target (two statements: its zero fill and the +=) that a matrix product in a
    kernel of its own reads: the kernel computing it returns it once (it was named twice among
    its results, a name error in the kernel's source)."""
    n, d, e = 64, 128, 33
    p = Program()
    idx, v, w = p.add_input("idx", (n,), "i64"), p.add_input("v", (n, d), "f32"), p.add_input("w", (d, d), "f32")
    grad = p.emit("g", (e, d), "f32", lambda ix: num(0.0))
    p.accumulate(grad, (n, d), lambda ix: [call("min", call("max", idx.read(ix[:1]), 0), e - 1), ix[1]], v.read)
    y = p.emit("y", (e, d), "f32", lambda ix: reduction("sum", [("k", d)], grad.read([ix[0], var("k")])
                                                          * w.read([var("k"), ix[1]])))
    p.add_result("a", grad)
    p.add_result("b", y)
    model = graph_model.GraphModel(p, "cpu", ["idx", "v", "w"], ["a", "b"], {})
    assert len(model.kernels) > 1 and all(len(set(k.results)) == len(k.results) for k in model.kernels)
    index = rng.integers(0, e, n)
    values, weights = rng.standard_normal((n, d)).astype(np.float32), rng.standard_normal((d, d)).astype(np.float32)
    expected = np.zeros((e, d))
    np.add.at(expected, index, values.astype(np.float64))
    got, product = model(index, values, weights)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(product, expected @ weights, rtol=1e-4, atol=1e-3)


def test_independent_statements_are_kernels_of_their_own(rng):
    """A run of statements that share no tensor (a training forward's saved activations: each
    layer's copies and views) is cut into pieces, so the layers' identical pieces are one kernel;
    a piece whose statements read each other stays one kernel."""
    p = Program()
    layers = [(p.add_input(f"a{n}", (7, 33), "f32"), p.add_input(f"b{n}", (33,), "f32")) for n in range(3)]
    for n, (a, b) in enumerate(layers):
        scaled = p.emit(f"s{n}", (7, 33), "f32", lambda ix, a=a, b=b: a.read(ix) * b.read(ix[1:]))
        p.add_result(f"copy{n}", scaled)
        p.add_result(f"row{n}", p.emit(f"m{n}", (7,), "f32", lambda ix, s=scaled: reduction(
            "sum", [("k", 33)], s.read([ix[0], var("k")]))))
    names = [name for n in range(3) for name in (f"a{n}", f"b{n}")]
    model = graph_model.GraphModel(p, "cpu", names, [r[0] for r in p.results], {})
    assert len(model.kernels) == 3 and len({k.source for k in model.kernels}) == 1, model.lower("fused")
    arrays = [rng.standard_normal((7, 33) if name[0] == "a" else (33,)).astype(np.float32) for name in names]
    got = model(*arrays)
    for n in range(3):
        a, b = arrays[2 * n].astype(np.float64), arrays[2 * n + 1].astype(np.float64)
        np.testing.assert_allclose(got[2 * n], a * b, rtol=1e-6)
        np.testing.assert_allclose(got[2 * n + 1], (a * b).sum(axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, also_returned", [(33, False), (64, True)])
def test_an_elementwise_function_of_a_gemm_joins_its_kernel(rng, rows, also_returned):
    """``h * tanh(h)`` of ``h = x @ W`` (a GELU-like epilogue, reading the GEMM twice, so fusion
    keeps the GEMM apart) runs in the GEMM's kernel, applied as the register tiles are written
    back; where ``h`` is also a result, a copy of it is a second kernel. Both match onnxruntime."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Mul", ["h", "t"], ["y"])]
    outputs = [("y", F32, [1, rows, 96])] + ([("h", F32, [1, rows, 96])] if also_returned else [])
    model = make_model(nodes, [("x", F32, [1, rows, 64])], outputs,
                       {"w": rng.standard_normal([64, 96]).astype(np.float32) / 8})
    compiled = check_against_ort(model, rng)
    assert len(compiled.kernels) == 1 + also_returned, compiled.lower("fused")
    if not also_returned:
        tile_store = [line for line in compiled.lower("scheduled").splitlines() if "tanh(" in line]
        assert tile_store and not any("t0[" in line for line in tile_store), tile_store  # from the tiles
