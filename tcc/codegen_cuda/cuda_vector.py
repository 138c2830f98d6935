"""``vector`` loops of the loop IR, printed as one wide memory access per thread.

A mixin of the CUDA C printer (:mod:`tcc.codegen_cuda.cuda_c`). A ``vector`` loop's body is
``let``s and one store (under at most one guard, the same for every lane) whose flat offset steps
by one element per lane, lane 0 on a multiple of the access (the schedule's promises: the GEMM
epilogues of :mod:`tcc.passes.autoschedule_cuda.staged_stores`). A copy between two buffers of one
format is one wide load and one wide store; otherwise the lanes' values are computed into
registers, then converted and stored together: two 16-bit floats by one ``cvt.rn.f16x2.f32``
(converting a wgmma accumulator on its own made ptxas serialise the kernel's wgmma
instructions, C7514). What is vectorised the schedule decided; the printer only checks that the
loop has the promised form.
"""

from __future__ import annotations

from dataclasses import dataclass

from tcc import dtypes
from tcc.codegen_cuda.cuda_values import VALUE_TYPE
from tcc.codegen_cuda.names import c_name
from tcc.errors import TccCompileError
from tcc.ir.expr import Cast, Expr, Load, substitute
from tcc.ir.loopnest import flat_coeff
from tcc.ir.loops import Buffer, For, If, Let, Stmt, Store
from tcc.passes.simplify import evaluate_int

_WORDS = {4: "unsigned", 8: "uint2", 16: "uint4"}  # the C type of an access of that many bytes
_LANE_TYPE = {"f16": "float", "bf16": "float", "f32": "float", "i32": "int"}


class VectorAccesses:
    """Printing of ``vector`` loops; the host class provides ``_line``, ``_flat``, ``_expr`` and
    ``buffers`` (name -> Buffer)."""

    buffers: dict[str, Buffer]

    def _line(self, depth: int, text: str) -> None:
        raise NotImplementedError

    def _flat(self, buf: Buffer, indices: tuple[Expr, ...], swizzled: bool = True) -> str:
        raise NotImplementedError

    def _expr(self, e: Expr) -> str:
        raise NotImplementedError

    def _vector_loop(self, s: For, depth: int) -> None:
        form = _form(s)
        store = form.store
        buf = self.buffers[store.buffer]
        lanes = evaluate_int(s.extent)
        nbytes = (lanes or 0) * buf.dtype.itemsize
        lets = form.outer + form.inner
        if store.accumulate or buf.scope == "local" or buf.swizzle or nbytes not in _WORDS \
                or buf.dtype.name not in _LANE_TYPE or _step(store, lets, buf, s) != 1:
            raise TccCompileError(f"internal error: vector loop {s.var.name} is not one {nbytes}-byte access of "
                                  f"consecutive elements of {buf.name}", s.span)
        word = _WORDS[nbytes]
        dst = f"*({word}*)&{c_name(buf.name)}[{self._flat(buf, store.indices)}]"
        source = _copied(store.value, lets, buf, s, self.buffers)
        self._line(depth, "{")
        if source is not None:  # a copy: one wide load, one wide store
            src = self.buffers[source.buffer]
            load = f"*(const {word}*)&{c_name(src.name)}[{self._flat(src, source.indices)}]"
            self._lane(form, 0, depth + 1, f"{dst} = {load};")
            self._line(depth, "}")
            return
        value = store.value
        if isinstance(value, Cast) and value.dtype == buf.dtype and value.dtype.itemsize == 2 \
                and value.a.dtype == dtypes.f32:
            value = value.a  # (rounded once, by the packing conversion)
        self._line(depth + 1, f"{_LANE_TYPE[buf.dtype.name]} tcc_lane[{lanes}];")
        for lane in range(lanes or 0):  # written out: a lane loop with a guarded read stayed a loop, and
            self._lane(form, lane, depth + 1, f"tcc_lane[{lane}] = {self._expr(value)};")  # its registers local
        self._lane(form, 0, depth + 1, f"{dst} = {_packed(buf.dtype.name, lanes or 0, word)};")
        self._line(depth, "}")

    def _lane(self, form: _Form, lane: int, depth: int, text: str) -> None:
        """``text`` in a scope where the loop variable is ``lane`` and the body's lets and guard hold."""
        self._line(depth, "{")
        self._line(depth + 1, f"const long long {c_name(form.loop.var.name)} = {lane};")
        self._lets(form.outer, depth + 1)
        inner = depth + 1
        if form.cond is not None:  # the same for every lane (the schedule's promise)
            self._line(depth + 1, f"if ({self._expr(form.cond)}) {{")
            inner = depth + 2
        self._lets(form.inner, inner)
        self._line(inner, text)
        if form.cond is not None:
            self._line(depth + 1, "}")
        self._line(depth, "}")

    def _lets(self, lets: list[Let], depth: int) -> None:
        for let in lets:
            ctype = VALUE_TYPE[let.var.dtype.name]
            self._line(depth, f"const {ctype} {c_name(let.var.name)} = {self._expr(let.value)};")


@dataclass(frozen=True)
class _Form:
    """A vector loop's body: lets, a guard (the same for every lane), lets, the store."""

    loop: For
    outer: list[Let]
    cond: Expr | None
    inner: list[Let]
    store: Store


def _form(loop: For) -> _Form:
    outer, body = _lets_of(loop.body)
    cond = None
    if isinstance(body, If) and body.otherwise is None:
        cond, (inner, body) = body.cond, _lets_of(body.then)
    else:
        inner = []
    if not isinstance(body, Store):
        raise TccCompileError(f"internal error: a vector loop's body ends in {type(body).__name__}, not a store",
                              loop.span)
    return _Form(loop, outer, cond, inner, body)


def _lets_of(body: Stmt) -> tuple[list[Let], Stmt]:
    lets = []
    while isinstance(body, Let):
        lets.append(body)
        body = body.body
    return lets, body


def _inlined(indices: tuple[Expr, ...], lets: list[Let]) -> tuple[Expr, ...]:
    """``indices`` with the ``lets`` around them substituted (innermost first)."""
    for let in reversed(lets):
        indices = tuple(substitute(i, {let.var.name: let.value}) for i in indices)
    return indices


def _step(store: Store | Load, lets: list[Let], buf: Buffer, loop: For) -> int | None:
    """How many elements the access moves per lane (1 for a vector access)."""
    return flat_coeff(_inlined(store.indices, lets), buf.shape, loop.var.name)


def _copied(value: Expr, lets: list[Let], dst: Buffer, loop: For, buffers: dict[str, Buffer]) -> Load | None:
    """The load a store copies lane for lane (the same format, consecutive elements), if it is one."""
    if not isinstance(value, Load) or value.buffer not in buffers:
        return None
    src = buffers[value.buffer]
    same = src.dtype == dst.dtype and src.scope != "local" and not src.swizzle
    return value if same and _step(value, lets, src, loop) == 1 else None


def _packed(name: str, lanes: int, word: str) -> str:
    """The C of ``tcc_lane``'s values in memory format, as a ``word``."""
    if name in ("f16", "bf16"):
        words = [f"tcc_pack_{name}x2(tcc_lane[{2 * i}], tcc_lane[{2 * i + 1}])" for i in range(lanes // 2)]
    elif name == "f32":
        words = [f"__float_as_uint(tcc_lane[{i}])" for i in range(lanes)]
    else:
        words = [f"(unsigned)tcc_lane[{i}]" for i in range(lanes)]
    return words[0] if word == "unsigned" else f"make_{word}({', '.join(words)})"
