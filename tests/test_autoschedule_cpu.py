"""The CPU auto-scheduler on convolutions: im2col's GEMM, nested in the batch loop, is scheduled."""

import re
from pathlib import Path

import numpy as np
import pytest
from helpers import check_op

import tcc
from tcc import target
from tcc.codegen_cpu import jit
from tcc.passes.autoschedule_cpu.gemm import column_tile, gemm_params

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SRC = (EXAMPLES / "conv2d_relu.tc").read_text()


@pytest.mark.parametrize("shapes", [
    dict(N=2, C=5, H=23, W=19, F=29, KH=3, KW=3),
    dict(N=1, C=7, H=25, W=21, F=13, KH=3, KW=3, S=2),
    dict(N=2, C=3, H=31, W=29, F=40, KH=5, KW=3, P=2),
])
def test_nested_conv_gemm_matches_reference(shapes, rng):
    check_op(SRC, "conv2d_relu", shapes, rng)


def test_nested_conv_gemm_is_scheduled():
    op = tcc.compile(SRC, conv="im2col").conv2d_relu
    x, w, b = np.zeros((2, 5, 23, 19), np.float32), np.zeros((29, 5, 3, 3), np.float32), np.zeros(29, np.float32)
    text = op.lower(x, w, b, stage="scheduled")
    batch = text.index("for n")
    # 29 rows at 2 threads: tiles of 8 rows (12 would pad 15 rows to 24); 437 columns: two vectors
    # with AVX2; with AVX-512 three, each its own vector (two would leave a 21-lane tail, one
    # would load more than it multiplies: see gemm_params and column_tile)
    lanes = target.CpuTarget.of_host(*jit.host()).vector_bytes // 4
    column = "jj" if lanes == 8 else "jj_vec * 16 + jj_lane"
    assert text.index("Xp_patches_c1[") > batch  # the patches are packed (cache B at ko) per batch element
    # A packed, C in registers
    assert "Wt_c1[" in text and f"Y_gemm_c1[ii, {column}] = Y_gemm_c1[ii, {column}] + " in text
    assert "for kk in 0..45:" in text  # c, r, s fused into one k loop
    if lanes == 8:
        assert "for jj in 0..32:  # vector" in text
    else:
        assert "for jj_vec in 0..3:  # unroll" in text and "for jj_lane in 0..16:  # vector" in text
    assert "for ii in 0..8:  # unroll" in text
    # the patches are gathered from X straight into the packed panels (no whole patch tensor);
    # one k block: the panel's rows loop over c, r, s (no divisions), c innermost (r, s mask)
    assert "allocate Xp_patches:" not in text
    pack = text.index(f"Xp_patches_c1[jr, (kk_row_row * 3 + kk_row_col) * 3 + kk_col, {column}] = select(")
    assert text.rindex("for kk_col in 0..3:", 0, pack) < text.rindex("for kk_row_row in 0..5:", 0, pack)
    parallel = [line.strip() for line in text.splitlines() if "# parallel" in line]
    if target.host_cores() > 2:  # fewer images than threads: the statements inside fork
        assert parallel and not any(line.startswith("for n") for line in parallel)
    elif target.host_cores() == 2:  # one image per thread: one fork per call, the GEMM serial
        assert parallel == ["for n_1 in 0..2:  # parallel"]


def test_batch_loop_runs_images_on_threads(rng, monkeypatch):
    """With at least one image per thread the batch loop is the one parallel loop: each thread
    gathers patches into, and multiplies from, its own buffers (allocated inside the loop)."""
    monkeypatch.setattr(target, "host_cores", lambda: 2)
    shapes = dict(N=3, C=5, H=17, W=13, F=19, KH=3, KW=3)
    check_op(SRC, "conv2d_relu", shapes, rng)
    op = tcc.compile(SRC, conv="im2col").conv2d_relu
    x, w, b = np.zeros((3, 5, 17, 13), np.float32), np.zeros((19, 5, 3, 3), np.float32), np.zeros(19, np.float32)
    text = op.lower(x, w, b, stage="scheduled")
    parallel = [line.strip() for line in text.splitlines() if "# parallel" in line]
    assert parallel == ["for n_1 in 0..3:  # parallel"]
    batch = text.index("for n_1")
    assert text.index("allocate Xp_patches") > batch and text.index("allocate Y_gemm") > batch


ONE_BY_ONE = """
op pointwise(X: f32[N, C, H, W], Wt: f32[F, C, 1, 1], b: f32[F]) -> Y: f32[N, F, H, W] {
    Y[n, f, y, x] = max(sum[c, r, s](X[n, c, y + r, x + s] * Wt[f, c, r, s]) + b[f], 0.0)
}
"""


@pytest.mark.parametrize("shapes", [dict(N=3, C=7, H=13, W=11, F=29), dict(N=1, C=33, H=9, W=37, F=13)])
def test_one_by_one_conv_is_a_gemm_over_pixels(shapes, rng):
    """A 1x1 convolution's y, x loops merge into one pixel loop: a GEMM [F x C] @ [C x H*W]."""
    check_op(ONE_BY_ONE, "pointwise", shapes, rng)
    op = tcc.compile(ONE_BY_ONE).pointwise
    n, c, h, w, f = (shapes[k] for k in "NCHWF")
    args = np.zeros((n, c, h, w), np.float32), np.zeros((f, c, 1, 1), np.float32), np.zeros(f, np.float32)
    text = op.lower(*args, stage="scheduled")
    assert "for yx" not in op.lower(*args, stage="loops")
    # the pixel loop indexes the last dim; the epilogue writes Y from the register tiles
    assert "Y[n, " in text and ", 0, jp * " in text and "allocate Y_acc:" not in text
    # 29 and 13 rows at 2 threads: register tiles of 8 rows pad 15 and 7 rows less than 12 would
    assert "for jj in 0..32:  # vector" in text and "for ii in 0..8:  # unroll" in text


def test_pixels_stay_apart_when_rows_are_wider(rng):
    """A 3x3 window reads rows of W + 2: merging y, x would change the elements read."""
    src = """
op valid(X: f32[N, C, H, W], Wt: f32[F, C, 3, 3]) -> Y: f32[N, F, H - 2, W - 2] {
    Y[n, f, y, x] = sum[c, r, s](X[n, c, y + r, x + s] * Wt[f, c, r, s])
}
"""
    check_op(src, "valid", dict(N=2, C=3, H=11, W=9, F=14), rng)
    op = tcc.compile(src, conv="direct").valid
    args = np.zeros((2, 3, 11, 9), np.float32), np.zeros((14, 3, 3, 3), np.float32)
    assert "yx" not in op.lower(*args, stage="scheduled")


DEPTHWISE = """
op dw(X: f32[N, C, H, W], Wt: f32[C, 3, 3], b: f32[C]) -> Y: f32[N, C, H, W] {
    Xp = pad(X, [0, 0, 1, 1])
    Y[n, c, y, x] = max(sum[r, s](Xp[n, c, y + r, x + s] * Wt[c, r, s]) + b[c], 0.0)
}
"""


def test_batch_of_one_parallel_over_images_and_channels(rng, monkeypatch):
    """A batch of one gives one parallel iteration: n and c are fused into the parallel loop."""
    monkeypatch.setattr(target, "host_cores", lambda: 2)
    shapes = dict(N=1, C=9, H=67, W=45)
    check_op(DEPTHWISE, "dw", shapes, rng)
    op = tcc.compile(DEPTHWISE).dw
    args = np.zeros((1, 9, 67, 45), np.float32), np.zeros((9, 3, 3), np.float32), np.zeros(9, np.float32)
    text = op.lower(*args, stage="scheduled")
    assert "for n_c in 0..9:  # parallel" in text and "# vector" in text


def test_gemm_packs_small_weights_once_per_thread():
    """A conv's weights (few rows) are packed once per thread, not once per block of columns."""
    op = tcc.compile(SRC, conv="im2col").conv2d_relu
    x, w, b = np.zeros((2, 5, 60, 60), np.float32), np.zeros((29, 5, 3, 3), np.float32), np.zeros(29, np.float32)
    text = op.lower(x, w, b, stage="scheduled")
    pack = next(line for line in text.splitlines() if line.strip().startswith("Wt_c1["))
    assert pack.strip().startswith("Wt_c1[ko, io, ir, kk, ii]")  # one buffer over all column blocks
    assert text.index("Wt_c1[ko") < text.index("for jo in")


def test_cache_sizes_are_read_from_sysfs(tmp_path):
    """The sysfs cache directory also holds a ``uevent`` file: it must not hide the real sizes."""
    (tmp_path / "uevent").write_text("")
    for name, kind, level, size in [("index0", "Data", 1, "48K"), ("index1", "Instruction", 1, "32K"),
                                    ("index2", "Unified", 2, "2048K"), ("index3", "Unified", 3, "300M")]:
        (tmp_path / name).mkdir()
        for field, value in (("type", kind), ("level", str(level)), ("size", size)):
            (tmp_path / name / field).write_text(value + "\n")
    assert target.read_caches(str(tmp_path)) == {1: 48 << 10, 2: 2 << 20, 3: 300 << 20}
    assert target.read_caches(str(tmp_path / "missing")) == {1: 32 << 10, 2: 1 << 20, 3: 8 << 20}


DEPTHWISE = """
op dw(X: f32[N, C, H, W], Wt: f32[C, 3, 3], b: f32[C]) -> Y: f32[N, C, H, W] {
    Xp = pad(X, [0, 0, 1, 1])
    Y[n, c, y, x] = max(sum[r, s](Xp[n, c, y + r, x + s] * Wt[c, r, s]) + b[c], 0.0)
}
"""


def test_masked_row_vectors_are_unrolled(rng):
    """The vectors of a padded row are unrolled (constant masks per copy); rows of one vector are not."""
    op = tcc.compile(DEPTHWISE).dw
    z = np.zeros
    text = op.lower(z((1, 3, 5, 100), np.float32), z((3, 3, 3), np.float32), z(3, np.float32), stage="scheduled")
    assert "for x_o in 0..3:  # unroll" in text
    check_op(DEPTHWISE, "dw", dict(N=1, C=3, H=5, W=100), rng)
    check_op(DEPTHWISE, "dw", dict(N=2, C=5, H=7, W=33), rng)


@pytest.mark.parametrize("vector_bytes, tile", [(64, (12, 32)), (32, (6, 16))])
def test_register_tile_fits_the_host_vectors(vector_bytes, tile, monkeypatch):
    """Three quarters of the vector registers accumulate: 12 x 32 f32 in AVX-512's 32 zmm
    registers, 6 x 16 in AVX2's 16 ymm registers (an AVX-512 tile there spills)."""
    monkeypatch.setattr(target.CpuTarget, "vector_bytes", property(lambda self: vector_bytes))
    p = gemm_params(1000, 1000, 1000, 4, target.CpuTarget(cores=2))
    assert (p["mr"], p["nr"]) == tile and p["mc"] % p["mr"] == 0 and p["nc"] % p["nr"] == 0


@pytest.mark.parametrize("n, tile", [(49, (8, 48)), (437, (8, 48)), (3136, (12, 32)), (196, (12, 32)), (24, (12, 32))])
def test_avx512_three_vector_tile_where_two_fit_badly(n, tile, monkeypatch, rng, fresh_cache):
    """49 columns (a 7x7 layer) get 8 x 48 tiles, not 12 x 16 ones; columns that two-vector
    tiles fit keep them. The three vectors of a tile row are separate vectors (one 48-lane
    vector spilled), and the results match the reference."""
    monkeypatch.setattr(target.CpuTarget, "vector_bytes", property(lambda self: 64))
    p = gemm_params(512, n, 4608, 4, target.CpuTarget(cores=1))
    assert (p["mr"], p["nr"]) == tile
    if n == 49:
        matmul = (EXAMPLES / "matmul.tc").read_text()
        z = np.zeros
        text = tcc.compile(matmul).matmul.lower(z((512, 33), np.float32), z((33, 49), np.float32), stage="scheduled")
        assert "for jj_vec in 0..3:  # unroll" in text and "for jj_lane in 0..16:  # vector" in text
        check_op(matmul, "matmul", dict(M=37, K=129, N=49), rng)
        check_op(matmul, "matmul", dict(M=41, K=7, N=97), rng)
        check_op(SRC, "conv2d_relu", dict(N=2, C=33, H=7, W=7, F=29, KH=3, KW=3, P=1), rng)


@pytest.mark.parametrize("shapes", [dict(N=1, C=7, H=9, W=9, F=33, KH=3, KW=3),
                                    dict(N=2, C=13, H=7, W=7, F=64, KH=3, KW=3)])
def test_avx2_register_tiles_match_reference(shapes, rng, monkeypatch, fresh_cache):
    """(fresh_cache: the cache key holds the real host, so AVX-512 kernels of other tests would be found.)"""
    monkeypatch.setattr(target.CpuTarget, "vector_bytes", property(lambda self: 32))
    check_op(SRC, "conv2d_relu", shapes, rng)
    check_op((EXAMPLES / "matmul.tc").read_text(), "matmul", dict(M=37, K=129, N=33), rng)


@pytest.mark.parametrize("n, nr, lanes, width", [(49, 32, 16, 16), (24, 32, 16, 16), (25, 32, 16, 16),
                                                  (41, 32, 16, 32), (64, 32, 16, 32), (9, 32, 16, 9),
                                                  (196, 32, 16, 32), (784, 32, 16, 32), (1, 32, 16, 1)])
def test_column_tile_is_whole_vectors_and_one_partial_tail(n, nr, lanes, width):
    """A register tile's row is whole vectors, its tail whole vectors or at most one: 49 columns
    are 3 x 16 + 1 rather than 32 + 17 (a 17-lane row LLVM rebuilt lane by lane with AVX-512)."""
    assert column_tile(n, nr, lanes) == width


@pytest.mark.parametrize("n", [1, 7, 24, 33, 49])
def test_avx512_column_tiles_match_reference(n, rng, monkeypatch, fresh_cache):
    """With 16-lane vectors no tile row is 17 to 31 lanes wide (the split vectors ran 5-16x
    slower); the results match the reference at odd and round widths."""
    monkeypatch.setattr(target.CpuTarget, "vector_bytes", property(lambda self: 64))
    matmul = (EXAMPLES / "matmul.tc").read_text()
    check_op(matmul, "matmul", dict(M=37, K=129, N=n), rng)
    check_op(SRC, "conv2d_relu", dict(N=1, C=9, H=7, W=7, F=33, KH=3, KW=3, P=1), rng)
    z = np.zeros
    text = tcc.compile(matmul).matmul.lower(z((37, 129), np.float32), z((129, n), np.float32), stage="scheduled")
    widths = {int(w) for w in re.findall(r"for jj\w* in 0\.\.(\d+):  # vector", text)}
    assert (widths or n < 16) and not any(16 < w < 32 for w in widths)


@pytest.mark.parametrize("vector_bytes", [64, 32])
def test_one_column_tiles_run_along_their_rows(vector_bytes, rng, monkeypatch, fresh_cache):
    """A register tile one column wide (the tail of 49 = 3 x 16 + 1 columns, a GEMM of one
    column) is vectorised along its rows: one vector of packed A per k step, not mr scalars."""
    monkeypatch.setattr(target.CpuTarget, "vector_bytes", property(lambda self: vector_bytes))
    matmul = (EXAMPLES / "matmul.tc").read_text()
    z = np.zeros
    # (few enough flops for one thread, whose columns are not split between threads)
    text = tcc.compile(matmul).matmul.lower(z((37, 33), np.float32), z((33, 49), np.float32), stage="scheduled")
    columns = "for jj_lane in 0..16:  # vector" if vector_bytes == 64 else "for jj in 0..16:  # vector"
    assert "for ii_lanes in " in text and columns in text  # (AVX-512: 48 + 1 columns, AVX2: 3 x 16 + 1)
    for n in (1, 17, 49):
        check_op(matmul, "matmul", dict(M=37, K=129, N=n), rng)
    check_op(SRC, "conv2d_relu", dict(N=1, C=9, H=7, W=7, F=29, KH=3, KW=3, P=1), rng)


QK = """op qk(Q: f32[B, M, D], K: f32[B, N, D]) -> S: f32[B, M, N] {
    S[b, i, j] = sum[d](Q[b, i, d] * K[b, j, d])
}"""


@pytest.mark.parametrize("shapes", [dict(B=2, M=37, N=33, D=29), dict(B=1, M=128, N=128, D=64)])
def test_transposed_b_is_a_tiled_gemm(shapes, rng):
    """``Q @ K^T`` (attention's scores) reads B as ``K[j, d]``: a GEMM all the same, B transposed
    into the packed panels (it ran as plain loops, 5x slower than the tiled GEMM in an encoder)."""
    check_op(QK, "qk", shapes, rng)
    op = tcc.compile(QK).qk
    q, k = (np.zeros((shapes["B"], shapes[n], shapes["D"]), np.float32) for n in ("M", "N"))
    text = op.lower(q, k, stage="scheduled")
    assert "K_c1[" in text and "S_c1[ii, jj] = S_c1[ii, jj] + " in text  # B packed, C in registers


MAXPOOL = """
op pool(X: f32[N, C, H, W]) -> Y: f32[N, C, (H - 1) // 2 + 1, (W - 1) // 2 + 1] {
    Xp = pad(X, [0, 0, 1, 1], [0, 0, 1, 1], value=-1e400)
    Y[n, c, y, x] = max[r: 3, s: 3](Xp[n, c, y * 2 + r, x * 2 + s])
}
"""


def test_masked_window_taps_are_unrolled(rng):
    """A 3x3 window read through a pad inside a vector loop is unrolled (its masks then hoist out
    of the row loop); the results still match the reference at odd and round sizes."""
    op = tcc.compile(MAXPOOL).pool
    z = np.zeros((1, 4, 112, 112), np.float32)
    text = op.lower(z, stage="scheduled")
    assert "for r in 0..3:  # unroll" in text and "for s in 0..3:  # unroll" in text
    for shapes in (dict(N=1, C=4, H=112, W=112), dict(N=2, C=3, H=33, W=7), dict(N=1, C=1, H=1, W=65)):
        check_op(MAXPOOL, "pool", shapes, rng)
