"""Generators of the elementwise operators beyond arithmetic: logic (And, Or, Xor, Not) and the
comparisons GreaterOrEqual/LessOrEqual, IsNaN and IsInf (every detect_* pair), Mod (fmod 0 and
1), Sign, Reciprocal, Round (with exact halves), the variadic Min, Max and Mean (broadcasting
both ways), and the activations with their alpha, beta and gamma, PRelu among them.

What two correct implementations may compute differently is kept out, each for its reason:
- a discontinuous function (Sign, Round, Mod of floats, ThresholdedRelu, a comparison) reads
  only exact values: a value rounded differently may land on the other side of the jump;
- a divisor is a fresh input or constant (never zero) or ``|b| + 0.5``: a computed integer may be
  0, whose remainder ONNX leaves undefined, and 1/x of a value near 0 magnifies its rounding;
- the infinities and NaNs IsInf and IsNaN read are in an operand made for them alone and read by
  no other node: how min, max or a reduction propagates a NaN differs between libraries;
- onnxruntime has no f64 Mean, no f16 IsInf, no f16 or f64 Celu, no f64 activation before opset
  18 (from 18 on it runs their function bodies) and no Mish before 18.
"""

from __future__ import annotations

import numpy as np

from fuzz.onnx.compute import NUMERIC, away_from_zero, broadcasts, operand
from fuzz.onnx.graph import FLOATS, INTS, Graph, Val, broadcast_shape, broadcastable_to

ACTIVATIONS = ("HardSigmoid", "HardSwish", "Softplus", "Softsign", "Mish", "Elu", "Celu", "Selu",
               "ThresholdedRelu", "PRelu")


def logic(g: Graph) -> bool:
    """And, Or, Xor and Not of bools; GreaterOrEqual and LessOrEqual of exact numbers."""
    if g.rng.random() < 0.5:
        x = g.pick(lambda v: v.dtype == "bool") or g.input("bool", g.random_shape(g.rng.randint(0, 3)))
        if g.rng.random() < 0.25:
            g.node("Not", [x], [("bool", x.shape)])
            return True
        y = operand(g, x)
        g.node(g.rng.choice(("And", "Or", "Xor")), [x, y], [("bool", broadcast_shape(x.shape, y.shape))])
        return True
    x = g.pick(lambda v: v.exact and v.dtype in NUMERIC + ("i8",))
    if x is None:
        return False
    y = operand(g, x, exact=True)
    g.node(g.rng.choice(("GreaterOrEqual", "LessOrEqual")), [x, y], [("bool", broadcast_shape(x.shape, y.shape))])
    return True


def special(g: Graph) -> bool:
    """IsNaN or IsInf (detect_positive, detect_negative) of ``x`` plus a constant holding
    infinities of both signs, NaNs and finite numbers."""
    x = g.pick(lambda v: v.dtype in ("f32", "f64") or v.dtype == "f16" and g.rng.random() < 0.5)
    if x is None:
        return False
    op = "IsNaN" if x.dtype == "f16" else g.rng.choice(("IsNaN", "IsInf", "IsInf"))
    shape = broadcastable_to(g.rng, x.shape)
    table = np.array([np.inf, -np.inf, np.nan, 1.0, -2.0])
    odd = g.const(table[[g.rng.randrange(len(table)) for _ in range(int(np.prod(shape)))]].reshape(shape), x.dtype)
    y = g.hide(g.node("Add", [x, odd], [(x.dtype, broadcast_shape(x.shape, shape))])[0])
    attrs = {}
    if op == "IsInf":
        attrs = {k: g.rng.choice((0, 1)) for k in ("detect_positive", "detect_negative") if g.rng.random() < 0.6}
    g.node(op, [y], [("bool", y.shape)], exact=True, **attrs)
    return True


def mod(g: Graph) -> bool:
    """Mod of integers (fmod 0: the divisor's sign; 1: the dividend's) or of exact floats
    (fmod 1: ONNX has no Python remainder of floats), by a divisor of either sign."""
    x = g.pick(lambda v: v.dtype in INTS or v.dtype in FLOATS and v.exact)
    if x is None:
        return False
    fmod = 1 if x.dtype in FLOATS else g.rng.choice((0, 1))
    shape = broadcastable_to(g.rng, x.shape) if g.rng.random() < 0.7 else x.shape
    b = g.input(x.dtype, shape) if g.rng.random() < 0.5 else g.const(g.random_array(x.dtype, shape), x.dtype)
    attrs = {"fmod": fmod} if fmod or g.rng.random() < 0.5 else {}
    g.node("Mod", [x, b], [(x.dtype, broadcast_shape(x.shape, shape))], **attrs)
    return True


def rounding(g: Graph) -> bool:
    """Sign of an exact number; Reciprocal away from zero; Round of an exact float, often of
    integers times 0.5 (exact halves: ties to even)."""
    op = g.rng.choice(("Sign", "Reciprocal", "Round", "Round"))
    if op == "Sign":
        x = g.pick(lambda v: v.exact and v.dtype in NUMERIC + ("i8",))
    elif op == "Reciprocal":
        x = g.pick(lambda v: v.dtype in FLOATS)
        x = away_from_zero(g, x) if x is not None else None
    else:
        x = _halves(g) if g.rng.random() < 0.5 else g.pick(lambda v: v.exact and v.dtype in FLOATS)
    if x is None:
        return False
    g.node(op, [x], [(x.dtype, x.shape)])
    return True


def _halves(g: Graph) -> Val:
    """Integers (an int value of the graph, else a new input) cast to float and halved: the
    ties Round must break to even, computed exactly."""
    n = g.pick(lambda v: v.dtype in INTS) or g.input("i32", g.random_shape(g.rng.randint(0, 3)))
    to = g.rng.choice(("f32", "f32", "f16", "f64"))
    f = g.node("Cast", [n], [(to, n.shape)], to={"f32": 1, "f16": 10, "f64": 11}[to])[0]
    half = g.const(np.array(0.5), to)
    return g.node("Mul", [f, half], [(to, f.shape)], exact=True)[0]


def variadic(g: Graph) -> bool:
    """Min, Max (numbers) or Mean (f32, f16) of one to four operands broadcast together, the
    first one sometimes the smaller."""
    x = g.pick(lambda v: v.dtype in NUMERIC + ("i8",))
    if x is None:
        return False
    op = g.rng.choice(("Min", "Max", "Mean") if x.dtype in ("f32", "f16") else ("Min", "Max"))
    args = [x]
    for _ in range(g.rng.randint(0, 3)):
        y = operand(g, x)
        args.append(y if all(broadcasts(a.shape, y.shape) for a in args) else x)
    shape = x.shape
    for a in args[1:]:
        shape = broadcast_shape(shape, a.shape)
    if g.rng.random() < 0.3 and len(args) > 1:
        args.reverse()
    g.node(op, args, [(x.dtype, shape)])
    return True


def activation(g: Graph) -> bool:
    """The activations with random alpha, beta and gamma (or their defaults); PRelu with a
    slope that broadcasts to the input."""
    x = g.pick(lambda v: v.dtype in ("f32", "f16") or v.dtype == "f64" and g.opset >= 18)
    if x is None:
        return False
    op = g.rng.choice(ACTIVATIONS)
    if op == "Celu" and x.dtype != "f32" or op == "ThresholdedRelu" and not x.exact or op == "Mish" and g.opset < 18:
        op = "Elu"
    if op == "PRelu":
        shape = broadcastable_to(g.rng, x.shape)
        slope = g.const(g.random_array(x.dtype, shape), x.dtype) if g.rng.random() < 0.7 else g.input(x.dtype, shape)
        g.node(op, [x, slope], [(x.dtype, x.shape)])
        return True
    g.node(op, [x], [(x.dtype, x.shape)], **_attrs(g, op))
    return True


def _attrs(g: Graph, op: str) -> dict[str, float]:
    """Some of the op's attributes, each given half the time (the default otherwise)."""
    names = {"HardSigmoid": ("alpha", "beta"), "Elu": ("alpha",), "Celu": ("alpha",), "Selu": ("alpha", "gamma"),
             "ThresholdedRelu": ("alpha",)}.get(op, ())
    return {n: g.rng.choice((0.1, 0.5, 1.25, 2.0)) for n in names if g.rng.random() < 0.5}
