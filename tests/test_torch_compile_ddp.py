"""examples/torch_compile_ddp.py: ``torch.compile(backend="tcc")`` under DistributedDataParallel
(2 CPU processes, gloo). Dynamo's DDP optimizer cuts the model at the bucket boundaries (two
pieces: four graphs for tcc), and after the all-reduce each process's gradients equal one eager
process's on the whole batch (the example exits non-zero otherwise)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent


def test_ddp_two_processes_match_one_eager_process():
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "torch_compile_ddp.py"), "--steps", "2"],
                          cwd=ROOT / "examples", capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    steps = re.findall(r"DDP step \d: (\d+) graph\(s\) compiled by tcc; .* error (\S+)", done.stdout)
    assert len(steps) == 2 and int(steps[0][0]) == 4, done.stdout  # two bucket pieces, forward and backward each
    assert all(float(err) < 1e-4 for _, err in steps)
    assert "gradients equal one process's" in done.stdout
