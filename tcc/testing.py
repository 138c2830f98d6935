"""Helpers to check ops against the reference interpreter (used by the tests and ``tcc run``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tcc import reference
from tcc.dtypes import DType, round_fp8
from tcc.ir.expr import Binary, Call, Cast, Const, Read, Reduce, Select, Unary, Var, walk
from tcc.ir.te import OpTE
from tcc.passes.te.specialize import specialize
from tcc.stack import deep

TOLERANCE = {"f16": 2e-2, "bf16": 5e-2, "f32": 2e-4, "f64": 1e-10, "f8e4m3": 0.25, "f8e5m2": 0.5}
UNIT_ROUNDOFF = {"f16": 2.0**-11, "bf16": 2.0**-8, "f32": 2.0**-24, "f64": 2.0**-53, "f8e4m3": 2.0**-4,
                 "f8e5m2": 2.0**-3}


TF32_ROUNDOFF = 2.0**-11  # an f32 operand rounded to TF32's 10 mantissa bits


def tolerance(op: OpTE, result: str, tf32: bool = False) -> float:
    """The error bound of ``result`` relative to its largest magnitude, from the op itself: a few
    roundings of the least precise type the op stores in, plus the rounding of the least precise
    float type it computes in, growing with the square root of its longest chain of reductions
    or of ``+=`` additions into one position (the reference computes in f64). A specialised op
    gives concrete reduction lengths; otherwise 1000 is assumed. ``tf32``: f32 contractions ran on
    TF32 tensor cores, whose rounding of both factors of every product adds a few TF32 roundings of
    the result's scale (independent errors grow with the square root of the sum's length, as its
    magnitude does)."""
    needed = {result}
    for c in reversed(op.computes):  # the statements the result depends on
        if c.tensor in needed:
            for n in walk(c.body):
                name = n.tensor if isinstance(n, Read) else None
                while name is not None:  # through pad views to what they pad
                    needed.add(name)
                    name = op.pads[name].source if name in op.pads else None
    computes = [c for c in op.computes if c.tensor in needed]
    stored = {op.tensors[c.tensor].dtype.name for c in computes}  # each store rounds once
    dtypes_used: set[str] = set()
    length = 1
    for c in computes:
        for n in walk(c.body):  # so does every operation (reads and literals are exact)
            if isinstance(n, Binary | Unary | Call | Cast | Select):
                dtypes_used.add(n.dtype.name)
        chain = _hits(c)
        if c.accumulate:  # every add rounds to the tensor's dtype
            dtypes_used.add(op.tensors[c.tensor].dtype.name)
        for n in walk(c.body):
            if isinstance(n, Reduce):  # its accumulator; its result rounds once
                dtypes_used.add(n.acc_dtype.name)
                stored.add(n.dtype.name)
                for ax in n.axes:
                    chain *= int(ax.extent.value) if isinstance(ax.extent, Const) else 1000
        length = max(length, chain)
    work = max((UNIT_ROUNDOFF[d] for d in dtypes_used if d in UNIT_ROUNDOFF), default=0.0)
    store = max((UNIT_ROUNDOFF[d] for d in stored if d in UNIT_ROUNDOFF), default=0.0)
    bound = 4 * store + 16 * work * math.sqrt(length)
    return bound + 8 * TF32_ROUNDOFF if tf32 and "f32" in dtypes_used else bound


def _hits(c) -> int:
    """How many values an accumulation (``+=``) may add into one position: its points over the
    axes that are not a left-hand index of their own (1 for other statements; 1000 per axis of
    unknown extent)."""
    if not c.accumulate:
        return 1
    own = {i.name for i in c.lhs if isinstance(i, Var)}
    extents = [ax.extent for ax in c.axes if ax.var.name not in own]
    return math.prod(int(e.value) if isinstance(e, Const) else 1000 for e in extents)


def random_array(shape: tuple[int, ...], dtype: DType, rng: np.random.Generator) -> np.ndarray:
    """Fresh random data of a dtype: normal floats, small signed ints, random bools (bf16 and 8-bit
    float values as float32 arrays, rounded to the type: pass them to CUDA as torch tensors)."""
    if dtype.is_fp8:
        return round_fp8(rng.standard_normal(shape), dtype).astype(np.float32)
    if dtype.is_float:
        return rng.standard_normal(shape).astype(dtype.numpy if dtype.name != "bf16" else np.float32)
    if dtype.is_int:
        return rng.integers(-9, 10, size=shape).astype(dtype.numpy)
    return rng.random(shape) < 0.5


def random_args(op: OpTE, bindings: dict[str, int | float], rng: np.random.Generator,
                scalars: dict[str, Any] | None = None) -> list[Any]:
    """Positional arguments for ``op`` at the given symbol and parameter values."""
    te = specialize_inputs(op, bindings)
    args: list[Any] = []
    for name in op.params:
        if name in op.scalars:
            given = (scalars or {}).get(name)
            dtype = op.scalars[name].dtype
            args.append(given if given is not None else _random_scalar(dtype, rng))
        else:
            args.append(random_array(te[name], op.tensors[name].dtype, rng))
    return args


def specialize_inputs(op: OpTE, bindings: dict[str, int | float]) -> dict[str, tuple[int, ...]]:
    """Concrete shapes of the inputs for these bindings."""
    spec = specialize(op, bindings)
    return {name: spec.tensors[name].concrete_shape() for name in op.inputs}


def _random_scalar(dtype: DType, rng: np.random.Generator) -> Any:
    if dtype.is_float:
        return float(rng.standard_normal())
    if dtype.is_int:
        return int(rng.integers(-9, 10))
    return bool(rng.random() < 0.5)


def reference_results(op: OpTE, args: list[Any], bindings: dict[str, int | float]) -> list[np.ndarray]:
    spec = deep(specialize, op, bindings)
    named = dict(zip(op.params, args))
    results = reference.run(spec, named)
    return [results[r] for r in op.results]


def max_relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.size == 0:
        return 0.0
    same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))  # infinities of one sign match
    finite = np.abs(expected[np.isfinite(expected)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(actual - expected))
    return float(np.max(diff) / scale) if not np.isnan(diff).any() else float("inf")


def assert_matches(actual: np.ndarray, expected: np.ndarray, dtype: DType, what: str = "result") -> None:
    """Equal shapes and values within the dtype's tolerance (exact for ints and bools)."""
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if not dtype.is_float:
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    err = max_relative_error(actual, expected)
    assert err <= TOLERANCE[dtype.name], f"{what}: max relative error {err:.3g} > {TOLERANCE[dtype.name]}"
