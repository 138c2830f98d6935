"""A bounded batch of the differential fuzzer (tests/fuzz) in CI: random valid programs, with
and without random user schedules, each in a worker process, against the reference interpreter;
a batch with every shape symbol dynamic; and a batch of the gradient fuzzer (``tcc.grad``,
first and second order, against finite differences). ``make fuzz N=5000`` and ``make fuzz-grad
N=2000`` run long batches; ``TCC_FUZZ_START`` moves these batches to other seeds."""

import os

import pytest
from fuzz.pool import run_seeds

import tcc

CI_PROGRAMS = 150
CI_GRAD_PROGRAMS = 30
FAILURES = ("mismatch", "internal", "crash", "timeout", "rejected")


def _batch(target: str, count: int, schedules: int) -> list[dict]:
    start = int(os.environ.get("TCC_FUZZ_START", "0"))
    jobs = [{"seed": s, "target": target, "schedules": schedules, "bf16": target == "cuda"}
            for s in range(start, start + count)]
    return list(run_seeds(jobs, workers=2, timeout=300))


def test_fuzz_batch_on_the_cpu(tmp_path):
    outcomes = _batch("cpu", CI_PROGRAMS, schedules=1)
    bad = [f"seed {o['seed']}: {o['status']}: {o['detail']}" for o in outcomes if o["status"] in FAILURES]
    assert len(outcomes) == CI_PROGRAMS
    assert not bad, "\n".join(bad)
    assert sum(o["schedules"] - o["refused"] for o in outcomes) > CI_PROGRAMS // 4  # schedules did run


CI_DYNAMIC_PROGRAMS = 12


def test_fuzz_batch_with_dynamic_shapes_on_the_cpu():
    """Every shape symbol dynamic, each op called at its sizes and at sizes drawn around them
    (one kernel for all): results match the reference, or the dynamic kernel refuses cleanly."""
    start = int(os.environ.get("TCC_FUZZ_START", "0"))
    jobs = [{"seed": s, "target": "cpu", "dynamic": True} for s in range(start, start + CI_DYNAMIC_PROGRAMS)]
    outcomes = list(run_seeds(jobs, workers=2, timeout=300))
    bad = [f"seed {o['seed']}: {o['status']}: {o['detail']}" for o in outcomes if o["status"] in FAILURES]
    assert len(outcomes) == CI_DYNAMIC_PROGRAMS
    assert not bad, "\n".join(bad)
    assert sum(o["schedules"] - o["refused"] for o in outcomes) > CI_DYNAMIC_PROGRAMS // 2  # dynamic ops ran


def test_grad_fuzz_batch():
    start = int(os.environ.get("TCC_FUZZ_START", "0"))
    jobs = [{"seed": s, "grad": True, "orders": 2} for s in range(start, start + CI_GRAD_PROGRAMS)]
    outcomes = list(run_seeds(jobs, workers=2, timeout=300))
    bad = [f"seed {o['seed']}: {o['status']}: {o['detail']}" for o in outcomes
           if o["status"] not in ("ok", "skipped", "singular")]
    assert len(outcomes) == CI_GRAD_PROGRAMS
    assert not bad, "\n".join(bad)
    assert sum(o.get("ops", 0) for o in outcomes) >= CI_GRAD_PROGRAMS // 2  # gradients were checked


@pytest.mark.cuda
@pytest.mark.skipif(not tcc.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_fuzz_batch_on_cuda():
    outcomes = _batch("cuda", CI_PROGRAMS, schedules=0)
    bad = [f"seed {o['seed']}: {o['status']}: {o['detail']}" for o in outcomes if o["status"] in FAILURES]
    assert not bad, "\n".join(bad)
