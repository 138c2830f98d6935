"""Run the compiler on a thread with a deep stack, so that program size is not limited by
Python's recursion limit.

The parser, semantic analysis, the passes, the printers, code generation and the reference
interpreter all recurse over expression trees, and a left-associated 5,000-term sum is 5,000
levels deep. Rather than rewrite every tree walk by hand, :func:`deep` runs the work on a
helper thread whose C stack is large (:data:`STACK_BYTES`, reserved, touched only as used) and
raises the interpreter's recursion limit to :data:`RECURSION_LIMIT` while any such thread
runs: the limit is then far below what the stack can hold, so deep recursion stays a Python
``RecursionError``, which becomes a :class:`TccCompileError` naming the limit, never a crash.

Entry points (``tcc.compile``, a kernel build, ``op.lower``, the reference) wrap their work in
:func:`deep`; nested calls run inline on the thread they are already on.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from tcc.errors import TccCompileError

STACK_BYTES = 1 << 30  # virtual: a thread touches only the pages it uses
RECURSION_LIMIT = 120_000  # Python frames; ~8 KiB of C stack each at most, well within STACK_BYTES

T = TypeVar("T")

_local = threading.local()
_lock = threading.Lock()
_active = 0  # deep threads running; the raised recursion limit is restored when none is left
_saved_limit = 0


def deep(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` on a deep-stack thread (inline when already on one, or when no
    thread can be started, e.g. under a tight address-space limit)."""
    if getattr(_local, "deep", False):
        return fn(*args, **kwargs)
    outcome: list = []

    def work() -> None:
        _local.deep = True
        try:
            outcome.append((True, fn(*args, **kwargs)))
        except RecursionError:
            outcome.append((False, TccCompileError(
                "an expression is nested too deeply for tcc (its limit is some tens of thousands of levels)",
                hint="split the expression into several statements")))
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread below
            outcome.append((False, exc))
        finally:
            _local.deep = False

    thread = _start(work)
    if thread is None:
        work()
    else:
        try:
            thread.join()
        finally:
            _finish()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _start(work: Callable[[], None]) -> threading.Thread | None:
    """A started deep-stack thread running ``work`` (the recursion limit raised), or None."""
    global _active, _saved_limit
    with _lock:
        previous = threading.stack_size(STACK_BYTES)
        try:
            thread = threading.Thread(target=work, name="tcc-compile", daemon=True)
            if _active == 0:
                _saved_limit = sys.getrecursionlimit()
                sys.setrecursionlimit(max(_saved_limit, RECURSION_LIMIT))
            _active += 1
            thread.start()
        except (RuntimeError, MemoryError):  # "can't start new thread"
            _active -= 1
            if _active == 0:
                sys.setrecursionlimit(_saved_limit)
            return None
        finally:
            threading.stack_size(previous)
    return thread


def _finish() -> None:
    global _active
    with _lock:
        _active -= 1
        if _active == 0:
            sys.setrecursionlimit(_saved_limit)
