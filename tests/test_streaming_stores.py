"""Large write-only results take non-temporal stores where aligned: the CPU schedule marks them
(passes/autoschedule_cpu/streaming.py), codegen_cpu/llvm_ir.py emits them."""

import numpy as np
import pytest

import tcc
from tcc.passes.autoschedule_cpu.streaming import stream_bytes
from tcc.runtime.cpu import aligned_empty, machine

SRC = "op fma_relu(A: f32[N], B: f32[N], C: f32[N]) -> Y: f32[N] { Y[i] = max(A[i] * B[i] + C[i], 0.0) }"
AVX512 = machine().avx512
BIG = stream_bytes(machine()) // 4 + 7  # elements: past the threshold (4 L2s of the tests' host model), with a tail


@pytest.mark.skipif(not AVX512, reason="non-temporal stores are emitted on AVX-512 hosts")
def test_only_large_results_stream():
    op = tcc.compile(SRC).fma_relu
    small = np.ones(1000, np.float32)
    assert "!nontemporal" not in op.lower(small, small, small, stage="llvm")
    big = np.ones(BIG, np.float32)
    text = op.lower(big, big, big, stage="llvm")
    assert "!nontemporal" in text and "llvm.x86.sse.sfence" in text
    assert "streamed: Y" in op.lower(big, big, big, stage="scheduled")  # the schedule's decision, in the loop IR


@pytest.mark.parametrize("offset", [0, 1])  # out= on a cache line, and one element past it (plain stores)
def test_streamed_results_are_right(offset, rng):
    a, b, c = (rng.standard_normal(BIG, dtype=np.float32) for _ in range(3))
    expected = np.maximum(a * b + c, np.float32(0))
    op = tcc.compile(SRC).fma_relu
    np.testing.assert_array_equal(op(a, b, c), expected)
    out = aligned_empty((BIG + 1,), np.float32)[offset:offset + BIG]
    out[:] = np.nan
    op(a, b, c, out=out)
    np.testing.assert_array_equal(out, expected)


def test_aligned_empty():
    for shape in [(3, 5), (1 << 20,), (7, 1, 33), (1000, 333)]:
        arr = aligned_empty(shape, np.float32)
        assert arr.shape == shape and arr.flags.c_contiguous and arr.flags.writeable
        assert arr.nbytes < (1 << 20) or arr.ctypes.data % 64 == 0
