"""The fixture of the tcc.torch tests that run on both eager paths (import it after
``pytest.importorskip("torch")``: it imports the C++ path's loader, which imports torch)."""

import pytest

from tcc.interop import torch_native


@pytest.fixture(params=["native", "python"], name="path")
def eager_path(request, monkeypatch):
    """Which eager path serves the test's fresh operators: the C++ one (skipped where it cannot be
    built) or the Python one (``TCC_TORCH_NATIVE=0``)."""
    if request.param == "python":
        monkeypatch.setenv("TCC_TORCH_NATIVE", "0")
    elif torch_native.load() is None:
        pytest.skip(f"the C++ eager path cannot be built here: {torch_native.status()}")
    return request.param
