"""Run hostile-input cases on a few worker processes; a worker that dies is a reported crash.

Each worker (:mod:`hostile.worker`) takes cases one at a time. If it exits, or holds a case
longer than ``timeout`` seconds, that case is reported as ``crash`` (with the exit status) or
``timeout`` and a fresh worker takes the rest.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

TESTS_DIR = str(Path(__file__).resolve().parent.parent)


def run_cases(cases: Iterable[dict], workers: int = 2, timeout: float = 60.0) -> list[dict]:
    """One outcome per case: ``{"id", "status": ok | raw | crash | timeout, "detail"}``."""
    env = {**os.environ, "PYTHONPATH": TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")}
    pending = list(cases)[::-1]
    outcomes: list[dict] = []
    sel = selectors.DefaultSelector()
    held: dict[subprocess.Popen, tuple[dict, float]] = {}

    def start() -> None:
        proc = subprocess.Popen([sys.executable, "-m", "hostile.worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        sel.register(proc.stdout, selectors.EVENT_READ, proc)
        feed(proc)

    def feed(proc: subprocess.Popen) -> None:
        if not pending:
            stop(proc)
            return
        case = pending.pop()
        held[proc] = (case, time.monotonic())
        proc.stdin.write(json.dumps(case) + "\n")
        proc.stdin.flush()

    def stop(proc: subprocess.Popen) -> None:
        sel.unregister(proc.stdout)
        held.pop(proc, None)
        if proc.poll() is None:
            proc.kill()
        proc.wait()

    def lost(proc: subprocess.Popen, status: str) -> None:
        case = held[proc][0]
        stop(proc)
        outcomes.append({"id": case["id"], "status": status, "detail": f"worker exit status {proc.returncode}"})
        if pending:
            start()

    for _ in range(workers):
        start()
    while sel.get_map():
        for key, _ in sel.select(timeout=1.0):
            proc = key.data
            line = proc.stdout.readline()
            if line:
                outcomes.append(json.loads(line))
                feed(proc)
            else:
                lost(proc, "crash")
        for proc, (_, since) in list(held.items()):
            if time.monotonic() - since > timeout:
                lost(proc, "timeout")
    return outcomes
