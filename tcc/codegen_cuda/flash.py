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
products; operands not 16-byte aligned are copied two bytes at a time instead, their rows being
whole multiples of 16 bytes; ``ALIGNED`` promises they are, which drops that test: 10-15 % at D
128 on an H200). Rows of ``D`` halves are stored with their 16-byte chunks exchanged by ``row % 8``,
so each ``ldmatrix`` of 8 rows hits 8 distinct bank groups. A block takes the keys from ``k0``
(a multiple of ``BN``) to ``n_k`` (all of them, or one split of them); keys past those, and past
a row's limit, score ``-inf``; tiles past every row's limit are never loaded.
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
// 16 bytes into shared memory at byte ``off`` of ``smem``: a cp.async where the operands are 16-byte
// aligned, else eight 2-byte copies (zeros where ``ok`` is false)
TCC_D void tcc_copy16(unsigned char* smem, unsigned off, const unsigned short* src, bool ok, bool aligned) {
  if (aligned) { tcc_cp16(tcc_smem(smem) + off, src, ok); return; }
  unsigned short* dst = (unsigned short*)(smem + off);
  for (int e = 0; e < 8; ++e) dst[e] = ok ? src[e] : (unsigned short)0;
}
TCC_D bool tcc_aligned16(const void* a, const void* b, const void* c) {
  return ((reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(b)
           | reinterpret_cast<unsigned long long>(c)) & 15ull) == 0;
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
// 2^x by the special-function unit alone (exp2f adds a rescaling for results below 2^-126, which
// only rounds terms of a row's sum that are already below its rounding)
TCC_D float tcc_ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
// One row's step of the online softmax over a tile of NT x 8 keys from j0 (two a lane, the rest of
// the row on the quad's other lanes): scores in log2 units (one ex2 per exponential) masked past
// the keys and the row's limit, the running maximum ``mx`` and sum ``sum``, the row's ``DT`` x 2
// accumulators rescaled. ``s(n, e)`` and ``o(d, e)`` are the lane's elements of the row. WHOLE: the
// caller knows every key of the tile is in range for the row (all but a row's last tile), so no
// score is compared: a third of the instructions of a step (0.46 -> 0.69 of SDPA at D 64 on an H200).
template <bool WHOLE, int NT, int DT, typename S, typename O, typename Score>
TCC_D void tcc_online_row(long long i, long long lim, long long n_q, long long n_k, long long j0, float& mx,
                          float& sum, S s, O o, Score score) {
  constexpr float LOG2E = 1.4426950408889634f;
  const bool row_ok = i < n_q;
  float top = -__int_as_float(0x7f800000);
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const long long j = j0 + n * 8 + e;
      const float v = (WHOLE || (row_ok && j < n_k && j < lim)) ? score(i, j, s(n, e)) * LOG2E
                                                                  : -__int_as_float(0x7f800000);
      s(n, e) = v;
      top = fmaxf(top, v);
    }
  top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
  top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
  const float m_new = fmaxf(mx, top), safe = m_new == -__int_as_float(0x7f800000) ? 0.f : m_new;
  const float rescale = tcc_ex2(mx - safe);
  float total = 0.f;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float p = tcc_ex2(s(n, e) - safe);
      s(n, e) = p;
      total += p;
    }
  sum = sum * rescale + total;
  mx = m_new;
#pragma unroll
  for (int d = 0; d < DT; ++d) { o(d, 0) *= rescale; o(d, 1) *= rescale; }
}
// A finished row: its sum over the quad, then the stores of its DT x 8 columns (two a lane) and
// of the row (by one lane); ``mx`` is in log2 units.
template <int DT, typename O, typename Out, typename RowOut>
TCC_D void tcc_finish_row(long long i, long long n_q, int lane, float mx, float sum, O o, Out out, RowOut row_out) {
  constexpr float LN2 = 0.6931471805599453f;
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (i >= n_q) return;
  const float top = mx * LN2;
#pragma unroll
  for (int d = 0; d < DT; ++d)
#pragma unroll
    for (int e = 0; e < 2; ++e) out(i, (long long)(d * 8 + 2 * (lane & 3) + e), o(d, e), sum, top);
  if ((lane & 3) == 0) row_out(i, sum, top);
}
template <int D> TCC_D unsigned tcc_swz(int row, int chunk) {  // byte offset of a 16-byte chunk of a row
  return (unsigned)(row * D * 2 + ((chunk ^ (row & 7)) << 4));
}
template <int D, int BN, int WARPS, int MT, bool QREG, bool BF16, bool ALIGNED, typename QRow, typename KRow,
          typename VRow, typename Score, typename Limit, typename Out, typename RowOut>
TCC_D void tcc_flash(unsigned char* smem, long long q0, long long n_q, long long k0, long long n_k, QRow qrow,
                     KRow krow, VRow vrow, Score score, Limit limit, Out out, RowOut row_out) {
  // a warp owns MT tiles of 16 rows: each K or V fragment read from shared memory feeds MT products
  constexpr int BM = 16 * MT * WARPS, CH = D / 8, THREADS = 32 * WARPS, NT = BN / 8, DT = D / 8, KT = D / 16;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr unsigned k_off = BM * D * 2, v_off = k_off + 2 * BN * D * 2;
  const unsigned s_q = tcc_smem(smem), s_k = s_q + k_off, s_v = s_q + v_off;
  const bool aligned = ALIGNED || tcc_aligned16(qrow(q0), krow(k0), vrow(k0));  // (a constant where promised)
  __shared__ long long block_limit;
  if (tid == 0) block_limit = 0;
  __syncthreads();
  for (int r = tid; r < BM; r += THREADS)
    if (q0 + r < n_q) atomicMax(&block_limit, (long long)limit(q0 + r));
  for (int x = tid; x < BM * CH; x += THREADS) {
    const int r = x / CH, c = x % CH;
    const bool ok = q0 + r < n_q;
    tcc_copy16(smem, tcc_swz<D>(r, c), qrow(ok ? q0 + r : q0) + c * 8, ok, aligned);
  }
  __syncthreads();
  const long long keys = block_limit < n_k ? block_limit : n_k;
  const int tiles = keys > k0 ? (int)((keys - k0 + BN - 1) / BN) : 0;
  auto load_kv = [&](int t, int slot) {
    for (int x = tid; x < BN * CH; x += THREADS) {
      const int r = x / CH, c = x % CH;
      const long long j = k0 + (long long)t * BN + r;
      const bool ok = j < n_k;
      const unsigned off = slot * BN * D * 2 + tcc_swz<D>(r, c);
      tcc_copy16(smem, k_off + off, krow(ok ? j : k0) + c * 8, ok, aligned);
      tcc_copy16(smem, v_off + off, vrow(ok ? j : k0) + c * 8, ok, aligned);
    }
  };
  if (tiles > 0) load_kv(0, 0);
  asm volatile("cp.async.commit_group;" ::: "memory");
  long long rows[MT][2], lims[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rows[m][h] = q0 + (warp * MT + m) * 16 + (lane >> 2) + 8 * h;
      lims[m][h] = rows[m][h] < n_q ? limit(rows[m][h]) : 0;
    }
  unsigned qf[QREG ? MT : 1][QREG ? KT : 1][4];
  float o[MT][DT][4], mx[MT][2], sum[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    mx[m][0] = mx[m][1] = -__int_as_float(0x7f800000);
    sum[m][0] = sum[m][1] = 0.f;
#pragma unroll
    for (int d = 0; d < DT; ++d) o[m][d][0] = o[m][d][1] = o[m][d][2] = o[m][d][3] = 0.f;
  }
  auto q_frag = [&](int m, int kk, unsigned* f) {
    const int r = (warp * MT + m) * 16 + (lane & 15);
    tcc_ldsm4(s_q + tcc_swz<D>(r, kk * 2 + (lane >> 4)), f, false);
  };
  for (int t = 0; t < tiles; ++t) {
    if (t + 1 < tiles) {
      load_kv(t + 1, (t + 1) & 1);
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    __syncthreads();
    if (QREG && t == 0) {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) q_frag(m, kk, qf[QREG ? m : 0][QREG ? kk : 0]);
    }
    const unsigned kb = s_k + (t & 1) * BN * D * 2, vb = s_v + (t & 1) * BN * D * 2;
    float s[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < NT; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      unsigned a[MT][4];
      if (!QREG) {
#pragma unroll
        for (int m = 0; m < MT; ++m) q_frag(m, kk, a[m]);
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        unsigned b[4];
        const int mi = lane >> 3;
        tcc_ldsm4(kb + tcc_swz<D>(np * 16 + (lane & 7) + (mi >> 1) * 8, kk * 2 + (mi & 1)), b, false);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const unsigned* af = QREG ? qf[QREG ? m : 0][QREG ? kk : 0] : a[m];
          tcc_mma16816<BF16>(s[m][2 * np], af, b[0], b[1]);
          tcc_mma16816<BF16>(s[m][2 * np + 1], af, b[2], b[3]);
        }
      }
    }
    const long long j0 = k0 + (long long)t * BN + 2 * (lane & 3), past = k0 + (long long)(t + 1) * BN;
    bool whole = past <= n_k;  // every key of the tile in range for each of the warp's rows
#pragma unroll
    for (int m = 0; m < MT; ++m) whole = whole && past <= lims[m][0] && past <= lims[m][1];
    whole = __all_sync(0xffffffffu, whole);  // (one path for the warp: the steps shuffle)
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      auto sv = [&](int n, int e) -> float& { return s[m][n][2 * h + e]; };
      auto ov = [&](int d, int e) -> float& { return o[m][d][2 * h + e]; };
      if (whole) tcc_online_row<true, NT, DT>(rows[m][h], lims[m][h], n_q, n_k, j0, mx[m][h], sum[m][h], sv, ov, score);
      else tcc_online_row<false, NT, DT>(rows[m][h], lims[m][h], n_q, n_k, j0, mx[m][h], sum[m][h], sv, ov, score);
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      unsigned a[MT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        a[m][0] = tcc_pack2<BF16>(s[m][2 * kk][0], s[m][2 * kk][1]);
        a[m][1] = tcc_pack2<BF16>(s[m][2 * kk][2], s[m][2 * kk][3]);
        a[m][2] = tcc_pack2<BF16>(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
        a[m][3] = tcc_pack2<BF16>(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        unsigned b[4];
        const int mi = lane >> 3;
        tcc_ldsm4(vb + tcc_swz<D>(kk * 16 + (lane & 7) + (mi & 1) * 8, dp * 2 + (mi >> 1)), b, true);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          tcc_mma16816<BF16>(o[m][2 * dp], a[m], b[0], b[1]);
          tcc_mma16816<BF16>(o[m][2 * dp + 1], a[m], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the slot is refilled by the next step's copies
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      tcc_finish_row<DT>(rows[m][h], n_q, lane, mx[m][h], sum[m][h],
                         [&](int d, int e) -> float { return o[m][d][2 * h + e]; }, out, row_out);
}
"""


def _wgmma(n: int, registers_a: bool) -> str:
    """``tcc_wgmma_{ss,rs}_{n}<BF16>``: one ``wgmma`` m64 x ``n`` x 16 into ``d`` (``n / 2`` floats a
    thread), A from shared memory (descriptor) or from registers (four a thread, B N-major)."""
    regs = n // 2
    outs = ",".join(f"%{i}" for i in range(regs))
    if registers_a:
        a_text, tail, a_param = f"{{%{regs},%{regs + 1},%{regs + 2},%{regs + 3}}}", "1, 1, 1", "const unsigned* a"
        b_slot, p_slot = regs + 4, regs + 5
        a_in = ", ".join(f'"r"(a[{i}])' for i in range(4))
    else:
        a_text, tail, a_param = f"%{regs}", "1, 1, 0, 0", "unsigned long long a"
        b_slot, p_slot = regs + 1, regs + 2
        a_in = '"l"(a)'
    d_out = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    body = []
    for kind in ("bf16", "f16"):
        body.append(f'asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{p_slot}, 0; wgmma.mma_async.sync.aligned.'
                    f'm64n{n}k16.f32.{kind}.{kind} {{{outs}}}, {a_text}, %{b_slot}, p, {tail}; }}" '
                    f': {d_out} : {a_in}, "l"(b), "r"(accumulate));')
    name = "rs" if registers_a else "ss"
    return (f"template <bool BF16> TCC_D void tcc_wgmma_{name}_{n}(float* d, {a_param}, unsigned long long b, "
            f"int accumulate) {{\n  if (BF16) {body[0]}\n  else {body[1]}\n}}\n")


FLASH_WARPGROUP = r"""
TCC_D unsigned long long tcc_wgmma_desc_at(unsigned addr, unsigned lead, unsigned stride) {  // 128B swizzle
  return (unsigned long long)((addr & 0x3FFFFu) >> 4) | ((unsigned long long)(lead >> 4) << 16)
         | ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}
""" + "".join(_wgmma(n, a) for n in (64, 128) for a in (False, True)) + _wgmma(48, False) + r"""
template <int R, int D> TCC_D unsigned tcc_swz_atoms(int row, int chunk) {  // wgmma's 128-byte swizzle
  return (unsigned)((chunk >> 3) * R * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}
TCC_D void tcc_wgmma_wait(float* d, int n) {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  for (int r = 0; r < n; ++r) asm volatile("" : "+f"(d[r]) :: "memory");
}
// FlashAttention's forward on Hopper's warpgroup matrix units: WG warpgroups of 64 query rows each.
template <int D, int BN, int WG, bool BF16, bool ALIGNED, typename QRow, typename KRow, typename VRow,
          typename Score, typename Limit, typename Out, typename RowOut>
TCC_D void tcc_flash_wg(unsigned char* smem, long long q0, long long n_q, long long k0, long long n_k, QRow qrow,
                        KRow krow, VRow vrow, Score score, Limit limit, Out out, RowOut row_out) {
  constexpr int BM = 64 * WG, CH = D / 8, THREADS = 128 * WG, SN = BN / 2, ON = D / 2;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  constexpr unsigned k_off = BM * D * 2, v_off = k_off + 2 * BN * D * 2;
  const unsigned s_q = tcc_smem(smem), s_k = s_q + k_off, s_v = s_q + v_off;
  const bool aligned = ALIGNED || tcc_aligned16(qrow(q0), krow(k0), vrow(k0));  // (a constant where promised)
  __shared__ long long block_limit;
  if (tid == 0) block_limit = 0;
  __syncthreads();
  for (int r = tid; r < BM; r += THREADS)
    if (q0 + r < n_q) atomicMax(&block_limit, (long long)limit(q0 + r));
  for (int x = tid; x < BM * CH; x += THREADS) {
    const int r = x / CH, c = x % CH;
    const bool ok = q0 + r < n_q;
    tcc_copy16(smem, tcc_swz_atoms<BM, D>(r, c), qrow(ok ? q0 + r : q0) + c * 8, ok, aligned);
  }
  __syncthreads();
  const long long keys = block_limit < n_k ? block_limit : n_k;
  const int tiles = keys > k0 ? (int)((keys - k0 + BN - 1) / BN) : 0;
  auto load_kv = [&](int t, int slot) {
    for (int x = tid; x < BN * CH; x += THREADS) {
      const int r = x / CH, c = x % CH;
      const long long j = k0 + (long long)t * BN + r;
      const bool ok = j < n_k;
      const unsigned off = slot * BN * D * 2 + tcc_swz_atoms<BN, D>(r, c);
      tcc_copy16(smem, k_off + off, krow(ok ? j : k0) + c * 8, ok, aligned);
      tcc_copy16(smem, v_off + off, vrow(ok ? j : k0) + c * 8, ok, aligned);
    }
  };
  if (tiles > 0) load_kv(0, 0);
  asm volatile("cp.async.commit_group;" ::: "memory");
  long long rows[2], lims[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rows[h] = q0 + wg * 64 + warp * 16 + (lane >> 2) + 8 * h;
    lims[h] = rows[h] < n_q ? limit(rows[h]) : 0;
  }
  float o[ON], s[SN], mx[2] = {-__int_as_float(0x7f800000), -__int_as_float(0x7f800000)}, sum[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < ON; ++r) o[r] = 0.f;
  for (int t = 0; t < tiles; ++t) {
    if (t + 1 < tiles) {
      load_kv(t + 1, (t + 1) & 1);
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const unsigned kb = s_k + (t & 1) * BN * D * 2, vb = s_v + (t & 1) * BN * D * 2;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned atom = (kk * 16 / 64) * 128, w0 = (kk * 16 % 64) * 2;
      const unsigned long long a = tcc_wgmma_desc_at(s_q + atom * BM + wg * 64 * 128 + w0, 16u, 1024u);
      const unsigned long long b = tcc_wgmma_desc_at(kb + atom * BN + w0, 16u, 1024u);
      if constexpr (BN == 48) tcc_wgmma_ss_48<BF16>(s, a, b, kk > 0);
      else if constexpr (BN == 64) tcc_wgmma_ss_64<BF16>(s, a, b, kk > 0);
      else tcc_wgmma_ss_128<BF16>(s, a, b, kk > 0);
    }
    tcc_wgmma_wait(s, SN);
    const long long j0 = k0 + (long long)t * BN + 2 * (lane & 3), past = k0 + (long long)(t + 1) * BN;
    const bool whole = __all_sync(0xffffffffu, past <= n_k && past <= lims[0] && past <= lims[1]);  // (the warp's)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      auto sv = [&](int n, int e) -> float& { return s[4 * n + 2 * h + e]; };
      auto ov = [&](int d, int e) -> float& { return o[4 * d + 2 * h + e]; };
      if (whole) tcc_online_row<true, BN / 8, D / 8>(rows[h], lims[h], n_q, n_k, j0, mx[h], sum[h], sv, ov, score);
      else tcc_online_row<false, BN / 8, D / 8>(rows[h], lims[h], n_q, n_k, j0, mx[h], sum[h], sv, ov, score);
    }
    unsigned p[BN / 16][4];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      p[kk][0] = tcc_pack2<BF16>(s[8 * kk + 0], s[8 * kk + 1]);
      p[kk][1] = tcc_pack2<BF16>(s[8 * kk + 2], s[8 * kk + 3]);
      p[kk][2] = tcc_pack2<BF16>(s[8 * kk + 4], s[8 * kk + 5]);
      p[kk][3] = tcc_pack2<BF16>(s[8 * kk + 6], s[8 * kk + 7]);
    }
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const unsigned long long b = tcc_wgmma_desc_at(vb + kk * 16 * 128, (unsigned)(BN * 128), 1024u);
      if (D == 64) tcc_wgmma_rs_64<BF16>(o, p[kk], b, 1);
      else tcc_wgmma_rs_128<BF16>(o, p[kk], b, 1);
    }
    tcc_wgmma_wait(o, ON);
    __syncthreads();  // the slot is refilled by the next step's copies
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
  for (int h = 0; h < 2; ++h)
    tcc_finish_row<D / 8>(rows[h], n_q, lane, mx[h], sum[h],
                          [&](int d, int e) -> float { return o[4 * d + 2 * h + e]; }, out, row_out);
}
"""
