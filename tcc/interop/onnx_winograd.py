"""3x3 convolutions by Winograd's F(2x2, 3x3) on the CPU: 2.25x fewer multiplies than the window.

Each 4x4 tile of the padded input ``d`` gives 2x2 outputs ``A^T [(G g G^T) * (B^T d B)] A``
(Lavin and Gray, 2015): the weights' transform ``U = G g G^T`` is computed here, once, from the
constant weights; the program then transforms the input (``B^T d B``, rows then columns, each a
sum of four reads), multiplies ``U`` and the transformed input as 16 GEMMs over the channels (one
per element of the 4x4 tile) and transforms the products back (``A^T m A``, columns then rows),
adding the bias. The following Relu and residual Add inline into the last statement as
they do into a direct convolution's.

Used where it measured faster on one Zen 4 core (interleaved with the direct convolution, the
three stages as tcc.onnx cuts them into kernels): 3x3, stride 1, pad 1, f32, at least
``MIN_CHANNELS`` channels in and out, ``MIN_SIDE`` pixels a side, and the transformed input of
one image within ``MAX_TILES_BYTES``. Alone, 256 channels at 14x14 took 0.66x the direct
convolution's time and 128 at 28x28 0.69x; 512 at 7x7 (tiles padded to 8x8, 16 GEMM columns)
1.15x, so it stays direct. The 64-channel layers at 56x56 (3 MiB of transformed input an image)
had run ResNet-18 no faster than direct (0.97-1.01x on one thread); since a model keeps its
intermediates' buffers between calls (``tcc.interop.graph_memory``: the transformed inputs and
products had been page-faulted afresh on every call) they run it 0.93-0.95x as long on one
thread and two, at batch 1 and 8 (interleaved in one process, against the 2 MiB budget that kept
them direct). Larger images or more channels (128 at 56x56: 6.4 MiB) stay direct. The products are laid out image first
(``[n, i, j, f, ty, tx]``): the batched GEMMs then split the images over the threads, and at
batch 8 the model ran 0.86-0.88x its all-direct time on two threads (0.96x on one); laid out
``[i, j, n, ...]`` (one GEMM's columns spanning the batch) two threads had run it 1.09x slower.
F(2x2, 3x3)'s rounding stays within a few f32 ulps of the direct sum (relative error 1-2e-6 on
those layers). CUDA keeps the direct convolution: its implicit-GEMM kernels already run these
layers ahead of eager PyTorch.
"""

from __future__ import annotations

import numpy as np

from tcc.frontend.unparse import Ex, add_all, num, reduction, var
from tcc.interop.graph import Node, Program, Value

MIN_CHANNELS = 16
MIN_SIDE = 8
MAX_TILES_BYTES = 4 << 20  # an image's transformed input at most (a 3x3 conv on 64 channels at 56x56: 3 MiB)

B_T = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
A_T = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)


def applies(node: Node, x: Value, w: Value, bias: Value | None, strides: list[int], dilations: list[int],
            lo: list[int], hi: list[int]) -> bool:
    """Whether the convolution is one that F(2x2, 3x3) runs faster (see the module docstring)."""
    return (x.rank == 4 and x.dtype == "f32" and w.const is not None and list(w.shape[2:]) == [3, 3]
            and node.attrs.get("group", 1) == 1 and strides == [1, 1] and dilations == [1, 1]
            and lo == [1, 1] and hi == [1, 1] and x.shape[1] >= MIN_CHANNELS and w.shape[0] >= MIN_CHANNELS
            and min(x.shape[2:]) >= MIN_SIDE and (bias is None or bias.const is not None)
            and 16 * x.shape[1] * -(-x.shape[2] // 2) * -(-x.shape[3] // 2) * 4 <= MAX_TILES_BYTES)


def conv(p: Program, node: Node, x: Value, w: Value, bias: Value | None) -> Value:
    """The statements of the convolution of ``x`` by the constant 3x3 weights ``w`` (pads 1)."""
    n, c, h, wd = x.shape
    f = w.shape[0]
    th, tw = -(-h // 2), -(-wd // 2)
    cols = 2 * tw + 3  # the padded input's columns that the row pass keeps
    out = node.outputs[0]
    gw = np.tensordot(G, w.const.astype(np.float64), axes=([1], [2]))  # [i, f, c, l]
    u = p.constant(np.tensordot(gw, G, axes=([3], [1])).transpose(0, 3, 1, 2), "f32", out + "_wino_u")  # [i, j, f, c]
    bt, at = p.constant(B_T, "f32", "wino_bt"), p.constant(A_T, "f32", "wino_at")
    xp = p.pad(x, [0, 0, 1, 1], [0, 0, 2 * th + 1 - h, 2 * tw + 2 - wd], out + "_in")

    def rows(idx: list[Ex]) -> Ex:  # (B^T d)[i, x] of each tile row ty, at every column
        b, i, ch, ty, col = idx
        return add_all([bt.read([i, num(k)]) * xp.read([b, ch, 2 * ty + k, col]) for k in range(4)])

    r = p.emit(out + "_wino_rows", (n, 4, c, th, cols), "f32", rows)

    def tiles(idx: list[Ex]) -> Ex:  # (B^T d B)[i, j] of tile (ty, tx)
        b, i, j, ch, ty, tx = idx
        return add_all([bt.read([j, num(k)]) * r.read([b, i, ch, ty, 2 * tx + k]) for k in range(4)])

    v = p.emit(out + "_wino_in", (n, 4, 4, c, th, tw), "f32", tiles)

    def products(idx: list[Ex]) -> Ex:  # image first: the threads take whole images' GEMMs
        b, i, j, fo, ty, tx = idx
        return reduction("sum", [("c", c)], u.read([i, j, fo, var("c")]) * v.read([b, i, j, var("c"), ty, tx]))

    m = p.emit(out + "_wino_gemm", (n, 4, 4, f, th, tw), "f32", products)

    def back_columns(idx: list[Ex]) -> Ex:  # (m A)[i, a] of tile (ty, tx)
        b, i, a, fo, ty, tx = idx
        return add_all([at.read([a, num(k)]) * m.read([b, i, num(k), fo, ty, tx]) for k in range(4)])

    q = p.emit(out + "_wino_out", (n, 4, 2, f, th, tw), "f32", back_columns)

    def outputs(idx: list[Ex]) -> Ex:  # (A^T m A)[y % 2, x % 2], plus the bias. A sum, not four
        b, fo, y, col = idx  # terms: a convolution read beside it (a downsample) then stays a GEMM
        k = var("k")
        tile = q.read([b, k, col % 2, fo, y // 2, col // 2])
        total = reduction("sum", [("k", 4)], at.read([y % 2, k]) * tile)
        return total + bias.read([fo]) if bias is not None else total

    p.notes.append(f"{node.where()}: Conv as Winograd F(2x2, 3x3) ({c} -> {f} channels at {h}x{wd})")
    return p.emit(out, (n, f, h, wd), "f32", outputs)
