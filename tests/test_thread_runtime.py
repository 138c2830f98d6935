"""libgomp's wait policy as tcc loads it: a short spin, unless the user chose one."""

import os
import subprocess
import sys

import pytest

from tcc.codegen_cpu import jit


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    return monkeypatch


def test_spin_count_is_set_only_while_libgomp_loads(clean_env):
    with jit._short_spin():
        assert os.environ["GOMP_SPINCOUNT"] == str(jit.SPIN_COUNT)
    assert "GOMP_SPINCOUNT" not in os.environ


@pytest.mark.parametrize("name, value", [("OMP_WAIT_POLICY", "passive"), ("GOMP_SPINCOUNT", "0")])
def test_a_policy_the_user_chose_is_kept(clean_env, name, value):
    clean_env.setenv(name, value)
    with jit._short_spin():
        assert os.environ[name] == value
        assert name == "GOMP_SPINCOUNT" or "GOMP_SPINCOUNT" not in os.environ
    assert os.environ[name] == value



@pytest.mark.parametrize("user, shown", [(None, str(jit.SPIN_COUNT)), ("777", "777")])
def test_libgomp_loads_with_it(user, shown):
    """libgomp itself reports the spin count it read (``OMP_DISPLAY_ENV=verbose``), in a fresh
    process where tcc loads it."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["OMP_DISPLAY_ENV"] = "verbose"
    if user is not None:
        env["GOMP_SPINCOUNT"] = user
    run = subprocess.run([sys.executable, "-c", "from tcc.codegen_cpu import jit; print(jit.load_thread_runtime())"],
                         env=env, capture_output=True, text=True, timeout=120)
    if run.stdout.strip() == "False":
        pytest.skip("no libgomp on this host: parallel loops run serially")
    assert run.returncode == 0, run.stderr
    assert f"GOMP_SPINCOUNT = '{shown}'" in run.stderr + run.stdout
