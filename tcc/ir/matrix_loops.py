"""The loop IR's statements for attention on the matrix units: FlashAttention-2's forward
(:class:`MatrixStream`) and backward (:class:`MatrixSweep`) tile of one block, each carrying the
program's expressions (score, key limit, stores) for a device template to run
(:mod:`tcc.codegen_cuda.flash`, :mod:`tcc.codegen_cuda.flash_backward`). Apart from the core
statements of :mod:`tcc.ir.loops`, whose printer and verifier reach them through
:class:`~tcc.ir.loops.BindingStmt`: they bind variables of their own, list their expressions and
print themselves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tcc.ir.expr import Expr, Load, Var, format_expr
from tcc.ir.loops import BindingStmt, Stmt


@dataclass(frozen=True)
class MatrixSweep(BindingStmt):
    """One block's tile of keys of attention's backward on the matrix units (FlashAttention-2's,
    :mod:`tcc.codegen_cuda.flash_backward`): for the block's ``16 * warps`` keys from ``first`` and
    every row (``block_m`` rows a step), the probabilities ``exp(score(dot) - lse(row))`` (keys at or
    past ``limit`` have none), ``dV = P^T dO``, ``dK = scale * dS^T Q`` with ``dS = P (dO . V -
    delta(row))``, stored by ``dk_out`` and ``dv_out`` at (``key``, ``col``) of ``value``; the block's
    share of ``dS K`` added into the f32 accumulator whose row ``dq`` names (the schedule's buffer,
    zeroed before; ``dq_out`` stores ``scale`` times it once every block is done). ``q``, ``k``, ``v``
    and ``do`` name the first element of a row (at ``row`` or ``key``) of ``depth`` contiguous
    16-bit values. The statement binds ``row``, ``key``, ``dot``, ``col`` and ``value``; ``outer``
    (batch, heads: ``outer_extents``) are bound around it by the schedule
    (:mod:`tcc.passes.autoschedule_cuda.attention_backward`)."""

    q: Load
    k: Load
    v: Load
    do: Load
    row: Var
    key: Var
    dot: Var
    col: Var
    value: Var
    score: Expr
    limit: Expr
    lse: Expr
    delta: Expr
    scale: Expr
    dq_out: Stmt
    dk_out: Stmt
    dv_out: Stmt
    rows: int
    keys: int
    depth: int
    outer: tuple[Var, ...] = ()
    outer_extents: tuple[int, ...] = ()
    dq: Load | None = None  # the accumulator's row (at ``row``): set by the schedule
    first: Expr | None = None  # the block's first key: set by the schedule
    block_m: int = 64
    warps: int = 4
    aligned: bool = False  # Q, K, V and dO start 16-byte aligned (the launcher checks)
    shared: str = ""

    def children(self) -> tuple[Stmt, ...]:
        return (self.dk_out, self.dv_out)

    @property
    def bound(self) -> set[str]:
        """The variables the statement binds for its expressions and stores."""
        return {v.name for v in (self.row, self.key, self.dot, self.col, self.value)}

    def __str__(self) -> str:
        return f"matrix sweep: {self.q.buffer}, {self.k.buffer}, {self.v.buffer}, {self.do.buffer}, " \
               f"{self.rows} x {self.keys} x {self.depth}"

    def exprs(self) -> tuple[Expr, ...]:
        return (self.q, self.k, self.v, self.do, self.score, self.limit, self.lse, self.delta, self.scale) + \
            tuple(e for e in (self.dq, self.first) if e is not None)

    def half_operands(self) -> tuple[Load, ...]:
        return (self.q, self.k, self.v, self.do)

    def format_lines(self, pad: str, depth: int, out: list[str],
                     format_stmt: Callable[[Stmt, int, list[str]], None]) -> None:
        first = "" if self.first is None else f" from key {format_expr(self.first)}"
        keys = f"{self.key.name} < min({self.keys}, {format_expr(self.limit)})"
        out.append(f"{pad}matrix_sweep{first} ({self.warps} warps of 16 keys, {self.block_m} rows a step, in "
                   f"{self.shared or '?'}): {self.row.name} < {self.rows}, {keys}")
        out.append(f"{pad}    {self.dot.name} = {format_expr(self.q)} . {format_expr(self.k)} over {self.depth}; "
                   f"score = {format_expr(self.score)}; lse = {format_expr(self.lse)}; "
                   f"delta = {format_expr(self.delta)}; scale = {format_expr(self.scale)}; "
                   f"dO {format_expr(self.do)}, V {format_expr(self.v)}")
        if self.dq is not None:
            out.append(f"{pad}    dQ += into {format_expr(self.dq)}")
        out.append(f"{pad}    each key ({self.key.name}, {self.col.name}) of ({self.value.name}):")
        format_stmt(self.dk_out, depth + 2, out)
        format_stmt(self.dv_out, depth + 2, out)


@dataclass(frozen=True)
class MatrixStream(BindingStmt):
    """One block's tile of a stream's rows on the matrix units (FlashAttention-2's forward): for
    the block's ``16 * row_tiles * warps`` query rows from ``first`` and every key, ``score`` of the row's
    dot product with the key (``Q . K`` over ``depth`` columns), the keys at or past ``limit``
    scoring ``-inf``; each row's maximum ``top``, sum ``total`` of the exponentials and sums ``w``
    weighted by ``V``, then the stores ``out`` of each finished element (``row``, ``col``) and
    ``row_out`` of each finished row. ``q``, ``k``, ``v`` name the first element of a row of
    Q (at ``row``), K and V (at ``key``), each row ``depth`` contiguous 16-bit values.
    ``tile`` keys at a time stream through the block's ``shared`` buffer (the schedule's
    choices: :mod:`tcc.passes.autoschedule_cuda.attention`). The variables ``row``, ``key``,
    ``dot``, ``col``, ``w``, ``total`` and ``top`` are bound by the statement itself."""

    q: Load
    k: Load
    v: Load
    row: Var
    key: Var
    dot: Var
    score: Expr
    limit: Expr
    col: Var
    w: Var
    total: Var
    top: Var
    out: Stmt
    row_out: Stmt
    rows: int  # query rows in all (per point of the outer rows)
    keys: int
    depth: int
    outer: tuple[Var, ...] = ()  # the loops around the row tiles (batch, heads): one block per point
    first: Expr | None = None  # the block's first row: set by the schedule
    key_begin: Expr | None = None  # the block's keys (a split of them): from the first, a multiple of ``tile``,
    key_end: Expr | None = None  # to before this one (None: all keys)
    tile: int = 64
    warps: int = 4
    row_tiles: int = 1  # tiles of 16 rows a warp owns (each fragment of K or V feeds that many products)
    q_registers: bool = True  # Q's fragments loaded once and kept in registers (else re-read each step)
    warpgroups: int = 0  # > 0: that many warpgroups of 64 rows on ``wgmma`` (sm_90) instead of warps on mma.sync
    aligned: bool = False  # Q, K and V start 16-byte aligned (the launcher checks: the kernel's aligned variant)
    shared: str = ""

    def children(self) -> tuple[Stmt, ...]:
        return (self.out, self.row_out)

    @property
    def bound(self) -> set[str]:
        """The variables the statement binds for its expressions and stores."""
        return {v.name for v in (self.row, self.key, self.dot, self.col, self.w, self.total, self.top)}

    def __str__(self) -> str:
        return (f"matrix stream: {self.q.buffer} . {self.k.buffer} -> {self.v.buffer}, "
                f"{self.rows} x {self.keys} x {self.depth}")

    def exprs(self) -> tuple[Expr, ...]:
        return (self.q, self.k, self.v, self.score, self.limit) + \
            tuple(e for e in (self.first, self.key_begin, self.key_end) if e is not None)

    def half_operands(self) -> tuple[Load, ...]:
        return (self.q, self.k, self.v)

    def format_lines(self, pad: str, depth: int, out: list[str],
                     format_stmt: Callable[[Stmt, int, list[str]], None]) -> None:
        first = "" if self.first is None else f" from row {format_expr(self.first)}"
        if self.key_begin is not None and self.key_end is not None:
            first += f", keys {format_expr(self.key_begin)} to {format_expr(self.key_end)}"
        q_in = "registers" if self.q_registers else "shared"
        units = (f"{self.warpgroups} warpgroups of 64 rows on wgmma" if self.warpgroups else
                 f"{self.warps} warps of {16 * self.row_tiles} rows, Q in {q_in}")
        out.append(f"{pad}matrix_stream{first} ({units}, {self.tile} keys a step, in {self.shared or '?'}): "
                   f"{self.row.name} < {self.rows}, {self.key.name} < min({self.keys}, {format_expr(self.limit)})")
        out.append(f"{pad}    {self.dot.name} = {format_expr(self.q)} . {format_expr(self.k)} over {self.depth}; "
                   f"score = {format_expr(self.score)}; weights {format_expr(self.v)}")
        sums = f"{self.w.name}, {self.total.name}, {self.top.name}"
        out.append(f"{pad}    each element ({self.row.name}, {self.col.name}) from ({sums}):")
        format_stmt(self.out, depth + 2, out)
        out.append(f"{pad}    each row:")
        format_stmt(self.row_out, depth + 2, out)
