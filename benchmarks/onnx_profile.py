"""Per-kernel times of a model through tcc.onnx next to onnxruntime's per-node profile (CPU).

    python benchmarks/onnx_profile.py [--model resnet18] [--batch 1] [--repeat 20] [--top 25]

tcc: each kernel of the compiled model timed on its own inputs (median of ``repeat`` calls, the
kernels of one pass over the model interleaved). onnxruntime: its own profiler
(``enable_profiling``), the median per node over ``repeat`` runs. Both lists are printed
largest first with what each kernel or node computes, so that the layers where tcc loses show.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_networks import MODELS  # noqa: E402 - first: it sets libgomp's wait policy before torch loads

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import numpy as np  # noqa: E402
import onnx_models  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

import tcc  # noqa: E402


def tcc_profile(compiled, x: np.ndarray, repeat: int) -> list[tuple[str, float]]:
    """(kernel description, median seconds) for each kernel call of one run of the model."""
    calls = compiled.compile()._calls
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(repeat + 1):
        values = {**compiled._weights, **dict(zip(compiled._inputs, [x]))}
        for n, (op, params, results) in enumerate(calls):
            args = [values[p] for p in params]
            start = time.perf_counter()
            got = op(*args)
            times[n].append(time.perf_counter() - start)
            values.update(zip(results, got) if len(results) > 1 else ((results[0], got),))
    out = []
    for n, (_, params, results) in enumerate(calls):
        shapes = " ".join(f"{p}{list(np.shape(values[p]))}" for p in params)
        out.append((f"k{n:02d} {','.join(results)} <- {shapes}", statistics.median(times[n][1:])))
    return out


def ort_profile(data: bytes, x: np.ndarray, repeat: int, threads: int | None) -> list[tuple[str, float]]:
    """(node description, median seconds) per node, from onnxruntime's profiler."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")  # not into the working directory
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    for _ in range(repeat + 1):
        session.run(None, {"x": x})
    path = Path(session.end_profiling())
    events = json.loads(path.read_text())
    path.unlink()
    per_node: dict[str, list[float]] = {}
    kinds: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][:-len("_kernel_time")]
            per_node.setdefault(name, []).append(e["dur"] * 1e-6)
            kinds[name] = e.get("args", {}).get("op_name", "")
    return [(f"{kinds[n]:12s} {n}", statistics.median(t[1:] or t)) for n, t in per_node.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", choices=list(MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    make, shape = MODELS[args.model]
    model = onnx_models.randomized(make())
    x = torch.randn(shape(args.batch))
    data = onnx_models.export(model, x)
    compiled = tcc.onnx.load(data)
    xn = x.numpy()
    print(f"{args.model} batch {args.batch}, load average {os.getloadavg()[0]:.1f}")
    for who, rows in (("tcc", tcc_profile(compiled, xn, args.repeat)),
                      ("onnxruntime", ort_profile(data, xn, args.repeat, args.threads))):
        total = sum(t for _, t in rows)
        print(f"{who}: {len(rows)} kernels, sum of medians {total * 1e3:.2f} ms")
        for name, t in sorted(rows, key=lambda r: -r[1])[:args.top]:
            print(f"  {t * 1e3:8.3f} ms  {name}")


if __name__ == "__main__":
    main()
