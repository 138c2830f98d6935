import os
import tempfile

import numpy as np
import pytest

# Each test session compiles into its own cache unless the caller chose one.
os.environ.setdefault("TCC_CACHE_DIR", tempfile.mkdtemp(prefix="tcc-test-cache-"))


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty disk cache in ``tmp_path`` and an empty memory cache, for this test only."""
    from tcc.runtime import cache

    monkeypatch.setenv("TCC_CACHE_DIR", str(tmp_path))
    cache.MEMORY.clear()
    yield tmp_path
    cache.MEMORY.clear()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


@pytest.fixture(autouse=True)
def _a_two_core_host(monkeypatch):
    """Schedule as for CI's 2-core machine, whatever this host has, so that tests asserting on
    scheduled loop text hold on the many-core GPU machines too (the code runs on all cores), with
    AVX-512's register tiles (an AVX2 host runs them too, only slower)."""
    from helpers import TWO_CORE_CACHES

    from tcc import target

    monkeypatch.setattr(target, "host_cores", lambda: 2)
    monkeypatch.setattr(target, "host_caches", lambda: dict(TWO_CORE_CACHES))
    monkeypatch.setattr(target.CpuTarget, "vector_bytes", property(lambda self: 64))  # AVX-512's tiles


@pytest.fixture(autouse=True)
def _graph_models_compile_in_process(monkeypatch):
    """The graph engine (tcc.onnx, torch.compile) builds a new model's kernels in worker
    processes, which schedule for the real host, not the pretend one above: their kernels would
    be keyed apart and built twice. Tests that exercise the workers start them themselves."""
    from tcc.interop import graph_model

    monkeypatch.setattr(graph_model, "PARALLEL_AFTER_S", float("inf"))

