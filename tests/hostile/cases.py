"""Hostile sources, made deterministically from a seed: random bytes, random unicode, and valid
programs (the examples, DSL.md's, a few more) mutated by token and by character."""

from __future__ import annotations

import random
import re
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"

EXTRA = [
    "op sel(X: f32[N], Y: i32[N]) -> (Z: f32[N], W: i8[N]) {\n"
    "    Z[i] = select(X[i] > 0.5, X[i] ** 2, -inf)\n    W[i] = i8(Y[i] % 7) // 2\n}\n",
    "op red[K = 3](X: f64[N, M]) -> Y: f64[N] {\n    Xp = pad(X, [0, 1], value=nan)\n"
    "    Y[n] = max[m](Xp[n, m]) + min[r: K](X[n, r % M]) * prod[m](X[n, m])\n}\n",
    "op cast(A: f16[N], b: bool[N]) -> C: f32[N] {\n    T[i] = f32(A[i]) * 2 + f32(i)\n"
    "    C[i] = select(b[i] and not (T[i] < 0), sqrt(abs(T[i])), floor(T[i]))\n}\n",
    "op mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {\n    C[i, j] = sum[k](A[i, k] * B[k, j])\n}\n"
    "schedule mm cpu {\n    split(i, 4, io, ii); reorder(io, j, k, ii)\n    vectorize(ii); parallel(io)\n}\n",
]

_TOKEN = re.compile(r"\s+|[A-Za-z_][A-Za-z0-9_]*|\d+\.?\d*(?:[eE][+-]?\d+)?|\*\*|//|->|[<>=!]=|.", re.S)
_NUMBERS = ["0", "-1", "1", "127", "128", "-129", "2147483648", "9223372036854775807",
            "9223372036854775808", "99999999999999999999", "100000000", "1e309", "1e-400", "0.0", "inf", "nan"]
_DTYPES = ["f16", "bf16", "f32", "f64", "i8", "i32", "i64", "bool"]
_PUNCT = list("()[]{},;:=+-*/%<>.#\n") + ["**", "//", "->", "sum[k]", "max[", "pad(", "op", "schedule"]
_UNICODE = "éλ∑→ 　\u200b\ufeff\U0001f600\x00\x7f\r\t\\\"'`ÿ\ud7ff\u0301"


def base_programs() -> list[str]:
    return [p.read_text() for p in sorted(EXAMPLES.glob("*.tc"))] + EXTRA


def random_bytes(rnd: random.Random) -> bytes:
    return bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 200)))


def random_unicode(rnd: random.Random) -> str:
    """Text that is valid UTF-8 but made of odd characters, with some of the language mixed in."""
    pieces = []
    for _ in range(rnd.randrange(1, 60)):
        r = rnd.random()
        if r < 0.4:
            pieces.append(rnd.choice(_UNICODE))
        elif r < 0.7:
            pieces.append(rnd.choice(_PUNCT))
        else:
            pieces.append(chr(rnd.randrange(0x20, 0x3000)))
    return "".join(pieces).encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def mutate(source: str, rnd: random.Random, gentle: bool = False) -> str:
    """One to three random edits of a valid program, by token or by character; ``gentle`` edits
    only numbers, dtypes and names, so that most results still parse and reach code generation."""
    tokens = _TOKEN.findall(source)
    for _ in range(rnd.randrange(1, 4)):
        if not tokens:
            break
        i = rnd.randrange(len(tokens))
        kind = rnd.randrange(3, 6) if gentle else rnd.randrange(9)
        if kind == 0:
            del tokens[i]
        elif kind == 1:
            tokens.insert(i, tokens[i])
        elif kind == 2 and i + 1 < len(tokens):
            tokens[i], tokens[i + 1] = tokens[i + 1], tokens[i]
        elif kind == 3:
            numbers = [j for j, t in enumerate(tokens) if t[:1].isdigit()]
            if numbers:
                tokens[rnd.choice(numbers)] = rnd.choice(_NUMBERS)
        elif kind == 4:
            dtypes = [j for j, t in enumerate(tokens) if t in _DTYPES]
            if dtypes:
                tokens[rnd.choice(dtypes)] = rnd.choice(_DTYPES)
        elif kind == 5:
            names = [t for t in tokens if t[:1].isalpha()]
            tokens[i] = rnd.choice(names) if names else tokens[i]
        elif kind == 6:
            tokens.insert(i, rnd.choice(_PUNCT))
        else:
            text = "".join(tokens)
            j = rnd.randrange(len(text) + 1)
            edit = rnd.randrange(3)
            if edit == 0:
                text = text[:j] + text[j + 1:]
            elif edit == 1:
                text = text[:j] + rnd.choice(_UNICODE + "0123456789_") + text[j:]
            else:
                text = text[:j] + text[j:j + 5] + text[j:]
            tokens = _TOKEN.findall(text)
    return "".join(tokens)
