"""``python -m fuzz.onnx -n 3000`` (with ``tests`` on PYTHONPATH; ``make fuzz-onnx N=3000`` does
that): generate graphs, run each with tcc and onnxruntime in worker processes, print every
failure (seed and what went wrong) and a summary. ``--seed S`` shows one seed's graph, the tcc
source and the outcome; ``--shrink`` makes each failure's graph smaller first; ``--save DIR``
writes each failing graph to DIR/seed-S.onnx. Exit status 1 on any mismatch, error, crash or
timeout."""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

import onnx
from tqdm import tqdm

from fuzz.onnx.check import check_seed
from fuzz.onnx.generate import generate
from fuzz.onnx.shrink import shrink
from fuzz.pool import run_seeds

FAILURES = ("mismatch", "error", "crash", "timeout")
WORKER = "fuzz.onnx.worker"


def run(seeds: range, workers: int = 2, timeout: float = 120.0) -> list[dict]:
    """The outcomes of ``seeds``, each graph in a worker process, compiled into a fresh cache."""
    with tempfile.TemporaryDirectory(prefix="tcc-fuzz-onnx-") as cache:
        outcomes = run_seeds(({"seed": s} for s in seeds), workers, timeout, {"TCC_CACHE_DIR": cache}, WORKER)
        return list(tqdm(outcomes, total=len(seeds), desc="fuzz onnx", file=sys.stderr, disable=len(seeds) < 50))


def summary(outcomes: list[dict]) -> str:
    """The counts by status, then the failures by kind (the error and its place, the operator
    whose output mismatched), most frequent first."""
    counts = collections.Counter(o["status"] for o in outcomes)
    valid = len(outcomes) - counts["invalid"]
    kinds = collections.Counter(kind(o) for o in outcomes if o["status"] in FAILURES)
    head = (f"fuzz onnx: {valid} graphs: " + ", ".join(f"{counts[k]} {k}" for k in ("ok", "refused", *FAILURES))
            + f" ({counts['invalid']} more discarded: onnxruntime or onnx.checker refused them)")
    return "\n".join([head] + [f"{n:6d} {k}" for k, n in kinds.most_common()])


def kind(outcome: dict) -> str:
    """A failure's kind: ``error TccBoundsError at passes/te/bounds.py:100``, ``mismatch MatMul``."""
    status, detail = outcome["status"], outcome["detail"]
    if status == "mismatch":
        return f"mismatch {detail.split(' output ')[0]}"
    if status == "error":
        return f"error {detail.split(':')[0]} at {detail.split(' at ')[-1]}"
    return status


def show(seed: int) -> int:
    """One seed in this process: its graph, tcc's source for it and the outcome."""
    case = generate(seed)
    print(onnx.printer.to_text(case.model.graph))
    try:
        import tcc
        print(tcc.onnx.translate(case.model).source())
    except Exception as exc:  # noqa: BLE001 - the outcome below reports it
        print(f"(translate failed: {type(exc).__name__})")
    outcome = check_seed(seed)
    print(f"seed {seed}: {outcome.status}: {outcome.detail}")
    return 1 if outcome.status in FAILURES else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fuzz.onnx", description=__doc__)
    ap.add_argument("-n", type=int, default=200, help="number of graphs")
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--seed", type=int, help="show and check this one seed")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per graph")
    ap.add_argument("--shrink", action="store_true", help="shrink each failing graph (printed)")
    ap.add_argument("--save", type=Path, help="write each failing graph (shrunk with --shrink) here")
    ap.add_argument("--show-refused", action="store_true", help="print the graphs tcc refused")
    args = ap.parse_args(argv)
    if args.seed is not None:
        return show(args.seed)
    outcomes = run(range(args.start, args.start + args.n), args.workers, args.timeout)
    failed = sorted((o for o in outcomes if o["status"] in FAILURES), key=lambda o: o["seed"])
    for o in sorted(outcomes, key=lambda o: o["seed"]):
        if o["status"] in FAILURES or args.show_refused and o["status"] == "refused":
            print(f"seed {o['seed']}: {o['status']}: {o['detail']}")
    for o in failed if args.shrink or args.save else ():
        report(o["seed"], args.shrink, args.save, args.timeout)
    print(summary(outcomes))
    return 1 if failed else 0


def report(seed: int, smaller: bool, save: Path | None, timeout: float) -> None:
    """The failing graph of ``seed``, shrunk if asked, printed and saved if asked."""
    model = shrink(seed, timeout) if smaller else generate(seed).model
    if smaller:
        print(f"seed {seed}, shrunk to {len(model.graph.node)} nodes:\n{onnx.printer.to_text(model.graph)}")
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        onnx.save(model, save / f"seed-{seed}.onnx")


if __name__ == "__main__":
    sys.exit(main())
