"""What cold compiles skip (issue 12), checked for the answers they give: short floor division by
constants (im2col's index arithmetic) and deep-stack threads kept between compiles."""

import multiprocessing
import sys
import threading

import numpy as np
import pytest
from helpers import check_op

import tcc
from tcc.stack import MAX_IDLE, deep


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


def test_deep_stack_threads_are_kept_between_compiles(rng):
    for _ in range(2):  # the first round may start the threads
        check_op("op f(X: f32[N]) -> Y: f32[N] { Y[i] = exp(X[i]) }", "f", {"N": 33}, rng)
    before = {t.ident for t in threading.enumerate() if t.name == "tcc-compile"}
    for _ in range(3):
        check_op("op f(X: f32[N]) -> Y: f32[N] { Y[i] = exp(X[i]) }", "f", {"N": 33}, rng)
    after = {t.ident for t in threading.enumerate() if t.name == "tcc-compile"}
    assert after == before and 0 < len(after) <= MAX_IDLE


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
