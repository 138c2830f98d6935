"""The buffers a compiled ONNX model reuses between calls: never shared by two live values, and
the answers stay right call after call, on several threads at once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tcc  # noqa: E402
from tcc.interop.graph_memory import BufferPlan  # noqa: E402

SHAPE = [2, 16, 9, 11]  # channels enough for each conv to be its own GEMM kernel


def random_program(rng: np.random.Generator, kernels: int):
    """Kernels reading 1-3 earlier values and writing 1-2 new ones, of a few layouts."""
    layouts = [((3, 5), np.dtype(np.float32)), ((7,), np.dtype(np.float32)), ((3, 5), np.dtype(np.int64))]
    values, calls, layout_of = ["x"], [], {}
    for n in range(kernels):
        reads = list(rng.choice(values, size=min(len(values), int(rng.integers(1, 4))), replace=False))
        written = [f"v{n}_{j}" for j in range(int(rng.integers(1, 3)))]
        for name in written:
            layout_of[name] = layouts[int(rng.integers(len(layouts)))]
        calls.append((reads, written))
        values += written
    return calls, layout_of, tuple(calls[-1][1])


@pytest.mark.parametrize("seed", range(40))
def test_no_slot_holds_two_live_values(seed):
    rng = np.random.default_rng(seed)
    calls, layouts, results = random_program(rng, int(rng.integers(2, 30)))
    plan = BufferPlan(calls, layouts, results)
    written_at = {name: n for n, (_, written) in enumerate(calls) for name in written}
    last_read = {name: n for n, (reads, _) in enumerate(calls) for name in reads}
    assert not set(results) & set(plan.slot_of)
    assert set(plan.slot_of) == set(written_at) - set(results)
    by_slot: dict[int, list[str]] = {}
    for name, slot in plan.slot_of.items():
        assert plan.layouts[slot] == layouts[name]
        by_slot.setdefault(slot, []).append(name)
    for names in by_slot.values():
        spans = sorted((written_at[n], max(written_at[n], last_read.get(n, written_at[n]))) for n in names)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end < start, f"slot shared by values live at once: {spans}"


def test_a_chain_takes_turns_in_two_buffers():
    f32 = ((4,), np.dtype(np.float32))
    calls = [(["x"], ["a"]), (["a"], ["b"]), (["b"], ["c"]), (["c"], ["d"]), (["d", "b"], ["e"]), (["e"], ["y"])]
    plan = BufferPlan(calls, {n: f32 for n in "abcdey"}, ("y",))
    assert plan.slot_of["a"] == plan.slot_of["c"] != plan.slot_of["b"]  # a is dead once b is written
    assert plan.slot_of["d"] not in (plan.slot_of["b"], plan.slot_of["c"])  # b is read again by e
    assert len(plan.layouts) == 3 and "y" not in plan.slot_of


def residual_model():
    """conv, relu, conv, + x, relu, conv: intermediates of one shape, one read again later."""
    rng = np.random.default_rng(0)
    weights = {f"w{i}": (rng.standard_normal([16, 16, 3, 3]) * 0.1).astype(np.float32) for i in range(3)}
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], **conv),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w1"], ["c"], **conv),
             helper.make_node("Add", ["c", "x"], ["d"]),
             helper.make_node("Relu", ["d"], ["e"]),
             helper.make_node("Conv", ["e", "w2"], ["f"], **conv),
             helper.make_node("Add", ["f", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
                              [numpy_helper.from_array(a, n) for n, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_calls_reuse_their_buffers_and_stay_right(rng):
    model = residual_model()
    compiled = tcc.onnx.load(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    kept = []
    for _ in range(4):
        x = rng.standard_normal(SHAPE).astype(np.float32)
        got = compiled(x)
        np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
        kept.append((got.copy(), got))
    for copy, returned in kept:  # a later call wrote none of the results handed out before
        np.testing.assert_array_equal(copy, returned)
    assert len(compiled.compile()._calls) > 1 and compiled._arenas.plan.slot_of
    arena = compiled._arenas.take()
    before = [id(a) for a in arena.arrays]
    compiled._arenas.give_back(arena)
    compiled(rng.standard_normal(SHAPE).astype(np.float32))
    assert [id(a) for a in compiled._arenas.take().arrays] == before  # the same buffers again


def test_calls_on_several_threads_at_once_get_their_own_buffers(rng):
    model = residual_model()
    compiled = tcc.onnx.load(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(4)]
    expected = [session.run(None, {"x": x})[0] for x in inputs]
    compiled(inputs[0])
    failures: list[str] = []
    start = threading.Barrier(len(inputs))

    def run(i: int) -> None:
        start.wait()
        for _ in range(25):
            got = compiled(inputs[i])
            if not np.allclose(got, expected[i], rtol=1e-4, atol=1e-5):
                failures.append(f"thread {i}: max error {np.abs(got - expected[i]).max():.3g}")
                return

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_released_buffers_are_planned_again(rng):
    model = residual_model()
    compiled = tcc.onnx.load(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal(SHAPE).astype(np.float32)
    compiled(x)
    compiled(x)
    compiled.release_buffers()
    assert compiled._arenas is None
    for _ in range(2):
        x = rng.standard_normal(SHAPE).astype(np.float32)
        np.testing.assert_allclose(compiled(x), session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert compiled._arenas is not None
