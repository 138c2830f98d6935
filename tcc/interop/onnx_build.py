"""Compile a model's kernels in worker processes, into the disk cache.

LLVM holds the GIL-free part of a compile under one lock per process, and the passes are
Python: one process compiles one kernel at a time. A network's distinct kernels are independent,
so ``build`` hands them to ``jobs`` workers (``python -m tcc.interop.onnx_build``), each compiling
one kernel at a time into the disk cache and asking for the next; the parent then loads every
kernel from the cache as a warm start would. Workers are plain subprocesses fed through a pipe
(not ``multiprocessing``, which re-imports the caller's main script). A kernel a worker fails on
is simply not in the cache: the parent compiles it again and reports the error itself.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tcc.compiler import compile as tcc_compile


def build(sources: list[str], options: dict[str, Any], jobs: int, done: Callable[[], None]) -> None:
    """Compile CPU kernels ``sources`` into the disk cache with ``jobs`` workers; ``done()`` after each."""
    root = str(Path(__file__).resolve().parent.parent.parent)  # the directory that holds the tcc package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    todo = list(reversed(sources))
    selector = selectors.DefaultSelector()
    workers = []
    for _ in range(min(jobs, len(sources))):
        worker = subprocess.Popen([sys.executable, "-m", "tcc.interop.onnx_build"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        workers.append(worker)
        _send(worker, {"options": options})
        _next(worker, todo)
        selector.register(worker.stdout, selectors.EVENT_READ, worker)  # type: ignore[arg-type]
    try:
        while selector.get_map():
            for key, _ in selector.select():
                worker = key.data
                if not worker.stdout.readline():  # the worker ended (or crashed): its kernels fall to the parent
                    selector.unregister(key.fileobj)
                    continue
                done()
                _next(worker, todo)
    finally:
        for worker in workers:
            if worker.stdin and not worker.stdin.closed:
                worker.stdin.close()
            worker.wait()


def _send(worker: subprocess.Popen, message: Any) -> None:
    try:
        worker.stdin.write(json.dumps(message) + "\n")  # type: ignore[union-attr]
        worker.stdin.flush()  # type: ignore[union-attr]
    except OSError:
        pass  # a worker that died: reading its output ends it


def _next(worker: subprocess.Popen, todo: list[str]) -> None:
    """The worker's next kernel, or the end of its input."""
    if todo:
        _send(worker, {"source": todo.pop()})
    elif worker.stdin and not worker.stdin.closed:
        worker.stdin.close()


def main() -> None:
    """A worker: the options on the first line, then one kernel source a line; ``done`` after each."""
    options = json.loads(sys.stdin.readline())["options"]
    for line in sys.stdin:
        try:
            next(iter(tcc_compile(json.loads(line)["source"], target="cpu", **options))).kernel({})
        except Exception:  # noqa: BLE001, S110 - the parent compiles it again and reports the error
            pass
        print("done", flush=True)


if __name__ == "__main__":
    main()
