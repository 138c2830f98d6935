"""``tcc.torch``: tcc ops as PyTorch operators with autograd (see docs/embedding.md).

The public name of ``tcc.interop.torch``, so that ``import tcc.torch`` works; importing it
imports PyTorch, which ``import tcc`` alone never does.
"""

from tcc.interop.torch import TorchOp, library, native_status, op, register

__all__ = ["TorchOp", "library", "native_status", "op", "register"]
