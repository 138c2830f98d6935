"""Interoperation with frameworks: ``torch`` (PyTorch operators with autograd)."""
