"""``tcc.torch``: tcc ops as PyTorch operators with autograd (see docs/embedding.md), and
``torch.compile(model, backend="tcc")`` (docs/torch_compile.md).

The public name of ``tcc.interop.torch`` and ``tcc.interop.torch_compile``, so that
``import tcc.torch`` works; importing it imports PyTorch, which ``import tcc`` alone never does,
and registers the ``"tcc"`` backend of ``torch.compile``.
"""

from tcc.interop.torch import TorchOp, library, native_status, op, register
from tcc.interop.torch_compile import Explanation, backend, explain, recording

__all__ = ["Explanation", "TorchOp", "backend", "explain", "library", "native_status", "op", "recording",
           "register"]
