"""``tcc.set_num_threads``: the team a parallel loop runs on, observed as the process's OS threads
(tcc's pool starts ``n - 1`` workers for a team of ``n``), in a fresh process per test so that
the pool starts with the environment given."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tcc
from tcc.errors import TccArgumentError

ROOT = Path(__file__).resolve().parent.parent

# Prints one JSON record: the process's threads after a call at each requested team size (growing:
# the pool keeps the workers it started), and whether every result was right. A 4M-element add is
# split into a parallel loop on the CPU.
SCRIPT = """
import json, os, sys, threading
import numpy as np
import tcc

lib = tcc.compile("op add(A: f32[N], B: f32[N]) -> C: f32[N] { C[i] = A[i] + B[i] }")
a = np.ones(1 << 22, np.float32)
record = {"default": tcc.get_num_threads(), "threads": [], "ok": True}
for n in json.loads(sys.argv[1]):
    tcc.set_num_threads(n)
    record["get"] = tcc.get_num_threads()
    record["ok"] &= bool((lib.add(a, a) == 2).all())
    record["threads"].append(len(os.listdir("/proc/self/task")))

def in_another_thread():  # the count is process-wide: a Python thread calling sees it too
    lib.add(a, a)
    record["other"] = len(os.listdir("/proc/self/task")) - 1  # less the Python thread itself

tcc.set_num_threads(3)
worker = threading.Thread(target=in_another_thread)
worker.start()
worker.join()
print(json.dumps(record))
"""


def _run(counts: list[int], **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), environ.get("PYTHONPATH", "")])
    environ.update(env)
    run = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(counts)], env=environ, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


needs_proc = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through /proc")


@needs_proc
def test_the_team_follows_set_num_threads():
    record = _run([1, 3, 5], OMP_NUM_THREADS="1")  # a default team of 1: no workers at first
    assert record["ok"] and record["get"] == 5
    one, three, five = record["threads"]
    assert (three - one, five - one) == (2, 4)  # workers that joined the calling thread
    assert record["other"] == five  # another Python thread's call runs on the same workers


@needs_proc
def test_omp_num_threads_is_the_default():
    record = _run([1], OMP_NUM_THREADS="3")
    assert record["default"] == 3


def test_bad_counts_are_refused():
    for bad in (0, -1, 2.5, "4", 10**6):
        with pytest.raises(TccArgumentError):
            tcc.set_num_threads(bad)
    tcc.set_num_threads(None)
    assert tcc.get_num_threads() >= 1
