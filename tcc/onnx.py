"""``tcc.onnx``: ONNX models compiled by tcc (``tcc.onnx.load``; see docs/onnx.md).

The public name of the importer in ``tcc.interop.onnx``, so that ``import tcc.onnx`` and
``from tcc.onnx import load`` work as well as ``tcc.onnx.load`` after ``import tcc``.
"""

from tcc.interop.onnx import HANDLERS, NeedsValue, OnnxImportError, OnnxModel, load, translate

__all__ = ["HANDLERS", "NeedsValue", "OnnxImportError", "OnnxModel", "load", "translate"]
