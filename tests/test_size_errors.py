"""Sizes that cannot be: a dim beyond 64 bits is a shape error at its source (never a size that
wrapped around to an empty array), and memory that cannot be had is a TccRuntimeError (never a
MemoryError traceback)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tcc
from tcc.cli import main
from tcc.errors import TccRuntimeError, TccShapeError

ROOT = Path(__file__).resolve().parent.parent
REPEAT = """
op rep[R = 1](X: f32[N]) -> Y: f32[N * R] { Y[i] = X[i // R] }
op back[R = 1](X: f32[N]) -> Y: f32[N * R // R] { Y[i] = X[i] }
op pair[R = 1](X: f32[N], Z: f32[N * R]) -> Y: f32[N] { Y[i] = X[i] + Z[i] }
"""


@pytest.mark.parametrize("r", [2**62, 2**61, 2**63 - 1])
def test_a_result_dim_beyond_64_bits(r):
    """4 * 2**62 is 0 in 64 bits and 4 * 2**61 negative: both are the true size's overflow."""
    with pytest.raises(TccShapeError, match="overflows 64-bit integers") as err:
        tcc.compile(REPEAT).rep(np.ones(4, np.float32), R=r)
    assert err.value.span.line == 2 and "use smaller sizes or parameters" in err.value.hint
    assert f"= {4 * r}" in str(err.value)


def test_a_step_beyond_64_bits_is_one_too():
    """``N * R // R`` is N in exact arithmetic, but the generated code's 64-bit step overflows."""
    with pytest.raises(TccShapeError, match=r"4 \* 4611686018427387904 = 18446744073709551616"):
        tcc.compile(REPEAT).back(np.ones(4, np.float32), R=2**62)


def test_an_argument_dim_beyond_64_bits():
    with pytest.raises(TccShapeError, match="argument Z of pair: dim 0 overflows"):
        tcc.compile(REPEAT).pair(np.ones(4, np.float32), np.ones(0, np.float32), R=2**62)


def test_lower_and_the_command_line_refuse_it(tmp_path, capsys):
    lib = tcc.compile(REPEAT)
    with pytest.raises(TccShapeError):
        lib.rep.lower(np.ones(4, np.float32), R=2**62, stage="loops")
    path = tmp_path / "rep.tc"
    path.write_text(REPEAT)
    assert main(["run", str(path), "--op", "rep", "-D", "N=4", "-D", f"R={2**62}"]) == 1
    assert "overflows 64-bit integers" in capsys.readouterr().err


def test_sizes_that_fit_still_run():
    assert tcc.compile(REPEAT).rep(np.arange(2, dtype=np.float32), R=3).tolist() == [0, 0, 0, 1, 1, 1]


# Under an address-space limit a little above what the process holds: a result, a strided input's
# contiguous copy and a constant parameter's packed panels each cannot be allocated. One thread:
# no worker's stack to reserve under the limit.
SCRIPT = """
import json, resource
import numpy as np
import tcc

tcc.set_num_threads(1)
rep = tcc.compile("op rep[R = 1](X: f32[N]) -> Y: f32[N * R] { Y[i] = X[i // R] }")
neg = tcc.compile("op neg(X: f32[M, N]) -> Y: f32[M, N] { Y[i, j] = -X[i, j] }")
mm = tcc.compile("examples/matmul.tc", constant_params=["B"])
x = np.ones(4, np.float32)
rep.rep(x, R=2)
strided = np.ones((4096, 8192), np.float32)[:, ::2]
neg.neg(strided)
A, B = np.ones((8, 2048), np.float32), np.ones((2048, 4096), np.float32)
mm.matmul(A, B)
B2 = B.copy()  # a new constant: packed again
with open("/proc/self/status") as f:
    size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (size + (8 << 20),) * 2)
errors = []
for call in (lambda: rep.rep(x, R=1 << 28), lambda: rep.rep(x, R=1 << 28), lambda: neg.neg(strided),
             lambda: mm.matmul(A, B2)):
    try:
        call()
        errors.append(None)
    except tcc.TccError as exc:
        errors.append([type(exc).__name__, exc.message, exc.hint])
print(json.dumps(errors))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists() or sys.platform != "linux", reason="Linux limits")
def test_memory_that_cannot_be_had_is_a_tcc_error():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    result, again, copy, prepare = json.loads(run.stdout.splitlines()[-1])
    assert result == again and result[0] == TccRuntimeError.__name__ and "cannot allocate result Y" in result[1]
    assert copy[0] == TccRuntimeError.__name__ and "strided argument X" in copy[1] and "contiguous" in copy[2]
    assert prepare[0] == TccRuntimeError.__name__ and "constant parameters B" in prepare[1]
