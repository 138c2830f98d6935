"""The compile cache: memory and disk, keyed by shapes/params, safe under concurrency and corruption."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import child_pythonpath

import tcc
from tcc.runtime import cache, cpu

ROOT = Path(__file__).resolve().parent.parent
SRC = "op axpy(a: f32, X: f32[N], Y: f32[N]) -> Z: f32[N] { Z[i] = a * X[i] + Y[i] }"


def entries(root: Path) -> list[Path]:
    return sorted(root.glob("*/*.bin"))


def counting_build(monkeypatch) -> list[int]:
    calls = []
    real = cpu.build

    def build(func, target=None):
        calls.append(1)
        return real(func, target)

    monkeypatch.setattr(cpu, "BACKEND", replace(cpu.BACKEND, build=build))
    return calls


def test_one_entry_per_specialisation(fresh_cache, monkeypatch, rng):
    calls = counting_build(monkeypatch)
    lib = tcc.compile(SRC)
    x = rng.standard_normal(5).astype(np.float32)
    lib.axpy(2.0, x, x)
    lib.axpy(3.0, x, x)  # scalars are runtime values: same kernel
    assert len(calls) == 1 and len(entries(fresh_cache)) == 1
    lib.axpy(2.0, x[:3], x[:3])  # a new shape: a new kernel
    assert len(calls) == 2 and len(entries(fresh_cache)) == 2


def test_disk_cache_survives_memory_and_is_used(fresh_cache, monkeypatch, rng):
    lib = tcc.compile(SRC)
    x = rng.standard_normal(7).astype(np.float32)
    expected = lib.axpy(2.0, x, x)
    cache.MEMORY.clear()
    calls = counting_build(monkeypatch)
    np.testing.assert_array_equal(tcc.compile(SRC).axpy(2.0, x, x), expected)
    assert calls == []


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip", "empty"])
def test_corrupt_entry_is_rebuilt(fresh_cache, monkeypatch, rng, damage):
    lib = tcc.compile(SRC)
    x = rng.standard_normal(9).astype(np.float32)
    expected = lib.axpy(2.0, x, x)
    (entry,) = entries(fresh_cache)
    data = entry.read_bytes()
    damaged = {"truncate": data[: len(data) // 2], "garbage": os.urandom(len(data)),
               "flip": data[:-10] + bytes(b ^ 0xFF for b in data[-10:]), "empty": b""}[damage]
    entry.write_bytes(damaged)
    cache.MEMORY.clear()
    calls = counting_build(monkeypatch)
    np.testing.assert_array_equal(tcc.compile(SRC).axpy(2.0, x, x), expected)
    assert len(calls) == 1
    assert entry.read_bytes() == data or len(entry.read_bytes()) == len(data)


def test_unwritable_cache_dir_still_works(tmp_path, monkeypatch, rng):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TCC_CACHE_DIR", str(blocker / "sub"))
    cache.MEMORY.clear()
    x = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(tcc.compile(SRC).axpy(1.0, x, x), 2 * x)


def test_key_changes_with_compile_time_parameters(fresh_cache, rng):
    lib = tcc.compile("op s[K = 2](X: f32[N]) -> Y: f32[N] { Y[i] = X[i] * f32(K) }")
    x = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(lib.s(x), 2 * x)
    np.testing.assert_allclose(lib.s(x, K=3), 3 * x)
    assert len(entries(fresh_cache)) == 2


WORKER = """
import sys, numpy as np, tcc
lib = tcc.compile(sys.argv[1])
x = np.arange(1000, dtype=np.float32)
assert np.array_equal(lib.axpy(2.0, x, x), 3 * x)
print("ok")
"""


def test_two_processes_compiling_at_once(fresh_cache):
    env = {**os.environ, "TCC_CACHE_DIR": str(fresh_cache), "PYTHONPATH": child_pythonpath(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, SRC], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.strip() == "ok"
    assert len(entries(fresh_cache)) == 1
    assert not list(fresh_cache.glob("*/.tmp-*"))
