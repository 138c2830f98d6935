"""tcc: a small tensor compiler. ``tcc.compile(source, target="cpu")`` gives a library of ops."""

from tcc import (
    cuda,  # tcc.cuda.Array; imports no CUDA library until used
    onnx,  # imports the onnx package only when a model is loaded
)
from tcc.autodiff import grad, grad_source, saving
from tcc.compiler import Library, Op, compile, kernels_built
from tcc.errors import TccError
from tcc.threads import get_num_threads, set_num_threads
from tcc.version import __version__

__all__ = ["Library", "Op", "TccError", "__version__", "compile", "cuda", "get_num_threads", "grad", "grad_source",
           "kernels_built", "onnx", "saving", "set_num_threads"]


def __getattr__(name: str):
    """``tcc.torch`` (PyTorch custom ops) is imported on first use: PyTorch is an optional, heavy
    dependency that ``import tcc`` must not load."""
    if name == "torch":
        import tcc.torch as module  # optional dependency, loaded lazily on purpose

        globals()["torch"] = module  # later lookups skip this function
        return module
    raise AttributeError(f"module 'tcc' has no attribute {name!r}")
