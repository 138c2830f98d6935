"""The fuzzer's templates: ops of the shapes the compiler specialises for (GEMMs, convolutions,
row chains, two contractions chained through an intermediate), with random sizes, dtype and
epilogue."""

from __future__ import annotations

import random


def template(rnd: random.Random, name: str, bf16: bool) -> tuple[str, dict[str, int]]:
    """One op of the shapes the compiler specialises for: matmul, batched matmul, convolutions
    (1-D, 2-D, strided, dilated, padded, grouped, depthwise), row chains and attention, with
    random sizes, dtype and epilogue; they take the GEMM, im2col, packing, epilogue and streaming
    paths."""
    dt = rnd.choice(["f32", "f32", "f64", "f16"] + (["bf16"] if bf16 else []))
    out = "f32" if dt in ("f16", "bf16") and rnd.random() < 0.5 else dt
    size = lambda: rnd.choice([1, 2, 3, 7, 8, 16, 33, 64, 100])  # noqa: E731
    epilogue = rnd.choice(["", " + b[{c}]", "", " * 0.5"])
    relu = rnd.random() < 0.4
    kind = rnd.choice(["matmul", "bmm", "conv1d", "conv2d", "depthwise", "grouped", "rows", "chain", "attention"])
    if kind == "chain":
        return chain(rnd, name, dt, out, size)
    if kind == "attention":
        return attention(rnd, name, dt, size)
    if kind == "matmul":
        e = epilogue.format(c="j")
        body = f"sum[k](A[i, k] * B[k, j]){e}"
        body = f"max({body}, 0.0)" if relu else body
        bias = f", b: {dt}[N]" if e.startswith(" + b") else ""
        src = f"op {name}(A: {dt}[M, K], B: {dt}[K, N]{bias}) -> C: {out}[M, N] {{\n    C[i, j] = {body}\n}}"
        return src, {"M": size(), "N": size(), "K": size()}
    if kind == "bmm":
        src = (f"op {name}(A: {dt}[G, M, K], B: {dt}[G, K, N]) -> C: {out}[G, M, N] {{\n"
               f"    C[g, i, j] = sum[k](A[g, i, k] * B[g, k, j])\n}}")
        return src, {"G": rnd.choice([1, 2, 3]), "M": size(), "N": size(), "K": size()}
    if kind == "rows":
        src = (f"op {name}(X: {dt}[N, C]) -> Y: {out}[N, C] {{\n    m[n] = max[c](X[n, c])\n"
               f"    e[n, c] = exp(X[n, c] - m[n])\n    s[n] = sum[c](e[n, c])\n    Y[n, c] = e[n, c] / s[n]\n}}")
        return src, {"N": size(), "C": size()}
    S, P, D = rnd.choice([1, 1, 2, 3]), rnd.choice([0, 1, 2]), rnd.choice([1, 1, 2])
    k = rnd.choice([1, 3, 5])
    h = max(rnd.choice([k * D + 3, 7, 12, 16, 33]), D * (k - 1) + 1)  # at least one output row
    cp = "[S = 1, P = 0, D = 1]"
    e = epilogue.format(c="f")
    if kind == "conv1d":
        acc = f"sum[c, r](Xp[n, c, y*S + r*D] * Wt[f, c, r]){e}"
        shape = "(H + 2*P - D*(KH - 1) - 1) // S + 1"
        src = (f"op {name}{cp}(X: {dt}[N, C, H], Wt: {dt}[F, C, KH]{{bias}}) -> Y: {out}[N, F, {shape}] {{\n"
               f"    Xp = pad(X, [0, 0, P])\n    Y[n, f, y] = {{body}}\n}}")
        binds = {"N": rnd.choice([1, 2]), "C": rnd.choice([1, 3, 8]), "H": h, "F": rnd.choice([1, 4, 16]), "KH": k}
    else:
        w = "Wt[f, r, s]" if kind == "depthwise" else "Wt[f, c, r, s]"
        xc = "f" if kind == "depthwise" else ("(f // (F // G)) * CG + c" if kind == "grouped" else "c")
        red = "r, s" if kind == "depthwise" else "c, r, s"
        acc = f"sum[{red}](Xp[n, {xc}, y*S + r*D, x*S + s*D] * {w}){e}"
        sh = "(H + 2*P - D*(KH - 1) - 1) // S + 1"
        sw = "(W + 2*P - D*(KW - 1) - 1) // S + 1"
        wdecl = {"depthwise": f"Wt: {dt}[C, KH, KW]", "grouped": f"Wt: {dt}[F, CG, KH, KW]",
                 "conv2d": f"Wt: {dt}[F, C, KH, KW]"}[kind]
        cps = "[S = 1, P = 0, D = 1, G = 1]" if kind == "grouped" else cp
        fdim = "C" if kind == "depthwise" else "F"
        src = (f"op {name}{cps}(X: {dt}[N, C, H, W], {wdecl}{{bias}}) -> Y: {out}[N, {fdim}, {sh}, {sw}] {{\n"
               f"    Xp = pad(X, [0, 0, P, P])\n    Y[n, f, y, x] = {{body}}\n}}")
        c = rnd.choice([1, 3, 8])
        w = max(rnd.choice([h, k * D + 1, 9]), D * (k - 1) + 1)  # at least one output column
        binds = {"N": rnd.choice([1, 2]), "C": c, "H": h, "W": w, "KH": k, "KW": k}
        if kind == "conv2d":
            binds["F"] = rnd.choice([1, 4, 16])
        if kind == "grouped":
            g = rnd.choice([1, 2])
            binds.update(G=g, C=4 * g, CG=4, F=2 * g)
    body = f"max({acc}, 0.0)" if relu else acc
    bias = f", b: {dt}[{'C' if kind == 'depthwise' else 'F'}]" if "b[" in e else ""
    binds.update(S=S, P=P, D=D)
    return src.replace("{bias}", bias).replace("{body}", body), binds


def attention(rnd: random.Random, name: str, dt: str, size) -> tuple[str, dict[str, int]]:
    """Attention-shaped chains (a max over the keys, the exponentials of the difference, their sum
    and a sum weighted by them): the streaming rewrite, plain or with a causal mask, a bias or a
    soft cap, over keys of another length than the queries; in 16 bits, rows of 64 or 128 half
    the time (the GPU's FlashAttention kernel)."""
    c = "f64" if dt == "f64" else "f32"  # the softmax's dtype (f32 for f16 and bf16 operands)
    score = f"sum[d]({c}(Q[b, i, d]) * {c}(K[b, j, d])) * 0.3"
    variant = rnd.choice(["plain", "causal", "bias", "cap"])
    if variant == "causal":
        score = f"select(j <= i, {score}, -inf)"
    elif variant == "bias":
        score = f"{score} - 0.1 * {c}(i - j)"
    elif variant == "cap":
        score = f"4.0 * tanh({score} / 4.0)"
    src = (f"op {name}(Q: {dt}[B, S, D], K: {dt}[B, L, D], V: {dt}[B, L, D]) -> O: {dt}[B, S, D] {{\n"
           f"    s[b, i, j] = {score}\n    m[b, i] = max[j](s[b, i, j])\n"
           f"    e[b, i, j] = exp(s[b, i, j] - m[b, i])\n    l[b, i] = sum[j](e[b, i, j])\n"
           f"    O[b, i, d] = {dt}(sum[j](e[b, i, j] * {c}(V[b, j, d])) / l[b, i])\n}}")
    # rows of 64 or 128 16-bit values: the GPU's matrix-unit kernel (split keys where few queries)
    depth = rnd.choice([64, 128]) if dt in ("f16", "bf16") and rnd.random() < 0.5 else size()
    return src, {"B": rnd.choice([1, 2]), "S": size(), "L": size(), "D": depth}


def chain(rnd: random.Random, name: str, dt: str, out: str, size) -> tuple[str, dict[str, int]]:
    """Two contractions through a kept intermediate, large enough for both to be GEMMs: a matmul
    chain, a convolution feeding a 1x1 one, or a strided window transform read back with batch
    axes (a Winograd input transform, which found merged pixel loops inlined wrongly)."""
    big = lambda: rnd.choice([8, 16, 33, 64])  # noqa: E731
    kind = rnd.choice(["mm", "conv", "window", "block", "attention"])
    if kind == "block":  # two 3x3 convolutions through a padded intermediate (a ResNet block)
        s1 = rnd.choice([1, 2])
        src = (f"op {name}(X: {dt}[N, C, H, W], W1: {dt}[F, C, 3, 3], W2: {dt}[F, F, 3, 3]) -> "
               f"Y: {out}[N, F, (H - 1) // {s1} + 1, (W - 1) // {s1} + 1] {{\n"
               f"    Xp = pad(X, [0, 0, 1, 1])\n"
               f"    Z[n, f, y, x] = max(sum[c, r, s](Xp[n, c, y*{s1} + r, x*{s1} + s] * W1[f, c, r, s]), 0.0)\n"
               f"    Zp = pad(Z, [0, 0, 1, 1])\n"
               f"    Y[n, g, y, x] = sum[f, r, s](Zp[n, f, y + r, x + s] * W2[g, f, r, s]) + Z[n, g, y, x]\n}}")
        return src, {"N": rnd.choice([1, 2]), "C": rnd.choice([3, 8]), "H": rnd.choice([5, 8, 14, 17]),
                     "W": rnd.choice([7, 8, 14, 23]), "F": rnd.choice([8, 16, 33])}
    if kind == "attention":  # Q @ K^T, a softmax over its rows, then @ V
        src = (f"op {name}(Q: {dt}[B, M, D], K: {dt}[B, N, D], V: {dt}[B, N, E]) -> O: {out}[B, M, E] {{\n"
               f"    S[b, i, j] = sum[d](Q[b, i, d] * K[b, j, d]) * 0.125\n"
               f"    m[b, i] = max[j](S[b, i, j])\n    e[b, i, j] = exp(S[b, i, j] - m[b, i])\n"
               f"    z[b, i] = sum[j](e[b, i, j])\n"
               f"    O[b, i, l] = sum[j](e[b, i, j] * V[b, j, l]) / z[b, i]\n}}")
        return src, {"B": rnd.choice([1, 2]), "M": big(), "N": big(), "D": rnd.choice([8, 16, 33]), "E": big()}
    if kind == "mm":
        src = (f"op {name}(A: {dt}[M, K], B: {dt}[K, N], D: {dt}[N, L]) -> C: {out}[M, L] {{\n"
               f"    T[i, j] = sum[k](A[i, k] * B[k, j])\n    C[i, l] = sum[j](T[i, j] * D[j, l])\n}}")
        return src, {"M": big(), "K": size(), "N": big(), "L": size()}
    if kind == "conv":
        z = "sum[c, r, s](Xp[n, c, y + r, x + s] * W1[f, c, r, s])"
        z = f"max({z}, 0.0)" if rnd.random() < 0.5 else z
        src = (f"op {name}(X: {dt}[N, C, H, W], W1: {dt}[F, C, 3, 3], W2: {dt}[G, F]) -> Y: {out}[N, G, H, W] {{\n"
               f"    Xp = pad(X, [0, 0, 1, 1])\n    Z[n, f, y, x] = {z}\n"
               f"    Y[n, g, y, x] = sum[f](Z[n, f, y, x] * W2[g, f])\n}}")
        return src, {"N": rnd.choice([1, 2]), "C": rnd.choice([3, 8, 16]), "H": rnd.choice([5, 8, 16, 17]),
                     "W": rnd.choice([5, 8, 16, 23]), "F": big(), "G": rnd.choice([1, 7, 16])}
    stride = rnd.choice([1, 2])
    src = (f"op {name}(X: {dt}[C, H, W], T: {dt}[4, 4]) -> V: {out}[4, 4, C, H // 2, W // 2] {{\n"
           f"    Xp = pad(X, [0, 1, 1], [0, 3, 3])\n"
           f"    R: {dt}[4, 4, C, H // 2, W // 2]\n"
           f"    R[i, l, c, ty, tx] = sum[k: 4](T[i, k] * Xp[c, {stride}*ty + k, {stride}*tx + l])\n"
           f"    V[i, j, c, ty, tx] = sum[l: 4](T[j, l] * R[i, l, c, ty, tx])\n}}")
    return src, {"C": rnd.choice([1, 7, 16, 32]), "H": rnd.choice([2, 9, 16, 30]), "W": rnd.choice([2, 14, 16, 46])}
