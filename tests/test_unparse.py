"""The printer of generated programs: every tree it prints parses back to the same tree, so an
expression built from parts (a view of a view) keeps its meaning whatever the parts are."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tcc.frontend import ast
from tcc.frontend.parser import parse
from tcc.frontend.unparse import Ex, call, num, reduction, select, unparse, var

ARITHMETIC = ["add", "sub", "mul", "div", "floordiv", "mod", "pow"]
COMPARISONS = ["lt", "le", "gt", "ge", "eq", "ne"]


def parsed(text: str) -> ast.Node:
    module = parse(f"op f(X: f32[4]) -> Y: f32[4] {{\n    Y[i] = {text}\n}}\n")
    return module.ops[0].body[0].value


def canonical(node: ast.Node) -> ast.Node:
    """The tree as the parser builds it: a negative literal is a negation of a positive one."""
    if isinstance(node, ast.Num) and math.copysign(1, node.value) < 0:  # -0.0 too
        return ast.UnaryOp("neg", ast.Num(-node.value, node.is_float))
    if isinstance(node, ast.BinOp):
        return ast.BinOp(node.op, canonical(node.a), canonical(node.b))
    if isinstance(node, ast.UnaryOp):
        return ast.UnaryOp(node.op, canonical(node.a))
    if isinstance(node, ast.CallExpr):
        return ast.CallExpr(node.fn, [canonical(a) for a in node.args])
    if isinstance(node, ast.Access):
        return ast.Access(node.tensor, [canonical(a) for a in node.indices])
    if isinstance(node, ast.ReduceExpr):
        return ast.ReduceExpr(node.op, node.axes, canonical(node.body))
    return node


leaves = st.one_of(st.sampled_from(["i", "j", "k"]).map(var), st.integers(-5, 9).map(num),
                   st.floats(-3, 3, allow_nan=False).map(num))


def extend(children):
    binary = st.tuples(st.sampled_from(ARITHMETIC), children, children).map(
        lambda t: Ex(ast.BinOp(t[0], t[1].node, t[2].node)))
    unary = children.map(lambda e: Ex(ast.UnaryOp("neg", e.node)))
    compare = st.tuples(st.sampled_from(COMPARISONS), children, children).map(
        lambda t: Ex(ast.BinOp(t[0], t[1].node, t[2].node)))
    logic = st.tuples(st.sampled_from(["and", "or"]), compare, compare).map(
        lambda t: Ex(ast.BinOp(t[0], t[1].node, t[2].node)))
    chosen = st.tuples(logic, children, children).map(lambda t: select(t[0].not_(), t[1], t[2]))
    reads = st.lists(children, min_size=1, max_size=2).map(lambda ix: Ex(ast.Access("X", [e.node for e in ix])))
    reduced = children.map(lambda e: reduction("sum", [("r", 3)], e))
    return st.one_of(binary, unary, chosen, reads, reduced, children.map(lambda e: call("exp", e)))


trees = st.recursive(leaves, extend, max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(trees)
def test_printed_trees_parse_back_to_themselves(e: Ex):
    assert parsed(unparse(e.node)) == canonical(e.node)


def test_composed_index_keeps_its_grouping():
    i, j = var("i"), var("j")
    flat = i * 3 + j
    assert str((flat // 4) % 3) == "(i * 3 + j) // 4 % 3"
    assert str(-(i - j) * 2) == "-(i - j) * 2"
    assert str(num(-2) ** 2) == "(-2) ** 2"
    assert str(i - (j - 1)) == "i - (j - 1)"


def test_integer_identities_fold():
    i = var("i")
    assert str(i * 1 + 0) == "i"
    assert str(0 + 1 * i) == "i"
    assert str(num(2) * 3 + 1) == "7"
