"""Compile a model's kernels in worker processes, into the disk cache, beside the caller.

The passes are Python and LLVM runs under one lock per process: one process compiles one kernel
at a time. A network's distinct kernels are independent, so :class:`Workers` starts worker
processes (``python -m tcc.interop.graph_build``) that take kernels from the back of the list
while the caller compiles from its front; each worker compiles into the disk cache and asks for
the next, and the caller then loads their kernels from the cache as a warm start would.
Workers are plain subprocesses fed through a pipe (not ``multiprocessing``, which re-imports the
caller's main script). A kernel a worker fails on is simply not in the cache: the caller
compiles it again and reports the error itself.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tcc.compiler import compile as tcc_compile

Item = tuple[str, tuple[str, ...]]  # a kernel: its source and its constant parameters


class Workers:
    """``jobs`` worker processes taking CPU kernels (source, constant parameters) from the back of
    ``todo`` (shared with the caller, who takes from the front through :meth:`take`); ``done()``
    after each they build."""

    def __init__(self, todo: list[Item], options: dict[str, Any], jobs: int, done: Callable[[], None]):
        self._todo = todo
        self._lock = threading.Lock()
        self._done = done
        root = str(Path(__file__).resolve().parent.parent.parent)  # the directory that holds the tcc package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self._procs = [subprocess.Popen([sys.executable, "-m", "tcc.interop.graph_build"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
                       for _ in range(jobs)]
        for proc in self._procs:
            _send(proc, {"options": options})
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def take(self) -> Item | None:
        """The caller's next kernel (None: none left)."""
        with self._lock:
            return self._todo.pop(0) if self._todo else None

    def _take_last(self) -> Item | None:
        with self._lock:
            return self._todo.pop() if self._todo else None

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        for proc in self._procs:
            self._next(proc)
            selector.register(proc.stdout, selectors.EVENT_READ, proc)  # type: ignore[arg-type]
        while selector.get_map():
            for key, _ in selector.select():
                proc = key.data
                if not proc.stdout.readline():  # the worker ended (or crashed): the caller loads or builds the rest
                    selector.unregister(key.fileobj)
                    continue
                self._done()
                self._next(proc)

    def _next(self, proc: subprocess.Popen) -> None:
        """The worker's next kernel, or the end of its input."""
        item = self._take_last()
        if item is not None:
            _send(proc, {"source": item[0], "constants": list(item[1])})
        elif proc.stdin and not proc.stdin.closed:
            proc.stdin.close()

    def join(self, kill: bool = False) -> None:
        """Wait for the workers to build what is left (``kill``: stop them now)."""
        if kill:
            with self._lock:
                self._todo.clear()
            for proc in self._procs:
                proc.kill()
        self._thread.join()
        for proc in self._procs:
            proc.wait()


def _send(proc: subprocess.Popen, message: Any) -> None:
    try:
        proc.stdin.write(json.dumps(message) + "\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
    except OSError:
        pass  # a worker that died: reading its output ends it


def main() -> None:
    """A worker: the options on the first line, then one kernel (source and constant parameters)
    a line; ``done`` after each."""
    options = json.loads(sys.stdin.readline())["options"]
    for line in sys.stdin:
        try:
            kernel = json.loads(line)
            constants = {"constant_params": kernel["constants"]} if kernel["constants"] else {}
            next(iter(tcc_compile(kernel["source"], target="cpu", **options, **constants))).kernel({})
        except Exception:  # noqa: BLE001, S110 - the caller compiles it again and reports the error
            pass
        print("done", flush=True)


if __name__ == "__main__":
    main()
