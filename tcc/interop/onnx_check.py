"""``tcc onnx MODEL --run [--check]``: run an imported model on random inputs, timed, and compare
every output with onnxruntime (an optional dependency, imported only here)."""

from __future__ import annotations

import statistics
import time

import numpy as np

from tcc.errors import TccArgumentError
from tcc.interop.onnx import OnnxModel
from tcc.testing import TOLERANCE, max_relative_error


def random_feeds(model: OnnxModel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for name in model.input_names:
        _, dtype, shape = next(p for p in model.program.params if p[0] == model.program.inputs[name])
        if dtype == "bool":
            feeds[name] = rng.random(shape) > 0.5
        elif dtype.startswith("i"):
            feeds[name] = rng.integers(0, 8, shape).astype(np.dtype(dtype.replace("i", "int")))
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.dtype(dtype.replace("f", "float")))
    return feeds


def run_against_onnxruntime(model: OnnxModel, path: str, check: bool, seed: int | None, repeat: int = 10) -> int:
    """Compile, time the first call and the median of ``repeat``; with ``check`` compare with
    onnxruntime. Returns the exit status (1 on a mismatch)."""
    feeds = random_feeds(model, np.random.default_rng(seed))
    start = time.perf_counter()
    model.compile()
    results = model(**feeds)
    first = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        model(**feeds)
        times.append(time.perf_counter() - start)
    results = results if isinstance(results, tuple) else (results,)
    print(f"{path} on {model.target}: " + ", ".join(f"{n}{list(np.shape(r))}" for n, r in zip(model.output_names,
                                                                                          results)))
    print(f"first call (compile + run): {first * 1e3:.1f} ms; median of {repeat} runs: "
          f"{statistics.median(times) * 1e3:.3f} ms")
    if not check:
        return 0
    try:
        import onnxruntime  # optional dependency: only the check needs it
    except ImportError:
        raise TccArgumentError("--check needs onnxruntime", hint="pip install onnxruntime") from None
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    status = 0
    for name, got, want in zip(model.output_names, results, expected):
        got = got.to_numpy() if hasattr(got, "to_numpy") else np.asarray(got)
        err = max_relative_error(got, want)
        # a whole graph accumulates rounding: five times one op's f32 tolerance
        ok = err <= 5 * TOLERANCE["f32"] if got.dtype.kind == "f" else bool(np.array_equal(got, want))
        print(f"check {name}: max relative error {err:.3g} vs onnxruntime: {'ok' if ok else 'MISMATCH'}")
        status |= 0 if ok else 1
    return status
