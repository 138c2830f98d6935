"""Vector loads of a kernel in LLVM IR: contiguous, guarded by a padding test (masked), lanes a
stride apart (one wide load and a shuffle), interleaved halves, and the per-lane gather that is
left for any other pattern. A mixin of the function builder in :mod:`.llvm_ir`, like
:mod:`.llvm_loops` and :mod:`.llvm_math`: it uses the builder's state (``builder``, ``buffers``,
``vec``) and its address helpers (``_element``, ``_lane``, ``_from_memory``).
"""

from __future__ import annotations

from llvmlite import ir

from tcc import dtypes
from tcc.codegen_cpu.llvm_types import I1, I32, I64, PTR, lane_mask, memory_type, splat_constant, type_suffix
from tcc.ir.expr import Binary, Const, Expr, Load, Select, Var, free_vars
from tcc.ir.loopnest import flat_terms
from tcc.ir.loops import Buffer

MAX_SPREAD_STRIDE = 4  # lanes this far apart load as one wider masked load and a shuffle


class LoadEmitter:
    """Loads (and the selects that guard them)."""

    def _e_Load(self, e: Load) -> ir.Value:
        buf, base = self.buffers[e.buffer]
        b = self.builder
        ty = memory_type(buf.dtype)
        stride = 0 if self.vec is None or self.lane0 else self._lane_stride(buf, e.indices)
        if stride == 0:
            ptr = self._element(buf, base, e.indices)
            return self._from_memory(b.load(ptr, typ=ty, align=buf.dtype.itemsize), buf.dtype)
        lanes = self.vec[1]
        vty = ir.VectorType(ty, lanes)
        if stride == 1:
            ptr = self._element(buf, base, e.indices, lane0=True)
            return self._from_memory(b.load(ptr, typ=vty, align=buf.dtype.itemsize), buf.dtype)
        if stride is not None and 1 < stride <= MAX_SPREAD_STRIDE:
            ptr = self._element(buf, base, e.indices, lane0=True)
            return self._from_memory(self._strided_load(ptr, vty, stride, buf.dtype.itemsize), buf.dtype)
        interleaved = self._interleaved_load(buf, base, e.indices, vty)
        if interleaved is not None:
            return self._from_memory(interleaved, buf.dtype)
        out = splat_constant(ty, lanes, None)
        for lane in range(lanes):  # a gather, one lane at a time
            with self._lane(lane):
                ptr = self._element(buf, base, e.indices, lane0=True)
            out = b.insert_element(out, b.load(ptr, typ=ty, align=buf.dtype.itemsize), ir.Constant(I32, lane))
        return self._from_memory(out, buf.dtype)

    def _e_Select(self, e: Select) -> ir.Value:
        guarded = self._guarded_load(e)
        if guarded is not None:
            return guarded
        cond, a, c = self._expr(e.cond), self._expr(e.a), self._expr(e.b)
        if isinstance(cond.type, ir.VectorType):
            cond, a, c = self._unify(cond, a, c)
        else:
            a, c = self._unify(a, c)
        return self.builder.select(cond, a, c)

    def _guarded_load(self, e: Select) -> ir.Value | None:
        """``select(inside, X[clamp(i)], v)`` (a read through a pad) on vector lanes: a masked load
        of ``X[i]`` (``llvm.masked.load``, or ``llvm.masked.gather`` for a constant stride) where
        ``inside`` holds, instead of one clamped scalar load per lane. ``inside`` must imply that
        every clamp is the identity, which is what lowering a pad read produces."""
        if self.vec is None or self.lane0 or not isinstance(e.a, Load):
            return None
        buf, base = self.buffers[e.a.buffer]
        indices = _unclamped(e.a.indices, _conjuncts(e.cond))
        if indices is None or buf.dtype.is_bool:
            return None
        stride = self._lane_stride(buf, indices)
        if not stride:
            return None
        b = self.builder
        lanes = self.vec[1]
        vty = ir.VectorType(memory_type(buf.dtype), lanes)
        mask, other = self._unify(self._expr(e.cond), self._expr(e.b))
        mask = self._splat(mask, lanes)
        other = self._splat(other, lanes)
        ptr = self._element(buf, base, indices, lane0=True, inbounds=False)
        size = buf.dtype.itemsize
        if stride == 1:
            return self._masked_load(ptr, vty, mask, other, size)
        if _spreads(stride, lanes):
            return self._spread_load(ptr, vty, stride, mask, other, size)
        offsets = ir.Constant(ir.VectorType(I64, lanes), [lane * stride * size for lane in range(lanes)])
        pty = ir.VectorType(PTR, lanes)
        ptrs = b.inttoptr(b.add(self._splat(b.ptrtoint(ptr, I64), lanes), offsets), pty)
        fn = self._declare(f"llvm.masked.gather.{type_suffix(vty)}.v{lanes}p0",
                           ir.FunctionType(vty, [pty, I32, mask.type, vty]))
        return b.call(fn, [ptrs, ir.Constant(I32, size), mask, other])

    def _interleaved_load(self, buf: Buffer, base: ir.Value, indices: tuple[Expr, ...],
                          vty: ir.VectorType) -> ir.Value | None:
        """Lanes whose address reads the vector index ``v`` as ``v // 2`` and ``v % 2`` (a row of
        Winograd's 2x2 output tiles: even columns from one tile element, odd from the other):
        each residue's lanes are ``v // 2``-affine, so they load as one vector (contiguous, spread
        or a splat) and a shuffle interleaves the two. Per lane it was a scalar load and an insert
        each (126 ``vinsertps`` in one output transform). None: not this form."""
        var, lanes = self.vec[0], vty.count
        flat = flat_terms(indices, buf.shape)
        if flat is None or lanes % 2:
            return None
        step = 0  # elements between lanes 2q + r and 2q + 2 + r
        for atom, coef in flat.atoms.items():
            if isinstance(atom, Var) and atom.name == var:
                step += 2 * coef
            elif isinstance(atom, Binary) and atom.op in ("floordiv", "mod") and isinstance(atom.b, Const) \
                    and atom.b.value == 2 and _lane_plus_even(atom.a, var):
                step += coef if atom.op == "floordiv" else 0
            elif var in free_vars(atom):
                return None
        half = ir.VectorType(vty.element, lanes // 2)
        if not 0 <= step <= MAX_SPREAD_STRIDE:
            return None
        parts = []
        for residue in (0, 1):
            with self._lane(residue):
                ptr = self._element(buf, base, indices, lane0=True)
            align = buf.dtype.itemsize
            if step == 0:
                parts.append(self._splat(self.builder.load(ptr, typ=vty.element, align=align), half.count))
            elif step == 1:
                parts.append(self.builder.load(ptr, typ=half, align=align))
            else:
                parts.append(self._strided_load(ptr, half, step, align))
        return self.builder.shuffle_vector(parts[0], parts[1],
                                           lane_mask([lane % 2 * half.count + lane // 2 for lane in range(lanes)]))

    def _strided_load(self, ptr: ir.Value, vty: ir.VectorType, stride: int, align: int) -> ir.Value:
        """Lanes ``stride`` elements apart, unguarded. 16 lanes or more (a pooling window's row):
        one masked load of ``lanes * stride`` elements (see ``_spread_load``). Fewer (Winograd's
        stride-2 tile columns, 14 or 7 lanes): one plain load from the first lane's element to
        the last's, then a shuffle; nothing outside that range is touched. A lane at a time
        (before) it was a scalar load and an insert each."""
        b = self.builder
        if _spreads(stride, vty.count):
            every = splat_constant(I1, vty.count, True)
            return self._spread_load(ptr, vty, stride, every, splat_constant(vty.element, vty.count, None), align)
        span = ir.VectorType(vty.element, (vty.count - 1) * stride + 1)
        loaded = b.load(ptr, typ=span, align=align)
        return b.shuffle_vector(loaded, loaded, lane_mask([lane * stride for lane in range(vty.count)]))

    def _spread_load(self, ptr: ir.Value, vty: ir.VectorType, stride: int, mask: ir.Value, other: ir.Value,
                     align: int) -> ir.Value:
        """Lanes ``stride`` elements apart (a stride-2 conv's patch row, a pooling window): one
        masked contiguous load of ``lanes * stride`` elements, only every ``stride``-th enabled (so
        nothing past the last lane is touched), then a shuffle; a masked gather moves one element
        per cycle, this a whole vector."""
        b = self.builder
        lanes = vty.count
        wide = lanes * stride
        wty = ir.VectorType(vty.element, wide)
        picks = [t // stride if t % stride == 0 else lanes for t in range(wide)]
        off = splat_constant(I1, lanes, False)
        wmask = b.shuffle_vector(mask, off, lane_mask(picks))
        wother = b.shuffle_vector(other, other, lane_mask([t // stride for t in range(wide)]))
        loaded = self._masked_load(ptr, wty, wmask, wother, align)
        return b.shuffle_vector(loaded, loaded, lane_mask([lane * stride for lane in range(lanes)]))

    def _masked_load(self, ptr: ir.Value, vty: ir.VectorType, mask: ir.Value, other: ir.Value,
                     align: int) -> ir.Value:
        """``llvm.masked.load`` of ``vty``, widened to whole 32-byte registers (lanes past ``vty``
        masked off, so never touched) and shuffled back. LLVM's x86 lowering of a masked load whose
        last piece is narrower than a register lost that piece's lanes on AVX2: lanes 16-17 of an
        18-lane load (fuzz seed 140268, a depthwise conv with padding 2) and lanes 4-5 of one split
        as 4 + 2 (seed 150073) read garbage, while whole registers load right."""
        b = self.builder
        lanes = vty.count
        full = max(1, 32 // align)  # lanes of a 32-byte register (``align`` is the element's size)
        wide = -(-lanes // full) * full
        if wide == lanes:
            fn = self._declare(f"llvm.masked.load.{type_suffix(vty)}.p0",
                               ir.FunctionType(vty, [PTR, I32, mask.type, vty]))
            return b.call(fn, [ptr, ir.Constant(I32, align), mask, other])
        wty = ir.VectorType(vty.element, wide)
        pad = list(range(lanes)) + [lanes] * (wide - lanes)  # (lane ``lanes``: the second operand's first)
        wmask = b.shuffle_vector(mask, splat_constant(I1, lanes, False), lane_mask(pad))
        wother = b.shuffle_vector(other, other, lane_mask([min(i, lanes - 1) for i in range(wide)]))
        fn = self._declare(f"llvm.masked.load.{type_suffix(wty)}.p0",
                           ir.FunctionType(wty, [PTR, I32, wmask.type, wty]))
        loaded = b.call(fn, [ptr, ir.Constant(I32, align), wmask, wother])
        return b.shuffle_vector(loaded, loaded, lane_mask(list(range(lanes))))


def _spreads(stride: int | None, lanes: int) -> bool:
    """Whether lanes ``stride`` apart load as one wide masked load and a shuffle: small strides,
    and vectors of 16 lanes or more (a 14-lane stride-2 conv row measured slower than a gather)."""
    return stride is not None and 1 < stride <= MAX_SPREAD_STRIDE and lanes >= 16


def _lane_plus_even(e: Expr, var: str) -> bool:
    """Whether ``e`` is ``var`` plus even terms (``32 * o + v``, ``32 + v``): then ``e % 2`` is
    ``var % 2`` and ``e // 2`` grows by one as ``var`` grows by two."""
    terms = flat_terms((e,), (1,))
    if terms is None or terms.constant % 2:
        return False
    for atom, k in terms.atoms.items():
        if isinstance(atom, Var) and atom.name == var:
            if k != 1:
                return False
        elif var in free_vars(atom) or k % 2:
            return False
    return any(isinstance(atom, Var) and atom.name == var for atom in terms.atoms)


def _conjuncts(e: Expr) -> set[Expr]:
    if isinstance(e, Binary) and e.op == "and":
        return _conjuncts(e.a) | _conjuncts(e.b)
    return {e}


def _unclamped(indices: tuple[Expr, ...], facts: set[Expr]) -> tuple[Expr, ...] | None:
    """``indices`` with each ``min(max(i, 0), n - 1)`` replaced by ``i`` when ``facts`` hold
    ``i >= 0`` and ``i < n``; None when there is no clamp or one is not implied."""
    out, found = [], False
    for idx in indices:
        if isinstance(idx, Binary) and idx.op == "min" and isinstance(idx.a, Binary) and idx.a.op == "max" \
                and isinstance(idx.b, Const) and idx.a.b == Const(0, idx.dtype):
            inner = idx.a.a
            lo = Binary("ge", inner, Const(0, idx.dtype), dtypes.boolean)
            hi = Binary("lt", inner, Const(idx.b.value + 1, idx.dtype), dtypes.boolean)
            if lo not in facts or hi not in facts:
                return None
            out.append(inner)
            found = True
        else:
            out.append(idx)
    return tuple(out) if found else None
