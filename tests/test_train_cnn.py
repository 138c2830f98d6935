"""examples/train_cnn.py: a CNN of tcc ops trains in PyTorch with PyTorch's gradients, and under
DistributedDataParallel (2 processes, gloo) its gradients equal one process's."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "train_cnn.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_loss_falls_and_gradients_match_torch():
    out = _run("--steps", "12")
    assert "gradients vs PyTorch" in out and "loss" in out.splitlines()[-1]


def test_ddp_two_processes_gloo():
    out = _run("--nproc", "2", "--steps", "2")
    assert out.count("DDP step") == 2 and "gradients equal one process's" in out


def _gpus() -> int:
    import torch

    import tcc

    try:
        return torch.cuda.device_count() if torch.cuda.is_available() and tcc.cuda.is_available() else 0
    except tcc.TccError:
        return 0


@pytest.mark.cuda
def test_on_one_gpu():
    if _gpus() < 1:
        pytest.skip("no CUDA GPU")
    _run("--steps", "12", "--device", "cuda")


@pytest.mark.cuda
def test_ddp_two_gpus_nccl():
    if _gpus() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    out = _run("--nproc", "2", "--steps", "3", "--device", "cuda")
    assert out.count("DDP step") == 3
