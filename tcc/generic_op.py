"""Calling an op that is generic over dtypes (``op rmsnorm[T: float](X: T[N, D]) ...``).

Each call reads the dtype of the argument that binds each type parameter, checks the kind admits
it and that every other argument declared with that parameter agrees, then runs the op compiled
for that binding: an ordinary op (``tcc.frontend.generic.bind`` rewrote its source), made on
first use and kept, so each binding has its own kernels and cache entries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tcc import dtypes
from tcc.errors import Source, TccArgumentError, TccTypeError
from tcc.frontend import generic
from tcc.frontend.ast import OpDef
from tcc.frontend.sema import analyze_op
from tcc.ir.te import OpTE


def dtype_name(value: Any) -> str | None:
    """The tcc dtype of an argument: a NumPy, PyTorch or CuPy array, or a Python number."""
    raw = getattr(value, "dtype", None)
    if raw is None:
        raw = np.asarray(value).dtype if isinstance(value, int | float | bool) else None
    if raw is None:
        return None
    name = str(raw).removeprefix("torch.")
    if name == "bfloat16":
        return "bf16"
    try:
        found = dtypes.from_numpy(np.dtype(name))
    except TypeError:
        return None
    return found.name if found is not None else None


class GenericOp:
    """An op with type parameters: call it like any op; ``op.bound(T="f16")`` is one binding."""

    def __init__(self, ast: OpDef, source: Source | None, make_op: Callable[[OpTE, OpDef], Any]):
        self.ast = ast
        self.name = ast.name
        self._source = source
        self._make_op = make_op
        self._ops: dict[tuple[tuple[str, str], ...], Any] = {}
        self._binders = generic.binders(ast)
        self._positions = {p.name: i for i, p in enumerate(ast.params)}
        self.checked = self.bound(**generic.checked_binding(ast))  # its te, docs and target, for introspection
        self.__doc__ = self.checked.__doc__

    def __repr__(self) -> str:
        kinds = ", ".join(f"{t.name}: {t.kind}" for t in generic.type_params(self.ast))
        return f"<tcc generic op {self.name}[{kinds}] on {self.checked.backend.kind}>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("checked", "_ops"):
            raise AttributeError(name)
        return getattr(self.checked, name)  # te, target, ... of the checked binding

    def bound(self, **binding: str) -> Any:
        """The op for one binding of the type parameters, by name (``T="bf16"``)."""
        key = tuple(sorted(binding.items()))
        op = self._ops.get(key)
        if op is None:
            for name, dtype in binding.items():
                generic.admit(self.ast, name, dtype, self.ast.span)
            bound_ast = generic.bind(self.ast, binding)
            op = self._ops[key] = self._make_op(analyze_op(bound_ast, self._source), bound_ast)
        return op

    def binding(self, args: tuple[Any, ...]) -> dict[str, str]:
        """Each type parameter's dtype, read from the argument that binds it."""
        if len(args) != len(self.ast.params):
            raise TccArgumentError(f"{self.name} takes {len(self.ast.params)} argument(s), got {len(args)}",
                                   self.ast.span)
        binding = {}
        for name, binder in self._binders.items():
            dtype = dtype_name(args[self._positions[binder]])
            if dtype is None:
                raise TccTypeError(f"{self.name}: cannot tell the dtype of argument {binder}, which binds {name}",
                                   self.ast.span, "pass an array (NumPy, PyTorch, CuPy)")
            generic.admit(self.ast, name, dtype, self.ast.span)
            binding[name] = dtype
        return binding

    def op_for(self, args: tuple[Any, ...]) -> Any:
        return self.bound(**self.binding(args))

    def __call__(self, *args: Any, out: Any = None, **cparams: Any) -> Any:
        return self.op_for(args)(*args, out=out, **cparams)

    def lower(self, *args: Any, stage: str = "loops", **cparams: Any) -> str:
        return self.op_for(args).lower(*args, stage=stage, **cparams)

    def schedule(self, text: str) -> GenericOp:
        """The same op with this schedule for every binding."""
        return GenericOp(self.ast, self._source, lambda te, a: self._make_op(te, a).schedule(text))
