"""The disk cache's cap (least recently used entries go first) and ``tcc cache info|clear``."""

import numpy as np
import pytest

import tcc
from tcc.cli import main
from tcc.errors import TccArgumentError
from tcc.runtime import cache, cache_size

SRC = "op axpy(a: f32, X: f32[N], Y: f32[N]) -> Z: f32[N] { Z[i] = a * X[i] + Y[i] }"


@pytest.mark.parametrize("text, size", [("1048576", 1 << 20), ("64k", 64 << 10), ("500M", 500 << 20),
                                        ("2G", 2 << 30), ("1.5GiB", 3 << 29), (" 3 T ", 3 << 40)])
def test_sizes(text, size):
    assert cache_size.parse_size(text) == size


def test_default_cap_and_a_bad_one(monkeypatch):
    monkeypatch.delenv(cache_size.ENV, raising=False)
    assert cache_size.cap() == 2 << 30
    monkeypatch.setenv(cache_size.ENV, "lots")
    with pytest.raises(TccArgumentError, match="TCC_CACHE_MAX_SIZE"):
        cache_size.cap()


def test_least_recently_used_goes_first(fresh_cache, monkeypatch):
    monkeypatch.setenv(cache_size.ENV, "2500")  # room for two of the 1000-byte entries below
    disk = cache.DiskCache(fresh_cache)
    for key in ("aa01", "bb02"):
        disk.put(key, bytes(1000))
    assert disk.get("aa01") == bytes(1000)  # a use: now bb02 is the least recently used
    disk.put("cc03", bytes(1000))
    assert disk.get("bb02") is None
    assert disk.get("aa01") == bytes(1000) and disk.get("cc03") == bytes(1000)
    assert sum(e.size for e in cache_size.entries(fresh_cache)) <= 2500


def test_kernels_stay_under_a_tiny_cap(fresh_cache, monkeypatch, rng):
    """Many shapes' kernels under a cap of a few: the directory stays under it, and a kernel that
    was evicted is built again when its shape comes back."""
    lib = tcc.compile(SRC)
    x = rng.standard_normal(64).astype(np.float32)
    lib.axpy(2.0, x, x)
    one = max(e.size for e in cache_size.entries(fresh_cache) if e.path.suffix == ".bin")
    monkeypatch.setenv(cache_size.ENV, str(3 * one))
    for n in range(1, 9):
        lib.axpy(2.0, x[:n], x[:n])
        assert sum(e.size for e in cache_size.entries(fresh_cache)) <= 3 * one
    cache.MEMORY.clear()
    np.testing.assert_allclose(tcc.compile(SRC).axpy(2.0, x[:1], x[:1]), 3 * x[:1], rtol=1e-6)
    assert len([e for e in cache_size.entries(fresh_cache) if e.path.suffix == ".bin"]) <= 3


def test_cache_info_and_clear(fresh_cache, capsys, rng):
    x = rng.standard_normal(8).astype(np.float32)
    tcc.compile(SRC).axpy(2.0, x, x)
    (fresh_cache / "torch_native" / "build").mkdir(parents=True)
    (fresh_cache / "torch_native" / "build" / "ext.so").write_bytes(bytes(100))
    (fresh_cache / "notes.txt").write_text("not tcc's")  # a directory shared with other files
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(fresh_cache) in out and "compiled kernels: 1 (" in out and "torch_native" in out
    assert main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out
    assert cache_size.entries(fresh_cache) == [] and not (fresh_cache / "torch_native").exists()
    assert sorted(p.name for p in fresh_cache.iterdir()) == ["notes.txt"]
    cache.MEMORY.clear()
    np.testing.assert_allclose(tcc.compile(SRC).axpy(2.0, x, x), 3 * x, rtol=1e-6)  # rebuilt


def test_cache_off(monkeypatch, capsys):
    monkeypatch.setenv("TCC_CACHE_DIR", "")
    assert main(["cache", "clear"]) == 0 and "off" in capsys.readouterr().out
