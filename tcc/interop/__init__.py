"""Bridges to other frameworks: ONNX models (``tcc.onnx``)."""
