"""Quickstart: compile two ops from source, run them on random data, compare with NumPy."""

from pathlib import Path

import numpy as np

import tcc

here = Path(__file__).parent
lib = tcc.compile(here / "matmul.tc")  # or source text; target="cpu" is the default
rng = np.random.default_rng(0)
A = rng.standard_normal((300, 200), dtype=np.float32)
B = rng.standard_normal((200, 100), dtype=np.float32)

C = lib.matmul(A, B)
err = np.abs(C - A @ B).max() / np.abs(A @ B).max()
print(f"matmul {A.shape} x {B.shape} -> {C.shape}; max relative error vs NumPy: {err:.2e}")

ops = tcc.compile(here / "softmax.tc")
X = rng.standard_normal((4, 1000), dtype=np.float32)
Y = ops.softmax(X)
expected = np.exp(X - X.max(1, keepdims=True))
expected /= expected.sum(1, keepdims=True)
print(f"softmax {X.shape}: max abs error vs NumPy: {np.abs(Y - expected).max():.2e}")

print("\nThe loop nest tcc generated for a 4x3 @ 3x2 matmul:")
print(lib.matmul.lower(A[:4, :3], B[:3, :2], stage="loops"))
assert err < 1e-4, "tcc disagrees with NumPy"
