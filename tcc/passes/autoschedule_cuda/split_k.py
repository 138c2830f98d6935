"""Split-K: contractions whose output tiles are too few to fill the GPU, their reduction cut
into chunks across blocks (deterministic: two kernels, no atomics).

``C[m, n] = sum[k](A[m, k] * B[k, n])`` with M = N = 128 and K = 65536 gives the tiled GEMM
(:mod:`.gemm`) one to sixteen blocks for a chip of 132 multiprocessors. Here, when the ordinary
grid leaves some of them idle and the reduction is long, its ``ceil(K / BK)`` k-steps are cut
into ``S`` chunks of whole k-steps, as many as fit one wave of blocks on the multiprocessors
and no more (one block past that is a second wave that doubles the time:
the weight gradient of a 3x3 64->64 convolution at batch 8 took 0.21 ms in 135 blocks, 0.15 ms
in 130 or 255, on an H200):

* kernel 1: the tiled GEMM, one block per (tile, chunk), the chunk's k-steps only; each block
  stores its raw accumulators (no epilogue) into the global intermediate
  ``partial[S, <output axes>]``;
* kernel 2: one thread per output element (the flat schedule) adds the ``S`` partials in chunk
  order to the accumulator's initial value, then runs the nest's final store (bias, relu,
  casts: its epilogue).

Only the order of the additions changes, and it is the same on every run. The tile is the
largest that fits the problem: with few tiles the grid comes from the chunks, and a big tile
reads each operand fewer times. The last chunk's k-steps past the reduction load zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, Load
from tcc.ir.loopnest import add_index, mul_index
from tcc.ir.loops import Allocate, Buffer, For, Let, Stmt, Store, seq
from tcc.passes.autoschedule_cuda import gemm
from tcc.passes.autoschedule_cuda.indexing import as_expr, hint, product, size_of
from tcc.target import CudaTarget

I64 = dtypes.i64
MIN_CHUNK_STEPS = 16  # k-steps a chunk walks at least: shorter chunks make kernel 2 dominate
SPLIT_COST = 1.25  # the second kernel and the partials' traffic, against the estimate of the first


@dataclass(frozen=True)
class Plan:
    """How one contraction is split: its tile ``(BM, BN, BK)``, ``chunks`` of ``steps`` k-steps."""

    tile: tuple[int, int, int]
    chunks: int
    steps: int


def plan(c: gemm.Contraction, target: CudaTarget, tile: tuple[int, int, int] | None = None) -> Plan | None:
    """The split of ``c`` for ``target``'s multiprocessors (``tile``: the tuner's), or None
    where the ordinary grid does as well (:func:`_time`), the reduction is short, or the
    accumulator does not start at zero (each chunk would add its start once more)."""
    k = c.size(c.k_axes)
    if not isinstance(k, int):
        return None  # (chunks of whole k-steps: a constant reduction)
    m, n, batch = (hint(c.size(axes)) for axes in (c.m_axes, c.n_axes, c.batch_axes))  # (a dynamic one's hint)
    sms = target.sms
    if not (isinstance(c.init, Const) and c.init.value == 0):
        return None
    ordinary = tile or gemm.choose_tile(m, n, batch, sms=sms)
    tile = tile or gemm.choose_tile(m, n, batch, sms=1)  # the largest that fits the problem
    steps, grid = -(-k // tile[2]), _grid(tile, m, n, batch)
    # one wave: a block per SM where the tiles divide the SMs, else as many per SM as fit at once
    # (gemm.resident_blocks: two on an H100, so fewer are left idle:
    # five tiles on 132 SMs are 130 blocks or 260 of 264; the weight gradient above ran 0.159 ms
    # in 130 and 0.150 in 255), as fewer, longer chunks write fewer partials (one 128 x 128 tile
    # over K = 65536: 0.074 ms in 128 chunks, 0.098 ms in 256, on an H200)
    per_sm = 1 if sms % grid == 0 else gemm.resident_blocks(target)
    s = min(sms * per_sm // grid, steps // MIN_CHUNK_STEPS)
    if s < 2:
        return None
    per = -(-steps // s)
    split = Plan(tile, -(-steps // per), per)
    plain = _time(ordinary, _grid(ordinary, m, n, batch), -(-k // ordinary[2]), sms)
    if _time(tile, grid * split.chunks, per, sms) * SPLIT_COST > plain:
        return None
    return split


def _time(tile: tuple[int, int, int], blocks: int, steps: int, sms: int) -> float:
    """A kernel's time in units of one thread's shared-memory loads: the blocks a multiprocessor
    runs, each ``steps`` k-steps of BK products over the tile, at the products per load of its
    register tile (a 2 x 2 thread tile does one, 8 x 8 four). The ordinary grid may fill the chip
    only with 32 x 32 tiles: ResNet-18's 512-channel convolutions at batch 8 ran 208 such blocks in
    0.32 ms on an H200."""
    tm, tn = tile[0] // gemm.SIDE, tile[1] // gemm.SIDE
    return -(-blocks // sms) * tile[0] * tile[1] * steps * tile[2] * (tm + tn) / (tm * tn)


def _grid(tile: tuple[int, int, int], m: int, n: int, batch: int) -> int:
    return batch * -(-m // tile[0]) * -(-n // tile[1])


def partials(c: gemm.Contraction, axes: list[For], p: Plan, fresh) -> Buffer:
    """The global intermediate of kernel 1's partial tiles: ``[chunk, <output axes>]``."""
    return Buffer(fresh("partial").name, c.acc.dtype, (p.chunks, *(gemm._const(f) for f in axes)))


class Builder(gemm.Builder):
    """Kernel 1: the FMA tiled GEMM over one chunk of k-steps per block, into ``partial``."""

    def __init__(self, c: gemm.Contraction, fresh, decompose, p: Plan, axes: list[For], partial: Buffer,
                 target: CudaTarget, stages: int | None = None):
        super().__init__(c, fresh, decompose, target, p.tile, stages)
        self.plan, self.axes, self.partial = p, axes, partial
        self.chunk = fresh("chunk")

    def kernel(self) -> Stmt:
        """The tiled kernel's blocks, once per chunk: block ``bx`` runs tile ``bx % tiles`` over
        chunk ``bx // tiles`` (``tiles`` counted at the call where M, N or the batch is dynamic)."""
        tiled = super().kernel()
        assert isinstance(tiled, For)
        tiles = size_of(tiled)
        bx = self.fresh("bx")
        body = Let(self.chunk, gemm.div_size(bx, tiles), Let(tiled.var, gemm.mod_size(bx, tiles), tiled.body))
        return For(bx, as_expr(product([tiles, self.plan.chunks])), body, "block.x", annotations=tiled.annotations,
                   span=tiled.span)

    def k_steps(self) -> int:
        return self.plan.steps

    def k_start(self, k0: Expr) -> Expr:
        return add_index(mul_index(self.chunk, self.plan.steps * self.bk), k0)

    def k_covered(self) -> bool:
        return self.plan.chunks * self.plan.steps * self.bk == self.k

    def result(self, acc: Expr) -> Stmt:
        return Store(self.partial.name, (self.chunk, *(f.var for f in self.axes)), acc, self.c.final.span)


def combine(c: gemm.Contraction, axes: list[For], p: Plan, partial: Buffer, fresh) -> Stmt:
    """Kernel 2's body for one output element (inside ``axes``): the accumulator from its start
    plus the chunks' partials in chunk order, then the nest's final store."""
    q, zero = fresh("q"), (Const(0, I64),)
    acc = Load(c.acc.name, zero, c.acc.dtype)
    part = Load(partial.name, (q, *(f.var for f in axes)), partial.dtype)
    add = Store(c.acc.name, zero, Binary("add", acc, part, c.add.dtype), c.final.span)
    return Allocate(c.acc, seq(Store(c.acc.name, zero, c.init), For(q, Const(p.chunks, I64), add), c.final))
