"""Tensor-core GEMMs: contractions of f16 or bf16 operands, accumulated in f32.

A contraction qualifies (see :func:`operands`) when both factors are 16-bit floats of one type
widened to f32 (``sum[k](f32(A[i, k]) * f32(B[k, j]))``): their products are exact in f32, so
the result is the f32 sum. A sum written over f16 or bf16 tensors (``sum[k](A[i, k] * B[k, j])``)
rounds every product to 16 bits before adding in f32, which tensor cores cannot reproduce; it
stays on the FMA path.

The kernel keeps the tiled GEMM's structure (:mod:`tcc.passes.autoschedule_cuda.gemm`): 256 threads fill
``BM x BK`` and ``BN x BK`` tiles of the 16-bit operands in shared memory (the reduction index
innermost, zeros outside the problem, so odd sizes need no other path), then the 8 warps
(2 x 4) each multiply a ``BM/2 x BN/4`` piece with ``mma.sync.aligned.m16n8k16`` (inline PTX:
NVRTC's pip wheel has no ``mma.h``) into f32 accumulators held in registers. Fragments are read
from shared memory as 32-bit pairs; a row of ``BK + 8`` halves (20 words) makes those reads
conflict-free. The epilogue runs per accumulator element, at the (row, column) the mma layout
gives it: lane ``l`` holds rows ``l / 4`` and ``l / 4 + 8``, columns ``2 (l % 4)`` and ``+1``.

**The copy-engine kernel.** Where each operand is one tensor read with unit stride along the
reduction (``A[.., i, k]``) or, for ``y``, along ``N`` (``B[.., k, j]``), with every row 16-byte
aligned (:func:`fast_layout`), the main loop is :data:`MAIN` instead: 16-byte ``cp.async`` copies
straight from global to shared memory (zero-filled outside the problem), two stages so the next
tile's copy overlaps this tile's products, and fragments read with ``ldmatrix`` (``.trans`` for a
``[k][n]`` tile). It assumes 16-byte aligned base pointers; the launcher checks them and runs the
register-staged kernel (scheduled right after it) when they are not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tcc import dtypes
from tcc.ir.expr import Call, Cast, Const, Expr, Load, Var, transform
from tcc.ir.loops import Buffer, For, If, Let, Stmt, Store, seq
from tcc.passes.autoschedule_cuda import gemm

I64 = dtypes.i64
F32 = dtypes.f32
BK = 32
KPAD = 8  # halves added to each shared row
WARPS_M, WARPS_N = 2, 4  # the 8 warps of a block, as a grid over its tile
TILES = ((128, 128, BK), (128, 64, BK), (64, 128, BK), (64, 64, BK))
MMA = "tcc_mma_tile"  # the Call that codegen turns into the warp's mma.sync sequence
MAIN = "tcc_tc_main"  # the Call that codegen turns into the whole cp.async / ldmatrix main loop
CHUNK = 8  # halves per 16-byte copy


@dataclass(frozen=True)
class FastLayout:
    """How the copy-engine kernel reads its operands: base loads (batch offsets only) and strides."""

    x: Load  # x at m = k = 0
    y: Load  # y at n = k = 0
    lda: int  # halves between rows of x (one m step)
    ldb: int  # halves between rows of y: one k step (k_fast False) or one n step (k_fast True)
    k_fast: bool  # y contiguous along k (a [n][k] tile) rather than along n (a [k][n] tile)


def fast_layout(c: gemm.Contraction, values: tuple[Expr, Expr],
                shapes: dict[str, tuple[int, ...]]) -> FastLayout | None:
    """The copy-engine layout of ``c``'s operands, or None when its loads do not fit it."""
    if len(c.m_axes) != 1 or len(c.n_axes) != 1 or len(c.k_axes) != 1:
        return None
    m, n, k = c.m_axes[0].var, c.n_axes[0].var, c.k_axes[0].var
    batch = {f.var.name for f in c.batch_axes}
    x = _strides(values[0], shapes, m, k, batch)
    y = _strides(values[1], shapes, n, k, batch)
    size_k, size_n = c.size(c.k_axes), c.size(c.n_axes)
    if x is None or y is None or x[1] != 1 or size_k % CHUNK:
        return None
    k_fast = y[1] == 1
    if not k_fast and (y[0] != 1 or size_n % CHUNK):
        return None  # y must be contiguous along k, or along n in whole 16-byte pieces
    return FastLayout(x[2], y[2], x[0], y[0] if k_fast else y[1], k_fast)


def _strides(value: Expr, shapes: dict[str, tuple[int, ...]], row: Var, k: Var,
             batch: set[str]) -> tuple[int, int, Load] | None:
    """(stride of ``row``, stride of ``k``, the load at row = k = 0) for a plain read
    ``T[..]`` indexed by bare loop variables, every stride but 1 a multiple of 8 halves."""
    if not isinstance(value, Load) or value.buffer not in shapes:
        return None
    shape = shapes[value.buffer]
    names = [i.name if isinstance(i, Var) else None for i in value.indices]
    if None in names or len(set(names)) != len(names) or len(shape) != len(names):
        return None
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    where = {name: s for name, s in zip(names, strides)}
    if row.name not in where or k.name not in where or any(
            name not in batch | {row.name, k.name} for name in names):
        return None
    if any(s % CHUNK for s in strides if s != 1):
        return None
    zero = Const(0, I64)
    base = tuple(zero if name in (row.name, k.name) else i for name, i in zip(names, value.indices))
    return where[row.name], where[k.name], Load(value.buffer, base, value.dtype)


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

    def __init__(self, c: gemm.Contraction, fresh, decompose, values: tuple[Expr, Expr],
                 fast: FastLayout | None = None, sms: int = gemm.SMS):
        super().__init__(c, fresh, decompose, sms)
        self.xv, self.yv = values
        self.fast = fast
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
        if self.fast is not None:  # MAIN declares its own shared tiles
            return (self.acct,)
        return (self.yst, self.xst, self.acct, self.ys, self.xs)

    def kernel(self) -> Stmt:
        k = super().kernel()
        return k if self.fast is None else replace(k, annotations=(("aligned", True),))

    def _main_loop(self, tid: Var, ty: Var, tx: Var, tm0: Var, tn0: Var) -> Stmt:
        f = self.fast
        if f is None:
            return super()._main_loop(tid, ty, tx, tm0, tn0)
        consts = (self.bm, self.bn, self.m, self.n, self.k, f.lda, f.ldb, int(f.k_fast),
                  int(self.xv.dtype.name == "bf16"))
        call = Call(MAIN, (f.x, f.y, tm0, tn0, tid, *(Const(v, I64) for v in consts)), F32)
        zero = Const(0, I64)
        return Store(self.acct.name, (zero, zero, zero), call)

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


def main_source(acc: str, x: str, y: str, args: list[str]) -> str:
    """The C call for the ``tcc_tc_main`` Call: (tm0, tn0, tid) then its template arguments."""
    tm0, tn0, tid, *consts = args
    values = ", ".join(str(int(v.rstrip("L"))) for v in consts)
    return f"{MAIN}<{values}>({acc}, {x}, {y}, (int){tm0}, (int){tn0}, (int){tid});"


PREAMBLE = r"""// One m16n8k16 product into c[4] (f32); a[4], b[2] hold the f16 (KIND 0) or bf16 (KIND 1) fragments.
template <int KIND> TCC_D void tcc_mma16816(float* c, const unsigned* a, const unsigned* b) {
  if (KIND == 0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}
// A warp's tensor-core products for one k-step: acc[MF][NF][4] += xs[MF*16][BK] * ys[NF*8][BK]^T
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
      for (int j = 0; j < NF; ++j) tcc_mma16816<KIND>(acc + (i * NF + j) * 4, a[i], b[j]);
    }
  }
}
TCC_D unsigned tcc_smem(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
TCC_D void tcc_cp16(void* dst, const void* src, bool full) {  // 16 bytes, zeros when !full
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(tcc_smem(dst)), "l"(src), "r"(full ? 16 : 0));
}
TCC_D void tcc_ldsm4(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tcc_smem(p)));
}
TCC_D void tcc_ldsm4t(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tcc_smem(p)));
}
// The whole main loop of a block: acc[MF][NF][4] += A[tm0.., :] * B (k-major [k][n], or [n][k] with BKF).
// A is [M][K] with rows LDA halves apart; B's rows (k, or n with BKF) are LDB apart; 8 warps as 2 x 4.
template <int BM, int BN, int M, int N, int K, int LDA, int LDB, int BKF, int KIND>
TCC_D void tcc_tc_main(float* acc, const unsigned short* A, const unsigned short* B, int tm0, int tn0, int tid) {
  constexpr int BK = 32, LX = BK + 8, YR = BKF ? BN : BK, LY = BKF ? BK + 8 : BN + 8;
  constexpr int WM = BM / 2, WN = BN / 4, MF = WM / 16, NF = WN / 8, STEPS = (K + BK - 1) / BK;
  static_assert(BM * BK / 8 % 256 == 0 && BN * BK / 8 % 256 == 0 && NF % 2 == 0, "tile shape");
  __shared__ __align__(16) unsigned short xs[2][BM * LX];
  __shared__ __align__(16) unsigned short ys[2][YR * LY];
  const int lane = tid & 31, wr = (tid >> 7) * WM, wc = ((tid >> 5) & 3) * WN;
  auto load = [&](int kt, int s) {
    const int k0 = kt * BK;
#pragma unroll
    for (int i = 0; i < BM * BK / 8 / 256; ++i) {
      const int c = tid + i * 256, r = c >> 2, kc = (c & 3) * 8, gm = tm0 + r, gk = k0 + kc;
      const bool in = gm < M && gk < K;
      tcc_cp16(&xs[s][r * LX + kc], in ? A + (long long)gm * LDA + gk : A, in);
    }
#pragma unroll
    for (int i = 0; i < BN * BK / 8 / 256; ++i) {
      const int c = tid + i * 256;
      if (BKF) {
        const int r = c >> 2, kc = (c & 3) * 8, gn = tn0 + r, gk = k0 + kc;
        const bool in = gn < N && gk < K;
        tcc_cp16(&ys[s][r * LY + kc], in ? B + (long long)gn * LDB + gk : B, in);
      } else {
        const int r = c / (BN / 8), nc = (c % (BN / 8)) * 8, gk = k0 + r, gn = tn0 + nc;
        const bool in = gk < K && gn < N;
        tcc_cp16(&ys[s][r * LY + nc], in ? B + (long long)gk * LDB + gn : B, in);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  load(0, 0);
  for (int kt = 0; kt < STEPS; ++kt) {
    if (kt + 1 < STEPS) {
      load(kt + 1, (kt + 1) & 1);
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    __syncthreads();
    const unsigned short* X = xs[kt & 1];
    const unsigned short* Y = ys[kt & 1];
#pragma unroll
    for (int k0 = 0; k0 < BK; k0 += 16) {
      unsigned a[MF][4], b[NF][2];
#pragma unroll
      for (int i = 0; i < MF; ++i) tcc_ldsm4(a[i], X + (wr + i * 16 + (lane & 15)) * LX + k0 + (lane >> 4) * 8);
#pragma unroll
      for (int j = 0; j < NF; j += 2) {
        unsigned r[4];
        if (BKF) {
          tcc_ldsm4(r, Y + (wc + j * 8 + (lane & 7) + (lane >> 4) * 8) * LY + k0 + ((lane >> 3) & 1) * 8);
        } else {
          tcc_ldsm4t(r, Y + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LY + wc + j * 8 + (lane >> 4) * 8);
        }
        b[j][0] = r[0]; b[j][1] = r[1]; b[j + 1][0] = r[2]; b[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < MF; ++i) {
#pragma unroll
        for (int j = 0; j < NF; ++j) tcc_mma16816<KIND>(acc + (i * NF + j) * 4, a[i], b[j]);
      }
    }
    __syncthreads();
  }
}
"""
