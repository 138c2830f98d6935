"""A hostile-input worker: reads one JSON case a line on stdin, writes one JSON outcome a line.

Each case is source bytes (base64). The worker writes them to a ``.tc`` file and puts them
through everything a user can: ``tcc.compile`` by path, a call of every op on small random
inputs, the CLI's ``check`` (and, for some cases, ``run``) in-process, and for some the CUDA C
or PTX of each op (NVRTC needs no GPU). The outcome is
``ok`` (success or a clean :class:`tcc.TccError`) or ``raw`` with the escaped exception's
traceback. It runs in its own process so that a segfault ends only this worker: the runner
(:mod:`hostile.runner`) reports the case it held as a crash.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import os
import sys
import tempfile
import traceback

import numpy as np

import tcc
from tcc import cli
from tcc.ir.expr import Reduce, walk
from tcc.passes.te.specialize import specialize
from tcc.runtime.binding import check_sizes
from tcc.testing import random_args

MAX_WORK = 2_000_000  # loop iterations above which a case is compiled but not called


def work(te) -> int:
    """Iterations the op's statements run (outer loops times their reductions): a mutated
    program may legally ask for 10**12 of them, which is slow, not a bug."""
    total = 0
    for c in te.computes:
        outer = math.prod(int(ax.extent.value) for ax in c.axes)
        inner = math.prod(int(ax.extent.value) for n in walk(c.body) if isinstance(n, Reduce) for ax in n.axes)
        total += outer * max(1, inner)
    return total


def call_ops(path: str, seed: int) -> None:
    """Compile ``path`` and call each op on random inputs; TccError ends the case quietly."""
    rng = np.random.default_rng(seed)
    lib = tcc.compile(path)
    for op in lib:
        bindings = {**op.te.cparams, **{s: int(rng.integers(1, 6)) for s in op.te.symbols}}
        check_sizes(op.te, bindings)  # as the CLI does before making inputs
        spec = specialize(op.te, bindings)
        inputs = sum(math.prod(spec.tensors[n].concrete_shape()) for n in op.te.inputs)
        if work(spec) > MAX_WORK or inputs > MAX_WORK:
            continue  # legal but slow: not what this suite looks for
        op(*random_args(op.te, bindings, rng), **op.te.cparams)


def lower_for_cuda(path: str, seed: int, stage: str) -> None:
    """CUDA C (or PTX, through NVRTC: no GPU needed) of every op at small sizes."""
    rng = np.random.default_rng(seed)
    for op in tcc.compile(path, target="cuda"):
        bindings = {**op.te.cparams, **{s: int(rng.integers(1, 6)) for s in op.te.symbols}}
        op.stage_text(bindings, stage)


def run_cli(argv: list[str]) -> str | None:
    """None when the CLI behaved (status 0, or 1 with a message and no traceback)."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse on a malformed command line
            code = exc.code
    text = err.getvalue()
    if "MISMATCH" in out.getvalue():
        return f"tcc {' '.join(argv)}: a silent wrong answer: {out.getvalue()[-2000:]}"
    if code not in (0, 1, 2) or "Traceback" in text or (code != 0 and not text.strip()):
        return f"tcc {' '.join(argv)}: status {code}, stderr: {text[-2000:]}"
    return None


def cli_run_args(path: str, seed: int) -> list[str] | None:
    """``tcc run`` arguments for the first op of a file that checks, or None."""
    try:
        op = next(iter(tcc.compile(path)))
    except (tcc.TccError, StopIteration):
        return None
    sizes = [f"-D{s}={1 + (seed + i) % 5}" for i, s in enumerate(op.te.symbols)]
    return ["run", path, "--op", op.name, *sizes, "--repeat", "1", "--seed", str(seed)]


def check_case(case: dict) -> dict:
    data = base64.b64decode(case["source"])
    seed = case["seed"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "case.tc")
        with open(path, "wb") as f:
            f.write(data)
        steps = [lambda: call_ops(path, seed)]
        if case.get("cuda"):
            steps.append(lambda: lower_for_cuda(path, seed, case["cuda"]))
        for step in steps:
            try:
                step()
            except tcc.TccError:
                pass
            except Exception:  # noqa: BLE001 - exactly what this worker reports
                return {"id": case["id"], "status": "raw", "detail": traceback.format_exc()[-3000:]}
        problem = run_cli(["check", path])
        if problem is None and case.get("cli_run"):
            argv = cli_run_args(path, seed)
            problem = run_cli(argv) if argv else None
        if problem is not None:
            return {"id": case["id"], "status": "raw", "detail": problem}
    return {"id": case["id"], "status": "ok", "detail": ""}


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # anything tcc or NumPy prints must not corrupt the protocol
    for line in sys.stdin:
        out.write(json.dumps(check_case(json.loads(line))) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
