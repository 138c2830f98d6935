"""bind(L, warp | warpgroup): each iteration of ``L`` runs on one warp (32 threads) or one
warpgroup (4 warps, 128 threads) of a block.

A loop bound to warps becomes a thread loop over ``32 * E`` threads that gives every thread its
warp's iteration and its lane::

    for wi in 0..2:  body        ->     for wi_t in 0..64:  # thread.x warps=wi:2 lane=lane
                                            let wi = wi_t // 32
                                            let lane = wi_t % 32
                                            body

All lanes of a warp run ``body`` in full, so the result is the loop's; ``tensorize`` later
shares a marked tile of it out among the lanes (the ``lane`` variable). A second loop bound the
same way directly inside the first (nothing but the binding's ``let``s between them) joins it:
the warps form a grid, the inner loop's iteration the faster digit (``bind(wi, warp)`` then
``bind(wj, warp)`` on a 2 x 2 nest: 128 threads, ``wi = t // 64``, ``wj = t // 32 % 2``).
The note :class:`Lanes` on the thread loop records that grid for ``cache(T, L, shared)`` (whose
tile then spans every warp's part) and ``tensorize`` (which needs the lane).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Const, Expr, Var
from tcc.ir.loopnest import const_extent, div_index, fresh, loops_named, mod_index, subst
from tcc.ir.loops import For, Let, LoopFunc, Seq, Stmt, map_stmt, walk_stmts

LANES = {"warp": 32, "warpgroup": 128}


@dataclass(frozen=True)
class Lanes:
    """How a thread loop made by ``bind(L, warp|warpgroup)`` splits its threads: ``groups`` are
    the bound loops (name, extent), outermost first, each iteration ``size`` threads, ``lane``
    the thread's place among those."""

    size: int
    groups: tuple[tuple[str, int], ...]
    lane: Var

    def __str__(self) -> str:
        return ",".join(f"{name}:{extent}" for name, extent in self.groups) + f" lane={self.lane.name}"

    @property
    def threads(self) -> int:
        return self.size * math.prod(e for _, e in self.groups)


def lanes_of(loop: For) -> Lanes | None:
    """The warp grid of a thread loop made by ``bind(L, warp|warpgroup)``, else None."""
    return next((v for k, v in loop.annotations if k in ("warps", "warpgroups") and isinstance(v, Lanes)), None)


def bind_lanes(func: LoopFunc, loop: str, axis: str, span: Span | None, max_threads: int) -> LoopFunc:
    """Bind every loop named ``loop`` (already checked: serial, disjoint iterations) to warps or
    warpgroups (``axis``), joining the warp grid of a thread loop right around it; the joined
    grid holds at most ``max_threads`` threads (the target's ``max_threads_per_block``)."""
    size = LANES[axis]
    _check_place(func, loop, axis, span)
    thread_name, lane_name = fresh(func, f"{loop}_t"), fresh(func, "lane")

    def rewrite(s: Stmt) -> Stmt | None:
        if isinstance(s, For) and s.var.name == loop:
            return _lanes_loop(Var(thread_name), size, ((loop, const_extent(s, span)),), Var(lane_name), s.body, s)
        if isinstance(s, For) and s.kind == "thread.x" and (outer := lanes_of(s)) is not None:
            inner = _inside(s.body, outer)
            if isinstance(inner, For) and inner.kind == "thread.x" and (lanes := lanes_of(inner)) is not None:
                body = subst(_inside(inner.body, lanes), {lanes.lane.name: outer.lane})
                joined = _lanes_loop(s.var, size, outer.groups + lanes.groups, outer.lane, body, s)
                if lanes_of(joined).threads > max_threads:  # type: ignore[union-attr]
                    raise TccScheduleError(f"binding {loop} to {axis}s makes {lanes_of(joined).threads} threads "
                                           f"per block, over {max_threads}", span, f"split {loop} first")
                return joined
        return None
    return replace(func, body=map_stmt(func.body, rewrite))


def _check_place(func: LoopFunc, loop: str, axis: str, span: Span | None) -> None:
    """A loop bound to warps holds no thread loop and is not inside one, unless right inside
    another warp grid of the same kind (which it joins)."""
    kind = "warps" if axis == "warp" else "warpgroups"
    for found in loops_named(func.body, loop):
        inner = next((t for t in walk_stmts(found.body) if isinstance(t, For) and t.kind == "thread.x"), None)
        if inner is not None:
            raise TccScheduleError(f"loop {loop} contains thread loop {inner.var.name}", span,
                                   f"bind the outer loops of the warp grid to {axis}s first, then the inner ones")
    for t in walk_stmts(func.body):
        if not (isinstance(t, For) and t.kind == "thread.x"):
            continue
        lanes = lanes_of(t)
        for found in walk_stmts(t.body):
            if not (isinstance(found, For) and found.var.name == loop):
                continue
            inside = _inside(t.body, lanes) if lanes is not None else None
            if inside is found:
                pass
            elif isinstance(inside, Seq) and found in inside.stmts:
                raise TccScheduleError(f"loop {loop} comes in two copies (a split's main part and its tail) inside "
                                       f"the warp grid of loop {t.var.name}; the grid needs one", span,
                                       f"split {loop} by a factor that divides its extent (the problem's size)")
            else:
                raise TccScheduleError(f"loop {loop} is inside thread loop {t.var.name}", span,
                                       f"bind {loop} to {axis}s before the loops inside it, or right inside "
                                       f"another loop bound to {axis}s")
            if dict(t.annotations).get(kind) is None:
                raise TccScheduleError(f"loop {loop} sits right inside a loop bound to other lanes than {axis}s",
                                       span, "bind the loops of one grid all to warps or all to warpgroups")


def _inside(body: Stmt, lanes: Lanes) -> Stmt:
    """``body`` of a warp-bound thread loop without the ``let``s that bind its grid and lane."""
    names = {name for name, _ in lanes.groups} | {lanes.lane.name}
    while isinstance(body, Let) and body.var.name in names:
        body = body.body
    return body


def _lanes_loop(t: Var, size: int, groups: tuple[tuple[str, int], ...], lane: Var, body: Stmt, old: For) -> For:
    """``for t in 0..size * E1 * E2 ..: let g1 = t // (size * E2 ..); let g2 = ..; let lane = t % size; body``."""
    lanes = Lanes(size, groups, lane)
    inner: Stmt = Let(lane, mod_index(t, size), body)
    stride = size
    for pos, (name, extent) in reversed(list(enumerate(groups))):
        digit: Expr = div_index(t, stride)
        inner = Let(Var(name), digit if pos == 0 else mod_index(digit, extent), inner)
        stride *= extent
    note = "warps" if size == LANES["warp"] else "warpgroups"
    return For(t, Const(lanes.threads, t.dtype), inner, "thread.x", annotations=((note, lanes),), span=old.span)
