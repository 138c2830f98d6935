template <bool WHOLE, int NT, int DT, typename S, typename O, typename Score>
TCC_D void tcc_online_row(long long i, long long lim, long long n_q, long long n_k, long long j0, float& mx,
                          float& sum, S s, O o, Score score) {
  constexpr float LOG2E = 1.4426950408889634f;
  const float NEG_INF = -__int_as_float(0x7f800000);
  const bool row_ok = i < n_q;
  float top = NEG_INF;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const long long j = j0 + n * 8 + e;
      const float v = (WHOLE || (row_ok && j < n_k && j < lim)) ? score(i, j, s(n, e)) : NEG_INF;
      s(n, e) = v;
      top = fmaxf(top, v);
    }
  top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
  top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
  const float m_new = fmaxf(mx, top * LOG2E);
  if (__any_sync(0xffffffffu, m_new > mx + 8.f)) {
    const float rescale = tcc_ex2(mx - (m_new == NEG_INF ? 0.f : m_new));
    sum *= rescale;
#pragma unroll
    for (int d = 0; d < DT; ++d) { o(d, 0) *= rescale; o(d, 1) *= rescale; }
    mx = m_new;
  }
  const float base = mx == NEG_INF ? 0.f : mx;
  float total = 0.f;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float p = tcc_ex2(fmaf(s(n, e), LOG2E, -base));
      s(n, e) = p;
      total += p;
    }
  sum += total;
}
