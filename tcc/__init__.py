"""tcc: a small tensor compiler. ``tcc.compile(source, target="cpu")`` gives a library of ops."""

__version__ = "0.1.0"

from tcc import cuda  # noqa: E402  (tcc.cuda.Array; imports no CUDA library until used)
from tcc.autodiff import grad, grad_source  # noqa: E402
from tcc.compiler import Library, Op, compile  # noqa: E402
from tcc.errors import TccError  # noqa: E402
from tcc.interop import onnx  # noqa: E402  (imports the onnx package only when a model is loaded)

__all__ = ["Library", "Op", "TccError", "__version__", "compile", "cuda", "grad", "grad_source", "onnx"]


def __getattr__(name: str):
    """``tcc.torch`` (PyTorch custom ops) is imported on first use: PyTorch is an optional, heavy
    dependency that ``import tcc`` must not load."""
    if name == "torch":
        import tcc.interop.torch as module  # optional dependency, loaded lazily on purpose

        globals()["torch"] = module  # later lookups skip this function
        return module
    raise AttributeError(f"module 'tcc' has no attribute {name!r}")
