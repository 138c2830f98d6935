"""What cold compiles skip (issue 12), checked for the answers they give: flat offsets that join a
row and a column, short floor division by constants (im2col's index arithmetic), LLVM's unroller
left only the innermost loops, and deep-stack threads kept between compiles."""

import gc
import multiprocessing
import operator
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers import TWO_CORE_HOST, check_op

import tcc
from tcc import dtypes
from tcc.codegen_cpu.llvm_loops import _holds_loop, _runs_once
from tcc.ir.expr import Binary, Const, Expr, Var
from tcc.ir.loopnest import flat_terms
from tcc.ir.loops import Allocate, Buffer, For, If, Let, Seq, Store, map_stmt, walk_stmts
from tcc.stack import MAX_IDLE, YOUNG_GC, deep

I64 = dtypes.i64


def _c(v: int) -> Const:
    return Const(v, I64)


def _evaluate(e: Expr, env: dict[str, int]) -> int:
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        return env[e.name]
    a, b = _evaluate(e.a, env), _evaluate(e.b, env)
    operators = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
                 "floordiv": operator.floordiv, "mod": operator.mod}
    return operators[e.op](a, b)  # only the one operator: a zero operand of an add must not divide


def _row_major(indices: tuple[int, ...], shape: tuple[int, ...]) -> int:
    flat = 0
    for i, d in zip(indices, shape):
        flat = flat * d + i
    return flat


def test_flat_offsets_join_rows_and_columns_for_any_integer(rng):
    """im2col's ``k // 9, k // 3 % 3, k % 3`` into ``[C, 3, 3]`` is ``k``: the joined offset equals
    the row-major one for every integer, negative ones included (floor semantics)."""
    f, ko, kk = Var("f", I64), Var("ko", I64), Var("kk", I64)
    k = Binary("add", Binary("mul", ko, _c(576), I64), Binary("sub", kk, _c(5), I64), I64)
    third = Binary("floordiv", k, _c(3), I64)
    indices = (Binary("add", f, _c(1), I64), Binary("floordiv", third, _c(3), I64),
               Binary("mod", third, _c(3), I64), Binary("mod", k, _c(3), I64))
    shape = (7, 64, 3, 3)
    flat = flat_terms(indices, shape)
    assert flat is not None and flat.recombined
    assert flat_terms(indices, shape) is flat  # cached: asked again per unrolled copy and lane test
    with pytest.raises(TypeError):
        flat.atoms[f] = 1  # type: ignore[index]  # shared between callers, so read-only
    for _ in range(200):
        env = {n: int(v) for n, v in zip(("f", "ko", "kk"), rng.integers(-1000, 1000, 3))}
        got = sum(c * _evaluate(a, env) for a, c in flat.atoms.items()) + flat.constant
        assert got == _row_major(tuple(_evaluate(i, env) for i in indices), shape)


@pytest.mark.parametrize("n", [1, 7, 33])
def test_an_unflattened_read_matches_the_reference(n, rng):
    """A tensor read through a flat index split three ways by constant divisors, as im2col reads its
    weights, at odd sizes."""
    src = """op f(X: f32[N, 3, 3], W: f32[M]) -> Y: f32[M] {
    Y[k] = X[k // 3 // 3, k // 3 % 3, k % 3] * W[k] + X[(k + 4) // 3 // 3, (k + 4) // 3 % 3, (k + 4) % 3]
}"""
    check_op(src, "f", {"N": n, "M": 9 * n - 4}, rng)


@pytest.mark.parametrize("n", [1, 7, 33])
def test_integer_floor_division_by_constants_matches_numpy(n, rng):
    """Constant divisors above zero take the short path: floor semantics on negative dividends."""
    op = tcc.compile("op f(X: i64[N]) -> (Q: i64[N], R: i64[N]) { Q[i] = X[i] // 7\n R[i] = X[i] % 7 }").f
    x = rng.integers(-10**12, 10**12, n).astype(np.int64)
    x[0] = -7 if n > 1 else -1
    q, r = op(x)
    np.testing.assert_array_equal(q, x // 7)
    np.testing.assert_array_equal(r, x % 7)


CONV2D = """op conv2d[P = 0](X: f32[N, C, H, W], Wt: f32[F, C, KH, KW], b: f32[F])
    -> Y: f32[N, F, H + 2*P - KH + 1, W + 2*P - KW + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, f, y, x] = sum[c, r, s](Xp[n, c, y + r, x + s] * Wt[f, c, r, s]) + b[f]
}"""


@pytest.mark.parametrize("n, c, f, hw", [(1, 7, 5, 33), (2, 16, 33, 9), (1, 64, 64, 56)])
def test_register_tiled_convolutions_match_the_reference(n, c, f, hw, rng):
    """im2col convolutions (packed weights, gathered patches, register tiles with row and column
    tails: the loops LLVM's unroller now leaves alone, the offsets summed by atoms) at odd sizes
    and the benchmark's layer."""
    check_op(CONV2D, "conv2d", {"N": n, "C": c, "H": hw, "W": hw, "F": f, "KH": 3, "KW": 3, "P": 1}, rng)


@pytest.mark.parametrize("m, k, n", [(1, 7, 33), (33, 65, 7), (257, 129, 263)])
def test_register_tiled_matmuls_match_the_reference(m, k, n, rng):
    check_op("op mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }",
             "mm", {"M": m, "K": k, "N": n}, rng)


def _unroll_disabled(llvm_text: str) -> dict[str, bool]:
    """Per loop (by its LLVM header's name, ``kk.header`` or a repeat ``kk.header.2``): whether a
    branch back to its header (the latch) carries ``!llvm.loop`` (its entry branch never does)."""
    found: dict[str, bool] = {}
    for line in llvm_text.splitlines():
        m = re.match(r'\s*br label %"(\w+)\.header(\.\d+)?"', line)
        if m:
            found[m.group(1) + (m.group(2) or "")] = found.get(m.group(1) + (m.group(2) or ""), False) \
                or "!llvm.loop" in line
    return found


def test_llvm_unrolls_only_innermost_loops():
    """Every loop holding another loop tells LLVM not to unroll it; innermost loops (a register
    tile's reduction, which LLVM unrolls in part) and loops of one iteration carry no such note.
    A decision, read from the emitted IR: the answers are checked numerically above."""
    op = tcc.compile(CONV2D).conv2d
    args = [np.ones((1, 64, 56, 56), np.float32), np.ones((64, 64, 3, 3), np.float32), np.ones(64, np.float32)]
    bindings = op.bindings_for(tuple(args), {"P": 1})
    loops = [s for s in walk_stmts(op.lowered(bindings).scheduled.body)
             if isinstance(s, For) and s.kind in ("serial", "parallel")]
    outer = {s.var.name for s in loops if _holds_loop(s.body) and not _runs_once(s)}
    inner = {s.var.name for s in loops if not _holds_loop(s.body) or _runs_once(s)}
    text = op.lower(*args, P=1, stage="llvm")
    assert "llvm.loop.unroll.disable" in text
    disabled = _unroll_disabled(text)
    assert outer and {n.split(".")[0] for n, off in disabled.items() if off} == outer
    assert inner and {n.split(".")[0] for n, off in disabled.items() if not off} == inner


def _nest() -> Seq:
    """A loop body with every kind of node map_stmt descends into."""
    i, j = Var("i"), Var("j")
    store = Store("A", (i,), Binary("add", i, j, I64))
    inner = Let(j, _c(3), Seq((store, If(Binary("lt", i, _c(2), dtypes.boolean), Store("B", (j,), j), store))))
    return Seq((For(i, _c(7), inner), Allocate(Buffer("T", I64, (7,)), For(i, _c(7), Store("B", (j,), j)))))


def test_map_stmt_keeps_what_it_does_not_change():
    """A schedule maps a whole function to change one nest: untouched statements are kept as they
    are (not copied), changed ones rebuilt up to the root, and the result equals a full rebuild."""
    body = _nest()
    assert map_stmt(body, lambda s: None) is body
    b_store = body.stmts[1].body.body
    renamed = map_stmt(body, lambda s: Store("C", s.indices, s.value) if s is b_store else None)
    assert renamed is not body and renamed.stmts[0] is body.stmts[0]  # the first nest never saw B
    assert renamed.stmts[1].body.body == Store("C", (Var("j"),), Var("j"))
    assert renamed.stmts[0].body.body.stmts[1].then == b_store  # an equal B elsewhere, not the one mapped
    flat = map_stmt(Seq((Seq((b_store,)), b_store)), lambda s: None)
    assert flat == Seq((b_store, b_store))  # nested sequences still come back flattened


def test_deep_stack_threads_are_kept_between_compiles(rng):
    for _ in range(2):  # the first round may start the threads
        check_op("op f(X: f32[N]) -> Y: f32[N] { Y[i] = exp(X[i]) }", "f", {"N": 33}, rng)
    before = {t.ident for t in threading.enumerate() if t.name == "tcc-compile"}
    for _ in range(3):
        check_op("op f(X: f32[N]) -> Y: f32[N] { Y[i] = exp(X[i]) }", "f", {"N": 33}, rng)
    after = {t.ident for t in threading.enumerate() if t.name == "tcc-compile"}
    assert after == before and 0 < len(after) <= MAX_IDLE


def test_the_collector_runs_less_often_during_deep_work_and_as_before_after(rng):
    """While a compile runs, young collections come every YOUNG_GC allocations (not 700); after it,
    the caller's thresholds are back, and a collector switched off stays off."""
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert deep(gc.get_threshold) == (YOUNG_GC, 10, 10)
        check_op("op f(X: f32[N]) -> Y: f32[N] { Y[i] = exp(X[i]) }", "f", {"N": 7}, rng)
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(0, 10, 10)
        assert deep(gc.get_threshold) == (0, 10, 10) and gc.get_threshold() == (0, 10, 10)
    finally:
        gc.set_threshold(*saved)


def test_deep_work_from_many_threads_gets_its_own_answers():
    """Callers at once: each gets its own result or exception, none waits on another's thread, and
    the recursion limit is back afterwards."""
    before = sys.getrecursionlimit()
    barrier = threading.Barrier(4)
    results: dict[int, object] = {}

    def work(i: int) -> int:
        barrier.wait(timeout=30)  # all four run at once: four threads
        if i == 3:
            raise ValueError("three")
        return deep(lambda: i * 10)  # nested: inline on the same thread

    def call(i: int) -> None:
        try:
            results[i] = deep(work, i)
        except ValueError as exc:
            results[i] = exc

    callers = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=60)
    assert [results[i] for i in range(3)] == [0, 10, 20] and isinstance(results[3], ValueError)
    assert sys.getrecursionlimit() == before


def _compile_in_child(queue) -> None:
    x = np.arange(5, dtype=np.float32)
    queue.put(tcc.compile("op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] + 1.0 }").f(x).tolist())


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_a_forked_child_compiles():
    """Kept threads do not survive a fork: the child starts its own instead of waiting on them."""
    deep(lambda: None)  # at least one thread kept in the parent
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_compile_in_child, args=(queue,))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0 and queue.get(timeout=5) == [1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("n", [7, 33, 256])
def test_vector_constants_made_once_keep_their_values(n, rng):
    """Splatted constants are made once per process: 0.0 and -0.0 (equal as Python numbers) stay
    apart, as do a float and an integer of one value."""
    op = tcc.compile("""op f(X: f32[N], K: i64[N]) -> (A: f32[N], B: f32[N], C: i64[N]) {
    A[i] = X[i] * 0.0
    B[i] = X[i] * -0.0
    C[i] = K[i] * 2 + 1
}""").f
    x = np.abs(rng.standard_normal(n)).astype(np.float32) + 0.5
    k = rng.integers(-1000, 1000, n)
    a, b, c = op(x, k)
    assert not np.signbit(a).any() and np.signbit(b).all()
    np.testing.assert_array_equal(c, k * 2 + 1)


@pytest.mark.parametrize("n", [1, 7, 33])
def test_index_arithmetic_folded_while_emitting_wraps_like_numpy(n, rng):
    """Unrolled loops make their index a constant, and the code generator folds the integer
    arithmetic on constants (i32 wrapping at 32 bits), adds of 0 and products by 0 and 1."""
    src = """op f(K: i32[N], X: f32[N, 3]) -> Y: f32[N, 3] {
    Y[i, j] = f64(K[i] * 1 + i32(j) * 1073741824 * 2 + i32(j) * 0 - 0) * f64(X[i, j * 1 + 0])
}
schedule f cpu { unroll(j) }"""
    k = rng.integers(-1000, 1000, n).astype(np.int32)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    check_op(src, "f", {"N": n}, rng, args=[k, x])


def test_a_cpu_compile_does_not_load_the_cuda_scheduler(tmp_path):
    """A CPU op compiled from an empty cache runs the CPU auto-scheduler only; the CUDA one (11 ms
    of imports) stays unloaded. The answer is checked too."""
    script = TWO_CORE_HOST + """
import sys
import numpy as np
import tcc
x = np.arange(33, dtype=np.float32)
y = tcc.compile("op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] * 2.0 + 1.0 }").f(x)
assert np.array_equal(y, x * 2 + 1)
print(sorted(m for m in sys.modules if m.startswith("tcc.passes.autoschedule")))
"""
    env = {**os.environ, "TCC_CACHE_DIR": str(tmp_path), "PYTHONPATH": os.path.dirname(os.path.dirname(tcc.__file__))}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    loaded = out.stdout.strip()
    assert "autoschedule_cpu.schedule" in loaded and "autoschedule_cuda" not in loaded
