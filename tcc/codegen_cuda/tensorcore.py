"""Tensor-core GEMMs: contractions of f16 or bf16 operands, accumulated in f32.

A contraction qualifies (see :func:`operands`) when both factors are 16-bit floats of one type
widened to f32 (``sum[k](f32(A[i, k]) * f32(B[k, j]))``): their products are exact in f32, so
the result is the f32 sum. A sum written over f16 or bf16 tensors (``sum[k](A[i, k] * B[k, j])``)
rounds every product to 16 bits before adding in f32, which tensor cores cannot reproduce; it
stays on the FMA path.

The kernel keeps the tiled GEMM's structure (:mod:`tcc.codegen_cuda.gemm`): 256 threads fill
``BM x BK`` and ``BN x BK`` tiles of the 16-bit operands in shared memory (the reduction index
innermost, zeros outside the problem, so odd sizes need no other path), then the 8 warps
(2 x 4) each multiply a ``BM/2 x BN/4`` piece with ``mma.sync.aligned.m16n8k16`` (inline PTX:
NVRTC's pip wheel has no ``mma.h``) into f32 accumulators held in registers. Fragments are read
from shared memory as 32-bit pairs; a row of ``BK + 8`` halves (20 words) makes those reads
conflict-free. The epilogue runs per accumulator element, at the (row, column) the mma layout
gives it: lane ``l`` holds rows ``l / 4`` and ``l / 4 + 8``, columns ``2 (l % 4)`` and ``+1``.
"""

from __future__ import annotations

from tcc import dtypes
from tcc.codegen_cuda import gemm
from tcc.ir.expr import Call, Cast, Const, Expr, Load, Var, transform
from tcc.ir.loops import Buffer, For, If, Let, Stmt, Store, seq

I64 = dtypes.i64
F32 = dtypes.f32
BK = 32
KPAD = 8  # halves added to each shared row
WARPS_M, WARPS_N = 2, 4  # the 8 warps of a block, as a grid over its tile
TILES = ((128, 128, BK), (128, 64, BK), (64, 128, BK), (64, 64, BK))
MMA = "tcc_mma_tile"  # the Call that codegen turns into the warp's mma.sync sequence


def operands(c: gemm.Contraction) -> tuple[Expr, Expr] | None:
    """The 16-bit values whose products ``c`` sums, when tensor cores can compute it."""
    if c.acc.dtype != F32 or c.add.b.dtype != F32:
        return None
    x, y = _widened(c.x), _widened(c.y)
    return (x, y) if x is not None and y is not None and x.dtype == y.dtype else None


def _widened(e: Expr) -> Expr | None:
    if isinstance(e, Cast) and e.dtype == F32 and e.a.dtype.name in ("f16", "bf16"):
        return e.a
    return None


class Builder(gemm.Builder):
    """A :class:`gemm.Builder` whose products run on tensor cores."""

    tiles = TILES
    double_buffered = True

    def __init__(self, c: gemm.Contraction, fresh, decompose, values: tuple[Expr, Expr]):
        super().__init__(c, fresh, decompose)
        self.xv, self.yv = values
        half = self.xv.dtype
        self.wm, self.wn = self.bm // WARPS_M, self.bn // WARPS_N
        self.mf, self.nf = self.wm // 16, self.wn // 8
        self.k_inner = True  # shared tiles are [slot][tile][BK + KPAD]
        self.xs = Buffer(self.xs.name, half, (2, self.bm, self.bk + KPAD), "shared")
        self.ys = Buffer(self.ys.name, half, (2, self.bn, self.bk + KPAD), "shared")
        self.xst = Buffer(self.xst.name, half, self.xst.shape, "local")
        self.yst = Buffer(self.yst.name, half, self.yst.shape, "local")
        self.acct = Buffer(self.acct.name, F32, (self.mf, self.nf, 4), "local")

    def local_buffers(self) -> tuple[Buffer, ...]:
        return (self.yst, self.xst, self.acct, self.ys, self.xs)

    def _init(self) -> Stmt:
        return self._frag_loops(lambda i, j, e: Store(self.acct.name, (i, j, e), self.c.init))

    def _frag_loops(self, body_fn) -> Stmt:
        i, j, e = self.fresh("fi"), self.fresh("fj"), self.fresh("fe")
        return For(i, Const(self.mf, I64), For(j, Const(self.nf, I64), For(
            e, Const(4, I64), body_fn(i, j, e), "unroll"), "unroll"), "unroll")

    def fills(self, tid: Var, tm0: Var, tn0: Var, k0: Expr, slot: Expr) -> tuple[Stmt, Stmt]:
        x = self._fill(self.xs, self.xst, self.xv, self.c.m_axes, self.m, tid, tm0, k0, slot)
        y = self._fill(self.ys, self.yst, self.yv, self.c.n_axes, self.n, tid, tn0, k0, slot)
        return seq(x[0], y[0]), seq(x[1], y[1])

    def _products(self, ty: Var, tx: Var, slot: Expr) -> Stmt:
        """One call per k-step: the warp's mma.sync over its piece (``ty``: warp, ``tx``: lane)."""
        wr, wc = gemm._mul(gemm._div(ty, WARPS_N), self.wm), gemm._mul(gemm._mod(ty, WARPS_N), self.wn)
        call = Call(MMA, (Load(self.xs.name, (slot, wr, Const(0, I64)), self.xs.dtype),
                          Load(self.ys.name, (slot, wc, Const(0, I64)), self.ys.dtype), tx), F32)
        zero = Const(0, I64)
        return Store(self.acct.name, (zero, zero, zero), call)

    def thread_coords(self, tid: Var) -> tuple[Expr, Expr]:
        return gemm._div(tid, 32), gemm._mod(tid, 32)  # (warp, lane)

    def _epilogue(self, ty: Var, tx: Var, tm0: Var, tn0: Var) -> Stmt:
        c = self.c
        gm, gn = self.fresh("gm"), self.fresh("gn")

        def store(i: Var, j: Var, e: Var) -> Stmt:
            acc = Load(self.acct.name, (i, j, e), F32)
            value = transform(c.final.value, lambda x: acc if gemm._is_acc(x, c.acc) else None)
            body: Stmt = Store(c.final.buffer, c.final.indices, value, c.final.span)
            body = self.decompose(c.n_axes, [gemm._const(f) for f in c.n_axes], gn, body)
            body = self.decompose(c.m_axes, [gemm._const(f) for f in c.m_axes], gm, body)
            cond = gemm._in_range([(gm, self.m, self.m % self.bm == 0), (gn, self.n, self.n % self.bn == 0)])
            if cond is not None:
                body = If(cond, body)
            row = gemm._add(gemm._add(tm0, gemm._mul(gemm._div(ty, WARPS_N), self.wm)), gemm._add(
                gemm._mul(i, 16), gemm._add(gemm._div(tx, 4), gemm._mul(gemm._div(e, 2), 8))))
            col = gemm._add(gemm._add(tn0, gemm._mul(gemm._mod(ty, WARPS_N), self.wn)), gemm._add(
                gemm._mul(j, 8), gemm._add(gemm._mul(gemm._mod(tx, 4), 2), gemm._mod(e, 2))))
            return Let(gm, row, Let(gn, col, body))
        return self._frag_loops(store)


def mma_source(acc: str, xs: str, ys: str, lane: str, bufs: tuple[Buffer, Buffer, Buffer]) -> str:
    """The C call for the ``tcc_mma_tile`` Call: template arguments from the buffers' shapes."""
    acct, xbuf, ybuf = bufs
    mf, nf = acct.shape[0], acct.shape[1]
    ld = xbuf.shape[-1]
    kind = 1 if xbuf.dtype.name == "bf16" else 0
    return f"tcc_mma_tile<{mf}, {nf}, {ld}, {ld - KPAD}, {kind}>({acc}, {xs}, {ys}, (int){lane});"


PREAMBLE = r"""// A warp's tensor-core products for one k-step: acc[MF][NF][4] += xs[MF*16][BK] * ys[NF*8][BK]^T
// (both tiles in shared memory, k innermost, rows LD halves apart). KIND 0: f16, 1: bf16.
template <int MF, int NF, int LD, int BK, int KIND>
TCC_D void tcc_mma_tile(float* acc, const unsigned short* xs, const unsigned short* ys, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int k0 = 0; k0 < BK; k0 += 16) {
    unsigned a[MF][4], b[NF][2];
#pragma unroll
    for (int i = 0; i < MF; ++i) {
      const unsigned short* p = xs + (i * 16 + g) * LD + k0 + 2 * t;
      a[i][0] = *(const unsigned*)(p);
      a[i][1] = *(const unsigned*)(p + 8 * LD);
      a[i][2] = *(const unsigned*)(p + 8);
      a[i][3] = *(const unsigned*)(p + 8 * LD + 8);
    }
#pragma unroll
    for (int j = 0; j < NF; ++j) {
      const unsigned short* q = ys + (j * 8 + g) * LD + k0 + 2 * t;
      b[j][0] = *(const unsigned*)(q);
      b[j][1] = *(const unsigned*)(q + 8);
    }
#pragma unroll
    for (int i = 0; i < MF; ++i) {
#pragma unroll
      for (int j = 0; j < NF; ++j) {
        float* c = acc + (i * NF + j) * 4;
        if (KIND == 0) {
          asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                       "{%8,%9}, {%0,%1,%2,%3};"
                       : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                       : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]), "r"(b[j][1]));
        } else {
          asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                       "{%8,%9}, {%0,%1,%2,%3};"
                       : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                       : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]), "r"(b[j][1]));
        }
      }
    }
  }
}
"""
