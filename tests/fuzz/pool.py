"""Run many fuzz seeds on a few worker processes; a worker that dies is a reported crash.

Each worker (``fuzz.worker``) takes seeds one at a time. If it exits or stops answering within
``timeout`` seconds, the seed it held is reported as ``crash`` (with the signal) or ``timeout``,
and a fresh worker takes its place.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

TESTS_DIR = str(Path(__file__).resolve().parent.parent)


class _Worker:
    def __init__(self, env: dict[str, str], module: str):
        self.module = module
        self.proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        self.job: dict | None = None
        self.started = 0.0

    def send(self, job: dict) -> None:
        self.job, self.started = job, time.monotonic()
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run_seeds(jobs: Iterable[dict], workers: int = 2, timeout: float = 120.0,
              env: dict[str, str] | None = None, module: str = "fuzz.worker") -> Iterator[dict]:
    """Yield one outcome (a dict, see ``fuzz.check.Outcome``) per job, in completion order.
    ``module`` is the worker's (``fuzz.onnx.worker`` for ONNX graphs)."""
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = TESTS_DIR + os.pathsep + env.get("PYTHONPATH", "")
    pending = iter(jobs)
    sel = selectors.DefaultSelector()
    pool = [_Worker(env, module) for _ in range(workers)]
    try:
        for w in pool:
            _feed(w, pending, sel)
        while sel.get_map():
            for key, _ in sel.select(timeout=1.0):
                w = key.data
                line = w.proc.stdout.readline()
                sel.unregister(w.proc.stdout)
                if line:
                    yield json.loads(line)
                    _feed(w, pending, sel)
                else:
                    yield _died(w, "crash")
                    w = _replace(pool, w, env)
                    _feed(w, pending, sel)
            for w in list(pool):
                if w.job is not None and time.monotonic() - w.started > timeout:
                    sel.unregister(w.proc.stdout)
                    yield _died(w, "timeout")
                    w = _replace(pool, w, env)
                    _feed(w, pending, sel)
    finally:
        for w in pool:
            w.close()


def _feed(w: _Worker, pending: Iterator[dict], sel: selectors.BaseSelector) -> None:
    job = next(pending, None)
    w.job = None
    if job is not None:
        w.send(job)
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)


def _died(w: _Worker, status: str) -> dict:
    w.close()
    code = w.proc.returncode
    detail = f"worker exited with {code}" + (f" (signal {-code})" if code is not None and code < 0 else "")
    return {"seed": w.job["seed"], "status": status, "detail": detail, "schedules": 0, "refused": 0}


def _replace(pool: list[_Worker], w: _Worker, env: dict[str, str]) -> _Worker:
    fresh = _Worker(env, w.module)
    pool[pool.index(w)] = fresh
    return fresh
