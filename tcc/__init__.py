"""tcc: a small tensor compiler. ``tcc.compile(source, target="cpu")`` gives a library of ops."""

__version__ = "0.1.0"

from tcc import cuda  # noqa: E402  (tcc.cuda.Array; imports no CUDA library until used)
from tcc.errors import TccError  # noqa: E402
from tcc.interop import onnx  # noqa: E402  (imports the onnx package only when a model is loaded)
from tcc.runtime.library import Library, Op, compile  # noqa: E402

__all__ = ["Library", "Op", "TccError", "__version__", "compile", "cuda", "onnx"]
