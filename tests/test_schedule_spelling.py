"""The schedule spelling: blocks in .tc files and op.schedule(text) give the loops of the Python
steps, scheduled ops match the reference, and every mistake is a located TccScheduleError."""

import numpy as np
import pytest
from helpers import check_op
from test_schedule import MATMUL, S

import tcc
from tcc.cli import main
from tcc.errors import TccArgumentError, TccScheduleError, TccSyntaxError
from tcc.ir.loops import format_func
from tcc.passes.loops.schedule import apply_schedule
from tcc.passes.trace import SILENT

CONV = """op conv2d[P = 1](X: f32[N, C, H, W], Wt: f32[F, C, KH, KW])
    -> Y: f32[N, F, H + 2*P - KH + 1, W + 2*P - KW + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, f, y, x] = sum[c, r, s](Xp[n, c, y + r, x + s] * Wt[f, c, r, s])
}"""
BLOCK = """
schedule matmul cpu {
    decompose(C)
    split(i, 4, io, ii); split(j, 8, jo, ji)
    reorder(io, jo, k, ii, ji)
    vectorize(ji); parallel(io); unroll(ii)
}
"""

# (spelling, the same schedule as Python steps)
ROUND_TRIPS = [
    ("split(i, 4); vectorize(j, 8); unroll(i_i)", ["split i by 4", "vectorize j by 8", "unroll i_i"]),
    ("decompose(C); split(i, 3, io, ii); split(j, 16, jo, ji); reorder(io, jo, k, ii, ji)\n"
     "unroll(ii); vectorize(ji); parallel(io)",
     ["decompose C", "split i by 3 -> io, ii", "split j by 16 -> jo, ji", "reorder io, jo, k, ii, ji",
      "unroll ii", "vectorize ji", "parallel io"]),
    ("decompose(C) tile(i, j, 8, 16) cache(B, i_o) pack(A, j_o) vectorize(j_i)",
     ["decompose C", "tile i, j by 8, 16", "cache B at i_o", "cache A at j_o", "vectorize j_i"]),
    ("decompose(C); tile(i, j, 4, 8, io, jo, ii, ji); cache(C, jo, local); unroll(ii, 2)",
     ["decompose C", "tile i, j by 4, 8 -> io, ii, jo, ji", "cache C at jo local", "unroll ii by 2"]),
    ("fuse(i, j, ij); parallel(ij)", ["fuse i, j -> ij", "parallel ij"]),
]


def _scheduled(op, bindings):
    return format_func(op.lowered(bindings).scheduled)


@pytest.mark.parametrize("text,steps", ROUND_TRIPS)
def test_spelling_gives_the_loops_of_the_python_steps(text, steps):
    op = tcc.compile(MATMUL).matmul
    bindings = dict(M=7, K=33, N=20)
    expected = format_func(apply_schedule(op.lowered(bindings).loops, [S(s) for s in steps], SILENT, op.target))
    assert _scheduled(op.schedule(text), bindings) == expected


def test_block_in_file_is_the_same_as_op_schedule():
    bindings = dict(M=9, K=5, N=17)
    from_file = tcc.compile(MATMUL + BLOCK).matmul
    from_python = tcc.compile(MATMUL).matmul.schedule(BLOCK.split("{")[1].split("}")[0])
    assert _scheduled(from_file, bindings) == _scheduled(from_python, bindings)
    assert "# parallel" in _scheduled(from_file, bindings) and "for jo in" in _scheduled(from_file, bindings)


@pytest.mark.parametrize("size", [1, 7, 33])
@pytest.mark.parametrize("text", [t for t, _ in ROUND_TRIPS])
def test_user_scheduled_matmul_matches_reference(text, size, rng):
    check_op(MATMUL + f"\nschedule matmul cpu {{ {text} }}\n", "matmul", dict(M=size, K=size + 2, N=size), rng)


@pytest.mark.parametrize("choice", ["im2col", "direct"])
def test_conv_choice_in_a_schedule(choice, rng):
    src = CONV + f"\nschedule conv2d cpu {{ conv({choice}) }}\n"
    op = tcc.compile(src).conv2d
    assert op.options["conv"] == choice
    fused = op.lower(np.zeros((1, 2, 7, 7), np.float32), np.zeros((3, 2, 3, 3), np.float32), stage="fused")
    assert ("Xp_patches" in fused) == (choice == "im2col")
    check_op(src, "conv2d", dict(N=1, C=2, H=7, W=7, F=3, KH=3, KW=3), rng)


def test_schedule_is_part_of_the_cache_key():
    op = tcc.compile(MATMUL).matmul
    bindings = dict(M=8, K=8, N=8)
    keys = {o.cache_key(bindings) for o in (op, op.schedule("split(i, 2)"), op.schedule("split(i, 4)"))}
    assert len(keys) == 3
    assert op.cache_key(bindings) == op.schedule("").cache_key(bindings)


def test_other_targets_schedules_are_ignored():
    src = MATMUL + "\nschedule matmul cuda { conv(direct) }\n"
    assert not tcc.compile(src).matmul.user_schedule
    src = MATMUL + "\nschedule matmul cpu { split(nope, 4) }\n"
    assert not tcc.compile(src, target="cuda").matmul.user_schedule


def test_lower_scheduled_stage_shows_the_users_schedule(tmp_path, capsys):
    path = tmp_path / "mm.tc"
    path.write_text(MATMUL + BLOCK)
    assert main(["lower", str(path), "-D", "M=8", "-D", "K=4", "-D", "N=16", "--stage", "scheduled"]) == 0
    out = capsys.readouterr().out
    assert "for io in 0..2:  # parallel" in out and "for ji in 0..8:  # vector" in out
    assert main(["lower", str(path), "-D", "M=8", "-D", "K=4", "-D", "N=16", "--stage", "scheduled",
                 "--schedule", "fuse(i, j, ij)"]) == 0
    assert "for ij in 0..128" in capsys.readouterr().out


# ---------------------------------------------------------------- errors, with their locations

FILE_ERRORS = [
    ("schedule mm cpu { split(i, 4) }", "schedule for unknown op 'mm'", (2, 10), "ops in this file: matmul"),
    ("schedule matmul tpu { split(i, 4) }", "unknown target 'tpu'", (2, 17), "cpu, cuda"),
    ("schedule matmul cpu {\n  frobnicate(i)\n}", "unknown schedule primitive 'frobnicate'", (3, 3), "split"),
    ("schedule matmul cpu {\n  split(i, 4, io)\n}", "split takes 2 or 4 arguments, got 3", (3, 3),
     "split(LOOP, FACTOR[, OUTER, INNER])"),
    ("schedule matmul cpu { split(i, x) }", "expected an integer here, got 'x'", (2, 32), "split("),
    ("schedule matmul cpu { vectorize(i, 0) }", "expected a positive integer here, got 0", (2, 36), "vectorize("),
    ("schedule matmul cpu { unroll(i, -2) }", "expected a positive integer here, got -2", (2, 33), "unroll("),
    ("schedule matmul cpu { split(i, 2.5) }", "expected an integer here, got 2.5", (2, 32), "split("),
    ("schedule matmul cpu { parallel(4) }", "expected a name here, got 4", (2, 32), "parallel(LOOP)"),
    ("schedule matmul cpu { cache(B, i, shared) }", "shared memory is a GPU scope", (2, 35), "local or global"),
    ("schedule matmul cpu { cache(B, i, texture) }", "unknown buffer scope 'texture'", (2, 35), "local, global"),
    ("schedule matmul cpu { conv(fft) }", "unknown convolution lowering 'fft'", (2, 28), "im2col, direct"),
    ("schedule matmul cpu { conv(direct); conv(im2col) }", "convolution lowering is chosen twice", (2, 37),
     "one conv"),
    ("schedule matmul cpu { }\nschedule matmul cpu { }", "a second schedule for matmul on cpu", (3, 10), "merge"),
]


@pytest.mark.parametrize("block,message,where,hint", FILE_ERRORS)
def test_spelling_errors_point_at_the_step(block, message, where, hint):
    with pytest.raises(TccScheduleError) as info:
        tcc.compile(MATMUL + "\n" + block, "cpu")
    err = info.value
    assert message in err.message
    assert (err.span.line, err.span.col) == where
    assert hint in err.hint


# errors found when the steps run on the loops (at the first call or lower)
LOOP_ERRORS = [
    ("split(q, 4)", "no loop 'q'", "its loops are"),
    ("cache(Z, i)", "no tensor 'Z'", "its tensors are"),
    ("parallel(k)", "k", ""),
    ("reorder(i, j, k)", "not perfectly nested", "decompose(C) as the first step"),
    ("decompose(C); split(k, 2, ko, ki); reorder(i, j, ki, ko)", "reduction", ""),
]


@pytest.mark.parametrize("steps,message,hint", LOOP_ERRORS)
def test_loop_errors_point_at_the_step_in_the_file(steps, message, hint):
    src = MATMUL + "\nschedule matmul cpu {\n    " + steps.replace("; ", "\n    ") + "\n}\n"
    op = tcc.compile(src, "cpu").matmul
    a = np.ones((6, 6), np.float32)
    with pytest.raises(TccScheduleError) as info:
        op(a, a)
    err = info.value
    assert message in err.message and hint in (err.hint or "")
    assert err.span.line >= 3 and err.span.source.line(err.span.line)[err.span.col - 1:].startswith(
        ("split", "cache", "parallel", "reorder"))


def test_python_schedule_errors_point_into_the_text():
    op = tcc.compile(MATMUL).matmul
    a = np.ones((4, 4), np.float32)
    with pytest.raises(TccScheduleError) as info:
        op.schedule("split(i, 2)\nvectorize(zz)")(a, a)
    assert info.value.span.location() == "<schedule>:2:1" and "no loop 'zz'" in info.value.message
    with pytest.raises(TccSyntaxError):
        op.schedule("split(i, 2")
    with pytest.raises(TccArgumentError, match="schedule's text"):
        op.schedule(["split i by 2"])


def test_cuda_schedules_take_gpu_primitives_only():
    with pytest.raises(TccScheduleError, match="parallel is a CPU primitive") as info:
        tcc.compile(MATMUL + "\nschedule matmul cuda { split(i, 4); parallel(i_o) }\n", target="cuda")
    assert (info.value.span.line, info.value.span.col) == (2, 37) and "bind(LOOP, thread)" in info.value.hint
    lib = tcc.compile(MATMUL + "\nschedule matmul cuda { split(i, 4); bind(i_o, block) }\n", target="cuda")
    assert [s.prim for s in lib.matmul.user_schedule.steps] == ["split", "bind"]
    lib = tcc.compile(CONV + "\nschedule conv2d cuda { conv(direct) }\n", target="cuda")
    assert lib.conv2d.options["conv"] == "direct"
