"""The device function a :class:`~tcc.ir.loops.MatrixStream` statement calls: one block's tile of
a streaming reduction's rows on the matrix units, FlashAttention-2's forward pass.

Written once in CUDA C rather than composed from the loop IR's matrix statements because its
heart is register-level: the scores a ``mma.sync`` leaves in a warp's accumulator fragments
are rescaled, exponentiated and repacked in place as the A operand of the second product
(the m16n8 accumulator layout of two adjacent tiles is the m16n8k16 A layout), and a row's
maximum and sum are combined across the four lanes of a quad by shuffles. Everything that
varies per program comes in as arguments the schedule chose (tile sizes, warps) and as lambdas
the printer writes from the statement's expressions (where a row of Q, K or V starts, the score
of a dot product, the key limit of a row, the stores of a finished element): the printer
decides nothing.

Layout: the block's ``16 * WARPS`` query rows are copied once into shared memory and each
warp's 16 rows loaded into registers as A fragments; K and V tiles of ``BN`` keys stream
through two shared-memory slots with ``cp.async`` (the next tile's copy overlaps this tile's
products). Rows of ``D`` halves are stored with their 16-byte chunks exchanged by ``row % 8``,
so each ``ldmatrix`` of 8 rows hits 8 distinct bank groups. Keys past the last one, and past a
row's limit, score ``-inf``; tiles past every row's limit are never loaded.
"""

FLASH = r"""
// FlashAttention-2's forward for one block of 16 * WARPS query rows (tcc/codegen_cuda/flash.py).
TCC_D void tcc_cp16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
TCC_D void tcc_ldsm4(unsigned addr, unsigned* r, bool trans) {
  if (trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
template <bool BF16> TCC_D void tcc_mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  if (BF16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};" : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};" : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <bool BF16> TCC_D unsigned tcc_pack2(float lo, float hi) {  // lo in the low half
  unsigned r;
  if (BF16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <int D> TCC_D unsigned tcc_swz(int row, int chunk) {  // byte offset of a 16-byte chunk of a row
  return (unsigned)(row * D * 2 + ((chunk ^ (row & 7)) << 4));
}
template <int D, int BN, int WARPS, bool BF16, typename QRow, typename KRow, typename VRow, typename Score,
          typename Limit, typename Out, typename RowOut>
TCC_D void tcc_flash(unsigned char* smem, long long q0, long long n_q, long long n_k, QRow qrow, KRow krow,
                     VRow vrow, Score score, Limit limit, Out out, RowOut row_out) {
  constexpr int BM = 16 * WARPS, CH = D / 8, THREADS = 32 * WARPS, NT = BN / 8, DT = D / 8;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const unsigned s_q = tcc_smem(smem), s_k = s_q + BM * D * 2, s_v = s_k + 2 * BN * D * 2;
  __shared__ long long block_limit;
  if (tid == 0) block_limit = 0;
  __syncthreads();
  if (tid < BM && q0 + tid < n_q) atomicMax(&block_limit, (long long)limit(q0 + tid));
  for (int x = tid; x < BM * CH; x += THREADS) {
    const int r = x / CH, c = x % CH;
    const bool ok = q0 + r < n_q;
    tcc_cp16(s_q + tcc_swz<D>(r, c), qrow(ok ? q0 + r : q0) + c * 8, ok);
  }
  __syncthreads();
  const long long keys = block_limit < n_k ? block_limit : n_k;
  const int tiles = keys > 0 ? (int)((keys + BN - 1) / BN) : 0;
  auto load_kv = [&](int t, int slot) {
    for (int x = tid; x < BN * CH; x += THREADS) {
      const int r = x / CH, c = x % CH;
      const long long j = (long long)t * BN + r;
      const bool ok = j < n_k;
      const unsigned off = slot * BN * D * 2 + tcc_swz<D>(r, c);
      tcc_cp16(s_k + off, krow(ok ? j : 0) + c * 8, ok);
      tcc_cp16(s_v + off, vrow(ok ? j : 0) + c * 8, ok);
    }
  };
  if (tiles > 0) load_kv(0, 0);
  asm volatile("cp.async.commit_group;" ::: "memory");
  const long long row_a = q0 + warp * 16 + (lane >> 2), row_b = row_a + 8;
  const long long lim_a = row_a < n_q ? limit(row_a) : 0, lim_b = row_b < n_q ? limit(row_b) : 0;
  unsigned qf[D / 16][4];
  float o[DT][4], mx[2] = {(-__int_as_float(0x7f800000)), (-__int_as_float(0x7f800000))}, sum[2] = {0.f, 0.f};
#pragma unroll
  for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  for (int t = 0; t < tiles; ++t) {
    if (t + 1 < tiles) {
      load_kv(t + 1, (t + 1) & 1);
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    __syncthreads();
    if (t == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        tcc_ldsm4(s_q + tcc_swz<D>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)), qf[kk], false);
    }
    const unsigned kb = s_k + (t & 1) * BN * D * 2, vb = s_v + (t & 1) * BN * D * 2;
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        unsigned b[4];
        const int mi = lane >> 3;
        tcc_ldsm4(kb + tcc_swz<D>(np * 16 + (lane & 7) + (mi >> 1) * 8, kk * 2 + (mi & 1)), b, false);
        tcc_mma16816<BF16>(s[2 * np], qf[kk], b[0], b[1]);
        tcc_mma16816<BF16>(s[2 * np + 1], qf[kk], b[2], b[3]);
      }
    }
    const long long j0 = (long long)t * BN + 2 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long i = h ? row_b : row_a, lim = h ? lim_b : lim_a;
      const bool row_ok = i < n_q;
      float top = (-__int_as_float(0x7f800000));
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const long long j = j0 + n * 8 + e;
          const float v = (row_ok && j < n_k && j < lim) ? score(i, j, s[n][2 * h + e]) : (-__int_as_float(0x7f800000));
          s[n][2 * h + e] = v;
          top = fmaxf(top, v);
        }
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
      const float m_new = fmaxf(mx[h], top), safe = m_new == (-__int_as_float(0x7f800000)) ? 0.f : m_new;
      const float rescale = __expf(mx[h] - safe);
      float total = 0.f;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = __expf(s[n][2 * h + e] - safe);
          s[n][2 * h + e] = p;
          total += p;
        }
      sum[h] = sum[h] * rescale + total;
      mx[h] = m_new;
#pragma unroll
      for (int d = 0; d < DT; ++d) { o[d][2 * h] *= rescale; o[d][2 * h + 1] *= rescale; }
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const unsigned a[4] = {tcc_pack2<BF16>(s[2 * kk][0], s[2 * kk][1]), tcc_pack2<BF16>(s[2 * kk][2], s[2 * kk][3]),
                             tcc_pack2<BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             tcc_pack2<BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        unsigned b[4];
        const int mi = lane >> 3;
        tcc_ldsm4(vb + tcc_swz<D>(kk * 16 + (lane & 7) + (mi & 1) * 8, dp * 2 + (mi >> 1)), b, true);
        tcc_mma16816<BF16>(o[2 * dp], a, b[0], b[1]);
        tcc_mma16816<BF16>(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // the slot is refilled by the next step's copies
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
    const long long i = h ? row_b : row_a;
    if (i >= n_q) continue;
#pragma unroll
    for (int d = 0; d < DT; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e) out(i, (long long)(d * 8 + 2 * (lane & 3) + e), o[d][2 * h + e], sum[h], mx[h]);
    if ((lane & 3) == 0) row_out(i, sum[h], mx[h]);
  }
}
"""
