"""Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): the
counter-based generator behind ``rand``, ``randn`` and ``philox`` in the language.

A pure function of a 64-bit key (the seed) and a 128-bit counter (up to four indices, 32 bits
each), so every target computes the same bits for the same element under any schedule: no state,
no order. The language's ``philox(word, seed, i, ...)`` is one of the four 32-bit output words;
``rand`` and ``randn`` are expressions over it that sema builds (``tcc.frontend.sema_expr``).
This module holds the constants every code generator uses and the NumPy implementation the
reference interpreter uses.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 10
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
KEY_BUMPS = (0x9E3779B9, 0xBB67AE85)
COUNTERS = 4  # indices a call may give; missing ones are 0
MASK = 0xFFFFFFFF


def philox(seed: np.ndarray, counter: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """The four output words (uint64 arrays holding 32-bit values) for an int64 seed (the key:
    its low and high words) and four int64 counter words (their low 32 bits), broadcast."""
    seed = _bits(seed)
    key = [seed & MASK, seed >> np.uint64(32)]
    c = [_bits(x) & MASK for x in counter]
    m0, m1 = np.uint64(MULTIPLIERS[0]), np.uint64(MULTIPLIERS[1])
    for r in range(ROUNDS):
        if r:
            key = [(key[0] + KEY_BUMPS[0]) & MASK, (key[1] + KEY_BUMPS[1]) & MASK]
        p0, p1 = m0 * c[0], m1 * c[2]  # < 2**64: exact in uint64
        hi0, lo0 = p0 >> np.uint64(32), p0 & MASK
        hi1, lo1 = p1 >> np.uint64(32), p1 & MASK
        c = [hi1 ^ c[1] ^ key[0], lo1, hi0 ^ c[3] ^ key[1], lo0]
    return tuple(c)


def word(which: int, seed: np.ndarray, counter: tuple[np.ndarray, ...]) -> np.ndarray:
    """Output word ``which`` (0-3) as int64 values in [0, 2**32)."""
    return philox(seed, counter)[which].astype(np.int64)


def _bits(x: np.ndarray) -> np.ndarray:
    """An int64 value's two's-complement bits as uint64."""
    return np.asarray(x, np.int64).view(np.uint64)
