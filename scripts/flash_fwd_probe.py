"""The FlashAttention forward template (``tcc_flash_wg``, sm_90) alone against SDPA on a GPU, by key
step and blocks a multiprocessor: correctness at odd sizes, then throughput ratios; and the
decoding shape's kernel by the number of key splits.

    python3 scripts/flash_fwd_probe.py                 # on the device (torch with CUDA)
    python3 scripts/flash_fwd_probe.py --compile-only  # anywhere with NVRTC: ptxas registers and spills
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from tcc.codegen_cuda import nvrtc  # noqa: E402
from tcc.codegen_cuda.flash import FLASH, FLASH_WARPGROUP, _wgmma  # noqa: E402
from tcc.codegen_cuda.preamble import PREAMBLE  # noqa: E402

ARCH = "sm_90a"
ROWS = 64  # one warpgroup's query rows a block
# 32 keys a step is not one of the template's own: its instructions, and its place in the dispatch
_STEP = "      if constexpr (BN == 48)"
TEMPLATES = PREAMBLE + FLASH + "".join(_wgmma(32, a) for a in (False, True)) + FLASH_WARPGROUP.replace(
    _STEP, "      if constexpr (BN == 32) tcc_wgmma_ss_32<BF16>(s, a, b, kk > 0);\n      else if constexpr (BN == 48)")
# row length -> (keys a step, blocks a multiprocessor asked of ptxas); the first is the scheduler's
VARIANTS = {64: [(128, 1), (128, 3), (64, 3)], 128: [(48, 3), (64, 2), (32, 4)]}
PARAMS = [("Q", "p"), ("K", "p"), ("V", "p"), ("O", "p"), ("scale", "f32"), ("S", "i64"), ("L", "i64"),
          ("splits", "i64")]


def source(depth: int, keys: int, blocks: int, bf16: bool, causal: bool) -> str:
    """One kernel: a block per (head, tile of rows, split of keys); O in the inputs' type, or the
    unnormalised f32 rows of each split (``splits`` > 1: timing only, no merge)."""
    half = "tcc_f32_to_bf16" if bf16 else "tcc_f32_to_f16"
    limit = "i + 1" if causal else "L"
    return TEMPLATES + f"""
extern "C" __global__ void __launch_bounds__(128, {blocks}) k(const unsigned short* __restrict__ Q,
    const unsigned short* __restrict__ K, const unsigned short* __restrict__ V, void* __restrict__ O, float scale,
    long long S, long long L, long long splits) {{
  extern __shared__ __align__(16) unsigned char raw[];
  unsigned char* sm = raw + ((1024u - (tcc_smem(raw) & 1023u)) & 1023u);
  const long long tiles = (S + {ROWS - 1}) / {ROWS}, part = blockIdx.x % splits, rest = blockIdx.x / splits;
  const long long bh = rest / tiles, t = tiles - 1 - rest % tiles;
  const long long chunk = (L / splits + {keys - 1}) / {keys} * {keys}, k0 = part * chunk;
  const long long k1 = splits == 1 || k0 + chunk > L ? L : k0 + chunk;
  tcc_flash_wg<{depth}, {keys}, 1, {str(bf16).lower()}, true>(sm, t * {ROWS}, S, k0, k1,
    [&](long long i) {{ return &Q[(bh * S + i) * {depth}]; }},
    [&](long long j) {{ return &K[(bh * L + j) * {depth}]; }},
    [&](long long j) {{ return &V[(bh * L + j) * {depth}]; }},
    [&](long long i, long long j, float dot) {{ return dot * scale; }},
    [&](long long i) -> long long {{ return {limit}; }},
    [&](long long i, long long d, float w, float l, float m) {{
      if (splits == 1) ((unsigned short*)O)[(bh * S + i) * {depth} + d] = {half}(w / l);
      else ((float*)O)[((bh * splits + part) * S + i) * {depth} + d] = w / l; }},
    [&](long long i, float l, float m) {{}});
}}
"""


def compile_only() -> None:
    for depth, variants in VARIANTS.items():
        for keys, blocks in variants:
            log = nvrtc.ptxas_report(source(depth, keys, blocks, False, True), ARCH)
            used = [line.split("info    : ")[-1] for line in log.splitlines() if "Used" in line or "spill" in line]
            print(f"D {depth}, {keys} keys a step, {blocks} blocks: {'; '.join(used)}")


class Kernel:
    """One variant loaded on the device, launched on torch's stream."""

    def __init__(self, torch, depth: int, keys: int, blocks: int, bf16: bool, causal: bool):
        from tcc.codegen_cuda import driver

        torch.zeros(1, device="cuda")
        driver.context(0).activate()
        self.module = driver.load_module(nvrtc.compile_cubin(source(depth, keys, blocks, bf16, causal), ARCH), "probe")
        self.driver, self.torch = driver, torch
        self.shared = ROWS * depth * 2 + 4 * keys * depth * 2 + 1024

    def __call__(self, q, k, v, out, splits: int = 1) -> None:
        B, H, S, D = q.shape
        grid = B * H * -(-S // ROWS) * splits
        launcher = self.driver.Launcher(self.module, "k", grid, 128, PARAMS, self.shared)
        values = dict(Q=q.data_ptr(), K=k.data_ptr(), V=v.data_ptr(), O=out.data_ptr(), scale=D ** -0.5, S=S,
                      L=k.shape[2], splits=splits)
        launcher.launch(values, self.torch.cuda.current_stream().cuda_stream, "probe")


def ratio(ours, theirs, trials: int = 11) -> tuple[float, float]:
    """(tcc ms, SDPA ms): medians of interleaved trials of queued calls (CUDA events)."""
    from cuda_kernels import gpu_ms

    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(trials):
        for fn, sink in ((ours, times[0]), (theirs, times[1])):
            sink.append(gpu_ms(fn, 5))
    return statistics.median(times[0]), statistics.median(times[1])


def check_and_time(torch) -> None:
    for depth, variants in VARIANTS.items():
        for keys, blocks in variants:
            for causal in (False, True):
                for bf16 in (False, True):
                    check(torch, Kernel(torch, depth, keys, blocks, bf16, causal), depth, bf16, causal)
                kernel = Kernel(torch, depth, keys, blocks, False, causal)
                for S in (2048, 8192):
                    speed = throughput(torch, kernel, depth, S, causal)
                    print(f"D {depth} keys {keys} blocks {blocks} causal {causal:d} S{S} f16: "
                          f"tcc/SDPA throughput {speed:.2f}", flush=True)


def check(torch, kernel: Kernel, depth: int, bf16: bool, causal: bool) -> None:
    """Odd sizes against SDPA in f32 (outputs poisoned; large scores in the 1000-row case)."""
    dtype = torch.bfloat16 if bf16 else torch.float16
    for S, L, amp in ((7, 33, 1.0), (1000, 1000, 12.0), (257, 300, 1.0), (1, 1, 1.0)):
        if causal and S != L:
            continue
        q = (torch.randn(1, 2, S, depth, device="cuda") * amp).to(dtype)
        k, v = (torch.randn(1, 2, L, depth, device="cuda", dtype=dtype) for _ in range(2))
        out = torch.full_like(q, float("nan"))
        kernel(q, k, v, out)
        want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        err = float((out.float() - want).abs().max())
        print(f"D {depth} {dtype} causal {causal:d} S {S} L {L}: max error {err:.4f}", flush=True)


def throughput(torch, kernel: Kernel, depth: int, S: int, causal: bool) -> float:
    """tcc's throughput over SDPA's, f16, B4 H16 (B1 at 8192)."""
    B = 4 if S == 2048 else 1
    q, k, v = (torch.randn(B, 16, S, depth, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    ours, theirs = ratio(lambda: kernel(q, k, v, out),
                         lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
    return theirs / ours


def decode(torch, B: int = 8, H: int = 16, L: int = 8192, depth: int = 128) -> None:
    """The decoding shape (one query) by the number of key splits: the kernel alone, no merge."""
    q = torch.randn(B, H, 1, depth, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, H, L, depth, device="cuda", dtype=torch.float16) for _ in range(2))
    kernel = Kernel(torch, depth, *VARIANTS[depth][0], False, False)
    for splits in (1, 2, 4, 8, 16):
        out = torch.empty(B * H * splits * depth, device="cuda", dtype=torch.float32)
        ours, theirs = ratio(lambda s=splits, o=out: kernel(q, k, v, o, s),
                             lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
        print(f"decode B{B} H{H} L{L} D{depth}, {splits} splits: {ours * 1e3:.1f} us "
              f"({2 * B * H * L * depth * 2 / ours / 1e6:.0f} GB/s), tcc/SDPA throughput {theirs / ours:.2f}")


if __name__ == "__main__":
    if "--compile-only" in sys.argv:
        compile_only()
    else:
        import torch

        check_and_time(torch)
        decode(torch)
