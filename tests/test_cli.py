"""The tcc command: check, lower (every CPU stage), run --check, and its error exits."""

from pathlib import Path

import pytest

from tcc.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MATMUL = str(EXAMPLES / "matmul.tc")


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_check_lists_ops(capsys):
    code, out, _ = run(capsys, "check", MATMUL)
    assert code == 0 and "ok (1 op: matmul)" in out


@pytest.mark.parametrize("stage,needle", [("ast", "OpDef(name='matmul')"), ("te", "sum[k: 64]"),
                                          ("loops", "for k in 0..64"), ("scheduled", "func matmul"),
                                          ("llvm", "define i32 @\"tcc_matmul\""), ("asm", "tcc_matmul")])
def test_lower_every_cpu_stage(capsys, stage, needle):
    code, out, _ = run(capsys, "lower", MATMUL, "--op", "matmul", "-D", "M=64", "-D", "N=64", "-D", "K=64",
                       "--stage", stage)
    assert code == 0 and needle in out


def test_lower_with_shapes_and_print_after_all(capsys):
    code, out, _ = run(capsys, "lower", str(EXAMPLES / "conv2d.tc"), "--shape", "X=1x3x8x8", "--shape",
                       "Wt=4x3x3x3", "-D", "P=1", "--stage", "loops", "--print-after-all")
    assert code == 0
    for name in ("specialize", "bounds", "inline", "im2col", "group", "lower", "streaming stores"):
        assert f";; ---- after {name} ----" in out
    assert "Y: f32[1, 4, 8, 8]" in out


def test_symbolic_te_without_shapes(capsys):
    code, out, _ = run(capsys, "lower", MATMUL, "--stage", "te")
    assert code == 0 and "sum[k: K]" in out


def test_run_check(capsys):
    code, out, _ = run(capsys, "run", str(EXAMPLES / "softmax.tc"), "-D", "N=7", "-D", "C=33", "--check",
                       "--repeat", "2")
    assert code == 0 and "check Y: max relative error" in out and "ok" in out


def test_error_exit_with_location(capsys, tmp_path):
    bad = tmp_path / "bad.tc"
    bad.write_text("op f(X: f32[N]) -> Y: f32[N] {\n    Y[i] = X[i + 1]\n}\n")
    code, _, err = run(capsys, "run", str(bad), "-D", "N=4")
    assert code == 1 and f"{bad}:2:12: bounds error" in err and "Traceback" not in err


@pytest.mark.parametrize("argv,needle", [
    (["lower", MATMUL, "--op", "nope", "--stage", "loops"], "no op 'nope'"),
    (["lower", MATMUL, "--stage", "loops"], "no size for M, K, N"),
    (["lower", MATMUL, "-D", "Q=3", "--stage", "te"], "no symbol or parameter 'Q'"),
    (["lower", MATMUL, "--shape", "A=3xq", "--stage", "te"], "dims must be integers"),
    (["lower", MATMUL, "-D", "M", "--stage", "te"], "expected NAME=VALUE"),
    (["check", "missing.tc"], "file not found: missing.tc"),
    (["lower", MATMUL, "-D", "M=4", "--stage", "loops", "--tf32"], "--tf32 is for --target cuda"),
])
def test_bad_cli_input(capsys, argv, needle):
    code, _, err = run(capsys, *argv)
    assert code == 1 and needle in err


def test_unknown_stage_is_rejected_by_argparse(capsys):
    with pytest.raises(SystemExit) as info:
        main(["lower", MATMUL, "--stage", "nope"])
    assert info.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err
