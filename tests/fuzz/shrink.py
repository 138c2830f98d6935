"""``python -m fuzz.shrink SEED [--target cuda] [--schedules N]``: the smallest program, by
deleting ops and statements, that still fails the way seed SEED fails; printed for a
regression test. Each attempt runs in a worker process (a crash is a failure like any other)."""

from __future__ import annotations

import argparse
import re
import sys

from fuzz.generate import generate
from fuzz.pool import run_seeds


def _signature(outcome: dict) -> tuple[str, str]:
    """What makes two failures the same: the status and the error's type and place."""
    detail = re.sub(r"^fz\d+(?: with schedule [^:]*)?: ", "", outcome["detail"])
    return outcome["status"], re.sub(r"[-\d.e+]+", "#", detail.split(":")[0] + detail.split(" at ")[-1])


def _ops(source: str) -> list[str]:
    return [o.strip() for o in re.split(r"\n(?=op )", source.strip())]


def shrink(seed: int, target: str = "cpu", schedules: int = 0) -> str:
    prog = generate(seed, bf16=target == "cuda")
    cases = {c.name: c.bindings for c in prog.cases}

    def outcome(ops: list[str]) -> dict:
        names = [re.match(r"op (\w+)", o).group(1) for o in ops]
        job = {"seed": seed, "source": "\n\n".join(ops) + "\n", "cases": [[n, cases[n]] for n in names],
               "target": target, "schedules": schedules}
        return next(run_seeds([job], workers=1))

    ops = _ops(prog.source)
    want = _signature(outcome(ops))
    if want[0] == "ok":
        return f"# seed {seed} passes\n" + prog.source
    for i in reversed(range(len(ops))):  # whole ops first
        if len(ops) > 1 and _signature(outcome(ops[:i] + ops[i + 1:])) == want:
            ops = ops[:i] + ops[i + 1:]
    for k, op in enumerate(ops):  # then statements, last to first, keeping the results
        lines = op.splitlines()
        i = len(lines) - 2
        while i >= 1:
            trial = lines[:i] + lines[i + 1:]
            if not re.match(r"\s+Y\d+\[", lines[i]) and \
                    _signature(outcome(ops[:k] + ["\n".join(trial)] + ops[k + 1:])) == want:
                lines = trial
            i -= 1
        ops[k] = "\n".join(lines)
    return f"# seed {seed}: {want[0]}\n" + "\n\n".join(ops) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fuzz.shrink", description=__doc__)
    ap.add_argument("seed", type=int)
    ap.add_argument("--target", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--schedules", type=int, default=0)
    args = ap.parse_args(argv)
    print(shrink(args.seed, args.target, args.schedules))
    return 0


if __name__ == "__main__":
    sys.exit(main())
