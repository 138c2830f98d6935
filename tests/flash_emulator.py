"""A host emulator of the hand-written flash templates (tcc/codegen_cuda/flash*.py), to check
their numbers on machines without a GPU: the CUDA C of a standalone program is compiled by g++
against a shim where every CUDA thread is a host thread, ``__syncthreads`` a barrier of the block's
threads, and the warp-wide instructions (``ldmatrix``, ``mma.sync`` m16n8k16, shuffles) are carried
out for the 32 lanes of a warp at a barrier of its own, with the fragments laid out as the PTX
manual says. Blocks run one after another; ``cp.async`` copies land at once (the commits and waits
become empty statements), so a missing wait goes unnoticed, as does any other async hazard.
Small problems only. The emulator's fragments are checked against the forward template, which
runs on the device. :func:`generated` runs a backward kernel of a program tcc generated (its
lambdas printed from the loop IR) the same way.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

from tcc.codegen_cuda.flash_backward import DELTA_THREADS, FLASH_BACKWARD, shared_bytes, standalone_kernels

SHIM = r"""// Host emulation of the CUDA pieces the backward template uses: a thread per CUDA thread,
// warp collectives (ldmatrix, mma.sync, shuffles) through per-warp barriers.
#include <barrier>
#include <thread>
#include <vector>
#include <mutex>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdint>
#define __global__
#define __launch_bounds__(x)
#define __restrict__ __restrict
#define TCC_D static inline
struct Dim { unsigned x; };
thread_local Dim threadIdx, blockIdx;
unsigned char* g_smem;
std::barrier<>* g_block;
struct Warp {
  std::barrier<>* bar;
  unsigned addr[32];
  unsigned a[32][4], b[32][2];
  float c[32][4];
  float v[32];
};
Warp* g_warps;
std::mutex g_atomic;
static inline void __syncthreads() { g_block->arrive_and_wait(); }
static inline Warp& my_warp() { return g_warps[threadIdx.x / 32]; }
static inline float __shfl_xor_sync(unsigned, float x, int m) {
  Warp& w = my_warp(); int l = threadIdx.x & 31;
  w.v[l] = x; w.bar->arrive_and_wait(); float r = w.v[l ^ m]; w.bar->arrive_and_wait(); return r;
}
static inline float h2f(unsigned short h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static inline unsigned short f2h(float x) { _Float16 f = (_Float16)x; unsigned short h; memcpy(&h, &f, 2); return h; }
static inline float b2f(unsigned short h) { unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline unsigned short f2b(float x) { unsigned u; memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }
TCC_D float tcc_f16_to_f32(unsigned short h) { return h2f(h); }
TCC_D unsigned short tcc_f32_to_f16(float f) { return f2h(f); }
TCC_D float tcc_bf16_to_f32(unsigned short h) { return b2f(h); }
TCC_D unsigned short tcc_f32_to_bf16(float f) { return f2b(f); }
TCC_D unsigned tcc_smem(const void* p) { return (unsigned)((const unsigned char*)p - g_smem); }
TCC_D void tcc_cp16(unsigned dst, const void* src, bool valid) {
  if (valid) memcpy(g_smem + dst, src, 16); else memset(g_smem + dst, 0, 16);
}
TCC_D void tcc_copy16(unsigned char* smem, unsigned off, const unsigned short* src, bool ok, bool aligned) {
  if (aligned) { tcc_cp16(tcc_smem(smem) + off, src, ok); return; }
  unsigned short* dst = (unsigned short*)(smem + off);
  for (int e = 0; e < 8; ++e) dst[e] = ok ? src[e] : (unsigned short)0;
}
TCC_D bool tcc_aligned16(const void* a, const void* b, const void* c) {
  return ((reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(b)
           | reinterpret_cast<unsigned long long>(c)) & 15ull) == 0;
}
static inline unsigned short smem16(unsigned addr) { unsigned short h; memcpy(&h, g_smem + addr, 2); return h; }
TCC_D void tcc_ldsm4(unsigned addr, unsigned* r, bool trans) {
  Warp& w = my_warp(); int l = threadIdx.x & 31;
  if (addr % 16) { fprintf(stderr, "misaligned ldmatrix\n"); abort(); }
  w.addr[l] = addr; w.bar->arrive_and_wait();
  int row = l >> 2, col = 2 * (l & 3);
  for (int m = 0; m < 4; ++m) {
    unsigned lo, hi;
    if (!trans) { lo = smem16(w.addr[m * 8 + row] + 2 * col); hi = smem16(w.addr[m * 8 + row] + 2 * (col + 1)); }
    else { lo = smem16(w.addr[m * 8 + col] + 2 * row); hi = smem16(w.addr[m * 8 + col + 1] + 2 * row); }
    r[m] = lo | (hi << 16);
  }
  w.bar->arrive_and_wait();
}
template <bool BF16> TCC_D unsigned tcc_pack2(float lo, float hi) {
  return BF16 ? (unsigned)f2b(lo) | ((unsigned)f2b(hi) << 16) : (unsigned)f2h(lo) | ((unsigned)f2h(hi) << 16);
}
template <bool BF16> static inline float half_of(unsigned x, int e) {
  unsigned short h = (unsigned short)(e ? x >> 16 : x & 0xffff); return BF16 ? b2f(h) : h2f(h);
}
template <bool BF16> TCC_D void tcc_mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  Warp& w = my_warp(); int l = threadIdx.x & 31;
  for (int i = 0; i < 4; ++i) w.a[l][i] = a[i];
  w.b[l][0] = b0; w.b[l][1] = b1;
  w.bar->arrive_and_wait();
  float A[16][16], B[16][8];
  for (int ln = 0; ln < 32; ++ln) {
    int g = ln >> 2, t = ln & 3;
    for (int e = 0; e < 2; ++e) {
      A[g][2 * t + e] = half_of<BF16>(w.a[ln][0], e); A[g + 8][2 * t + e] = half_of<BF16>(w.a[ln][1], e);
      A[g][2 * t + 8 + e] = half_of<BF16>(w.a[ln][2], e); A[g + 8][2 * t + 8 + e] = half_of<BF16>(w.a[ln][3], e);
      B[2 * t + e][g] = half_of<BF16>(w.b[ln][0], e); B[2 * t + 8 + e][g] = half_of<BF16>(w.b[ln][1], e);
    }
  }
  w.bar->arrive_and_wait();
  int g = l >> 2, t = l & 3;
  for (int i = 0; i < 4; ++i) {
    int r = g + 8 * (i >> 1), n = 2 * t + (i & 1);
    float acc = c[i];
    for (int k = 0; k < 16; ++k) acc += A[r][k] * B[k][n];
    c[i] = acc;
  }
}
static inline bool __all_sync(unsigned, bool x) {
  Warp& w = my_warp(); int l = threadIdx.x & 31;
  w.v[l] = x; w.bar->arrive_and_wait();
  bool r = true;
  for (int i = 0; i < 32; ++i) r = r && w.v[i] != 0.f;
  w.bar->arrive_and_wait(); return r;
}
TCC_D float tcc_ex2(float x) { return exp2f(x); }
static inline void atomicAdd(float* p, float x) { std::lock_guard<std::mutex> g(g_atomic); *p += x; }
template <int D> TCC_D unsigned tcc_swz(int row, int chunk) {  // byte offset of a 16-byte chunk of a row
  return (unsigned)(row * D * 2 + ((chunk ^ (row & 7)) << 4));
}
"""

_BACKWARD_MAIN = r"""
#include <fstream>
template <typename T> std::vector<T> rd(const char* f, size_t n) {
  std::vector<T> v(n);
  std::ifstream(f, std::ios::binary).read((char*)v.data(), n * sizeof(T));
  return v;
}
template <typename T> void wr(const char* f, const std::vector<T>& v) {
  std::ofstream(f, std::ios::binary).write((const char*)v.data(), v.size() * sizeof(T));
}
template <typename F> void launch(long long grid, int threads, size_t smem, F f) {
  std::vector<unsigned char> sm(smem + 16, 0x7e);
  for (long long blk = 0; blk < grid; ++blk) {
    memset(sm.data(), 0x7e, sm.size());
    g_smem = sm.data();
    std::barrier<> block(threads);
    g_block = &block;
    int nw = (threads + 31) / 32;
    std::vector<Warp> warps(nw);
    std::vector<std::barrier<>*> bars;
    for (int w = 0; w < nw; ++w) { bars.push_back(new std::barrier<>(32)); warps[w].bar = bars.back(); }
    g_warps = warps.data();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) ts.emplace_back([=] { threadIdx.x = t; blockIdx.x = (unsigned)blk; f(); });
    for (auto& t : ts) t.join();
    for (auto* b : bars) delete b;
  }
}
int main(int argc, char** argv) {
  long long B = atoll(argv[1]), H = atoll(argv[2]), S = atoll(argv[3]), L = atoll(argv[4]);
  int causal = atoi(argv[5]); float scale = atof(argv[6]);
  const long long D = DIM, BN = 16 * WARPS;
  auto q = rd<unsigned short>("q.bin", B * H * S * D), k = rd<unsigned short>("k.bin", B * H * L * D),
       v = rd<unsigned short>("v.bin", B * H * L * D), o = rd<unsigned short>("o.bin", B * H * S * D),
       g = rd<unsigned short>("do.bin", B * H * S * D);
  auto lse = rd<float>("lse.bin", B * H * S);
  std::vector<float> delta(B * H * S, NAN), dqa(B * H * S * D, 0.f);
  std::vector<unsigned short> dq(B * H * S * D, 0x7e7e), dk(B * H * L * D, 0x7e7e), dv(B * H * L * D, 0x7e7e);
  long long n = B * H * S;
  long long rows = DELTA / (D / 8);
  launch((n + rows - 1) / rows, DELTA, 0, [&] { delta_k(o.data(), g.data(), delta.data(), n); });
  launch(B * H * ((L + BN - 1) / BN), 32 * WARPS, SMEM, [&] {
    bwd_k(q.data(), k.data(), v.data(), g.data(), lse.data(), delta.data(), dqa.data(), dk.data(), dv.data(),
          scale, S, L, causal); });
  long long m = n * D;
  launch((m + 255) / 256, 256, 0, [&] { dq_k(dqa.data(), dq.data(), scale, m); });
  wr("dq.bin", dq); wr("dk.bin", dk); wr("dv.bin", dv); wr("delta.bin", delta);
}
"""

_ASYNC = ('asm volatile("cp.async.commit_group;" ::: "memory");',
          'asm volatile("cp.async.wait_group 1;" ::: "memory");',
          'asm volatile("cp.async.wait_group 0;" ::: "memory");')


def available() -> bool:
    return shutil.which("g++") is not None


def host_program(cuda_text: str) -> str:
    """``cuda_text`` (template and kernels, no preamble) as C++ for the shim: the async copies' commits
    and waits dropped, dynamic shared memory the block's buffer."""
    for a in _ASYNC:
        cuda_text = cuda_text.replace(a, ";")
    cuda_text = cuda_text.replace("extern __shared__ __align__(16) unsigned char raw[];",
                                  "unsigned char* raw = g_smem;")
    left = [ln for ln in cuda_text.splitlines() if "asm" in ln and "red.global" not in ln]
    assert not left, left
    return SHIM + "\n" + cuda_text


def build(cpp: str) -> str:
    """An executable of ``cpp`` (cached by its text in the temporary directory)."""
    key = hashlib.sha256(cpp.encode()).hexdigest()[:16]
    exe = os.path.join(tempfile.gettempdir(), f"tcc-flash-emu-{os.getuid()}-{key}")
    if not os.path.exists(exe):
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "k.cpp")
            with open(src, "w") as f:
                f.write(cpp)
            subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-w", src, "-o", exe + ".part"], check=True)
            os.replace(exe + ".part", exe)
    return exe


def backward(d: int, bm: int, warps: int, bf16: bool, q, k, v, o, do, lse, causal: bool, scale: float):
    """(dq, dk, dv, delta) of the standalone kernels on ``[B, H, n, d]`` uint16 bit patterns and an
    f32 ``[B, H, S]`` log-sum-exp; the outputs as uint16 bit patterns (Delta f32)."""
    text = standalone_kernels(d, bm, warps, bf16)
    body = text[text.index(FLASH_BACKWARD):]
    defines = (f"#define DIM {d}\n#define WARPS {warps}\n#define DELTA {DELTA_THREADS}\n"
               f"#define SMEM {shared_bytes(d, bm, warps)}\n")
    exe = build(host_program(body) + defines + _BACKWARD_MAIN)
    B, H, S, L = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    with tempfile.TemporaryDirectory() as tmp:
        for name, x in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do)):
            np.ascontiguousarray(x, np.uint16).tofile(os.path.join(tmp, name + ".bin"))
        np.ascontiguousarray(lse, np.float32).tofile(os.path.join(tmp, "lse.bin"))
        subprocess.run([exe, str(B), str(H), str(S), str(L), str(int(causal)), repr(scale)], check=True, cwd=tmp)
        read = lambda name, n: np.fromfile(os.path.join(tmp, name + ".bin"), np.uint16).reshape(B, H, n, d)  # noqa: E731
        delta = np.fromfile(os.path.join(tmp, "delta.bin"), np.float32).reshape(B, H, S)
        return read("dq", S), read("dk", L), read("dv", L), delta


def to16(x, bf16: bool) -> np.ndarray:
    """f32 values as f16 or bf16 (nearest even) bit patterns."""
    x = np.asarray(x, np.float32)
    if bf16:
        u = x.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return x.astype(np.float16).view(np.uint16)


def from16(h, bf16: bool) -> np.ndarray:
    return (h.astype(np.uint32) << 16).view(np.float32) if bf16 else h.view(np.float16).astype(np.float32)


_FORWARD_SHIM = r"""
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline void atomicMax(long long* p, long long v) { std::lock_guard<std::mutex> g(g_atomic); if (v > *p) *p = v; }
#define __shared__ static
"""

_FORWARD_KERNEL = r"""
void k(const unsigned short* Q, const unsigned short* K, const unsigned short* V, unsigned short* O, float scale,
       long long S, long long L, int causal) {
  const long long tiles = (S + BM - 1) / BM;
  const long long bh = blockIdx.x / tiles, t = blockIdx.x % tiles;
  CALL(g_smem, t * BM, S, 0, L,
    [&](long long i) { return &Q[(bh * S + i) * DIM]; },
    [&](long long j) { return &K[(bh * L + j) * DIM]; },
    [&](long long j) { return &V[(bh * L + j) * DIM]; },
    [&](long long i, long long j, float dot) { return dot * scale; },
    [&](long long i) -> long long { return causal ? i + 1 : L; },
    [&](long long i, long long d, float w, float l, float m) { O[(bh * S + i) * DIM + d] = tcc_f32_to_f16(w / l); },
    [&](long long i, float l, float m) {});
}
#include <fstream>
template <typename T> std::vector<T> rd(const char* f, size_t n) {
  std::vector<T> v(n);
  std::ifstream(f, std::ios::binary).read((char*)v.data(), n * sizeof(T));
  return v;
}
int main(int argc, char** argv) {
  long long BH = atoll(argv[1]), S = atoll(argv[2]), L = atoll(argv[3]);
  int causal = atoi(argv[4]);
  float scale = atof(argv[5]);
  auto q = rd<unsigned short>("q.bin", BH * S * DIM), kk = rd<unsigned short>("k.bin", BH * L * DIM),
       v = rd<unsigned short>("v.bin", BH * L * DIM);
  std::vector<unsigned short> o(BH * S * DIM, 0x7e7e);
  std::vector<unsigned char> sm(SMEM, 0x7e);
  const long long grid = BH * ((S + BM - 1) / BM);
  for (long long blk = 0; blk < grid; ++blk) {
    g_smem = sm.data();
    std::barrier<> block(32 * WARPS);
    g_block = &block;
    std::vector<Warp> warps(WARPS);
    for (auto& w : warps) w.bar = new std::barrier<>(32);
    g_warps = warps.data();
    std::vector<std::thread> ts;
    for (int t = 0; t < 32 * WARPS; ++t)
      ts.emplace_back([&, t] { threadIdx.x = t; blockIdx.x = (unsigned)blk; k(q.data(), kk.data(), v.data(), o.data(),
                                                                             scale, S, L, causal); });
    for (auto& t : ts) t.join();
    for (auto& w : warps) delete w.bar;
  }
  std::ofstream("o.bin", std::ios::binary).write((const char*)o.data(), o.size() * 2);
}
"""


def forward(d: int, bn: int, warps: int, mt: int, qreg: bool, q, k, v, causal: bool, scale: float):
    """The forward template ``tcc_flash`` (f16, ``[BH, n, d]`` bit patterns in and out): what runs on
    the device, so the emulator's fragments are checked against it."""
    from tcc.codegen_cuda.flash import FLASH

    start = FLASH.rindex("template <", 0, FLASH.index("TCC_D void tcc_online_row"))  # (the helpers: the shim's)
    body = re.sub(r"template <int D> TCC_D unsigned tcc_swz\(.*?\n}\n", "", FLASH[start:], flags=re.S)
    bm = 16 * warps * mt
    defines = (f"#define DIM {d}\n#define WARPS {warps}\n#define BM {bm}\n"
               f"#define SMEM {bm * d * 2 + 4 * bn * d * 2}\n"
               f"#define CALL tcc_flash<{d}, {bn}, {warps}, {mt}, {str(qreg).lower()}, false, true>\n")
    exe = build(host_program(_FORWARD_SHIM + body) + defines + _FORWARD_KERNEL)
    BH, S, L = q.shape[0], q.shape[1], k.shape[1]
    with tempfile.TemporaryDirectory() as tmp:
        for name, x in (("q", q), ("k", k), ("v", v)):
            np.ascontiguousarray(x, np.uint16).tofile(os.path.join(tmp, name + ".bin"))
        subprocess.run([exe, str(BH), str(S), str(L), str(int(causal)), repr(scale)], check=True, cwd=tmp)
        return np.fromfile(os.path.join(tmp, "o.bin"), np.uint16).reshape(BH, S, d)


_GENERATED_SHIM = r"""
static inline float tcc_round_f16(float f) { return h2f(f2h(f)); }
static inline float tcc_round_bf16(float f) { return b2f(f2b(f)); }
template <typename T> static inline T tcc_floordiv(T a, T b) {
  T q = a / b; return (a % b != 0 && ((a % b < 0) != (b < 0))) ? q - 1 : q; }
template <typename T> static inline T tcc_mod(T a, T b) {
  T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
"""
_CTYPES = {"unsigned short": np.uint16, "float": np.float32, "long long": np.int64, "int": np.int32}


def generated(kernel_text: str, grid: int, threads: int, smem: int, inputs: dict[str, np.ndarray | float]
              ) -> dict[str, np.ndarray]:
    """Run one kernel of a program tcc generated (``kernel_text``: its C, calling ``tcc_flash_bwd``)
    on the host: ``inputs`` name every parameter (arrays for pointers, numbers for scalars); the
    arrays of the pointers it writes come back."""
    found = re.search(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\((.*?)\) \{', kernel_text)
    assert found, kernel_text[:200]
    name, params = found.group(1), [p.strip() for p in found.group(2).split(",")]
    text = kernel_text.replace(found.group(0), f"static void {name}({found.group(2)}) {{", 1)
    text = re.sub(r"extern __shared__ .*?tcc_shared_raw\[\];\n", "", text)
    text = re.sub(r"unsigned char\* const tcc_shared = tcc_shared_raw .*?;\n",
                  "unsigned char* const tcc_shared = g_smem;\n", text)
    decls, args, outs = [], [], []
    for p in params:
        ctype, pname = p.rsplit(" ", 1)
        base = ctype.replace("const ", "").replace("__restrict__", "").replace("*", "").strip()
        if "*" in ctype:
            n = np.asarray(inputs[pname]).size
            decls.append(f'  auto {pname} = rd<{base}>("{pname}.bin", {n});')
            args.append(f"{pname}.data()")
            if "const" not in ctype:
                outs.append((pname, base))
        else:
            args.append(f"({base})({inputs[pname]!r})")
    main = "\n".join([
        "#include <fstream>",
        "template <typename T> std::vector<T> rd(const char* f, size_t n) {",
        "  std::vector<T> v(n); std::ifstream(f, std::ios::binary).read((char*)v.data(), n * sizeof(T)); return v; }",
        "template <typename T> void wr(const char* f, const std::vector<T>& v) {",
        "  std::ofstream(f, std::ios::binary).write((const char*)v.data(), v.size() * sizeof(T)); }",
        _BACKWARD_MAIN[_BACKWARD_MAIN.index("template <typename F> void launch"):_BACKWARD_MAIN.index("int main")],
        "int main() {", *decls,
        f"  launch({grid}, {threads}, {smem}, [&] {{ {name}({', '.join(args)}); }});",
        *(f'  wr("{o}.bin", {o});' for o, _ in outs), "}"])
    exe = build(host_program(_GENERATED_SHIM + FLASH_BACKWARD + text) + "\n" + main)
    with tempfile.TemporaryDirectory() as tmp:
        for p in params:
            pname = p.rsplit(" ", 1)[1]
            if "*" in p:
                np.ascontiguousarray(inputs[pname]).tofile(os.path.join(tmp, pname + ".bin"))
        subprocess.run([exe], check=True, cwd=tmp)
        return {o: np.fromfile(os.path.join(tmp, o + ".bin"), _CTYPES[base]).reshape(np.shape(inputs[o]))
                for o, base in outs}
