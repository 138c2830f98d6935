"""A/B of the FlashAttention forward template's variants against SDPA on a GPU (`python3 scripts/flash_fwd_probe.py`;
`--compile-only` prints ptxas registers and spills without one): the kernel alone, CUDA events, medians."""
import sys, time, statistics
from tcc.codegen_cuda.preamble import PREAMBLE
from tcc.codegen_cuda.flash import FLASH, FLASH_WARPGROUP
from tcc.codegen_cuda import nvrtc

FAST_ROW = r"""
TCC_D float tcc_ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
// tcc_online_row for a tile every key of which is in range for the row: no comparisons
template <int NT, int DT, typename S, typename O, typename Score>
TCC_D void tcc_online_row_whole(long long i, long long j0, float& mx, float& sum, S s, O o, Score score) {
  constexpr float LOG2E = 1.4426950408889634f;
  float top = -__int_as_float(0x7f800000);
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float v = score(i, j0 + n * 8 + e, s(n, e)) * LOG2E;
      s(n, e) = v;
      top = fmaxf(top, v);
    }
  top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
  top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
  const float m_new = fmaxf(mx, top);  // finite: the tile has keys
  const float rescale = tcc_ex2(mx - m_new);
  float total = 0.f;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float p = tcc_ex2(s(n, e) - m_new);
      s(n, e) = p;
      total += p;
    }
  sum = sum * rescale + total;
  mx = m_new;
#pragma unroll
  for (int d = 0; d < DT; ++d) { o(d, 0) *= rescale; o(d, 1) *= rescale; }
}
"""

from tcc.codegen_cuda.flash import _wgmma
EXTRA = "".join(_wgmma(32, a) for a in (False, True))  # (48, 64 and 128 are the template's own)
_qk = "      if constexpr (BN == 48)"
assert _qk in FLASH_WARPGROUP
WG = FLASH_WARPGROUP.replace(_qk, "      if constexpr (BN == 32) tcc_wgmma_ss_32<BF16>(s, a, b, kk > 0);\n      else if constexpr (BN == 48)")
_start = FLASH.index("template <bool WHOLE, int NT")
_end = FLASH.index("// A finished row")
LAZY = FLASH[:_start] + open(__file__.replace("flash_fwd_probe.py", "flash_fwd_lazy_row.cu")).read() + FLASH[_end:]
def source(D, BN, bf16, causal, fn, minb, lazy=False):
    lim = "return i + 1;" if causal else "return n_k;"
    call = f"{fn}<{D}, {BN}, 1, {str(bf16).lower()}, true>"
    return PREAMBLE + (LAZY if lazy else FLASH) + EXTRA + WG + f"""
extern "C" __global__ void __launch_bounds__(128, {minb}) k(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
  const unsigned short* __restrict__ V, unsigned short* __restrict__ O, float scale, long long S, long long L, long long H) {{
  extern __shared__ __align__(16) unsigned char raw[];
  unsigned char* sm = raw + ((1024u - (tcc_smem(raw) & 1023u)) & 1023u);
  const long long tiles = (S + 63) / 64, n_k = L;
  const long long bh = blockIdx.x / tiles, t = tiles - 1 - blockIdx.x % tiles;
  {call}(sm, t * 64, S, 0, L,
    [&](long long i) {{ return &Q[(bh * S + i) * {D}]; }},
    [&](long long j) {{ return &K[(bh * L + j) * {D}]; }},
    [&](long long j) {{ return &V[(bh * L + j) * {D}]; }},
    [&](long long i, long long j, float dot) {{ return dot * scale; }},
    [&](long long i) -> long long {{ {lim} }},
    [&](long long i, long long d, float w, float l, float m) {{ O[(bh * S + i) * {D} + d] = {'tcc_f32_to_bf16' if bf16 else 'tcc_f32_to_f16'}(w / l); }},
    [&](long long i, float l, float m) {{}});
}}
"""

VARIANTS = [("wg", "tcc_flash_wg", 1, 0), ("lazy", "tcc_flash_wg", 1, 0), ("bn48", "tcc_flash_wg", 3, 48),
            ("lz48", "tcc_flash_wg", 3, 48), ("lz32", "tcc_flash_wg", 4, 32)]

def usage(src):
    import cuda.bindings.nvrtc as nv
    err, prog = nv.nvrtcCreateProgram(src.encode(), b"t.cu", 0, [], [])
    opts = [b"--gpu-architecture=sm_90a", b"--std=c++17", b"--device-as-default-execution-space", b"--ptxas-options=-v"]
    (r,) = nv.nvrtcCompileProgram(prog, len(opts), opts)
    _, n = nv.nvrtcGetProgramLogSize(prog); log = b" " * n; nv.nvrtcGetProgramLog(prog, log)
    return r, [l for l in log.decode(errors="replace").splitlines() if "registers" in l or "spill" in l or "error" in l]

if "--compile-only" in sys.argv:
    for D, BN in ((64, 128), (128, 64)):
        for name, fn, minb, bn in VARIANTS:
            for causal in (False, True):
                r, lines = usage(source(D, bn or BN, False, causal, fn, minb, name.startswith('l')))
                print(D, name, causal, r, lines)
    sys.exit()

import torch
from tcc.codegen_cuda import driver

def run(B, H, S, L, D, dtype, causal, BN, variant, time_it=False, amp=1.0):
    name, fn, minb, bn = variant
    BN = bn or BN
    bf16 = dtype == torch.bfloat16
    cubin = nvrtc.compile_cubin(source(D, BN, bf16, causal, fn, minb, name.startswith('l')), "sm_90a")
    torch.zeros(1, device="cuda"); driver.context(0).activate()
    mod = driver.load_module(cubin, "flash")
    smem = 64 * D * 2 + 4 * BN * D * 2 + 1024
    grid = B * H * ((S + 63) // 64)
    ln = driver.Launcher(mod, "k", grid, 128, [("Q","p"),("K","p"),("V","p"),("O","p"),("scale","f32"),("S","i64"),("L","i64"),("H","i64")], smem)
    q = (torch.randn(B, H, S, D, device="cuda") * amp).to(dtype)
    k = torch.randn(B, H, L, D, device="cuda", dtype=dtype)
    v = torch.randn(B, H, L, D, device="cuda", dtype=dtype)
    o = torch.full_like(q, float("nan"))
    scale = D ** -0.5
    vals = dict(Q=q.data_ptr(), K=k.data_ptr(), V=v.data_ptr(), O=o.data_ptr(), scale=scale, S=S, L=L, H=H)
    stream = torch.cuda.current_stream().cuda_stream
    ln.launch(vals, stream, "flash")
    torch.cuda.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, scale=scale)
    err = (o.float() - ref).abs().max().item()
    res = f"{name:5s} amp{amp:g} B{B} H{H} S{S} L{L} D{D} {str(dtype)[6:]} causal={causal:d}: maxerr {err:.4f}"
    if time_it:
        f1 = lambda: ln.launch(vals, stream, "flash")
        f2 = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        ts = {"tcc": [], "sdpa": []}
        for f in (f1, f2): f(); f()
        for _ in range(11):
            for nm, f in (("tcc", f1), ("sdpa", f2)):
                torch.cuda.synchronize(); t0 = time.perf_counter()
                for _ in range(5): f()
                torch.cuda.synchronize(); ts[nm].append((time.perf_counter() - t0) / 5)
        a, b = statistics.median(ts["tcc"]), statistics.median(ts["sdpa"])
        flops = 4 * B * H * S * L * D / (2 if causal else 1)
        res += f"  tcc {flops/a/1e12:.0f} TF sdpa {flops/b/1e12:.0f} TF  tcc/sdpa throughput {b/a:.2f}"
    print(res, flush=True)

for variant in VARIANTS:
    for args in [(1, 2, 7, 33, 64), (2, 3, 1000, 1000, 64), (1, 4, 257, 300, 128), (1, 1, 1, 1, 128)]:
        for causal in (False, True):
            if causal and args[2] != args[3]: continue
            for amp in (1.0, 12.0):
                run(*args, torch.float16 if amp == 1 else torch.bfloat16, causal, 128 if args[4] == 64 else 64, variant, amp=amp)
for D, BN in ((64, 128), (128, 64)):
    for causal in (False, True):
        for S in (2048, 8192):
            for variant in VARIANTS:
                if variant[3] and D == 64: continue
                run(4 if S == 2048 else 1, 16, S, S, D, torch.float16, causal, BN, variant, time_it=True)

# decode: the kernel's time by the number of key splits (no combine: time only)
def decode_src(D, BN, splits):
    return PREAMBLE + FLASH + EXTRA + WG + f"""
extern "C" __global__ void __launch_bounds__(128, 1) k(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
  const unsigned short* __restrict__ V, float* __restrict__ O, float scale, long long S, long long L, long long H) {{
  extern __shared__ __align__(16) unsigned char raw[];
  unsigned char* sm = raw + ((1024u - (tcc_smem(raw) & 1023u)) & 1023u);
  const long long bh = blockIdx.x / {splits}, part = blockIdx.x % {splits};
  const long long chunk = (L / {splits} + {BN} - 1) / {BN} * {BN};
  const long long k0 = part * chunk, k1 = k0 + chunk < L ? k0 + chunk : L;
  tcc_flash_wg<{D}, {BN}, 1, false, true>(sm, 0, S, k0, k1,
    [&](long long i) {{ return &Q[(bh * S + i) * {D}]; }},
    [&](long long j) {{ return &K[(bh * L + j) * {D}]; }},
    [&](long long j) {{ return &V[(bh * L + j) * {D}]; }},
    [&](long long i, long long j, float dot) {{ return dot * scale; }},
    [&](long long i) -> long long {{ return L; }},
    [&](long long i, long long d, float w, float l, float m) {{ O[((bh * {splits} + part) * S + i) * {D} + d] = w / l; }},
    [&](long long i, float l, float m) {{}});
}}
"""

def decode(B=8, H=16, L=8192, D=128, BN=64):
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
    k = torch.randn(B, H, L, D, device="cuda", dtype=torch.float16)
    v = torch.randn(B, H, L, D, device="cuda", dtype=torch.float16)
    stream = torch.cuda.current_stream().cuda_stream
    f2 = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    for splits in (1, 2, 4, 8, 16):
        o = torch.empty(B * H * splits * D, device="cuda", dtype=torch.float32)
        mod = driver.load_module(nvrtc.compile_cubin(decode_src(D, BN, splits), "sm_90a"), "dec")
        ln = driver.Launcher(mod, "k", B * H * splits, 128, [("Q","p"),("K","p"),("V","p"),("O","p"),("scale","f32"),("S","i64"),("L","i64"),("H","i64")], 64 * D * 2 + 4 * BN * D * 2 + 1024)
        vals = dict(Q=q.data_ptr(), K=k.data_ptr(), V=v.data_ptr(), O=o.data_ptr(), scale=D ** -0.5, S=1, L=L, H=H)
        f1 = lambda: ln.launch(vals, stream, "dec")
        ts = {"tcc": [], "sdpa": []}
        for f in (f1, f2): f(); f()
        for _ in range(11):
            for nm, f in (("tcc", f1), ("sdpa", f2)):
                torch.cuda.synchronize(); t0 = time.perf_counter()
                for _ in range(5): f()
                torch.cuda.synchronize(); ts[nm].append((time.perf_counter() - t0) / 5)
        a, b = statistics.median(ts["tcc"]), statistics.median(ts["sdpa"])
        gbs = 2 * B * H * L * D * 2 / a / 1e9
        print(f"decode B{B} H{H} L{L} D{D} splits {splits}: tcc kernel {a*1e6:.1f} us ({gbs:.0f} GB/s) sdpa {b*1e6:.1f} us  tcc/sdpa throughput {b/a:.2f}", flush=True)

decode()
