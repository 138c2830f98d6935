"""A fuzz worker: reads one JSON job a line on stdin, writes one JSON outcome a line on stdout.

It runs in its own process so that a segfault in generated code ends only this process; the
pool (``fuzz.pool``) reports the seed it was running as a crash and starts a new worker.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from fuzz.check import check_program, check_seed
from fuzz.generate import OpCase, Program
from fuzz.grad_check import check_grad_seed


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # anything tcc or NumPy prints must not corrupt the protocol
    for line in sys.stdin:
        job = json.loads(line)
        if job.get("grad"):  # tcc.grad to job["orders"] against finite differences
            outcome = check_grad_seed(job["seed"], job.get("orders", 2), job.get("torch", False))
        elif "source" in job:  # a given program (the shrinker's)
            prog = Program(job["seed"], job["source"], [OpCase(n, b) for n, b in job["cases"]])
            outcome = check_program(prog, job.get("target", "cpu"), job.get("schedules", 0))
        else:
            outcome = check_seed(job["seed"], job.get("target", "cpu"), job.get("schedules", 0), job.get("bf16", False),
                                 job.get("dynamic", False))
        out.write(json.dumps(dataclasses.asdict(outcome)) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
