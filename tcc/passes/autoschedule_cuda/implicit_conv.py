"""16-bit convolutions as an implicit GEMM over a channels-last copy of the input.

The contraction of a convolution reads its input through window indices
(``select(inside, X[n, c, y + r - P, x + s - P], 0)``); gathered element by element into the
GEMM's shared tiles, those 2-byte reads, each behind its padding test, limit the tensor-core
kernel (0.39 of cuDNN on an H100). As CUTLASS's implicit-GEMM convolutions do, the reduction
is ordered ``(r, s, c)`` with the channels innermost and the input read channels-last, so that
8 consecutive reduction indices of one pixel are 16 contiguous bytes: one ``cp.async``.

Two small kernels run first, both shared-memory transposes (:func:`transpose.tiled`):

* ``T[n, u, v, c] = value(y + r := u, x + s := v)``: the operand's own expression evaluated at
  every padded position, channels last. Where the operand reads the window only through sums
  ``y + r`` of an output and a reduction index (checked, not assumed), this is exact: the
  padding's zeros are computed once, and the GEMM reads ``T[n, y + r, x + s, c]`` with no test.
* ``Wc[f, (r * S + s) * C + c] = w(f, c, r, s)``: the other operand in the same reduction order.

The GEMM is then a copy-engine tensor-core kernel whose two copies read those buffers at
``(pixel, k)`` and ``(f, k)``, the epilogue unchanged (bias, relu, the cast, stored in the
output's own layout): on sm_90 from 128 pixels, the ``wgmma`` kernel with the pixels as its
rows (:class:`WarpgroupBuilder`: a warpgroup's 64 rows are filled however few the channels),
else ``mma.sync`` tiles of channels x pixels (:class:`Builder`). Both buffers are the kernel's
own allocations, 16-byte aligned, so it needs no misaligned fallback.

Measured on an H100 (3x3 64->64 56x56 batch 32, bias, relu; cuDNN 82 us): the element-wise
im2col fills ran 212 us; with this layout 91 us on ``mma.sync``, 58 us on ``wgmma`` (input
copy 21.6 us, weights 1.6 us, GEMM 30.8 us).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, Load, Var, free_vars, substitute, transform, walk
from tcc.ir.loops import Buffer, Stmt, Store, seq
from tcc.passes.autoschedule_cuda import gemm, tensorcore, transpose, warpgroup
from tcc.target import CudaTarget

I64 = dtypes.i64
I32 = dtypes.i32


@dataclass
class Plan:
    """How one convolution's operands are laid out for the copy engine."""

    window: list[tuple[Var, Var]]  # (output index, reduction index) pairs read as their sum
    batch: list[Var]  # the other output indices of the input operand
    channel: Var  # the reduction index of both operands that is no window's
    image: Expr  # the input operand with each window sum replaced by its window variable
    windows: list[Var]  # those window variables, in order
    extents: dict[str, int]  # every index's extent


def plan(c: gemm.Contraction, values: tuple[Expr, Expr], fresh) -> Plan | None:
    """The channels-last plan for ``c`` (16-bit operands ``values``), or None when it is not a
    convolution of that form: one output axis for the weights, a channel count in whole 16-byte
    pieces, every reduction index but the channel paired with an output index in a window sum."""
    if len(c.m_axes) != 1 or not c.static:
        return None  # (see Contraction.static)
    image = values[1]
    extents = {f.var.name: gemm._const(f) for f in (*c.m_axes, *c.n_axes, *c.batch_axes, *c.k_axes)}
    n_vars = {f.var.name: f.var for f in c.n_axes}
    k_vars = {f.var.name: f.var for f in c.k_axes}
    pairs: dict[str, tuple[Var, Var]] = {}
    for e in walk(image):
        if (isinstance(e, Binary) and e.op == "add" and isinstance(e.a, Var) and isinstance(e.b, Var)
                and e.a.name in n_vars and e.b.name in k_vars):
            known = pairs.get(e.a.name)
            if known is not None and known[1].name != e.b.name:
                return None
            pairs[e.a.name] = (n_vars[e.a.name], k_vars[e.b.name])
    window = [pairs[f.var.name] for f in c.n_axes if f.var.name in pairs]
    if not window or len({k.name for _, k in window}) != len(window):
        return None
    windows = [fresh(f"u_{y.name}") for y, _ in window]
    sums = {(y.name, k.name): w for (y, k), w in zip(window, windows)}
    replaced = transform(image, lambda e: sums.get((e.a.name, e.b.name)) if isinstance(e, Binary) and e.op == "add"
                         and isinstance(e.a, Var) and isinstance(e.b, Var) else None)
    paired = {v.name for pair in window for v in pair}
    left = free_vars(replaced)
    if left & paired:
        return None  # an index of a window read alone: the copy would not be exact
    channels = [k for k in k_vars if k not in paired]
    weight_vars = {c.m_axes[0].var.name, *k_vars}
    if len(channels) != 1 or channels[0] not in free_vars(values[0]) or not free_vars(values[0]) <= weight_vars \
            or extents[channels[0]] % 8:
        return None
    batch = [f.var for f in c.n_axes if f.var.name not in paired]
    if any(f.var.name in left for f in c.batch_axes) or not left <= {v.name for v in (*batch, *windows)} | {
            channels[0]}:
        return None
    for (y, k), w in zip(window, windows):
        extents[w.name] = extents[y.name] + extents[k.name] - 1
    return Plan(window, batch, k_vars[channels[0]], replaced, windows, extents)


def kernels(c: gemm.Contraction, values: tuple[Expr, Expr], p: Plan, fresh, decompose,
            temps: list[Buffer], target: CudaTarget) -> Stmt:
    """The two layout kernels and the copy-engine GEMM reading what they wrote."""
    ext = p.extents
    dtype = values[1].dtype
    image = Buffer(fresh("Xc").name, dtype, (*(ext[v.name] for v in (*p.batch, *p.windows)), ext[p.channel.name]),
                   "global")
    taps = math.prod(ext[k.name] for _, k in p.window)
    channels = ext[p.channel.name]
    m = c.m_axes[0]
    weights = Buffer(fresh("Wc").name, values[0].dtype, (ext[m.var.name], taps * channels), "global")
    span = c.final.span
    made = seq(_image_kernel(p, image, fresh, span), _weight_kernel(c, values[0], p, weights, fresh, span),
               _gemm(c, p, image, weights, fresh, decompose, target))
    temps.extend((image, weights))  # (once the GEMM fits the target: gemm.OverBudget leaves none behind)
    return made


def _image_kernel(p: Plan, out: Buffer, fresh, span) -> Stmt:
    """``out[b.., u.., c] = image(b.., u.., c)``: read along the last window (rows: channels)."""
    lead_vars = [*p.batch, *p.windows[:-1]]
    last, ext = p.windows[-1], p.extents

    def read(lead: list[Expr], r: Expr, col: Expr) -> Expr:
        where = {v.name: e for v, e in zip(lead_vars, lead)} | {p.channel.name: r, last.name: col}
        return substitute(p.image, where)

    def write(lead: list[Expr], r: Expr, col: Expr, v: Expr) -> Stmt:
        return Store(out.name, (*lead, col, r), v)
    return transpose.tiled(read, write, [ext[v.name] for v in lead_vars], ext[p.channel.name], ext[last.name],
                           out.dtype, fresh, span)


def _weight_kernel(c: gemm.Contraction, value: Expr, p: Plan, out: Buffer, fresh, span) -> Stmt:
    """``out[f, tap * C + c] = w(f, c, taps..)``: read along the taps (rows: channels)."""
    ext = p.extents
    taps = [k for _, k in p.window]
    channels = ext[p.channel.name]

    def read(lead: list[Expr], r: Expr, col: Expr) -> Expr:
        return substitute(value, {c.m_axes[0].var.name: lead[0], p.channel.name: r} | _digits(taps, ext, col))

    def write(lead: list[Expr], r: Expr, col: Expr, v: Expr) -> Stmt:
        return Store(out.name, (lead[0], Binary("add", Binary("mul", col, Const(channels, I64), I64), r, I64)), v)
    return transpose.tiled(read, write, [ext[c.m_axes[0].var.name]], channels, math.prod(ext[k.name] for k in taps),
                           out.dtype, fresh, span)


def _digits(axes: list[Var], ext: dict[str, int], flat: Expr) -> dict[str, Expr]:
    """Each of ``axes`` bound to its digit of the row-major ``flat`` index (in ``flat``'s type)."""
    out: dict[str, Expr] = {}
    stride = 1
    for i, v in reversed(list(enumerate(axes))):
        digit = flat if stride == 1 else Binary("floordiv", flat, Const(stride, flat.dtype), flat.dtype)
        if i > 0:
            digit = Binary("mod", digit, Const(ext[v.name], flat.dtype), flat.dtype)
        out[v.name] = digit
        stride *= ext[v.name]
    return out


class _Copies:
    """The copies of a GEMM whose operands are ``Wc`` and ``Xc`` reads: each of the values reads
    its tile row and the reduction index through the placeholder variables ``rows``."""

    def kernel(self) -> Stmt:
        return replace(super().kernel(), annotations=())  # it copies only from its own (aligned) buffers

    def _copies(self, tid: Var, tm0: Var, tn0: Var, k0: Expr, slot: Expr) -> Stmt:
        x_row, y_row, k = self.rows
        x = self._copy_tile(self.xs, self.xv, x_row, k, tm0, k0, self.m, tid, slot, k_rows=False)
        y = self._copy_tile(self.ys, self.yv, y_row, k, tn0, k0, self.n, tid, slot, k_rows=False)
        return seq(x, y)


class Builder(_Copies, tensorcore.Builder):
    """``mma.sync`` tiles of output channels x pixels, 64 deep along the reduction (on an H100,
    the 3x3 64->64 56x56 b32 convolution: 0.82 of cuDNN with ``BK = 32``, 0.91 with 64; 1.42
    on wgmma)."""

    tiles = tuple((bm, bn, 64) for bm, bn, _ in tensorcore.TILES)

    def __init__(self, c: gemm.Contraction, fresh, decompose, values: tuple[Load, Load], rows: tuple[Var, Var, Var],
                 narrow: bool, target: CudaTarget):
        super().__init__(c, fresh, decompose, values, tensorcore.FastLayout(True, narrow), target)
        self.rows = rows


class WarpgroupBuilder(_Copies, warpgroup.Builder):
    """``wgmma`` tiles of pixels x output channels (the pixels are the 64-row side of each
    warpgroup's instruction, so that few channels still fill it)."""

    tiles = ((128, 256, 64), (128, 128, 64), (128, 64, 64))

    def __init__(self, c: gemm.Contraction, fresh, decompose, values: tuple[Load, Load], rows: tuple[Var, Var, Var],
                 narrow: bool, target: CudaTarget):
        super().__init__(c, fresh, decompose, values, tensorcore.FastLayout(True, narrow), target)
        self.rows = rows


def _gemm(c: gemm.Contraction, p: Plan, image: Buffer, weights: Buffer, fresh, decompose, target: CudaTarget) -> Stmt:
    narrow = max(image.size, weights.size) < 2**31
    index = I32 if narrow else I64
    fm, pixel, k = (Var(fresh(s).name, index) for s in ("cf", "cpx", "ck"))
    ext = p.extents
    n_names = [f.var.name for f in c.n_axes]
    at = _digits([f.var for f in c.n_axes], ext, pixel)
    order = [kk for _, kk in p.window] + [p.channel]
    kd = _digits(order, ext, k)
    window_of = {y.name: kk.name for y, kk in p.window}
    indices = [at[v.name] for v in p.batch]
    indices += [Binary("add", at[y], kd[window_of[y]], index) for y in n_names if y in window_of]
    indices.append(kd[p.channel.name])
    w = Load(weights.name, (fm, k), weights.dtype)
    x = Load(image.name, tuple(indices), image.dtype)
    if target.warpgroup_mma and c.size(c.n_axes) >= warpgroup.MIN_SIDE:
        swapped = replace(c, m_axes=c.n_axes, n_axes=c.m_axes, x=c.y, y=c.x)
        wide = gemm.fitting(WarpgroupBuilder, swapped, fresh, decompose, (x, w), (pixel, fm, k), narrow, target)
        if wide is not None:
            return wide.kernel()
    return Builder(c, fresh, decompose, (w, x), (fm, pixel, k), narrow, target).kernel()
