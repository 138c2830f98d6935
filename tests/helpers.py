"""Shared test helpers: run an op from source on random data and compare with the reference."""

from __future__ import annotations

import os

import numpy as np

import tcc
from tcc.testing import assert_matches, random_args, reference_results

# The host model every test schedules for (see conftest.py): CI's 2 cores, default cache sizes.
TWO_CORE_CACHES = {1: 32 << 10, 2: 1 << 20, 3: 8 << 20}
# The same for a Python subprocess a test starts: prepend it to the script.
TWO_CORE_HOST = ("from tcc import target as _t\n_t.host_cores = lambda: 2\n"
                 f"_t.host_caches = lambda: {TWO_CORE_CACHES!r}\n")


def child_pythonpath(*first: object) -> str:
    """PYTHONPATH for a child Python: these folders first, then the parent's own (packages installed
    with ``--target`` on the GPU machine live there)."""
    return os.pathsep.join([*(str(f) for f in first), *filter(None, [os.environ.get("PYTHONPATH")])])


def check_op(source: str, name: str, bindings: dict, rng: np.random.Generator, target: str = "cpu",
             scalars: dict | None = None, args: list | None = None):
    """Compile, run on random inputs with poisoned outputs, compare every result; returns them."""
    lib = tcc.compile(source, target=target)
    op = lib[name]
    full = {**op.te.cparams, **bindings}
    cparams = {k: v for k, v in bindings.items() if k in op.te.cparams}
    args = args if args is not None else random_args(op.te, full, rng, scalars)
    expected = reference_results(op.te, args, full)
    outs = tuple(np.full(e.shape, np.nan if e.dtype.kind == "f" else 99, e.dtype) for e in expected)
    got = op(*args, out=outs[0] if len(outs) == 1 else outs, **cparams)
    got = got if isinstance(got, tuple) else (got,)
    for r, g, e in zip(op.te.results, got, expected):
        assert_matches(g, e, op.te.tensors[r].dtype, f"{name}.{r}")
    return got
