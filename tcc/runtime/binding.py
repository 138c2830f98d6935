"""Bind a call's arguments to an op: check them, bind shape symbols, prepare the results.

Every check runs before anything is written, so a bad call changes nothing. Errors point at
the parameter in the op's source and say what to do.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from tcc import dtypes
from tcc.errors import TccArgumentError, TccShapeError
from tcc.ir.expr import Binary, Const, Unary, Var, substitute
from tcc.ir.te import OpTE
from tcc.passes.simplify import evaluate_int


@dataclass
class BoundCall:
    """A checked call: symbol/parameter values, arrays by name, scalars by name."""

    bindings: dict[str, int | float]
    arrays: dict[str, Any]
    scalars: dict[str, int | float | bool]
    result_shapes: dict[str, tuple[int, ...]]
    args: tuple[Any, ...] = ()  # the call's own arguments (constant parameters are known by identity)


def as_host_array(value: Any, what: str) -> np.ndarray:
    """A NumPy view of an array-like: ndarray, ``__array__``, or DLPack (CPU) objects."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__") and not hasattr(value, "__array__"):
        try:
            return np.from_dlpack(value)
        except (TypeError, RuntimeError, BufferError) as exc:
            raise TccArgumentError(f"{what}: cannot read it through DLPack ({exc})",
                                   hint="pass a NumPy array or a CPU tensor") from None
    try:
        return np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - any conversion failure is the caller's input
        raise TccArgumentError(f"{what}: not an array ({type(value).__name__}: {exc})") from None


def bind_cparams(op: OpTE, kwargs: dict[str, Any]) -> dict[str, int | float]:
    values: dict[str, int | float] = {}
    for name, value in kwargs.items():
        if name not in op.cparams:
            known = ", ".join(op.cparams) or "none"
            raise TccArgumentError(f"{op.name} has no compile-time parameter {name!r} (it has: {known})",
                                   op.span)
        default = op.cparams[name]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TccArgumentError(f"{op.name}: {name} must be a number, got {value!r}", op.span)
        if isinstance(default, int) and not _is_integer(value):
            raise TccArgumentError(f"{op.name}: {name} must be an integer, got {value!r}", op.span)
        if isinstance(default, int) and not -2**63 <= int(value) < 2**63:
            raise TccArgumentError(f"{op.name}: {name} = {value} does not fit a 64-bit integer", op.span)
        values[name] = int(value) if isinstance(default, int) else float(value)
    return {name: values.get(name, default) for name, default in op.cparams.items()}


def _is_integer(value: Any) -> bool:
    if isinstance(value, (int, np.integer)):
        return True
    return bool(np.isfinite(value)) and float(value).is_integer()


def bind(op: OpTE, args: tuple[Any, ...], kwargs: dict[str, Any], arrays: dict[str, Any],
         solved: dict[tuple, tuple[dict, dict]] | None = None) -> BoundCall:
    """Check ``args`` (already converted to arrays in ``arrays`` for tensor params).

    ``solved`` memoises, per op, the symbol values and result shapes of input shapes and
    parameters seen before (a pure function of them): a repeat call re-checks dtypes and
    scalars but does not solve the shape expressions again.
    """
    scalars: dict[str, int | float | bool] = {}
    for name, value in zip(op.params, args):
        if name in op.scalars:
            scalars[name] = _scalar(op, name, value)
        else:
            _check_dtype(op, name, arrays[name])
    shapes = {name: tuple(int(n) for n in arr.shape) for name, arr in arrays.items()}
    values = bind_cparams(op, kwargs)
    key = (tuple(shapes.values()), tuple(values.values()))
    known = solved.get(key) if solved is not None else None
    if known is None:
        bindings = bind_shapes(op, shapes, values)
        known = (bindings, result_shapes(op, bindings))
        check_sizes(op, bindings)
        if solved is not None:
            if len(solved) >= 256:
                solved.clear()
            solved[key] = known
    bindings, outs = known
    return BoundCall(dict(bindings), arrays, scalars, outs, tuple(args))


def bind_shapes(op: OpTE, shapes: dict[str, tuple[int, ...]], values: dict[str, int | float]
                ) -> dict[str, int | float]:
    """Bind shape symbols from input shapes; ``values`` holds parameters (and symbols) given already."""
    bindings = dict(values)
    where: dict[str, tuple[str, int]] = {}
    for name in op.inputs:
        if name not in shapes:
            continue
        tensor, shape = op.tensors[name], shapes[name]
        if len(shape) != len(tensor.shape):
            raise TccArgumentError(f"argument {name} of {op.name} must have rank {len(tensor.shape)}, got "
                                   f"shape {tuple(shape)}", tensor.span)
        for dim, (expr, size) in enumerate(zip(tensor.shape, shape)):
            _bind_dim(op, name, dim, expr, size, bindings, where)
    return bindings


def result_shapes(op: OpTE, bindings: dict[str, int | float]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for r in op.results:
        dims = []
        for dim, expr in enumerate(op.tensors[r].shape):
            value = dim_value(op, r, dim, expr, bindings)
            if value is None or value < 0:
                raise TccShapeError(f"result {r} of {op.name} would have dim {dim} = {value} for "
                                    f"{_fmt(bindings)}", op.tensors[r].span,
                                    "the inputs are too small for these parameters")
            dims.append(value)
        shapes[r] = tuple(dims)
    return shapes


I64_RANGE = range(-(1 << 63), 1 << 63)  # what the generated code's sizes and offsets hold


class _Overflow(Exception):
    """A step of a shape expression whose value does not fit 64 bits."""

    def __init__(self, step: str, value: int):
        super().__init__(step)
        self.step, self.value = step, value


_EXACT = {"add": (lambda a, b: a + b, "+"), "sub": (lambda a, b: a - b, "-"), "mul": (lambda a, b: a * b, "*"),
          "floordiv": (lambda a, b: a // b, "//"), "mod": (lambda a, b: a % b, "%"),
          "max": (max, "max"), "min": (min, "min")}


def dim_value(op: OpTE, name: str, dim: int, expr, bindings: dict[str, int | float]) -> int | None:
    """A tensor dim's value for ``bindings``, in Python's unbounded integers: the generated code
    computes sizes in 64 bits, so a dim (or a step of its expression) beyond them is a shape
    error here, not a size that wrapped around (``N * R`` with ``R = 2**62`` is 0 in 64 bits).
    None where the expression is not an integer of the bindings."""
    try:
        return _exact(expr, bindings)
    except _Overflow as exc:
        tensor = op.tensors[name]
        what = {"input": "argument", "result": "result"}.get(tensor.kind, "intermediate")
        raise TccShapeError(f"{what} {name} of {op.name}: dim {dim} overflows 64-bit integers "
                            f"({exc.step} = {exc.value}) "
                            f"for {_fmt(bindings)}", tensor.span,
                            "use smaller sizes or parameters: a tensor's dims, and every step of computing "
                            "them, must fit in a signed 64-bit integer") from None


def _exact(e, bindings: dict[str, int | float]) -> int | None:
    if isinstance(e, Const):
        return e.value if isinstance(e.value, int) and not isinstance(e.value, bool) else None
    if isinstance(e, Var):
        value = bindings.get(e.name)
        return value if isinstance(value, int) else None
    if isinstance(e, Unary) and e.op == "neg":
        a = _exact(e.a, bindings)
        return None if a is None else _fits(-a, f"-{a}")
    if isinstance(e, Binary) and e.op in _EXACT:
        a, b = _exact(e.a, bindings), _exact(e.b, bindings)
        if a is None or b is None or (e.op in ("floordiv", "mod") and b == 0):
            return None
        fn, sign = _EXACT[e.op]
        return _fits(fn(a, b), f"{sign}({a}, {b})" if sign.isalpha() else f"{a} {sign} {b}")
    return evaluate_int(substitute(e, _consts(bindings)))


def _fits(value: int, step: str) -> int:
    if value not in I64_RANGE:
        raise _Overflow(step, value)
    return value


INDEX_LIMIT = 1 << 62  # bytes: element offsets are 64-bit integers in the generated code


def check_sizes(op: OpTE, bindings: dict[str, int | float]) -> None:
    """Refuse, before any work, shapes whose tensors cannot exist: results (and inputs, for
    ``tcc run``'s random data) larger than the machine's memory, and any tensor, intermediates
    included, too large for 64-bit offsets."""
    memory = physical_memory()
    for name, tensor in op.tensors.items():
        if tensor.kind == "pad":
            continue
        dims = [dim_value(op, name, dim, d, bindings) for dim, d in enumerate(tensor.shape)]
        if any(d is None or d < 0 for d in dims):
            continue  # reported with its location by the shape checks
        nbytes = math.prod(dims) * tensor.dtype.itemsize
        what = {"input": "input", "result": "result"}.get(tensor.kind, "intermediate")
        if nbytes >= INDEX_LIMIT or (memory and tensor.kind != "temp" and nbytes > memory):
            limit = f"this machine has {_bytes(memory)} of memory" if memory and nbytes < INDEX_LIMIT else \
                "more than 64-bit offsets can address"
            raise TccShapeError(f"{what} {name} of {op.name} would be {tensor.dtype}{dims}: {_bytes(nbytes)}, "
                                f"{limit}", tensor.span, f"use smaller sizes ({_fmt(bindings)})")


@functools.cache
def physical_memory() -> int | None:
    """Bytes of RAM, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _consts(bindings: dict[str, int | float]) -> dict[str, Const]:
    return {k: Const(v, dtypes.f64 if isinstance(v, float) else dtypes.i64) for k, v in bindings.items()}


def _fmt(bindings: dict[str, int | float]) -> str:
    return ", ".join(f"{k}={v}" for k, v in bindings.items())


def _bind_dim(op: OpTE, name: str, dim: int, expr, size: int, bindings: dict, where: dict) -> None:
    if isinstance(expr, Var) and expr.name in op.symbols and expr.name not in bindings:
        bindings[expr.name] = size
        where[expr.name] = (name, dim)
        return
    expected = dim_value(op, name, dim, expr, bindings)
    if expected == size:
        return
    if isinstance(expr, Var) and expr.name in where:
        other, other_dim = where[expr.name]
        raise TccShapeError(
            f"symbol {expr.name} is {bindings[expr.name]} from {other} (dim {other_dim}) but {size} "
            f"from {name} (dim {dim})", op.tensors[name].span,
            f"{other} and {name} must agree on {expr.name}")
    raise TccShapeError(f"dim {dim} of argument {name} must be {expected}, got {size}", op.tensors[name].span)


def _check_dtype(op: OpTE, name: str, arr: np.ndarray) -> None:
    want = op.tensors[name].dtype
    got = getattr(arr, "tcc_dtype", None) or dtypes.from_numpy(arr.dtype)  # device views carry a tcc dtype
    if got != want:
        hint = f"convert it: {name}.astype(np.{want.numpy.name})" if want.has_numpy else \
            f"{want} has no NumPy type: pass a CUDA torch tensor of it (or a tcc.cuda.Array), target='cuda'"
        raise TccArgumentError(f"argument {name} of {op.name} must be {want}, got {arr.dtype}",
                               op.tensors[name].span, hint)


def _scalar(op: OpTE, name: str, value: Any) -> int | float | bool:
    dtype = op.scalars[name].dtype
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, np.generic):
        value = value.item()
    ok = isinstance(value, (bool, int, float))
    if dtype.is_bool:
        ok = isinstance(value, bool)
    elif dtype.is_int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        info = np.iinfo(dtype.numpy)
        if ok and not info.min <= value <= info.max:
            raise TccArgumentError(f"argument {name} of {op.name} is {value}, out of range for {dtype} "
                                   f"({info.min} to {info.max})", op.span)
    elif ok:
        try:
            value = float(value)
        except OverflowError:
            raise TccArgumentError(f"argument {name} of {op.name} is too large for {dtype}", op.span) from None
    if not ok:
        raise TccArgumentError(f"argument {name} of {op.name} must be a {dtype} scalar, got {value!r}",
                               op.span)
    if dtype.is_int and not np.iinfo(dtype.numpy).min <= value <= np.iinfo(dtype.numpy).max:
        raise TccArgumentError(f"argument {name} of {op.name} is {value}, out of the range of {dtype}", op.span)
    return value


def out_list(op: OpTE, out: Any) -> list[Any]:
    """``out=`` as one entry per result (None where the call allocates), its count checked."""
    if out is None:
        return [None] * len(op.results)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(outs) != len(op.results):
        raise TccArgumentError(f"{op.name} has {len(op.results)} result(s); out= gave {len(outs)}", op.span)
    for i, a in enumerate(outs):
        for j in range(i):
            b = outs[j]
            if a is not None and (a is b or (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                                             and np.may_share_memory(a, b))):
                raise TccArgumentError(f"out= arrays for {op.results[j]} and {op.results[i]} of {op.name} overlap",
                                       op.span, "give each result its own array")
    return outs
