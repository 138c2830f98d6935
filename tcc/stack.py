"""Run the compiler on a thread with a deep stack, so that program size is not limited by
Python's recursion limit.

The parser, semantic analysis, the passes, the printers, code generation and the reference
interpreter all recurse over expression trees, and a left-associated 5,000-term sum is 5,000
levels deep. Rather than rewrite every tree walk by hand, :func:`deep` runs the work on a
helper thread whose C stack is large (:data:`STACK_BYTES`, reserved, touched only as used) and
raises the interpreter's recursion limit to :data:`RECURSION_LIMIT` while any such thread
runs (and the garbage collector's youngest-generation threshold to :data:`YOUNG_GC`: a compile
builds IR that mostly lives until it ends, and at Python's default of 700 allocations the
collector ran ~30 times over it, 6-8 ms of a convolution's ~300 ms cold compile). The limit is
then far below what the stack can hold, so deep recursion stays a Python ``RecursionError``,
which becomes a :class:`TccCompileError` naming the limit, never a crash.

Entry points (``tcc.compile``, a kernel build, ``op.lower``, the reference) wrap their work in
:func:`deep`; nested calls run inline on the thread they are already on. Threads are kept
between calls (at most :data:`MAX_IDLE` idle), so a compile starts none after the first.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from tcc.errors import TccCompileError

STACK_BYTES = 1 << 30  # virtual: a thread touches only the pages it uses
RECURSION_LIMIT = 120_000  # Python frames; ~8 KiB of C stack each at most, well within STACK_BYTES

YOUNG_GC = 50_000  # allocations between young collections while deep work runs (Python's default: 700)
T = TypeVar("T")
MAX_IDLE = 2  # deep-stack threads kept waiting for the next compile (a new one costs ~0.5-4 ms)

_local = threading.local()
_lock = threading.Lock()
_active = 0  # deep work items running; the raised recursion limit is restored when none is left
_saved_limit = 0
_saved_gc: tuple[int, ...] = ()
_idle: list[_Worker] = []  # threads between work items, newest last


def deep(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` on a deep-stack thread (inline when already on one, or when no
    thread can be started, e.g. under a tight address-space limit). The thread stays for the next
    call: a compile and its first call use two, and starting each cost more than a warm start's
    other work."""
    if getattr(_local, "deep", False):
        return fn(*args, **kwargs)
    outcome: list = []

    def work() -> None:
        try:
            outcome.append((True, fn(*args, **kwargs)))
        except RecursionError:
            outcome.append((False, TccCompileError(
                "an expression is nested too deeply for tcc (its limit is some tens of thousands of levels)",
                hint="split the expression into several statements")))
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread below
            outcome.append((False, exc))

    done = _submit(work)
    if done is None:
        _local.deep = True
        try:
            work()
        finally:
            _local.deep = False
    else:
        try:
            done.wait()
        finally:
            _finish()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


class _Worker:
    """A deep-stack thread that runs one work item at a time and then waits for the next."""

    def __init__(self) -> None:
        self._ready = threading.Condition(threading.Lock())
        self._item: tuple[Callable[[], None], threading.Event] | None = None
        self.thread = threading.Thread(target=self._loop, name="tcc-compile", daemon=True)

    def give(self, work: Callable[[], None]) -> threading.Event:
        done = threading.Event()
        with self._ready:
            self._item = (work, done)
            self._ready.notify()
        return done

    def _loop(self) -> None:
        _local.deep = True
        while True:
            with self._ready:
                while self._item is None:
                    self._ready.wait()
                (work, done), self._item = self._item, None
            try:
                work()
            finally:
                keep = _release(self)
                done.set()
            if not keep:
                return


def _submit(work: Callable[[], None]) -> threading.Event | None:
    """Start ``work`` on an idle deep-stack thread, or a new one (the recursion limit raised);
    the event it sets when done, or None when no thread can be started."""
    global _active, _saved_limit, _saved_gc
    with _lock:
        if _active == 0:
            _saved_limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_saved_limit, RECURSION_LIMIT))
            _saved_gc = gc.get_threshold()
            if _saved_gc[0]:  # 0: the collector is off, and stays so
                gc.set_threshold(max(_saved_gc[0], YOUNG_GC), *_saved_gc[1:])
        _active += 1
        worker = _idle.pop() if _idle else None
    if worker is not None:
        return worker.give(work)
    worker = _Worker()
    done = worker.give(work)
    previous = threading.stack_size(STACK_BYTES)
    try:
        worker.thread.start()
    except (RuntimeError, MemoryError):  # "can't start new thread"
        _finish()
        return None
    finally:
        threading.stack_size(previous)
    return done


def _release(worker: _Worker) -> bool:
    """Return a worker that finished its item to the idle list; False when enough are idle."""
    with _lock:
        if len(_idle) >= MAX_IDLE:
            return False
        _idle.append(worker)
        return True


def _finish() -> None:
    global _active
    with _lock:
        _active -= 1
        if _active == 0:
            sys.setrecursionlimit(_saved_limit)
            gc.set_threshold(*_saved_gc)


def _forget_workers() -> None:
    """In a forked child no worker thread exists any more: start afresh."""
    global _lock, _active
    _lock = threading.Lock()
    if _active:  # forked while deep work ran: the child's interpreter settings were still raised
        sys.setrecursionlimit(_saved_limit)
        gc.set_threshold(*_saved_gc)
    _active = 0
    _idle.clear()


os.register_at_fork(after_in_child=_forget_workers)
