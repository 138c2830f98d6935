"""im2col: lower convolution-shaped reductions to a patch gather plus a GEMM.

A reduction ``sum[c, r, s](Xp[n, c, y*S + r*D, x*S + s*D] * Wt[f, c, r, s])`` reads its input
through *window* indices (an output index and a reduction index added together). Gathering
that read into a patch tensor ``P[n, c, r, s, y, x]`` turns the reduction into a plain
contraction ``sum[c, r, s](P[n, c, r, s, y, x] * Wt[f, c, r, s])``: a GEMM of the weights
(F x C*R*S) with the patches (C*R*S x OY*OX), which the CPU auto-scheduler's GEMM kernel runs.

The rule is generic over 1-D, 2-D and 3-D windows, stride, dilation, padding and groups. The
cost model applies it only where the GEMM reuses each patch (the weights have an output index
the input read lacks: output channels), so depthwise convolutions stay direct; and only while
one batch element's patches fit in ``MAX_PATCH_BYTES``. The patch tensor's leading index is the
batch, and fusion groups it with the GEMM under one batch loop, so only one batch element's
patches per thread exist at a time (the CPU runs whole images on each thread when the batch has
one per thread): the peak extra memory is ``threads * C*R*S*OY*OX*itemsize`` whatever the batch,
except where one image's pixels fill the vector lanes badly (7x7 layers): there the batch leads
the GEMM's columns, within ``FOLD_MAX_BYTES`` of patches (``_promote_columns``).
Strided windows with more than ``ROW_BLOCK_FROM`` of patches per batch element are gathered and
multiplied a block of output rows at a time (``_row_block``), each block's patches in L2.

A weight gradient ``sum[n, y, x](dY[n, f, y, x] * Xp[n, c, y + r, x + s])`` is the same rule with
the roles turned round (its window outputs are the kernel offsets): ``_promote_columns`` makes
``c`` a GEMM column next to ``r, s`` and ``_partial_axes`` takes ``n`` out of the reduction as a
batch whose GEMM results are summed after, so it is one ``F x C*R*S`` GEMM per image.

Override with ``tcc.compile(..., conv="im2col" | "direct" | "auto")``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tcc import dtypes
from tcc.errors import TccScheduleError
from tcc.ir.expr import Binary, Cast, Const, Expr, IterVar, Read, Reduce, Var, free_vars, substitute, transform, walk
from tcc.ir.loopnest import linear_coeff
from tcc.ir.te import Compute, OpTE, Tensor
from tcc.passes.simplify import simplify
from tcc.passes.te.specialize import size_hint

MAX_PATCH_BYTES = 32 * 1024 * 1024
ROW_BLOCK_FROM = 2 * 1024 * 1024  # strided patches of one batch element above this are blocked by rows
ROW_BLOCK_BYTES = 512 * 1024  # ... into blocks of at most this (a quarter of a 2 MiB L2)
VECTOR = 32  # columns of the GEMM's register tile: blocks of whole tiles are preferred
FOLD_WASTE = 0.25  # the batch joins the columns where an image's pixels leave more of the lanes empty ...
FOLD_MAX_BYTES = 8 * 1024 * 1024  # ... and the patches of the whole batch take at most this
PARTIAL_MIN_K = 256  # a GEMM reduction at least this long (one L1 block) may leave the batch to partial sums
I64 = dtypes.i64
CHOICES = ("auto", "im2col", "direct")


def im2col(op: OpTE, mode: str = "auto") -> OpTE:
    """Rewrite each convolution-shaped reduction whose cost model (or ``mode``) says so."""
    if mode not in CHOICES:
        raise TccScheduleError(f"unknown convolution lowering {mode!r}", op.span, f"use one of {', '.join(CHOICES)}")
    if mode == "direct":
        return op
    computes: list[Compute] = []
    tensors = dict(op.tensors)
    notes = list(op.fusion_notes)
    for c in op.computes:
        new_c, added = (c, []) if c.accumulate else _rewrite(c, op, tensors, mode, notes)  # (a scatter's own axes)
        for compute, tensor in added:
            tensors[tensor.name] = tensor
            computes.append(compute)
        computes.append(new_c)
    return replace(op, computes=computes, tensors=tensors, fusion_notes=notes)


def _rewrite(c: Compute, op: OpTE, tensors: dict[str, Tensor], mode: str, notes: list[str]):
    """``c`` with its convolution reductions replaced by reads of GEMM results, and the new statements."""
    new: list[tuple[Compute, Tensor]] = []

    def visit(n: Expr) -> Expr | None:
        if not (isinstance(n, Reduce) and n.op == "sum"):
            return None
        found = _conv_operands(n, c)
        if found is None:
            return None
        window, other = found
        plan = _plan(window, other, n, c, mode)
        notes.append(f"{'im2col' if plan.apply else 'direct'} {c.tensor}: {plan.why}")
        if not plan.apply:
            return None
        patch, gemm, read = _build(plan, window, n, c, tensors)
        new.extend([patch, gemm])
        tensors.update({patch[1].name: patch[1], gemm[1].name: gemm[1]})  # a second convolution of c takes others
        return read

    body = transform(c.body, visit)
    return replace(c, body=body), new


@dataclass
class _Plan:
    apply: bool
    why: str
    outer: list[IterVar] = field(default_factory=list)  # output axes of the input read only (batch)
    partial: list[IterVar] = field(default_factory=list)  # reduction axes summed after the GEMMs (batch)
    reduce: list[IterVar] = field(default_factory=list)  # the GEMM's reduction axes
    spatial: list[IterVar] = field(default_factory=list)  # the GEMM's columns: output axes of the input read
    weights: list[IterVar] = field(default_factory=list)  # output axes of the other factor only
    row_block: int = 0  # output rows per patch block (0: the whole of a batch element at once)


def _plan(window: Read, other: Read, r: Reduce, c: Compute, mode: str) -> _Plan:
    out_names = {ax.var.name for ax in c.axes}
    red_names = {ax.var.name for ax in r.axes}
    a_vars = _vars_of(window.indices)
    b_vars = _vars_of(other.indices)
    in_window = set().union(*(_vars_of((i,)) for i in window.indices if _is_window(i, out_names, red_names)))
    plan = _Plan(False, "")
    plan.outer = [ax for ax in c.axes if ax.var.name in a_vars and ax.var.name not in in_window]
    plan.reduce = [ax for ax in r.axes if ax.var.name in a_vars]
    plan.spatial = [ax for ax in c.axes if ax.var.name in in_window]
    plan.weights = [ax for ax in c.axes if ax.var.name in b_vars and ax.var.name not in a_vars]
    promoted = _promote_columns(plan, c, b_vars, window.dtype.itemsize)
    plan.partial = _partial_axes(plan, b_vars, in_window)
    shared = [ax.var.name for ax in plan.outer if ax.var.name in b_vars]
    per_outer = window.dtype.itemsize * _size(plan.reduce) * _size(plan.spatial)
    partials = r.acc_dtype.itemsize * _size(plan.outer + plan.partial + plan.weights + plan.spatial)
    window_axes = [ax for ax in plan.reduce if ax.var.name in in_window]
    if mode == "auto" and _size(window_axes) == 1 and not _strided(window, plan.spatial):
        plan.why = "a 1x1 window: the input is already the GEMM's operand, patches would only copy it"
    elif mode == "auto" and shared:
        plan.why = (f"{', '.join(shared)} indexes both the input and the weights (depthwise or grouped): the "
                    "patches would be gathered again for each of its values")
    elif mode == "auto" and not plan.weights:
        plan.why = "the weights have no output index of their own: a GEMM would not reuse the patches"
    elif mode == "auto" and per_outer > MAX_PATCH_BYTES and all(isinstance(ax.extent, Const) for ax in plan.spatial):
        # (a dynamic image's patches grow with it: they are one batch element's, whatever its size)
        plan.why = f"one batch element's patches would take {per_outer / 2**20:.1f} MiB (> {MAX_PATCH_BYTES >> 20} MiB)"
    elif mode == "auto" and plan.partial and partials > MAX_PATCH_BYTES:
        plan.why = f"the partial sums over {plan.partial[0].var.name} would take {partials / 2**20:.1f} MiB"
    elif any(not isinstance(ax.extent, Const) for ax in plan.reduce + plan.weights + plan.partial):
        plan.why = "a window or channel extent is a dynamic shape symbol: the GEMM's rows and reduction need constants"
    elif any(ax.var.name not in {x.var.name for x in plan.outer + plan.spatial + plan.weights} for ax in c.axes):
        plan.why = "an output index is used by neither operand alone"
    else:
        plan.apply = True
        result = r.dtype.itemsize * _size(plan.weights) * _size(plan.spatial)
        plan.row_block = 0 if promoted else _row_block(plan, window, per_outer)
        if plan.row_block:
            rows = int(plan.spatial[0].extent.value)  # type: ignore[attr-defined]
            per_outer = per_outer * plan.row_block // rows
            result = result * plan.row_block // rows
        batch = plan.outer + plan.partial
        plan.why = (f"patches of {window.tensor}, then a GEMM over {', '.join(ax.var.name for ax in plan.reduce)} "
                    f"into columns {', '.join(ax.var.name for ax in plan.spatial)}; "
                    f"extra memory {per_outer / 2**20:.2f} MiB patches + {result / 2**20:.2f} MiB GEMM result "
                    f"per {'batch element' if batch else 'call'}"
                    + (f" and block of {plan.row_block} output rows (strided patches)" if plan.row_block else "")
                    + (f", the GEMMs of each {', '.join(ax.var.name for ax in plan.partial)} summed after"
                       if plan.partial else ""))
    return plan


def _promote_columns(plan: _Plan, c: Compute, b_vars: set[str], itemsize: int) -> bool:
    """Make the input-only output axes outside the window columns too when the window's own
    output axes are fewer than a register tile's columns. A weight gradient
    ``dW[f, c, r, s] = sum[n, y, x](dY[n, f, y, x] * Xp[n, c, y + r, x + s])`` has the 3x3 kernel
    offsets as its window outputs: with ``c`` as a batch axis it would be C GEMMs of 9 columns (8.8x
    PyTorch's time on a 64-channel layer); with ``c, r, s`` as columns it is one GEMM of 576.

    Likewise a forward convolution's batch becomes the leading part of the columns where one
    image's pixels fill the register tiles' lanes badly and the batch's do better (see
    :func:`_lane_waste`), while all their patches fit ``FOLD_MAX_BYTES``: a 7x7 layer at batch 8
    is one GEMM of 392 columns rather than 8 of 49 (4 vectors of 16 for 49 pixels), and its
    weights are read once rather than once per image (512 channels: 26.9 -> 22.3 ms on one
    AVX-512 core; at 14x14, 14% of the lanes wasted, folding was 5% slower)."""
    promoted = {ax.var.name for ax in plan.outer if ax.var.name not in b_vars}
    if not promoted or not all(isinstance(ax.extent, Const) for ax in plan.outer + plan.spatial):
        return False  # (columns of a dynamic size: each batch element's own)
    columns, axes = _size(plan.spatial), [ax for ax in c.axes if ax.var.name in promoted]
    if columns < VECTOR:
        plan.spatial += axes
    elif _lane_waste(columns) > FOLD_WASTE and _lane_waste(columns * _size(axes)) < _lane_waste(columns) \
            and itemsize * _size(plan.reduce) * columns * _size(axes) <= FOLD_MAX_BYTES:
        plan.spatial = axes + plan.spatial  # image-major columns: each image's pixels stay one run
    else:
        return False
    plan.outer = [ax for ax in plan.outer if ax.var.name not in promoted]
    return True


def _lane_waste(columns: int) -> float:
    """The share of a GEMM's column lanes that pad ``columns`` up to whole vectors of
    ``VECTOR // 2`` (16 f32 lanes: one AVX-512 register, two AVX2 ones)."""
    lanes = VECTOR // 2
    return -(-columns // lanes) * lanes / columns - 1


def _partial_axes(plan: _Plan, b_vars: set[str], in_window: set[str]) -> list[IterVar]:
    """Reduction axes to take out of the GEMM as a batch whose results are summed afterwards:
    those both operands index outside any window (a weight gradient's batch ``n``), when the
    rest of the reduction is at least ``PARTIAL_MIN_K`` long (one image's pixels). Like a
    forward convolution's batch, each value then has patches of its own, so the patches of
    one image at a time exist per thread and the threads take whole images."""
    partial = [ax for ax in plan.reduce if ax.var.name in b_vars and ax.var.name not in in_window]
    rest = [ax for ax in plan.reduce if ax not in partial]
    if not partial or _size(rest) < PARTIAL_MIN_K:
        return []
    plan.reduce = rest
    return partial


def _row_block(plan: _Plan, window: Read, per_outer: int) -> int:
    """Output rows per patch block, or 0 for none. Patches of a stride-1 window are gathered
    straight into the GEMM's packed panels (passes/autoschedule_cpu/pack_gather.py); a strided window's pixels
    jump rows, so its patches are written out first: above ``ROW_BLOCK_FROM`` per batch element
    (7.4 MiB for a 7x7/2 layer on a 224x224 image) they are made and multiplied one block of
    output rows at a time, each block small enough to stay in L2 (and the blocks, like batch
    elements, go to the threads)."""
    if per_outer <= ROW_BLOCK_FROM or len(plan.spatial) < 2 or not isinstance(plan.spatial[0].extent, Const):
        return 0
    first = plan.spatial[0].var.name
    strides = {linear_coeff(i, first) for i in window.indices} - {0, None}
    if strides == {1}:
        return 0
    rows = int(plan.spatial[0].extent.value)  # type: ignore[attr-defined]
    per_row = per_outer // rows
    width = _size(plan.spatial[1:])
    fitting = [d for d in range(1, rows) if rows % d == 0 and d * per_row <= ROW_BLOCK_BYTES]
    whole_vectors = [d for d in fitting if d * width % VECTOR == 0]  # no narrow tail tile per block
    return max(whole_vectors or fitting, default=0)


def _build(plan: _Plan, window: Read, r: Reduce, c: Compute, tensors: dict[str, Tensor]):
    """The patch gather P[outer, reduce, j], the GEMM G[outer, weights, j] and the read replacing ``r``
    (with a row block ``R``: P[outer, yb, reduce, j] and G[outer, yb, weights, j] for output rows
    ``yb*R .. yb*R + R - 1``, read back at ``yb = y // R`` and ``y % R`` within the block; with
    partial sums, ``outer`` ends with the partial axes, G holds accumulator values and the read
    is their sum)."""
    j = Var(_fresh_var("j", c, r), I64)
    spatial, outer, block = list(plan.spatial), plan.outer + plan.partial, []
    y = spatial[0].var
    if plan.row_block:
        yb = IterVar(Var(_fresh_var(f"{y.name}_block", c, r), I64),
                     Const(int(spatial[0].extent.value) // plan.row_block, I64))  # type: ignore[attr-defined]
        block = [yb]
        spatial[0] = IterVar(Var(_fresh_var(f"{y.name}_in", c, r), I64), Const(plan.row_block, I64))
    extent_j = _extent(spatial)
    spatial_of_j = _unflatten(j, spatial)
    if plan.row_block:
        row = spatial_of_j.pop(spatial[0].var.name)
        spatial_of_j[y.name] = Binary("add", Binary("mul", block[0].var, Const(plan.row_block, I64), I64), row, I64)
    patch_name = _fresh(f"{window.tensor}_patches", tensors)
    gemm_name = _fresh(f"{c.tensor}_gemm", tensors)
    p_axes = (*outer, *block, *plan.reduce, IterVar(j, extent_j))
    patch_body = substitute(window, spatial_of_j)
    patch = Compute(patch_name, p_axes, patch_body, c.span)
    p_read = Read(patch_name, tuple(ax.var for ax in p_axes), window.dtype, window.span)
    g_axes = (*outer, *block, *plan.weights, IterVar(j, extent_j))
    partial = {ax.var.name for ax in plan.partial}
    g_dtype = r.acc_dtype if partial else r.dtype
    g_body = replace(r, axes=tuple(ax for ax in r.axes if ax.var.name not in partial), dtype=g_dtype,
                     body=transform(r.body, lambda n: p_read if n == window else None))
    gemm = Compute(gemm_name, g_axes, g_body, c.span)
    if plan.row_block:
        rb = Const(plan.row_block, I64)
        local = [(Binary("mod", y, rb, I64), plan.row_block), *_parts(plan.spatial[1:])]
        leading = (*(ax.var for ax in outer), Binary("floordiv", y, rb, I64))
    else:
        local, leading = _parts(spatial), tuple(ax.var for ax in outer)
    flat = _flatten(local)
    read: Expr = Read(gemm_name, (*leading, *(ax.var for ax in plan.weights), flat), g_dtype, r.span)
    if partial:
        read = Reduce("sum", tuple(plan.partial), read, r.dtype, r.acc_dtype, r.span)
    p_tensor = Tensor(patch_name, window.dtype, tuple(ax.extent for ax in p_axes), "temp", window.span)
    g_tensor = Tensor(gemm_name, g_dtype, tuple(ax.extent for ax in g_axes), "temp", r.span)
    return (patch, p_tensor), (gemm, g_tensor), read


def _unflatten(j: Var, spatial: list[IterVar]) -> dict[str, Expr]:
    """Each spatial index as a function of the flattened index ``j`` (row-major)."""
    out: dict[str, Expr] = {}
    rest: Expr = j
    for ax in reversed(spatial):
        extent = ax.extent  # (a constant, or an expression of dynamic shape symbols)
        out[ax.var.name] = rest if ax is spatial[0] else Binary("mod", rest, extent, I64)
        rest = Binary("floordiv", rest, extent, I64)
    return out


def _parts(axes: list[IterVar]) -> list[tuple[Expr, int | Expr]]:
    return [(ax.var, int(ax.extent.value) if isinstance(ax.extent, Const) else ax.extent) for ax in axes]


def _flatten(parts: list[tuple[Expr, int | Expr]]) -> Expr:
    """Row-major ``(a * Eb + b) * Ec + c`` of (index, extent) pairs (an index may be ``y % R``)."""
    flat: Expr | None = None
    for index, extent in parts:
        size = Const(extent, I64) if isinstance(extent, int) else extent
        flat = index if flat is None else Binary("add", Binary("mul", flat, size, I64), index, I64)
    return flat if flat is not None else Const(0, I64)


def _extent(axes: list[IterVar]) -> Expr:
    """The product of the axes' extents: a constant, or an expression of dynamic shape symbols."""
    n: Expr = Const(1, I64)
    for ax in axes:
        n = ax.extent if n == Const(1, I64) else Binary("mul", n, ax.extent, I64)
    return simplify(n)


def _size(axes: list[IterVar]) -> int:
    """Elements of the axes' box; a dynamic shape symbol's extent counted as the cost models' hint."""
    n = 1
    for ax in axes:
        n *= size_hint(ax.extent, frozenset(free_vars(ax.extent))) or 1
    return n


def _vars_of(indices: tuple[Expr, ...]) -> set[str]:
    return {n.name for i in indices for n in walk(i) if isinstance(n, Var)}


def _fresh_var(base: str, c: Compute, r: Reduce) -> str:
    taken = {ax.var.name for ax in (*c.axes, *r.axes)} | _vars_of((c.body,))
    name = base
    while name in taken:
        name += "_"
    return name


def _conv_operands(r: Reduce, c: Compute) -> tuple[Read, Read] | None:
    """(the windowed input read, the other factor) of a ``sum`` of a product, or None."""
    body = r.body
    while isinstance(body, Cast):
        body = body.a
    if not (isinstance(body, Binary) and body.op == "mul"):
        return None
    a, b = (_strip(body.a), _strip(body.b))
    if not (isinstance(a, Read) and isinstance(b, Read)):
        return None
    out_vars = {ax.var.name for ax in c.axes}
    red_vars = {ax.var.name for ax in r.axes}
    for window, other in ((a, b), (b, a)):
        if any(_is_window(i, out_vars, red_vars) for i in window.indices):
            return window, other
    return None


def _strip(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.a
    return e


def _strided(window: Read, spatial: list[IterVar]) -> bool:
    """Whether an output index steps the input by more than one (a 1x1 convolution of stride 2,
    ResNet's downsample: its input is no GEMM operand, only every other pixel of each row is,
    and without patches the GEMM had one output row's 14 columns)."""
    names = {ax.var.name for ax in spatial}
    return any(linear_coeff(i, v) not in (0, 1, None) for i in window.indices for v in names)


def _is_window(index: Expr, out_vars: set[str], red_vars: set[str]) -> bool:
    """An output index plus a reduction index, both with non-zero affine coefficients (``y*S + r*D``).

    A group offset such as ``(o // G) * CG + c`` is not a window: it does not slide with ``o``.
    """
    names = {n.name for n in walk(index) if isinstance(n, Var)}
    return any(linear_coeff(index, v) not in (None, 0) for v in names & out_vars) and \
        any(linear_coeff(index, v) not in (None, 0) for v in names & red_vars)


def _fresh(base: str, taken: dict[str, Tensor]) -> str:
    name, i = base, 1
    while name in taken:
        i += 1
        name = f"{base}{i}"
    return name
