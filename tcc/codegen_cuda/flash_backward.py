"""FlashAttention-2's backward pass on the matrix units (``mma.sync``, sm_80 and later): the device
functions a kernel calls to get ``dQ``, ``dK`` and ``dV`` of ``O = softmax(score(Q K^T)) V`` from the
row log-sum-exp the forward saved, never holding the ``S x L`` probabilities in memory.

Written in CUDA C next to :mod:`.flash` (whose helpers it reuses: ``tcc_cp16``/``tcc_copy16``,
``tcc_ldsm4``, ``tcc_mma16816``, ``tcc_pack2``, the swizzled rows of ``tcc_swz``) for the same
reason: its heart is register-level. The transposed scores ``S^T = K Q^T`` a warp's ``mma.sync``
leaves in its accumulators become the probabilities ``P^T`` and the score gradients
``dS^T = P^T * (dP^T - Delta)`` in place, and repacked as A operands they feed ``dV += P^T dO`` and
``dK += dS^T Q`` without leaving the registers (the m16n8 accumulator layout of two adjacent tiles
is the m16n8k16 A layout).

Layout (one block per tile of ``BN = 16 * WARPS`` keys): the block's K and V tiles are copied once
into shared memory and each warp owns 16 of their keys, its ``dK`` and ``dV`` rows accumulated in
f32 registers. The block walks the query tiles of ``BM`` rows (Q, dO, and the rows' log-sum-exp
and ``Delta``) through two shared-memory slots with ``cp.async`` (the next tile's copy overlaps
this tile's products). ``dQ = dS K`` sums over the keys, which the warps split, so ``dS`` goes
through shared memory once (``[query][key]``, swizzled) and the block computes its ``BM x D`` share
of ``dQ`` split anew over the warps (row groups of 16 x column groups), adding it into an f32
accumulator in global memory (``red.global.add``; a later kernel converts it). ``Delta =
rowsum(dO * O)`` comes from :func:`tcc_flash_bwd_delta`, run before.

What varies per program comes in as lambdas, as in the forward: where a row of Q, K, V or dO
starts, the score of a dot product (``dS`` is scaled by ``scale``, the derivative of the score in
the dot product: scores linear in it, plus terms that do not depend on Q or K), the key limit of a
row (causal: ``i + 1``; it must not decrease with the row, which lets a block skip the query tiles
that see none of its keys, the tiles above the diagonal), the row's log-sum-exp in natural-log
units (tcc's forward saves the shift ``m`` and the sum ``l``: ``m + log(l)``), ``Delta``, the row of
the ``dQ`` accumulator, and the stores of ``dK`` and ``dV``. Keys past ``n_k``, rows past ``n_q`` and
pairs past a row's limit have zero probability; the tiles where no row or key needs the test skip
it.
"""

from __future__ import annotations

from tcc.codegen_cuda.flash import FLASH
from tcc.codegen_cuda.preamble import PREAMBLE
from tcc.passes.autoschedule_cuda.attention_backward import shared_bytes as shared_bytes

DELTA_THREADS = 256  # a block of tcc_flash_bwd_delta: 256 / (D / 8) rows
# (BM, WARPS) by head dimension that ptxas fits in 255 registers without spills (sm_90, f16 and bf16;
# tests/test_flash_backward.py keeps them so): D 128 holds dK and dV (128 floats a thread) and so
# takes 32 query rows a step (BM 64 spills)
# (the scheduler's pick per row length: tcc.passes.autoschedule_cuda.attention_backward.TILES)
TILES: dict[int, tuple[tuple[int, int], ...]] = {64: ((64, 4), (64, 8)), 128: ((32, 4), (32, 8))}

FLASH_BACKWARD = r"""
// FlashAttention-2's backward (tcc/codegen_cuda/flash_backward.py); uses the forward's helpers (flash.py).
TCC_D void tcc_red_add2(float* at, float a, float b) {  // at[0] += a, at[1] += b (8-byte aligned)
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(at), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(at, a);
  atomicAdd(at + 1, b);
#endif
}
// Delta[i] = sum[d](dO[i, d] * O[i, d]) for the rows i0 + threadIdx.x / (D / 8): D / 8 lanes a row.
template <int D, bool BF16, typename ORow, typename DORow, typename Out>
TCC_D void tcc_flash_bwd_delta(long long i0, long long n_q, ORow orow, DORow dorow, Out out) {
  constexpr int CH = D / 8;
  static_assert(32 % CH == 0, "a row's lanes are part of one warp");
  const long long i = i0 + threadIdx.x / CH;
  const int c = threadIdx.x % CH;
  float acc = 0.f;
  if (i < n_q) {
    const unsigned short* o = orow(i) + c * 8;
    const unsigned short* g = dorow(i) + c * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      acc += BF16 ? tcc_bf16_to_f32(o[e]) * tcc_bf16_to_f32(g[e]) : tcc_f16_to_f32(o[e]) * tcc_f16_to_f32(g[e]);
  }
#pragma unroll
  for (int m = CH / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (c == 0 && i < n_q) out(i, acc);
}
// dK, dV of the keys k0 .. k0 + 16 * WARPS and this block's share of dQ (added into its accumulator).
template <int D, int BM, int WARPS, bool BF16, bool ALIGNED, typename QRow, typename KRow, typename VRow,
          typename DORow, typename Score, typename Limit, typename Lse, typename Delta, typename DQRow,
          typename DKOut, typename DVOut>
TCC_D void tcc_flash_bwd(unsigned char* smem, long long k0, long long n_q, long long n_k, float scale, QRow qrow,
                         KRow krow, VRow vrow, DORow dorow, Score score, Limit limit, Lse lse, Delta delta,
                         DQRow dq_row, DKOut dk_out, DVOut dv_out) {
  constexpr int BN = 16 * WARPS, CH = D / 8, THREADS = 32 * WARPS, NQ = BM / 8, DT = D / 8, KT = D / 16;
  constexpr int RG = BM / 16, CG = WARPS / RG, DC = D / CG;  // dQ's split: row groups x column groups
  static_assert(BM % 16 == 0 && BN >= 64 && WARPS % RG == 0 && DC % 16 == 0, "an unsupported tile shape");
  constexpr float LOG2E = 1.4426950408889634f;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr unsigned v_off = BN * D * 2, q_off = 2 * BN * D * 2, o_off = q_off + 2 * BM * D * 2;
  constexpr unsigned ds_off = o_off + 2 * BM * D * 2, st_off = ds_off + BM * BN * 2;
  const unsigned s_k = tcc_smem(smem), s_v = s_k + v_off, s_q = s_k + q_off, s_o = s_k + o_off, s_ds = s_k + ds_off;
  float* stats = reinterpret_cast<float*>(smem + st_off);  // a slot: the rows' lse (log2 units), then Delta
  const bool aligned = ALIGNED || (tcc_aligned16(qrow(0), krow(k0), vrow(k0))
                                   && tcc_aligned16(dorow(0), dorow(0), dorow(0)));
  const int tiles = (int)((n_q + BM - 1) / BM);
  int first = 0;  // the first query tile whose last row sees a key of this block (limits never decrease)
  for (int hi = tiles; first < hi;) {
    const int mid = (first + hi) / 2;
    const long long last = ((long long)(mid + 1) * BM < n_q ? (long long)(mid + 1) * BM : n_q) - 1;
    if ((long long)limit(last) <= k0) first = mid + 1; else hi = mid;
  }
  for (int x = tid; x < BN * CH; x += THREADS) {
    const int r = x / CH, c = x % CH;
    const long long j = k0 + r;
    const bool ok = j < n_k;
    tcc_copy16(smem, tcc_swz<D>(r, c), krow(ok ? j : k0) + c * 8, ok, aligned);
    tcc_copy16(smem, v_off + tcc_swz<D>(r, c), vrow(ok ? j : k0) + c * 8, ok, aligned);
  }
  auto load_q = [&](int t, int slot) {
    const long long q0 = (long long)t * BM;
    for (int x = tid; x < BM * CH; x += THREADS) {
      const int r = x / CH, c = x % CH;
      const long long i = q0 + r;
      const bool ok = i < n_q;
      const unsigned off = slot * BM * D * 2 + tcc_swz<D>(r, c);
      tcc_copy16(smem, q_off + off, qrow(ok ? i : 0) + c * 8, ok, aligned);
      tcc_copy16(smem, o_off + off, dorow(ok ? i : 0) + c * 8, ok, aligned);
    }
    for (int r = tid; r < BM; r += THREADS) {
      const long long i = q0 + r;
      const bool ok = i < n_q;
      stats[slot * 2 * BM + r] = ok ? (float)lse(i) * LOG2E : 0.f;
      stats[slot * 2 * BM + BM + r] = ok ? (float)delta(i) : 0.f;
    }
  };
  if (first < tiles) load_q(first, 0);
  asm volatile("cp.async.commit_group;" ::: "memory");
  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d)
#pragma unroll
    for (int r = 0; r < 4; ++r) dk[d][r] = dv[d][r] = 0.f;
  const long long keys[2] = {k0 + warp * 16 + (lane >> 2), k0 + warp * 16 + (lane >> 2) + 8};
  for (int t = first; t < tiles; ++t) {
    const int slot = (t - first) & 1;
    if (t + 1 < tiles) {
      load_q(t + 1, slot ^ 1);
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    __syncthreads();
    const long long q0 = (long long)t * BM;
    const unsigned qb = s_q + slot * BM * D * 2, ob = s_o + slot * BM * D * 2;
    const float* lse2 = stats + slot * 2 * BM;
    const float* dlt = lse2 + BM;
    // S^T = K Q^T and dP^T = V dO^T: the warp's 16 keys x BM queries
    float s[NQ][4], g[NQ][4];
#pragma unroll
    for (int n = 0; n < NQ; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) s[n][r] = g[n][r] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      unsigned ka[4], va[4];
      const unsigned at = tcc_swz<D>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4));
      tcc_ldsm4(s_k + at, ka, false);
      tcc_ldsm4(s_v + at, va, false);
#pragma unroll
      for (int np = 0; np < NQ / 2; ++np) {
        unsigned b[4];
        const int mi = lane >> 3;
        const unsigned bt = tcc_swz<D>(np * 16 + (lane & 7) + (mi >> 1) * 8, kk * 2 + (mi & 1));
        tcc_ldsm4(qb + bt, b, false);
        tcc_mma16816<BF16>(s[2 * np], ka, b[0], b[1]);
        tcc_mma16816<BF16>(s[2 * np + 1], ka, b[2], b[3]);
        tcc_ldsm4(ob + bt, b, false);
        tcc_mma16816<BF16>(g[2 * np], va, b[0], b[1]);
        tcc_mma16816<BF16>(g[2 * np + 1], va, b[2], b[3]);
      }
    }
    // P^T and dS^T = P^T * (dP^T - Delta) in place; a pair is tested only where some pair of the tile may fail
    const bool full = q0 + BM <= n_q && k0 + BN <= n_k && (long long)limit(q0) >= k0 + BN;
#pragma unroll
    for (int n = 0; n < NQ; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = n * 8 + 2 * (lane & 3) + e;
        const long long i = q0 + c;
        const float l2 = lse2[c], de = dlt[c];
        const long long lim = (full || i >= n_q) ? 0 : (long long)limit(i);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool ok = full || (i < n_q && keys[h] < n_k && keys[h] < lim);
          const float p = ok ? tcc_ex2(score(i, keys[h], s[n][2 * h + e]) * LOG2E - l2) : 0.f;
          s[n][2 * h + e] = p;
          g[n][2 * h + e] = p * (g[n][2 * h + e] - de);
        }
      }
    // dV += P^T dO, dK += dS^T Q (unscaled)
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      unsigned pa[4], da[4];
      pa[0] = tcc_pack2<BF16>(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = tcc_pack2<BF16>(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = tcc_pack2<BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = tcc_pack2<BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      da[0] = tcc_pack2<BF16>(g[2 * kk][0], g[2 * kk][1]);
      da[1] = tcc_pack2<BF16>(g[2 * kk][2], g[2 * kk][3]);
      da[2] = tcc_pack2<BF16>(g[2 * kk + 1][0], g[2 * kk + 1][1]);
      da[3] = tcc_pack2<BF16>(g[2 * kk + 1][2], g[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        unsigned b[4];
        const int mi = lane >> 3;
        const unsigned bt = tcc_swz<D>(kk * 16 + (lane & 7) + (mi & 1) * 8, dp * 2 + (mi >> 1));
        tcc_ldsm4(ob + bt, b, true);
        tcc_mma16816<BF16>(dv[2 * dp], pa, b[0], b[1]);
        tcc_mma16816<BF16>(dv[2 * dp + 1], pa, b[2], b[3]);
        tcc_ldsm4(qb + bt, b, true);
        tcc_mma16816<BF16>(dk[2 * dp], da, b[0], b[1]);
        tcc_mma16816<BF16>(dk[2 * dp + 1], da, b[2], b[3]);
      }
    }
    // dS into shared memory as [query][key] rows of BN halves, 16-byte chunks swizzled like tcc_swz
#pragma unroll
    for (int n = 0; n < NQ; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = n * 8 + 2 * (lane & 3) + e, kr = warp * 16 + (lane >> 2) + 8 * h;
          const float x = g[n][2 * h + e];
          *reinterpret_cast<unsigned short*>(smem + ds_off + tcc_swz<BN>(c, kr >> 3) + (kr & 7) * 2) =
              BF16 ? tcc_f32_to_bf16(x) : tcc_f32_to_f16(x);
        }
    __syncthreads();
    // dQ[q0 .., :] += dS K: the warp's 16 rows x DC columns
    {
      const int rg = warp % RG, cg = warp / RG;
      float acc[DC / 8][4];
#pragma unroll
      for (int d = 0; d < DC / 8; ++d) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        unsigned a[4];
        tcc_ldsm4(s_ds + tcc_swz<BN>(rg * 16 + (lane & 15), kk * 2 + (lane >> 4)), a, false);
#pragma unroll
        for (int dp = 0; dp < DC / 16; ++dp) {
          unsigned b[4];
          const int mi = lane >> 3;
          const int chunk = (cg * (DC / 16) + dp) * 2 + (mi >> 1);
          tcc_ldsm4(s_k + tcc_swz<D>(kk * 16 + (lane & 7) + (mi & 1) * 8, chunk), b, true);
          tcc_mma16816<BF16>(acc[2 * dp], a, b[0], b[1]);
          tcc_mma16816<BF16>(acc[2 * dp + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const long long i = q0 + rg * 16 + (lane >> 2) + 8 * h;
        if (i < n_q) {
          float* row = dq_row(i) + cg * DC + 2 * (lane & 3);
#pragma unroll
          for (int d = 0; d < DC / 8; ++d) tcc_red_add2(row + d * 8, acc[d][2 * h], acc[d][2 * h + 1]);
        }
      }
    }
    __syncthreads();  // the slot and dS are rewritten by the next step
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
  for (int h = 0; h < 2; ++h)
    if (keys[h] < n_k) {
#pragma unroll
      for (int d = 0; d < DT; ++d)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const long long col = d * 8 + 2 * (lane & 3) + e;
          dk_out(keys[h], col, dk[d][2 * h + e] * scale);
          dv_out(keys[h], col, dv[d][2 * h + e]);
        }
    }
}
"""


def standalone_kernels(d: int, bm: int, warps: int, bf16: bool) -> str:
    """A whole program of three kernels over contiguous ``[B, H, S, D]`` halves (``bf16``: bfloat16)
    with an f32 ``[B, H, S]`` log-sum-exp: ``delta_k`` (Delta), ``bwd_k`` (one block per batch x
    head x tile of ``16 * warps`` keys; ``causal``: key ``j`` seen by query ``i`` where ``j <= i``)
    and ``dq_k`` (the f32 dQ accumulator, zeroed before, scaled into halves). What
    ``scripts/flash_bwd_probe.py`` runs and the tests compile, until the CUDA schedule calls the
    template itself."""
    cvt = "tcc_f32_to_bf16" if bf16 else "tcc_f32_to_f16"
    b = str(bf16).lower()
    bn = 16 * warps
    return PREAMBLE + FLASH + FLASH_BACKWARD + f"""
extern "C" __global__ void __launch_bounds__({DELTA_THREADS}) delta_k(const unsigned short* __restrict__ O,
    const unsigned short* __restrict__ dO, float* __restrict__ Delta, long long n) {{
  tcc_flash_bwd_delta<{d}, {b}>((long long)blockIdx.x * {DELTA_THREADS // (d // 8)}, n,
      [&](long long i) {{ return &O[i * {d}]; }}, [&](long long i) {{ return &dO[i * {d}]; }},
      [&](long long i, float x) {{ Delta[i] = x; }});
}}
extern "C" __global__ void __launch_bounds__({32 * warps}) bwd_k(const unsigned short* __restrict__ Q,
    const unsigned short* __restrict__ K, const unsigned short* __restrict__ V, const unsigned short* __restrict__ dO,
    const float* __restrict__ Lse, const float* __restrict__ Delta, float* __restrict__ DQA,
    unsigned short* __restrict__ DK, unsigned short* __restrict__ DV, float scale, long long S, long long L,
    int causal) {{
  extern __shared__ __align__(16) unsigned char raw[];
  const long long ktiles = (L + {bn} - 1) / {bn};
  const long long bh = blockIdx.x / ktiles, kt = blockIdx.x % ktiles;
  tcc_flash_bwd<{d}, {bm}, {warps}, {b}, true>(raw, kt * {bn}, S, L, scale,
      [&](long long i) {{ return &Q[(bh * S + i) * {d}]; }},
      [&](long long j) {{ return &K[(bh * L + j) * {d}]; }},
      [&](long long j) {{ return &V[(bh * L + j) * {d}]; }},
      [&](long long i) {{ return &dO[(bh * S + i) * {d}]; }},
      [&](long long i, long long j, float dot) {{ return dot * scale; }},
      [&](long long i) -> long long {{ return causal ? i + 1 : L; }},
      [&](long long i) {{ return Lse[bh * S + i]; }},
      [&](long long i) {{ return Delta[bh * S + i]; }},
      [&](long long i) {{ return &DQA[(bh * S + i) * {d}]; }},
      [&](long long j, long long c, float x) {{ DK[(bh * L + j) * {d} + c] = {cvt}(x); }},
      [&](long long j, long long c, float x) {{ DV[(bh * L + j) * {d} + c] = {cvt}(x); }});
}}
extern "C" __global__ void __launch_bounds__(256) dq_k(const float* __restrict__ DQA, unsigned short* __restrict__ DQ,
    float scale, long long n) {{
  const long long x = (long long)blockIdx.x * 256 + threadIdx.x;
  if (x < n) DQ[x] = {cvt}(DQA[x] * scale);
}}
"""
