"""Hostile source, arguments and options: every one is a success or a clean TccError.

The explicit cases are the ones a new user hit (issue 9): non-UTF-8 files, missing paths, very
large programs, sizes that cannot be allocated, bad CLI options, unknown keywords, literals out
of range, long or reserved identifiers, bad call arguments. The fuzz batch puts random bytes,
random unicode and mutated valid programs through ``tcc.compile``, a call and the CLI on worker
processes (``hostile/``), so that a segfault is a reported failure, not a dead test run.
"""

from __future__ import annotations

import base64
import importlib.util
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hostile import cases, runner

import tcc
from tcc import cli
from tcc.errors import TccArgumentError, TccShapeError, TccSyntaxError, TccTypeError
from tcc.testing import assert_matches, reference_results

ROOT = Path(__file__).resolve().parent.parent


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def check_against_reference(source: str, sizes: dict[str, int], rng: np.random.Generator) -> None:
    op = next(iter(tcc.compile(source)))
    args = [rng.standard_normal(tuple(sizes[str(d)] for d in op.te.tensors[p].shape)).astype(np.float32)
            for p in op.te.params]
    got = op(*args)
    want = reference_results(op.te, args, sizes)[0]
    assert_matches(got, want, op.te.tensors[op.te.results[0]].dtype)


# ---------------------------------------------------------------- files and paths

BAD_UTF8 = b"op f(X: f32[N]) -> Y: f32[N] {\n    Y[i] = X[i]  # caf\xe9\n}\n"


def test_non_utf8_file_is_a_syntax_error_at_the_byte(tmp_path, capsys):
    path = tmp_path / "latin1.tc"
    path.write_bytes(BAD_UTF8)
    with pytest.raises(TccSyntaxError, match="not UTF-8") as info:
        tcc.compile(str(path))
    assert info.value.span.line == 2 and info.value.span.col == 23
    code, _, err = run_cli(capsys, "check", str(path))
    assert code == 1 and "latin1.tc:2:23: syntax error" in err and "Traceback" not in err


def test_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.tc"
    path.write_bytes(b"\xef\xbb\xbf" + BAD_UTF8.replace(b"\xe9", b"e"))
    assert [op.name for op in tcc.compile(path)] == ["f"]


@pytest.mark.parametrize("path", ["no/such/file", "missing.tc", "examples/matmul"])
def test_missing_path_is_file_not_found(path):
    with pytest.raises(TccArgumentError, match=f"file not found: {path}"):
        tcc.compile(path)


def test_unreadable_paths_are_errors(tmp_path):
    with pytest.raises(TccArgumentError, match="cannot read .*: Is a directory"):
        tcc.compile(tmp_path)
    if Path("/dev/zero").exists():  # an endless file is refused, not read into memory
        with pytest.raises(TccArgumentError, match="larger than 64 MiB"):
            tcc.compile("/dev/zero")


def test_a_long_line_is_cut_to_a_window_in_errors():
    with pytest.raises(tcc.TccError) as info:
        tcc.compile("op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] + " + "1 + " * 5000 + "q }")
    line, caret = str(info.value).splitlines()[1:3]
    assert len(line) < 140 and line.endswith("q }") and line[caret.index("^")] == "q"


def test_source_text_is_never_taken_for_a_path():
    with pytest.raises(TccSyntaxError, match="end of file"):
        tcc.compile("op f(X: f32[N]) -> Y: f32[N]")
    assert tcc.compile("").ops == {}
    with pytest.raises(TccArgumentError, match="bytes"):
        tcc.compile(b"op f() -> Y: f32[1] { Y[i] = 1.0 }")


# ---------------------------------------------------------------- program size

def test_5000_term_sum_matches_the_reference(rng):
    terms = " + ".join(f"X[i] * {k % 7 - 3}" for k in range(5000))
    check_against_reference(f"op f(X: f32[N]) -> Y: f32[N] {{ Y[i] = {terms} }}", {"N": 7}, rng)


@pytest.mark.parametrize("opening,closing", [("sin(", ")"), ("-", ""), ("(", ")"), ("abs(-", ")")])
def test_1000_deep_nesting_matches_the_reference(opening, closing, rng):
    expr = opening * 1000 + "X[i]" + closing * 1000
    check_against_reference(f"op f(X: f32[N]) -> Y: f32[N] {{ Y[i] = {expr} }}", {"N": 5}, rng)


def test_300_statement_chain_matches_the_reference(rng):
    lines = ["T0[i] = X[i] * 0.5"] + [f"T{k}[i] = T{k - 1}[i] * 0.5 + X[i]" for k in range(1, 300)]
    body = "\n    ".join([*lines, "Y[i] = T299[i]"])
    check_against_reference(f"op f(X: f32[N]) -> Y: f32[N] {{\n    {body}\n}}", {"N": 3}, rng)


def test_beyond_the_depth_limit_is_a_compile_error_not_a_crash():
    code = ("import tcc\ntry:\n    tcc.compile('op f(X: f32[N]) -> Y: f32[N] { Y[i] = ' + '-' * 200000 + 'X[i] }')\n"
            "except tcc.TccError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0 and "nested too deeply" in proc.stdout, proc.stderr[-2000:]


def test_without_threads_small_programs_still_compile(monkeypatch):
    """Under an address-space limit no deep-stack thread may start: compile on the caller's stack."""
    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(tcc.compile("op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] * 2.0 }").f(x), 2 * x)


def test_the_recursion_limit_is_restored():
    before = sys.getrecursionlimit()
    tcc.compile("op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] }")
    assert sys.getrecursionlimit() == before


# ---------------------------------------------------------------- sizes

def test_a_result_that_cannot_be_allocated_fails_before_any_work(monkeypatch):
    lib = tcc.compile("op f(X: f32[N]) -> Y: f32[N, N, N] { Y[i, j, k] = X[i] }")
    monkeypatch.setattr(tcc.Op, "kernel", lambda *a: pytest.fail("compiled a kernel for an impossible size"))
    with pytest.raises(TccShapeError, match=r"result Y of f would be f32\[100000, 100000, 100000\]: 3.55 PiB"):
        lib.f(np.ones(100_000, np.float32))


def test_a_tensor_beyond_64_bit_offsets_is_refused():
    lib = tcc.compile("op f(X: f32[N]) -> Y: f32[N] { T[i, j, k, l] = X[i] * X[j] * X[k] * X[l]; "
                      "Y[i] = T[i, i, i, i] }")
    with pytest.raises(TccShapeError, match="intermediate T of f .* more than 64-bit offsets"):
        lib.f(np.ones(70_000, np.float32))


# ---------------------------------------------------------------- the command line

@pytest.mark.parametrize("argv,needle", [
    (["--seed", "-1"], "--seed -1: needs a non-negative integer"),
    (["-D", "N=100000000000000000000000"], "more than 64-bit offsets can address"),
    (["-D", "N=3.5"], "N is a size and needs a non-negative integer"),
    (["-D", "N=-2"], "N is a size and needs a non-negative integer"),
    (["-D", "N=5", "--repeat", "0"], "--repeat 0: needs at least 1"),
    (["-D", "N=5", "--arch", "sm_90"], "--arch sm_90 is for --target cuda"),
])
def test_bad_run_options_are_clean_errors(capsys, argv, needle):
    code, out, err = run_cli(capsys, "run", str(ROOT / "examples" / "axpy.tc"), *argv)
    assert code == 1 and needle in err and "Traceback" not in err and not out


@pytest.mark.parametrize("argv,needle", [
    (["run", "--shape", "A=3x3", "--shape", "A=4x4", "-D", "N=2"], "--shape A is given more than once"),
    (["run", "-D", "N=2", "-D", "N=3", "-D", "M=1", "-D", "K=1"], "-D N is given more than once"),
    (["run", "--shape", "A=100000000x250000000", "-D", "N=2"], "this machine has"),
    (["lower", "-D", "M=3", "-D", "N=4", "-D", "K=99999999999999999999", "--stage", "llvm"], "64-bit offsets"),
    (["tune", "-D", "M=3", "-D", "N=4", "-D", "K=5", "--trials", "-3"], "--trials -3: needs at least 1"),
])
def test_bad_sizes_and_repeated_options_are_clean_errors(capsys, argv, needle):
    code, _, err = run_cli(capsys, argv[0], str(ROOT / "examples" / "matmul.tc"), *argv[1:])
    assert code == 1 and needle in err and "Traceback" not in err


def test_cli_errors_have_no_traceback_in_a_real_process(tmp_path):
    bad = tmp_path / "bad.tc"
    bad.write_bytes(b"\xff\xfe op")
    for argv in (["check", str(bad)], ["check", str(tmp_path / "nothing")],
                 ["run", str(ROOT / "examples" / "axpy.tc"), "--seed", "-1"]):
        proc = subprocess.run([sys.executable, "-m", "tcc.cli", *argv], capture_output=True, text=True,
                              timeout=300, cwd=ROOT)
        assert proc.returncode == 1 and proc.stderr.strip() and "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- options and keywords

AXPY = "op axpy(a: f32, X: f32[N], Y: f32[N]) -> Z: f32[N] { Z[i] = a * X[i] + Y[i] }"


@pytest.mark.parametrize("options,needle", [
    ({"bogus": 1}, "no option 'bogus'"),
    ({"arch": "sm_90"}, "option arch= is for target cuda"),
    ({"conv": "fft"}, r"unknown convolution lowering 'fft' \(conv=\)"),
])
def test_unknown_or_misplaced_compile_options_are_errors(options, needle):
    with pytest.raises(TccArgumentError, match=needle):
        tcc.compile(AXPY, **options)


def test_unknown_call_keyword_is_an_error():
    x = np.ones(3, np.float32)
    with pytest.raises(TccArgumentError, match="no compile-time parameter 'alpha'"):
        tcc.compile(AXPY).axpy(1.0, x, x, alpha=2)


# ---------------------------------------------------------------- literals

@pytest.mark.parametrize("body", ["Y[i] = X[i] + 300", "Y[i] = X[i] - 129", "Y[i] = 128", "Y[i] = i8(200)",
                                  "Y[i] = select(X[i] > 0, X[i], 1000)",
                                  "Y[i] = i8(i64(X[i]) + 99999999999999999999)"])
def test_integer_literal_out_of_range_is_an_error(body):
    with pytest.raises(TccTypeError, match="out of range for i(8|64)"):
        tcc.compile(f"op f(X: i8[N]) -> Y: i8[N] {{ {body} }}")


def test_integer_comparisons_with_any_literal_are_exact():
    lib = tcc.compile("op f(X: i8[N]) -> (A: bool[N], B: i8[N]) { A[i] = X[i] < 300 and X[i] > -1000; "
                      "B[i] = X[i] + -128 }")
    x = np.array([-128, 0, 127], np.int8)
    a, b = lib.f(x)
    np.testing.assert_array_equal(a, [True, True, True])
    np.testing.assert_array_equal(b, (x.astype(np.int64) - 128).astype(np.int8))


def test_int_parameters_and_scalars_out_of_range_are_errors():
    lib = tcc.compile("op f[P = 2](s: i8, X: i32[N]) -> Y: i32[N] { Y[i] = X[i] * P + i32(s) }")
    x = np.ones(3, np.int32)
    with pytest.raises(TccArgumentError, match="out of range for i8"):
        lib.f(300, x)
    with pytest.raises(TccArgumentError, match="does not fit a 64-bit integer"):
        lib.f(1, x, P=10**30)
    with pytest.raises(TccTypeError, match="default of P does not fit"):
        tcc.compile("op g[P = 99999999999999999999](X: i32[N]) -> Y: i32[N] { Y[i] = X[i] * P }")


@pytest.mark.parametrize("dtype", ["f16", "f32", "f64"])
def test_inf_and_nan_literals(dtype, rng):
    lib = tcc.compile(f"""
op f(X: {dtype}[N, K]) -> (M: {dtype}[N], L: {dtype}[N], S: {dtype}[N]) {{
    M[n] = max[k](select(X[n, k] > 0, X[n, k], -inf))
    L[n] = min[k](select(X[n, k] > 0, X[n, k], inf))
    S[n] = select(X[n, 0] > 0, nan, X[n, 0] * inf)
}}""")
    x = rng.standard_normal((6, 5)).astype(dtype.replace("f", "float"))
    x[0] = -1  # a row with no positive entry: its max is -inf, its min +inf
    m, low, s = lib.f(x)
    wide = x.astype(np.float64)
    assert_matches(m, np.where(wide > 0, wide, -np.inf).max(1).astype(x.dtype), lib.f.te.tensors["M"].dtype)
    assert_matches(low, np.where(wide > 0, wide, np.inf).min(1).astype(x.dtype), lib.f.te.tensors["L"].dtype)
    assert_matches(s, np.where(wide[:, 0] > 0, np.nan, wide[:, 0] * np.inf).astype(x.dtype),
                   lib.f.te.tensors["S"].dtype)
    assert m[0] == -np.inf and low[0] == np.inf


def test_inf_and_nan_are_reserved():
    with pytest.raises(tcc.TccError, match="'inf' is a float literal"):
        tcc.compile("op f(X: f32[N]) -> Y: f32[N] { inf[i] = X[i]; Y[i] = X[i] }")


def test_constants_too_large_for_f16_are_infinite():
    lib = tcc.compile("op f(X: f16[N]) -> Y: f16[N] { Y[i] = X[i] % 9223372036854775807 + 1e6 * 0.0 }")
    x = np.array([1.5, -2.0, 3.0], np.float16)
    want = reference_results(lib.f.te, [x], {"N": 3})[0]
    assert_matches(lib.f(x), want, lib.f.te.tensors["Y"].dtype)


# ---------------------------------------------------------------- identifiers

LONG = "a" * 2000
NAMES = {
    "a 2,000-character name everywhere": f"op {LONG}(s{LONG}: f32, X{LONG}: f32[N{LONG}]) -> Y{LONG}: f32[N{LONG}] {{\n"
                                         f"    T{LONG}[i{LONG}] = exp(X{LONG}[i{LONG}])\n"
                                         f"    Y{LONG}[i] = T{LONG}[i] + s{LONG} * sum[k{LONG}](T{LONG}[k{LONG}])\n}}",
    "names equal after truncation": f"op f(s: f32, {LONG}x: f32[N]) -> {LONG}y: f32[N] {{\n"
                                    f"    {LONG}z[i] = exp({LONG}x[i])\n"
                                    f"    {LONG}y[i] = {LONG}z[i] + s * sum[k]({LONG}z[k])\n}}",
    "C, CUDA and LLVM words": "op main(float: f32, int: f32[blockDim]) -> void: f32[blockDim] {\n"
                              "    expf[threadIdx] = exp(int[threadIdx])\n"
                              "    void[i] = expf[i] + float * sum[entry](expf[entry])\n}",
    "mangled names meet plain ones": "op tcc_f(int_: f32, int: f32[N]) -> u_int: f32[N] {\n"
                                     "    tcc_x[i] = exp(int[i])\n"
                                     "    u_int[i] = tcc_x[i] + int_ * sum[u_tcc_x](tcc_x[u_tcc_x])\n}",
    "generated names": "op f(acc_2: f32, bx: f32[gid]) -> tx: f32[gid] {\n"
                       "    i_1[i] = exp(bx[i])\n    tx[i] = i_1[i] + acc_2 * sum[k](i_1[k])\n}",
}


@pytest.mark.parametrize("name", list(NAMES))
def test_identifiers_reach_llvm_sanitised_and_unique(name, rng):
    op = next(iter(tcc.compile(NAMES[name])))
    x = rng.standard_normal(9).astype(np.float32)
    got = op(0.5, x)
    size = {s: 9 for s in op.te.symbols}
    assert_matches(got, reference_results(op.te, [0.5, x], size)[0], op.te.tensors[op.te.results[0]].dtype)


@pytest.mark.parametrize("name", list(NAMES))
def test_identifiers_reach_cuda_c_sanitised_and_unique(name):
    pytest.importorskip("cuda.bindings.nvrtc")
    op = next(iter(tcc.compile(NAMES[name], target="cuda")))
    ptx = op.lower(np.float32(0.5), np.ones(9, np.float32), stage="ptx")  # NVRTC compiles it: no GPU needed
    assert ".entry" in ptx


# ---------------------------------------------------------------- call arguments

CALL = """
op f(a: f32, X: f32[N], Y: f32[N]) -> Z: f32[N] { Z[i] = a * X[i] + Y[i] }
op g(X: f32[N, M]) -> (A: f32[N], B: f32[M]) { A[i] = sum[j](X[i, j]); B[j] = max[i](X[i, j]) }
"""
X5, Y5 = np.arange(5, dtype=np.float32), np.ones(5, np.float32)


@pytest.mark.parametrize("args,needle", [
    ((1.0, X5.astype(np.float64), Y5), "argument X of f must be f32, got float64"),
    ((1.0, X5, np.ones(4, np.float32)), "symbol N is 5 from X"),
    ((1.0, X5[None], Y5), "must have rank 1"),
    (("1", X5, Y5), "must be a f32 scalar"),
    ((np.ones(2, np.float32), X5, Y5), "must be a f32 scalar"),
    ((10**400, X5, Y5), "too large for f32"),
    ((1.0, X5), "takes 3 argument"),
    ((1.0, object(), Y5), "must be f32, got object"),
    ((1.0, [[1.0], [1.0, 2.0]], Y5), "not an array"),
])
def test_bad_call_arguments_are_errors_and_write_nothing(args, needle):
    out = np.full(5, np.nan, np.float32)
    with pytest.raises(tcc.TccError, match=needle):
        tcc.compile(CALL).f(*args, out=out)
    assert np.isnan(out).all()


def test_bad_out_arrays_are_errors_and_write_nothing():
    lib = tcc.compile(CALL)
    read_only = np.full(5, np.nan, np.float32)
    read_only.flags.writeable = False
    for out, needle in [(np.full(5, np.nan, np.float64), "must be f32"), (np.full(4, np.nan, np.float32), "f32"),
                        (read_only, "read-only"), ([np.nan] * 5, "out= gave 5")]:
        with pytest.raises(TccArgumentError, match=needle):
            lib.f(1.0, X5, Y5, out=out)
        assert np.isnan(np.asarray(out, dtype=np.float64)).all()
    shared = np.full(4, np.nan, np.float32)
    second = np.full(5, np.nan, np.float32)
    for outs, needle in [((shared, shared), "overlap"), ((shared[:3], shared[1:]), "overlap"),
                         ((np.full(3, np.nan, np.float32), second), r"out= for B must be f32\[4\]")]:
        with pytest.raises(TccArgumentError, match=needle):
            lib.g(np.ones((3, 4), np.float32), out=outs)
        assert np.isnan(shared).all() and np.isnan(second).all()


def test_out_may_overlap_an_input_or_be_strided():
    lib = tcc.compile(CALL)
    buf = np.arange(10, dtype=np.float32)
    want = 2 * buf[0:5] + Y5
    lib.f(2.0, buf[0:5], Y5, out=buf[1:6])
    np.testing.assert_array_equal(buf[1:6], want)
    strided = np.full(10, np.nan, np.float32)
    lib.f(2.0, X5, Y5, out=strided[::2])
    np.testing.assert_array_equal(strided[::2], 2 * X5 + Y5)
    assert np.isnan(strided[1::2]).all()


# ---------------------------------------------------------------- the fuzz batch

FUZZ_SEED = 20261123


def fuzz_cases() -> list[bytes]:
    rnd = random.Random(FUZZ_SEED)
    base = cases.base_programs()
    sources = [cases.random_bytes(rnd) for _ in range(150)]
    sources += [cases.random_unicode(rnd).encode() for _ in range(150)]
    sources += [cases.mutate(rnd.choice(base), rnd, gentle=i % 2 == 0).encode() for i in range(700)]
    return sources


def test_hostile_sources_give_success_or_a_tcc_error():
    """1,000 sources through compile, a call and the CLI on two worker processes (~40 s); a
    quarter also through CUDA C generation and a twentieth through NVRTC, where it is installed."""
    sources = fuzz_cases()
    nvrtc = importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.bindings") is not None
    jobs = [{"id": i, "seed": i, "source": base64.b64encode(s).decode(), "cli_run": i % 4 == 0,
             "cuda": ("ptx" if i % 20 == 0 else "cuda" if i % 4 == 1 else None) if nvrtc else None}
            for i, s in enumerate(sources)]
    outcomes = runner.run_cases(jobs, workers=2, timeout=120)
    assert len(outcomes) == len(sources)
    bad = [o for o in outcomes if o["status"] != "ok"]
    report = "\n\n".join(f"case {o['id']} ({o['status']}):\n{sources[o['id']].decode('utf-8', 'replace')}\n"
                         f"{o['detail']}" for o in bad[:5])
    assert not bad, f"{len(bad)} of {len(sources)} hostile sources escaped:\n{report}"


# ---------------------------------------------------------------- schedules

MM = "op mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }"


@pytest.mark.parametrize("steps,needle", [
    ("split(i, 2, io, ii); split(io, 2, io, ii)", "the name 'ii' is already used"),
    ("split(i, 2, k, ii)", "the name 'k' is already used"),
    ("split(i, 0, io, ii)", "positive integer"),
    ("split(k, 1000000, ko, ki); unroll(ki)", "would bloat the code"),
    ("split(i, 2, \u00e9, ii)", "unexpected character"),
    ("\x00", "unexpected character"),
    ("x" * 5000 + "(i)", "unknown schedule primitive"),
])
def test_hostile_schedules_are_schedule_errors(steps, needle):
    a, b = np.ones((7, 300), np.float32), np.ones((300, 5), np.float32)
    with pytest.raises(tcc.TccError, match=needle):
        tcc.compile(MM).mm.schedule(steps)(a, b)


def test_a_split_factor_beyond_64_bits_is_harmless(rng):
    a, b = rng.standard_normal((7, 30)).astype(np.float32), rng.standard_normal((30, 5)).astype(np.float32)
    got = tcc.compile(MM).mm.schedule("split(i, 99999999999999999999, io, ii)")(a, b)
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_a_bf16_result_on_the_cpu_is_a_type_error_even_when_nothing_is_computed():
    """Found by the fuzz batch: a zero-size bf16 result reached the allocation (KeyError)."""
    src = (ROOT / "examples" / "conv2d_relu.tc").read_text()
    src = src.replace("-> Y: f32", "-> Y: bf16").replace("S = 1", "S = -129")
    op = tcc.compile(src).conv2d_relu
    x, w, b = np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 2, 2), np.float32), np.ones(1, np.float32)
    with pytest.raises(TccTypeError, match="result Y is bf16, which is supported on target='cuda' only"):
        op(x, w, b)


def test_a_file_that_is_not_onnx_is_a_clean_cli_error(capsys):
    pytest.importorskip("onnx")
    code, _, err = run_cli(capsys, "onnx", str(ROOT / "examples" / "matmul.tc"), "--run")
    assert code == 1 and "cannot read ONNX model" in err and "Traceback" not in err
