"""The C++ half of ``tcc.torch``'s eager path (``torch_native.cpp``), built against the installed
PyTorch with its own ``torch.utils.cpp_extension`` (as ``torch.compile``'s inductor builds C++ at
run time), once per PyTorch version, tcc version, Python and source: into tcc's cache directory
(``tcc.paths.cache_dir``), where later processes load it without building.

Why C++: a ``tcc.torch`` call's own work is small (one ``torch.empty``, one kernel call), but from
Python each input tensor's checks cost ~450 ns and asking whether anything watches torch's
dispatcher ~470 ns, so an eager call cost 2.3-2.7x ``torch.add``'s (benchmarks/torch_overhead.py).
The module serves CPU signatures (tcc's CPU plan: one call of the kernel's entry point) and CUDA
ones (tcc's CUDA plan without intermediates: its kernels launched with ``cuLaunchKernel`` on
PyTorch's current stream).

Where no compiler (or ``ninja``) is at hand the build fails once, quietly, and the Python path
serves every call; ``TCC_TORCH_NATIVE=0`` forces that path. ``status()`` says which one runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

import torch  # the optional dependency this module exists for

from tcc.paths import cache_dir
from tcc.version import __version__

SOURCE = Path(__file__).with_name("torch_native.cpp")
# the extension's sources (compiled) and headers: all of them name the build
SOURCES = [SOURCE, SOURCE.with_name("torch_learn.cpp"), SOURCE.with_name("torch_autograd.cpp")]
HEADERS = [SOURCE.with_name("torch_native.h"), SOURCE.with_name("torch_autograd.h")]
_LOCK = threading.Lock()
_state: dict[str, object] = {}  # "module": the loaded module or None, "reason": why None


def enabled() -> bool:
    return os.environ.get("TCC_TORCH_NATIVE", "1") != "0"


def load() -> ModuleType | None:
    """The compiled module (built on the first call in a fresh cache: ~30 s), or None when it
    cannot be built here or ``TCC_TORCH_NATIVE=0``; tried once per process."""
    if not enabled():
        return None
    if "module" in _state:
        return _state["module"]  # type: ignore[return-value]
    with _LOCK:
        if "module" not in _state:
            try:
                _state["module"], _state["reason"] = _build(), ""
            except Exception as exc:  # noqa: BLE001 - any build failure: the Python path serves
                _state["module"], _state["reason"] = None, f"{type(exc).__name__}: {str(exc)[:500]}"
    return _state["module"]  # type: ignore[return-value]


def status() -> str:
    """Which eager path runs, and why: for docs, tests and bug reports."""
    if not enabled():
        return "python (TCC_TORCH_NATIVE=0)"
    if "module" not in _state:
        return "not loaded yet"
    return "native" if _state["module"] is not None else f"python (build failed: {_state['reason']})"


def _name() -> str:
    """The module's name, which is also its build directory's: a digest of what it depends on."""
    text = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    key = f"{torch.__version__}|{__version__}|{sys.version}|{sys.platform}".encode()
    return "tcc_torch_native_" + hashlib.sha256(key + text).hexdigest()[:16]


def _build() -> ModuleType:
    name = _name()
    base = cache_dir()
    folder = (base if base is not None else Path(tempfile.gettempdir()) / "tcc") / "torch_native" / name
    built = folder / f"{name}.so"
    if built.exists():  # built before: import it, without asking ninja whether it is up to date
        spec = importlib.util.spec_from_file_location(name, built)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    from torch.utils import cpp_extension  # the builder imports setuptools (~70 ms): only to build

    folder.mkdir(parents=True, exist_ok=True)
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = _with_ninja(path)
    try:
        return cpp_extension.load(name=name, sources=[str(source) for source in SOURCES], build_directory=str(folder),
                                  extra_cflags=["-O2"], verbose=False)
    finally:
        os.environ["PATH"] = path


def _with_ninja(path: str) -> str:
    """``PATH`` with the ``ninja`` that pip installed (the ``ninja`` package: tcc's dev extra) when
    none is on it: torch's builder runs ``ninja`` by name, and an inactive venv's bin is not on it."""
    if shutil.which("ninja", path=path) is not None:
        return path
    try:
        import ninja  # optional: its binary, for a venv that is not activated
    except ImportError:
        return path
    return os.pathsep.join([ninja.BIN_DIR, path]) if path else ninja.BIN_DIR
