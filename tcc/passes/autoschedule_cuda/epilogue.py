"""An element-wise statement over a reduction's result joins the reduction's final store.

Fusion inlines an intermediate into its consumer only where that does not repeat work; a
reduction read at two places stays its own statement (``Z = sum[k](X * W) + b`` read twice by
a GELU). On the CPU the GEMM schedule then groups the two nests; on the GPU each nest was a
kernel, so the contraction wrote ``Z`` (64 MB for 4096 x 4096 f32) and a second kernel read it
back: a third of a half-precision GEMM's speed. Here, before the GPU schedule, a nest that only
computes ``Y[i...] = f(Z[i...], ...)`` element by element right after the nest that reduces into
``Z``, over the same loops, becomes that nest's final store: ``Y[i...] = f(value, ...)`` where
``value`` is what the reduction nest stored (the accumulator and its epilogue: ``acc + b``), so
``f`` runs on the accumulator in registers, and ``Z`` (a global intermediate no other nest reads)
is never written.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.ir.expr import Load, Var, substitute, transform, walk
from tcc.ir.loopnest import loads, stores
from tcc.ir.loops import Allocate, Buffer, For, Seq, Stmt, Store, holds_sequential


def fuse(nests: list[Stmt], temps: list[Buffer]) -> list[Stmt]:
    """``nests`` with each element-wise consumer of a reduction nest's intermediate folded into
    that nest's final store (the intermediate dropped from ``temps``)."""
    out: list[Stmt] = []
    for nest in nests:
        fused = _fold(out[-1], nest, temps, nests) if out else None
        if fused is None:
            out.append(nest)
        else:
            out[-1] = fused
    return out


def _fold(producer: Stmt, consumer: Stmt, temps: list[Buffer], nests: list[Stmt]) -> Stmt | None:
    """The producer with the consumer as its final store, or None where that could change a result."""
    p_axes, p_body = _loops(producer)
    c_axes, c_body = _loops(consumer)
    final = _final_store(p_body)
    if final is None or not isinstance(c_body, Store) or c_body.accumulate \
            or [f.extent for f in p_axes] != [f.extent for f in c_axes]:
        return None
    temp = next((b for b in temps if b.name == final.buffer), None)
    reads = [n for n in walk(c_body.value) if isinstance(n, Load) and n.buffer == final.buffer]
    others = [n for n in nests if n is not producer and n is not consumer]
    if temp is None or final.indices != tuple(_vars(p_axes)) or not reads \
            or any(r.indices != tuple(_vars(c_axes)) for r in reads) or c_body.buffer == temp.name \
            or _touches(producer, c_body.buffer) or any(_touches(n, temp.name) for n in others) \
            or any(n.buffer == temp.name for n in loads(producer)) or holds_sequential(producer):
        return None  # Z read elsewhere, at another element or by its own recurrence; Y read by the reduction
    rename = {g.var.name: v for g, v in zip(c_axes, _vars(p_axes))}
    value = transform(c_body.value, lambda n: final.value if isinstance(n, Load) and n.buffer == temp.name else None)
    store = Store(c_body.buffer, tuple(substitute(i, rename) for i in c_body.indices), substitute(value, rename),
                  span=c_body.span)
    temps.remove(temp)
    return _replace_final(producer, store)


def _loops(nest: Stmt) -> tuple[list[For], Stmt]:
    axes = []
    while isinstance(nest, For) and nest.kind == "serial":
        axes.append(nest)
        nest = nest.body
    return axes, nest


def _vars(axes: list[For]) -> list[Var]:
    return [Var(f.var.name, f.var.dtype) for f in axes]


def _final_store(body: Stmt) -> Store | None:
    """The last statement of a reduction nest (``acc = init; for k: acc = acc (op) v; final``)."""
    if not (isinstance(body, Allocate) and body.buffer.scope == "local" and isinstance(body.body, Seq)
            and len(body.body.stmts) == 3):
        return None
    init, red, final = body.body.stmts
    if not (isinstance(init, Store) and init.buffer == body.buffer.name and isinstance(red, For)
            and isinstance(final, Store) and not final.accumulate and final.buffer != body.buffer.name):
        return None
    return final


def _replace_final(producer: Stmt, store: Store) -> Stmt:
    if isinstance(producer, For):
        return replace(producer, body=_replace_final(producer.body, store))
    assert isinstance(producer, Allocate) and isinstance(producer.body, Seq)
    init, red, _ = producer.body.stmts
    return replace(producer, body=Seq((init, red, store)))


def _touches(s: Stmt, name: str) -> bool:
    return any(n.buffer == name for n in loads(s)) or any(st.buffer == name for st in stores(s))
