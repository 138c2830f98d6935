"""Shrink a failing graph: the smallest graph, by dropping outputs and nodes, that still fails
the way the seed's graph fails (same status; for an error, the same exception type and place).
The inputs keep their data (``feeds_for`` of the seed), so a shrunk graph reads the same numbers.
Attempts run in this process, or in a worker when the failure is a crash or a timeout."""

from __future__ import annotations

import copy
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import ModelProto

from fuzz.onnx.check import check_model
from fuzz.onnx.generate import generate
from fuzz.pool import run_seeds


def signature(status: str, detail: str) -> tuple[str, str]:
    """What makes two failures the same: the status, and an error's type and place or the
    operator whose output mismatched."""
    if status == "mismatch":
        return status, detail.split(" output ")[0]
    if status != "error":
        return status, ""
    return status, re.sub(r":.* at ", " at ", detail.split(":")[0] + ":" + detail.split(" at ")[-1])


def shrink(seed: int, timeout: float = 120.0) -> ModelProto:
    model = generate(seed).model
    want = _outcome(model, seed, timeout, in_worker=True)
    if want[0] == "ok":
        return model
    in_worker = want[0] in ("crash", "timeout")
    changed = True
    while changed:
        changed = False
        for smaller in _candidates(model):
            if _outcome(smaller, seed, timeout, in_worker) == want:
                model, changed = smaller, True
                break
    return model


def _outcome(model: ModelProto, seed: int, timeout: float, in_worker: bool) -> tuple[str, str]:
    if not in_worker:
        o = check_model(model, seed)
        return signature(o.status, o.detail)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.onnx"
        onnx.save(model, path)
        o = next(run_seeds([{"seed": seed, "model": str(path)}], 1, timeout, module="fuzz.onnx.worker"))
    return signature(o["status"], o["detail"])


def _candidates(model: ModelProto) -> Iterator[ModelProto]:
    """Smaller graphs: one output fewer; an output moved to a node's input (the node and what
    only it needed go); a node bypassed (its input, of the same type and shape, read instead)."""
    outputs = list(model.graph.output)
    for k in range(len(outputs)) if len(outputs) > 1 else ():
        yield _pruned(model, outputs[:k] + outputs[k + 1:])
    known = _value_infos(model)
    for k, out in enumerate(outputs):
        node = next(n for n in model.graph.node if out.name in n.output)
        for name in node.input:
            if name in known and name not in {o.name for o in outputs} and not _is_input(model, name):
                yield _pruned(model, outputs[:k] + [known[name]] + outputs[k + 1:])
    for node in model.graph.node:
        for out in node.output:
            for name in node.input:
                if out in known and name in known and known[name].type == known[out].type and \
                        out not in {o.name for o in outputs}:
                    yield _pruned(_renamed(model, out, name), outputs)


def _value_infos(model: ModelProto) -> dict[str, onnx.ValueInfoProto]:
    graph = onnx.shape_inference.infer_shapes(model).graph
    return {vi.name: vi for vi in [*graph.input, *graph.value_info, *graph.output]}


def _is_input(model: ModelProto, name: str) -> bool:
    return any(vi.name == name for vi in model.graph.input)


def _renamed(model: ModelProto, old: str, new: str) -> ModelProto:
    """Every read of ``old`` reads ``new`` instead."""
    model = copy.deepcopy(model)
    for node in model.graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
    return model


def _pruned(model: ModelProto, outputs: list[onnx.ValueInfoProto]) -> ModelProto:
    """The graph of ``outputs``: only the nodes and initializers they need (the inputs stay)."""
    model = copy.deepcopy(model)
    needed = {o.name for o in outputs}
    keep = []
    for node in reversed(model.graph.node):
        if needed & set(node.output):
            keep.append(node)
            needed |= set(node.input)
    del model.graph.node[:]
    model.graph.node.extend(reversed(keep))
    inits = [t for t in model.graph.initializer if t.name in needed]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    return model
