"""Every example of DSL.md runs on the CPU and matches the reference, at odd and round sizes."""

from pathlib import Path

import numpy as np
import pytest

import tcc
from tcc.testing import assert_matches, random_args, reference_results

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# op -> list of (symbol bindings, compile-time parameters)
CASES = {
    "matmul": [dict(M=1, K=1, N=1), dict(M=7, K=33, N=5), dict(M=64, K=32, N=48)],
    "axpy": [dict(N=1), dict(N=1000), dict(N=33)],
    "bias_relu": [dict(N=7, C=33), dict(N=1, C=1)],
    "softmax": [dict(N=7, C=33), dict(N=1, C=1), dict(N=4, C=1000)],
    "conv2d": [dict(N=1, C=3, H=7, W=9, F=4, KH=3, KW=3), dict(N=2, C=2, H=8, W=8, F=3, KH=1, KW=1),
               dict(N=1, C=3, H=9, W=7, F=2, KH=3, KW=2, S=2, P=1),
               dict(N=2, C=1, H=11, W=10, F=2, KH=3, KW=3, S=1, P=2, D=2)],
    "conv2d_relu": [dict(N=1, C=3, H=7, W=9, F=4, KH=3, KW=3), dict(N=2, C=2, H=8, W=6, F=3, KH=3, KW=3, S=2)],
    "layernorm": [dict(N=7, D=33), dict(N=1, D=1), dict(N=3, D=1000)],
    "maxpool2d": [dict(N=1, C=3, H=7, W=9), dict(N=2, C=2, H=8, W=8, K=3, S=1)],
    "hmm": [dict(M=7, K=33, N=5), dict(M=1, K=1, N=1)],
}


def _case_ids():
    for name, cases in CASES.items():
        for i, case in enumerate(cases):
            yield pytest.param(name, case, id=f"{name}-{i}")


@pytest.mark.parametrize("name,case", list(_case_ids()))
def test_example_matches_reference(name, case, rng):
    lib = tcc.compile(EXAMPLES / f"{name}.tc")
    op = lib[name]
    cparams = {k: v for k, v in case.items() if k in op.te.cparams}
    bindings = {**{k: v for k, v in op.te.cparams.items()}, **case}
    args = random_args(op.te, bindings, rng)
    expected = reference_results(op.te, args, bindings)
    # poisoned outputs show any element the kernel does not write
    outs = [np.full(e.shape, np.nan if e.dtype.kind == "f" else -77, e.dtype) for e in expected]
    got = op(*args, out=outs[0] if len(outs) == 1 else tuple(outs), **cparams)
    got = got if isinstance(got, tuple) else (got,)
    for r, g, e in zip(op.te.results, got, expected):
        assert_matches(g, e, op.te.tensors[r].dtype, f"{name}.{r}")
    fresh = op(*args, **cparams)
    fresh = fresh if isinstance(fresh, tuple) else (fresh,)
    for r, g, e in zip(op.te.results, fresh, expected):
        assert_matches(g, e, op.te.tensors[r].dtype, f"{name}.{r} (new array)")
