"""tcc's thread pool (tcc.codegen_cpu.pool), which parallel loops run on: right results at every
team size, a caller that does not wait for workers that never join, calls from several Python
threads at once, a forked child, and workers that sleep when idle. Each in a fresh process, since
the pool is process-wide."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tcc.codegen_cpu import pool

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not pool.available(), reason="no thread pool on this host: loops run serially")

# A parallel kernel (a 1M-element elementwise op, split into a parallel loop) and its check.
PRELUDE = """
import json, os, sys, threading, time
import numpy as np
import tcc
from tcc.codegen_cpu import pool

lib = tcc.compile("op f(A: f32[N], B: f32[N]) -> C: f32[N] { C[i] = A[i] * B[i] + A[i] }")
rng = np.random.default_rng()

def right(n=(1 << 20) + 7):
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    out = np.full(n, np.nan, np.float32)  # poisoned: an element no thread wrote shows
    lib.f(a, b, out=out)
    return bool(np.array_equal(out, a * b + a))
"""


def _run(body: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", PRELUDE + body], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


def test_every_team_size_computes_the_same():
    record = _run("""
ok = {}
for n in (1, 2, 3, 4, 7):
    tcc.set_num_threads(n)
    ok[n] = all(right(size) for size in (1, 7, 33, 1000, (1 << 20) + 7))
print(json.dumps(ok))
""")
    assert all(record.values()), record


def test_the_caller_runs_the_chunks_of_workers_that_never_join():
    """Workers the pool counts but that do not exist (as after a fork, or a worker the OS never
    schedules): the caller runs their chunks itself and returns without waiting for them."""
    record = _run("""
tcc.set_num_threads(2)
right()
cells = pool.pool().cells
real = cells["workers"].value
cells["workers"].value = 6  # five phantom workers beside the real one
tcc.set_num_threads(7)
start = time.perf_counter()
ok = all(right() for _ in range(20))
seconds = time.perf_counter() - start
cells["workers"].value = real
print(json.dumps({"ok": ok, "seconds": seconds}))
""")
    assert record["ok"]


def test_calls_from_several_python_threads_at_once():
    record = _run("""
tcc.set_num_threads(2)
results = []
def work():
    results.append(all(right(size) for size in (33, 1000, (1 << 20) + 7) for _ in range(5)))
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"ok": results}))
""")
    assert record["ok"] == [True] * 4


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_computes_on_workers_of_its_own():
    record = _run("""
tcc.set_num_threads(3)
right()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    ok = right() and right()
    os.write(write, json.dumps({"ok": ok, "workers": pool.pool().cells["workers"].value}).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(read, 1000).decode())
""")
    assert record == {"ok": True, "workers": 2}


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread states from /proc")
def test_idle_workers_sleep():
    """After a call the workers spin for tens of microseconds, then sleep (state S), so that they
    hold no core another process needs."""
    record = _run("""
tcc.set_num_threads(3)
right()
time.sleep(0.5)
me = threading.get_native_id()
states = [open(f"/proc/self/task/{t}/stat").read().rsplit(")", 1)[1].split()[0]
          for t in os.listdir("/proc/self/task") if int(t) != me]
print(json.dumps({"states": states}))
""")
    assert set(record["states"]) <= {"S"}, record


def test_a_worker_preempted_in_its_chunk_makes_later_calls_serial_for_a_while():
    """A worker that joins a loop and then stalls (here it sleeps 50 ms in its share, as when
    another process holds its core) makes the caller wait; the call after it runs on the caller
    alone (a team of 1) until the back-off ends, then the workers are asked again. (Up to five
    tries: on a loaded machine the second call may itself start after the first back-off, 1 ms.)"""
    record = _run("""
import ctypes
run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
    pool.pool().engine.get_function_address(pool.SYMBOL))
caller, teams, joined, stall = threading.get_native_id(), [], [], [False]

def body(ctx, team):
    if threading.get_native_id() == caller:
        teams.append(team)
        deadline = time.perf_counter() + 2.0
        while stall[0] and team > 1 and not joined and time.perf_counter() < deadline:  # the worker is in
            time.sleep(0)
    elif stall[0]:
        joined.append(1)
        time.sleep(0.05)

callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(body)
tcc.set_num_threads(2)
tries = []
for _ in range(5):
    teams.clear(), joined.clear()
    stall[0] = True
    run(callback, None, 0)  # the worker joins and stalls: the caller waits 50 ms
    run(callback, None, 0)  # within the back-off: serial
    stall[0] = False
    tries.append(list(teams))
    time.sleep(0.2)  # past the longest back-off
    if teams == [2, 1]:
        break
teams.clear()
run(callback, None, 0)
print(json.dumps({"backed_off": tries[-1], "after": teams, "right": right()}))
""")
    assert record == {"backed_off": [2, 1], "after": [2], "right": True}
