"""Run one generated graph with tcc and with onnxruntime (optimisations off: the reference is
each operator's own kernel, not a rewritten graph) and compare every output.

The outcome is one of: ``ok``; ``invalid`` (onnx.checker or onnxruntime refused the graph: a
generator limit, discarded and counted apart); ``refused`` (tcc raised an ``OnnxImportError``,
naming an operator, attribute or type it does not have); ``mismatch`` (a wrong value, dtype or
shape, or an output left unwritten); ``error`` (any other exception from tcc on a valid graph: a
bounds error, an internal error). The pool adds ``crash`` and ``timeout``.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto

import tcc
from fuzz.onnx.generate import feeds_for, generate
from tcc.interop.onnx import OnnxImportError
from tcc.testing import TOLERANCE, max_relative_error

# a whole graph accumulates rounding, and onnxruntime rounds f16 after every node where tcc
# fuses several into one f32 expression: a few times one op's tolerance
GRAPH_TOLERANCE = {TensorProto.FLOAT16: 3 * TOLERANCE["f16"], TensorProto.FLOAT: 5 * TOLERANCE["f32"],
                   TensorProto.DOUBLE: 1e-8}


@dataclass
class Outcome:
    seed: int
    status: str  # ok | invalid | refused | mismatch | error
    detail: str = ""


def check_seed(seed: int) -> Outcome:
    try:
        case = generate(seed)
    except Exception as exc:  # noqa: BLE001 - a generator bug: no graph, nothing of tcc's to blame
        return Outcome(seed, "invalid", f"generator: {describe(exc)}")
    return check_model(case.model, seed, case.feeds)


def check_model(model: onnx.ModelProto, seed: int, feeds: dict[str, np.ndarray] | None = None) -> Outcome:
    """Compare tcc with onnxruntime on ``model`` (inputs from ``seed`` unless given)."""
    feeds = feeds if feeds is not None else feeds_for(model, seed)
    try:
        onnx.checker.check_model(model, full_check=True)
        expected = reference(model, feeds)
    except Exception as exc:  # noqa: BLE001 - whatever the oracle refuses is not a valid graph
        return Outcome(seed, "invalid", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    try:
        compiled = tcc.onnx.load(model, jobs=1, progress=False)
        poisoned = tuple(np.full(e.shape, np.nan if e.dtype.kind == "f" else 7, e.dtype) for e in expected)
        got = compiled(**feeds, out=poisoned[0] if len(poisoned) == 1 else poisoned)
    except OnnxImportError as exc:
        return Outcome(seed, "refused", str(exc).splitlines()[0])
    except Exception as exc:  # noqa: BLE001 - anything else on a valid graph is a bug to report
        return Outcome(seed, "error", describe(exc))
    got = got if isinstance(got, tuple) else (got,)
    producer = {out: n.op_type for n in model.graph.node for out in n.output}
    names = [f"{producer.get(o.name, 'input')} output {o.name}" for o in model.graph.output]
    tol = tolerance(model)
    problems = [p for n, g, e in zip(names, got, expected) if (p := compare(n, np.asarray(g), e, tol))]
    return Outcome(seed, "mismatch", "; ".join(problems)) if problems else Outcome(seed, "ok")


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # no warnings about unused initializers
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def tolerance(model: onnx.ModelProto) -> float:
    """The tolerance of the least precise float type in the graph: an f64 output computed from
    f32 values (through a Cast) carries f32's rounding."""
    graph = onnx.shape_inference.infer_shapes(model).graph
    elems = {vi.type.tensor_type.elem_type for vi in [*graph.input, *graph.value_info, *graph.output]}
    return max((GRAPH_TOLERANCE[e] for e in elems if e in GRAPH_TOLERANCE), default=0.0)


def compare(name: str, got: np.ndarray, want: np.ndarray, tol: float) -> str:
    """What is wrong with output ``name`` (empty when it matches)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{name}: got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    if want.dtype.kind != "f":
        wrong = np.argwhere(got != want)
        return f"{name}: {len(wrong)} of {want.size} differ, first at {tuple(wrong[0])}" if len(wrong) else ""
    err = max_relative_error(got, want)
    if err <= tol:
        return ""
    worst = np.unravel_index(np.nanargmax(np.where(np.isnan(got) != np.isnan(want), np.inf,
                                                   np.abs(got.astype(np.float64) - want))), want.shape)
    return (f"{name} {want.dtype}{list(want.shape)}: max relative error {err:.3g} > {tol:g} "
            f"(at {tuple(int(i) for i in worst)}: {got[worst]!r} vs {want[worst]!r})")


def describe(exc: BaseException) -> str:
    """The exception's type, first line and innermost frame: the place to look."""
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" at {frame.filename.split('/tcc/')[-1]}:{frame.lineno}" if frame else ""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first[:300]}{where}"
