"""tcc as an ``onnx.backend.base.Backend``: what ONNX's backend test runner drives.

A prepared model compiles on its first ``run``: ONNX's node tests feed shape-like inputs (a
Reshape's shape, Slice's starts) as graph inputs, and tcc compiles for static shapes, so those
inputs are fixed to the values of the run (``constants=``) and the model compiled for them.

``onnx`` is an optional dependency: this module is imported only by code that has it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx  # optional dependency: this module is only imported where onnx is installed
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from tcc import cuda
from tcc.interop.graph import NeedsValue
from tcc.interop.onnx import OnnxModel, load


class TccRep(BackendRep):
    """A model prepared for tcc; compiled on first run (per set of values of its shape inputs)."""

    def __init__(self, model: onnx.ModelProto, target: str):
        self.model = model
        self.target = target
        self.needed: list[str] = []  # inputs whose values the import needs
        self.compiled: dict[tuple, OnnxModel] = {}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        initializers = {t.name for t in self.model.graph.initializer}
        names = [vi.name for vi in self.model.graph.input if vi.name not in initializers]
        feeds = dict(zip(names, inputs if isinstance(inputs, list | tuple) else [inputs]))
        while True:
            constants = {n: feeds[n] for n in self.needed}
            key = tuple((n, feeds[n].tobytes()) for n in self.needed)
            model = self.compiled.get(key)
            if model is None:
                try:
                    model = load(self.model, self.target, constants=constants,
                                 input_shapes={n: np.shape(v) for n, v in feeds.items()})
                except NeedsValue as need:
                    if need.input_name in self.needed or need.input_name not in feeds:
                        raise
                    self.needed.append(need.input_name)
                    continue
                self.compiled[key] = model
            break
        results = model(*(np.asarray(feeds[n]) for n in model.input_names))
        results = results if isinstance(results, tuple) else (results,)
        return tuple(r.to_numpy() if hasattr(r, "to_numpy") else np.asarray(r) for r in results)


class TccBackend(Backend):
    """``onnx.backend`` entry points for tcc (CPU, and CUDA where a GPU is present)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> TccRep:
        super().prepare(model, device, **kwargs)
        return TccRep(model, "cuda" if Device(device).type == DeviceType.CUDA else "cpu")

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        kind = Device(device).type
        if kind == DeviceType.CUDA:
            return cuda.is_available()
        return kind == DeviceType.CPU
