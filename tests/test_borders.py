"""Window reductions over a padded tensor run their interior without bound checks
(passes/autoschedule_cpu/borders.py): every output element checked against the reference,
where the windows reach the padding on one side, both, or everywhere."""

import pytest
from helpers import check_op

import tcc
from tcc.ir.expr import Select, walk
from tcc.ir.loops import For, Store, walk_stmts
from tcc.passes.autoschedule_cpu.borders import peel_borders

POOLS = """
op max_pool[S = 2, P = 1, K = 3](X: f32[N, C, H, W]) -> Y: f32[N, C, (H + 2*P - K) // S + 1, (W + 2*P - K) // S + 1] {
    Xp = pad(X, [0, 0, P, P], value=(-1e400))
    Y[n, c, y, x] = max[r: K, s: K](Xp[n, c, y*S + r, x*S + s])
}
op avg_pool[S = 1, P = 1, K = 3](X: f32[N, C, H, W]) -> Y: f32[N, C, (H + 2*P - K) // S + 1, (W + 2*P - K) // S + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, c, y, x] = sum[r: K, s: K](Xp[n, c, y*S + r, x*S + s]) / 9.0
}
op lopsided(X: f32[N, C, H, W]) -> Y: f32[N, C, H + 2, (W - 1) // 2] {
    Xp = pad(X, [0, 0, 0, 2], [0, 0, 4, 0], value=0.5)
    Y[n, c, y, x] = max[r: 3, s: 3](Xp[n, c, y + r, x*2 + s*2]) + max(Xp[n, c, y, x*2], 0.0)
}
op skewed(X: f32[H, V]) -> Y: f32[H, V - H + 1] {
    Xp = pad(X, [1, 1], [1, 2], value=(-1e400))
    Y[y, x] = max[r: 3](Xp[y + r, x - y + r + H])
}
"""


@pytest.mark.parametrize("name, n, c, h, w, s, p", [
    ("max_pool", 1, 64, 112, 112, 2, 1),  # ResNet-18's stem pool
    ("max_pool", 2, 3, 33, 17, 2, 1), ("max_pool", 1, 7, 7, 40, 1, 1), ("max_pool", 1, 1, 1, 1, 1, 1),
    ("max_pool", 1, 5, 2, 2, 2, 1),  # every window reaches the padding: no interior
    ("avg_pool", 1, 7, 33, 33, 1, 1), ("avg_pool", 3, 2, 9, 64, 2, 1), ("avg_pool", 1, 1, 5, 1, 1, 1),
    ("lopsided", 1, 3, 17, 33, 1, 0), ("lopsided", 2, 1, 1, 7, 1, 0), ("lopsided", 1, 2, 40, 70, 1, 0),
    ("skewed", 1, 1, 9, 17, 1, 0), ("skewed", 1, 1, 40, 33, 1, 0),  # column checks on x - y: rows peeled first
])
def test_pools_match_the_reference(rng, name, n, c, h, w, s, p):
    bindings = {"H": h, "V": w + h} if name == "skewed" else {"N": n, "C": c, "H": h, "W": w} \
        | ({"S": s, "P": p} if name != "lopsided" else {})
    check_op(POOLS, name, bindings, rng)


def _scheduled(name: str, **bindings: int):
    op = tcc.compile(POOLS)[name]
    return op.lowered({**op.te.cparams, **bindings}).scheduled


def _guarded_updates(body) -> list[bool]:
    """For each accumulator update of the max pool, whether it still reads through a select."""
    return [any(isinstance(e, Select) for e in walk(st.value)) for st in walk_stmts(body)
            if isinstance(st, Store) and any(getattr(e, "buffer", None) == st.buffer for e in walk(st.value))]


def test_the_stem_pool_interior_has_no_checks():
    updates = _guarded_updates(_scheduled("max_pool", N=1, C=64, H=112, W=112).body)
    assert False in updates and True in updates  # an unguarded interior, guarded borders


def test_copies_through_a_pad_are_not_peeled():
    """An im2col-like gather (no accumulator) is left to the GEMM schedule's packing."""
    op = tcc.compile("""
op shifted(X: f32[H, W]) -> Y: f32[H, W] {
    Xp = pad(X, [1, 1])
    Y[y, x] = Xp[y, x] + Xp[y + 2, x + 2]
}
""").shifted
    loops = op.lowered({"H": 40, "W": 40}).loops
    assert peel_borders(loops) == loops
    assert sum(isinstance(n, For) for n in walk_stmts(loops.body)) == 2
