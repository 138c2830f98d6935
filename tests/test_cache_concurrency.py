"""The cache under threads, processes, damaged entries and unwritable directories: right answers."""

import errno
import os
import pickle
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import TWO_CORE_HOST, child_pythonpath

import tcc
from tcc import compiler
from tcc.frontend import parser
from tcc.runtime import cache, cpu
from tcc.testing import assert_matches, random_args, reference_results

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# Eight different ops (one per thread), at odd and round sizes.
CASES = [
    ("axpy", {"N": 33}),
    ("matmul", {"M": 7, "K": 33, "N": 64}),
    ("softmax", {"N": 5, "C": 33}),
    ("layernorm", {"N": 3, "D": 64}),
    ("bias_relu", {"N": 7, "C": 1}),
    ("maxpool2d", {"N": 1, "C": 3, "H": 9, "W": 8}),
    ("conv2d", {"N": 1, "C": 3, "H": 9, "W": 9, "F": 4, "KH": 3, "KW": 3, "P": 1}),
    ("conv2d_relu", {"N": 1, "C": 2, "H": 7, "W": 7, "F": 3, "KH": 3, "KW": 3}),
]


def run_case(name: str, bindings: dict, seed: int, calls: int = 3) -> None:
    """Compile the example ``name`` and check ``calls`` calls on fresh random inputs."""
    rng = np.random.default_rng(seed)
    op = tcc.compile(EXAMPLES / f"{name}.tc")[name]
    full = {**op.te.cparams, **bindings}
    cparams = {k: v for k, v in bindings.items() if k in op.te.cparams}
    for i in range(calls):
        args = random_args(op.te, full, rng)
        expected = reference_results(op.te, args, full)
        got = op(*args, **cparams)
        got = got if isinstance(got, tuple) else (got,)
        for r, g, e in zip(op.te.results, got, expected):
            assert_matches(g, e, op.te.tensors[r].dtype, f"{name}.{r} (call {i})")


def test_eight_threads_compile_and_call_different_ops_at_once(fresh_cache):
    start = threading.Barrier(len(CASES))
    errors: list[BaseException] = []

    def work(i: int, name: str, bindings: dict) -> None:
        try:
            start.wait()
            run_case(name, bindings, seed=i)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i, *case)) for i, case in enumerate(CASES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(list(fresh_cache.glob("*/*.bin"))) == len(CASES)


def test_threads_share_one_op_across_shapes_and_out(fresh_cache):
    """One op object, eight threads, each its own shapes and out= arrays: its plans and argument
    arrays must never mix two calls."""
    op = tcc.compile(EXAMPLES / "matmul.tc").matmul
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        rng = np.random.default_rng(i)
        m = 1 + i % 3 * 16
        try:
            start.wait()
            for _ in range(30):
                a, b = rng.standard_normal((m, 33), np.float32), rng.standard_normal((33, 7), np.float32)
                out = np.full((m, 7), np.nan, np.float32)
                np.testing.assert_allclose(op(a, b, out=out) if i % 2 else op(a, b), a @ b, rtol=1e-4, atol=1e-4)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


WORKER = TWO_CORE_HOST + """
import sys
sys.path.insert(0, sys.argv[1])
from test_cache_concurrency import CASES, run_case
for i, case in enumerate(CASES[:4]):
    run_case(*case, seed=int(sys.argv[2]) * 10 + i)
print("ok")
"""


def test_four_processes_share_one_empty_cache_dir(fresh_cache):
    env = {**os.environ, "TCC_CACHE_DIR": str(fresh_cache), "PYTHONPATH": child_pythonpath(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(ROOT / "tests"), str(i)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert out.strip() == "ok"
    assert len(list(fresh_cache.glob("*/*.bin"))) == 4  # one kernel per op, whoever wrote it last
    assert not list(fresh_cache.glob("*/.tmp-*"))


def test_a_stale_kernel_entry_is_rebuilt(fresh_cache, rng):
    """An entry with a valid checksum that this compiler cannot use (another artifact format, or
    another op's object code) is rebuilt, not trusted."""
    src = "op axpy(a: f32, X: f32[N], Y: f32[N]) -> Z: f32[N] { Z[i] = a * X[i] + Y[i] }"
    x, y = rng.standard_normal(33).astype(np.float32), rng.standard_normal(33).astype(np.float32)
    tcc.compile(src).axpy(2.0, x, y)
    (entry,) = fresh_cache.glob("*/*.bin")
    key = entry.stem
    other = tcc.compile("op neg(X: f32[N]) -> Y: f32[N] { Y[i] = -X[i] }").neg
    other(x)
    foreign = cache.DiskCache(fresh_cache).get(other.cache_key({"N": 33}))
    for stale in (b"an old format", foreign[len(cpu._MAGIC) + 4:], cpu._MAGIC + b"\xff\xff\xff\xff{"):
        cache.DiskCache(fresh_cache).put(key, stale)
        cache.MEMORY.clear()
        np.testing.assert_allclose(tcc.compile(src).axpy(2.0, x, y), 2 * x + y, rtol=1e-6)
        assert cache.DiskCache(fresh_cache).get(key).startswith(cpu._MAGIC)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "stale"])
def test_a_damaged_ast_entry_is_parsed_again(fresh_cache, rng, damage):
    src = "op twice(X: f32[N]) -> Y: f32[N] { Y[i] = 2 * X[i] }"
    x = rng.standard_normal(7).astype(np.float32)
    np.testing.assert_allclose(tcc.compile(src).twice(x), 2 * x)
    (entry,) = fresh_cache.glob("*/*.ast")
    data = entry.read_bytes()
    if damage == "stale":  # a valid entry holding something that is not an AST
        cache.DiskCache(fresh_cache).put(entry.stem, pickle.dumps({"not": "a module"}), ".ast")
    else:
        entry.write_bytes(data[: len(data) // 2] if damage == "truncate" else os.urandom(len(data)))
    cache.MEMORY.clear()
    np.testing.assert_allclose(tcc.compile(src).twice(x), 2 * x)


def test_damaged_parser_tables_fall_back_to_building(tmp_path, monkeypatch):
    bad = tmp_path / "grammar.tables"
    bad.write_bytes(parser._grammar_digest().encode() + b"\n" + os.urandom(200))
    monkeypatch.setattr(parser, "_TABLES", bad)
    assert parser._shipped_parser() is None
    monkeypatch.setattr(parser, "_TABLES", tmp_path / "missing.tables")
    assert parser._shipped_parser() is None


def test_shipped_parser_tables_are_current():
    """``grammar.tables`` must be rebuilt (``make tables``) whenever the grammar changes."""
    shipped = parser._shipped_parser()
    assert shipped is not None, "tcc/frontend/grammar.tables is stale: run `make tables`"
    built = parser._build_parser()
    for path in sorted(EXAMPLES.glob("*.tc")):
        text = path.read_text()
        assert shipped.parse(text, start="start") == built.parse(text, start="start"), path.name


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_full_or_read_only_cache_dir_still_gives_right_answers(fresh_cache, monkeypatch, rng, error):
    def refuse(*args, **kwargs):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(cache.tempfile, "mkstemp", refuse)
    monkeypatch.setattr(cache, "_warned", set())
    x = rng.standard_normal(33).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            cache.MEMORY.clear()
            lib = tcc.compile(EXAMPLES / "axpy.tc")
            np.testing.assert_allclose(lib.axpy(1.5, x, x), 2.5 * x, rtol=1e-6)
    assert not list(fresh_cache.glob("*/*.bin"))
    assert len([w for w in caught if "cache" in str(w.message)]) == 1  # one warning, not one per entry


def test_an_unwritable_entry_file_is_only_a_miss(fresh_cache, monkeypatch, rng):
    """A write that fails half-way (the disk fills during it) leaves no entry and no temporary file."""
    real = os.fdopen

    class Full:
        def __init__(self, fd, mode):
            self.f = real(fd, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache.os, "fdopen", Full)
    monkeypatch.setattr(cache, "_warned", set())
    x = rng.standard_normal(9).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_allclose(tcc.compile(EXAMPLES / "axpy.tc").axpy(1.0, x, x), 2 * x)
    assert not list(fresh_cache.glob("*/*.bin")) and not list(fresh_cache.glob("*/.tmp-*"))


def test_a_warm_start_parses_and_lowers_nothing_yet_prints_every_stage(fresh_cache, monkeypatch, rng):
    """With the disk cache filled, compile() and a call build no parser and run no pass; a stage
    print on that warm op still runs the pipeline for its text."""
    path = EXAMPLES / "conv2d.tc"
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((1, 3, 9, 9), (4, 3, 3, 3), (4,)))
    expected = tcc.compile(path).conv2d(x, w, b, P=1)
    cache.MEMORY.clear()

    def refuse(*args, **kwargs):
        raise AssertionError("compiler work on a warm start")

    with monkeypatch.context() as m:
        m.setattr(parser, "_parser", refuse)
        m.setattr(compiler, "lower_op", refuse)
        m.setattr(cpu, "build", refuse)
        op = tcc.compile(path).conv2d
        np.testing.assert_array_equal(op(x, w, b, P=1), expected)
    scheduled = op.lower(x, w, b, P=1, stage="scheduled")
    assert "for " in scheduled and op.lower(x, w, b, P=1, stage="llvm").startswith("; ModuleID")
