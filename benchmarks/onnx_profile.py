"""Per-kernel times of a model through tcc.onnx next to onnxruntime's per-node profile (CPU).

    python benchmarks/onnx_profile.py [--model resnet18] [--batch 1] [--repeat 20] [--top 25]
    python benchmarks/onnx_profile.py --model t5 [--hidden 128] [--seq 64] [--layers 2]   # of onnx_transformers.py

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

TRANSFORMERS = ("bert", "gpt2", "vit", "llama", "t5")  # onnx_transformers.py's (they need ``transformers``)


def tcc_profile(compiled, feeds: dict[str, np.ndarray], repeat: int) -> list[tuple[str, float]]:
    """(kernel description, median seconds) for each kernel call of one run of the model."""
    calls = compiled.compile()._calls
    times: list[list[float]] = [[] for _ in calls]
    inputs = [feeds[name] for name in compiled.input_names]
    for _ in range(repeat + 1):
        values = {**compiled._weights, **dict(zip(compiled._inputs, inputs))}
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


def ort_profile(data: bytes, feeds: dict[str, np.ndarray], repeat: int, threads: int | None
                ) -> list[tuple[str, float]]:
    """(node description, median seconds) per node, from onnxruntime's profiler."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")  # not into the working directory
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    for _ in range(repeat + 1):
        session.run(None, feeds)
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
    parser.add_argument("--model", default="resnet18", choices=[*MODELS, *TRANSFORMERS])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=128, help="a transformer's width")
    parser.add_argument("--seq", type=int, default=64, help="a transformer's sequence length")
    parser.add_argument("--layers", type=int, default=2, help="a transformer's layers")
    args = parser.parse_args()
    data, feeds = transformer(args) if args.model in TRANSFORMERS else network(args)
    compiled = tcc.onnx.load(data, input_shapes={name: x.shape for name, x in feeds.items()})
    print(f"{args.model} batch {args.batch}, load average {os.getloadavg()[0]:.1f}")
    for who, rows in (("tcc", tcc_profile(compiled, feeds, args.repeat)),
                      ("onnxruntime", ort_profile(data, feeds, args.repeat, args.threads))):
        total = sum(t for _, t in rows)
        print(f"{who}: {len(rows)} kernels, sum of medians {total * 1e3:.2f} ms")
        for name, t in sorted(rows, key=lambda r: -r[1])[:args.top]:
            print(f"  {t * 1e3:8.3f} ms  {name}")


def network(args: argparse.Namespace) -> tuple[bytes, dict[str, np.ndarray]]:
    """A network of onnx_networks.py, randomized and exported, and its input."""
    make, shape = MODELS[args.model]
    x = torch.randn(shape(args.batch))
    return onnx_models.export(onnx_models.randomized(make()), x), {"x": x.numpy()}


def transformer(args: argparse.Namespace) -> tuple[bytes, dict[str, np.ndarray]]:
    """A transformer of onnx_transformers.py (TorchScript exporter) and its inputs."""
    import onnx_transformers  # here: only the transformers need the ``transformers`` package

    torch.manual_seed(0)
    model, inputs, names = onnx_transformers.build(args.model, args.hidden, args.seq, args.layers, args.batch)
    proto = onnx_transformers.export(model, inputs, names, "torchscript")
    given = dict(zip(names, (a.numpy() for a in inputs)))
    return proto.SerializeToString(), {i.name: given[i.name] for i in proto.graph.input if i.name in given}


if __name__ == "__main__":
    main()
