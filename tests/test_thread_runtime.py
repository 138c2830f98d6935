"""libgomp's wait policy as tcc loads it: a short spin, unless the user chose one."""

import os

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

