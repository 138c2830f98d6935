"""An ONNX fuzz worker: one JSON job a line on stdin (``{"seed": S}``, or ``{"seed": S, "model":
PATH}`` for a given graph such as the shrinker's), one JSON outcome a line on stdout. Its own
process, so that a crash in compiled code ends only this worker (see ``fuzz.pool``)."""

from __future__ import annotations

import dataclasses
import json
import sys

import onnx

from fuzz.onnx.check import check_model, check_seed


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # anything tcc or NumPy prints must not corrupt the protocol
    for line in sys.stdin:
        job = json.loads(line)
        if "model" in job:
            outcome = check_model(onnx.load(job["model"]), job["seed"])
        else:
            outcome = check_seed(job["seed"])
        out.write(json.dumps(dataclasses.asdict(outcome)) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
