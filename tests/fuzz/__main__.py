"""``python -m fuzz -n 5000 [--target cuda] [--schedules 2] [--workers 2] [--dynamic]`` (with ``tests``
on PYTHONPATH; ``make fuzz N=5000`` does that): fuzz seeds and print every failure and a summary
(``--dynamic``: every shape symbol dynamic, each op called at several sizes).
``--grad [--orders 2] [--torch]`` fuzzes ``tcc.grad`` instead (``fuzz.grad_check``: first and
second order against finite differences in float64; ``make fuzz-grad N=2000``).
Exit status 1 when any program crashed, timed out, raised an internal error or mismatched (or,
with ``--grad``, when ``tcc.grad`` refused an op whose forward runs)."""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile

from tqdm import tqdm

from fuzz.pool import run_seeds

FAILURES = ("mismatch", "internal", "crash", "timeout")
GRAD_FAILURES = (*FAILURES, "refused")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__)
    ap.add_argument("-n", type=int, default=200, help="number of programs")
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--target", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--schedules", type=int, default=1, help="random user schedules per op")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per program")
    ap.add_argument("--show-rejected", action="store_true", help="print programs the frontend refused")
    ap.add_argument("--dynamic", action="store_true", help="every shape symbol dynamic, ops called at several sizes")
    ap.add_argument("--grad", action="store_true", help="fuzz tcc.grad (float64, CPU) instead")
    ap.add_argument("--orders", type=int, default=2, help="with --grad: derivative orders to check")
    ap.add_argument("--torch", action="store_true", help="with --grad: also gradcheck/gradgradcheck via tcc.torch")
    args = ap.parse_args(argv)
    if args.grad:
        return _grad_main(args)
    jobs = ({"seed": s, "target": args.target, "schedules": args.schedules, "bf16": args.target == "cuda",
             "dynamic": args.dynamic} for s in range(args.start, args.start + args.n))
    counts: collections.Counter = collections.Counter()
    scheduled = refused = 0
    with tempfile.TemporaryDirectory(prefix="tcc-fuzz-") as cache:
        outcomes = run_seeds(jobs, args.workers, args.timeout, env={"TCC_CACHE_DIR": cache})
        for o in tqdm(outcomes, total=args.n, desc=f"fuzz {args.target}", file=sys.stderr):
            counts[o["status"]] += 1
            scheduled += o["schedules"]
            refused += o["refused"]
            if o["status"] in FAILURES or (args.show_rejected and o["status"] == "rejected"):
                tqdm.write(f"seed {o['seed']}: {o['status']}: {o['detail']}")
    summary = ", ".join(f"{counts[k]} {k}" for k in ("ok", *FAILURES, "rejected"))
    runs = f"{scheduled} ops run with dynamic shapes ({refused} refused by the dynamic kernel)" if args.dynamic \
        else f"{scheduled} random schedules ({refused} refused as TccScheduleError)"
    print(f"fuzz {args.target}: {args.n} programs: {summary}; {runs}")
    return 1 if any(counts[k] for k in FAILURES) else 0


def _grad_main(args: argparse.Namespace) -> int:
    jobs = ({"seed": s, "grad": True, "orders": args.orders, "torch": args.torch}
            for s in range(args.start, args.start + args.n))
    counts: collections.Counter = collections.Counter()
    ops = 0
    with tempfile.TemporaryDirectory(prefix="tcc-fuzz-grad-") as cache:
        # the Python path of tcc.torch: each fresh cache would build the C++ eager path again
        env = {"TCC_CACHE_DIR": cache, "TCC_TORCH_NATIVE": "0"}
        outcomes = run_seeds(jobs, args.workers, args.timeout, env=env)
        for o in tqdm(outcomes, total=args.n, desc="fuzz grad", file=sys.stderr):
            counts[o["status"]] += 1
            ops += o.get("ops", 0)
            if o["status"] in GRAD_FAILURES or (args.show_rejected and o["status"] == "rejected"):
                tqdm.write(f"seed {o['seed']}: {o['status']}: {o['detail']}")
    summary = ", ".join(f"{counts[k]} {k}" for k in ("ok", *GRAD_FAILURES, "singular", "skipped", "rejected"))
    print(f"fuzz grad (orders 1..{args.orders}{', torch' if args.torch else ''}): {args.n} programs: "
          f"{summary}; {ops} ops' gradients checked")
    return 1 if any(counts[k] for k in GRAD_FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
