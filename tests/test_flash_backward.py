"""FlashAttention-2's backward template (tcc/codegen_cuda/flash_backward.py) compiles through NVRTC
for every tile shape it offers, within the registers (no spills) and the shared memory of a block.
Its numbers are checked on the device by scripts/flash_bwd_probe.py (against torch autograd)."""

import re

import pytest

from tcc.codegen_cuda import nvrtc
from tcc.codegen_cuda.flash_backward import TILES, shared_bytes, standalone_kernels

H100_SHARED_PER_BLOCK = 227 * 1024


@pytest.mark.parametrize("d,bm,warps", [(d, bm, w) for d, tiles in TILES.items() for bm, w in tiles])
@pytest.mark.parametrize("bf16", [False, True])
def test_backward_fits_registers_without_spills(d, bm, warps, bf16):
    pytest.importorskip("cuda.bindings.nvrtc")
    log = nvrtc.ptxas_report(standalone_kernels(d, bm, warps, bf16), "sm_90")
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert len(spills) == 3, log  # the three kernels
    assert all(s == ("0", "0") for s in spills), log
    assert shared_bytes(d, bm, warps) <= H100_SHARED_PER_BLOCK


def test_backward_compiles_for_sm80():
    """Without sm_90's vector reductions the dQ accumulator takes scalar atomics."""
    pytest.importorskip("cuda.bindings.nvrtc")
    d, (bm, warps) = 64, TILES[64][0]
    assert nvrtc.compile_cubin(standalone_kernels(d, bm, warps, False), "sm_80")
