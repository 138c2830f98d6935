"""Bridges to other frameworks: ``torch`` (PyTorch operators with autograd) and ONNX models
(``tcc.onnx``)."""
