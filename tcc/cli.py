"""The ``tcc`` command: check a file, print any stage of an op, run an op on random data.

    tcc check FILE
    tcc lower FILE --op NAME --stage STAGE [-D SYM=VALUE ...] [--shape T=64x32 ...]
    tcc run FILE --op NAME [-D ...] [--shape ...] [--check] [--repeat N]
    tcc tune FILE --op NAME [-D ...] [--shape ...] [--trials N] [--target cuda]
    tcc bench FILE [--op NAME ...] [-D ...] [--shape ...] [--target cuda] [--roofline [--png PATH]]
              [--measure-peaks]
    tcc onnx MODEL.onnx [--stage fused] [--run [--check]] [--shape INPUT=1x3x224x224]
    tcc cache info|clear

``lower`` and ``run`` take ``--schedule "split(i, 32); ..."`` (replacing the file's schedule).

Errors print ``file:line:col``, the source line and a caret, and exit with status 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

import tcc
from tcc import roofline
from tcc.compiler import Library, Op
from tcc.errors import TccArgumentError, TccError, TccRuntimeError
from tcc.interop.onnx_check import run_against_onnxruntime
from tcc.passes.te.specialize import specialize
from tcc.paths import cache_dir
from tcc.runtime import cache_size
from tcc.runtime.backend import kinds
from tcc.runtime.binding import bind_cparams, bind_shapes, check_sizes
from tcc.stack import deep
from tcc.target import Target
from tcc.testing import max_relative_error, random_args, reference_results, tolerance
from tcc.tune import DEFAULT_TRIALS, search, store_tuning, tunable

ALL_STAGES = ("ast", "te", "fused", "loops", "scheduled", "llvm", "asm", "cuda", "ptx")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return deep(args.func, args)  # the whole command on a deep stack (see tcc/stack.py)
    except TccError as err:
        print(err, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tcc", description="tcc: a small tensor compiler")
    parser.add_argument("--version", action="version", version=f"tcc {tcc.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="parse and check every op of a file")
    check.add_argument("file")
    check.set_defaults(func=cmd_check)

    lower = sub.add_parser("lower", help="print one stage of an op's compilation")
    _op_arguments(lower)
    lower.add_argument("--stage", default="loops", choices=ALL_STAGES, help="the stage to print")
    lower.add_argument("--print-after-all", action="store_true", help="print the IR after every pass")
    lower.set_defaults(func=cmd_lower)

    run = sub.add_parser("run", help="run an op on random inputs")
    _op_arguments(run)
    run.add_argument("--check", action="store_true", help="compare with the reference interpreter")
    run.add_argument("--repeat", type=int, default=10, help="timed runs (median reported)")
    run.add_argument("--seed", type=int, default=None, help="random seed for the inputs")
    run.set_defaults(func=cmd_run)

    tune = sub.add_parser("tune", help="search the auto-scheduler's tile sizes (CUDA: also pipeline depth and "
                                       "block size) for an op and store the winner in the cache")
    _op_arguments(tune, schedule=False)
    tune.add_argument("--trials", type=int, default=None, help="candidates to time (default 12)")
    tune.set_defaults(func=cmd_tune)

    bench = sub.add_parser("bench", help="time ops on random inputs; with --roofline, against the machine's peaks")
    _op_arguments(bench, schedule=False, one_op=False)
    bench.add_argument("--op", action="append", default=None, dest="ops",
                       help="an op to time (repeatable; default: every op of the file)")
    bench.add_argument("--repeat", type=int, default=20, help="timed runs per op (median reported)")
    bench.add_argument("--roofline", action="store_true",
                       help="FLOPs, bytes, intensity, the floor time at the measured peaks and the fraction reached")
    bench.add_argument("--png", default="roofline.png", help="with --roofline: the plot, a point per op")
    bench.add_argument("--measure-peaks", action="store_true",
                       help="measure the machine's peaks again, not from the cache (implies --roofline)")
    bench.set_defaults(func=cmd_bench)

    onnx = sub.add_parser("onnx", help="import an ONNX model: print a stage, or run it against onnxruntime")
    onnx.add_argument("model", help="an .onnx file")
    onnx.add_argument("--stage", default=None, choices=ALL_STAGES[1:], help="print this stage of the model's op")
    onnx.add_argument("--shape", action="append", default=[], metavar="INPUT=1x3x224x224",
                      help="the shape of an input the model leaves symbolic")
    onnx.add_argument("--target", default="cpu", choices=kinds())
    onnx.add_argument("--run", action="store_true", help="compile and run on random inputs")
    onnx.add_argument("--check", action="store_true", help="with --run: compare with onnxruntime")
    onnx.add_argument("--seed", type=int, default=None, help="random seed for the inputs")
    onnx.set_defaults(func=cmd_onnx)

    disk = sub.add_parser("cache", help="the disk cache: what it holds (info) or remove it (clear)")
    disk.add_argument("action", choices=("info", "clear"))
    disk.set_defaults(func=cmd_cache)
    return parser


def _op_arguments(p: argparse.ArgumentParser, schedule: bool = True, one_op: bool = True) -> None:
    p.add_argument("file")
    if one_op:
        p.add_argument("--op", help="the op (may be omitted when the file has one)")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                   help="a shape symbol or compile-time parameter")
    p.add_argument("--shape", action="append", default=[], metavar="TENSOR=64x32",
                   help="the shape of an input tensor")
    p.add_argument("--target", default="cpu", choices=kinds())
    p.add_argument("--arch", default=None, help="CUDA architecture, e.g. sm_90 (target cuda)")
    p.add_argument("--tf32", action="store_true",
                   help="f32 contractions on TF32 tensor cores: faster, operands rounded to 10 bits (target cuda)")
    if schedule:
        p.add_argument("--schedule", default=None, metavar="STEPS",
                       help='the op\'s schedule, e.g. "split(i, 32, io, ii); vectorize(ii)" (replaces the file\'s)')


# ---------------------------------------------------------------- commands

def cmd_check(args: argparse.Namespace) -> int:
    lib = tcc.compile(args.file)
    names = [op.name for op in lib]
    print(f"{args.file}: ok ({len(names)} op{'s' if len(names) != 1 else ''}: {', '.join(names)})")
    return 0


def cmd_lower(args: argparse.Namespace) -> int:
    op = _select_op(args)
    bindings = _bindings(op, args, need_all=args.stage not in ("ast", "te") or args.print_after_all)
    after = None
    if args.print_after_all:
        def after(name: str, text: str) -> None:
            print(f";; ---- after {name} ----\n{text}\n")
    print(op.stage_text(bindings, args.stage, after))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        raise TccArgumentError(f"--repeat {args.repeat}: needs at least 1 timed run")
    if args.seed is not None and args.seed < 0:
        raise TccArgumentError(f"--seed {args.seed}: needs a non-negative integer")
    op = _select_op(args)
    bindings = _bindings(op, args, need_all=True)
    rng = np.random.default_rng(args.seed)
    try:
        inputs = random_args(op.te, bindings, rng)
    except (MemoryError, ValueError) as exc:  # sizes check_sizes could not judge (memory unknown)
        raise TccRuntimeError(f"cannot make random inputs of these sizes ({exc})", hint="use smaller sizes") from None
    cparams = {k: v for k, v in bindings.items() if k in op.te.cparams}
    start = time.perf_counter()
    results = op(*inputs, **cparams)
    first = time.perf_counter() - start
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        op(*inputs, **cparams)
        times.append(time.perf_counter() - start)
    results = results if isinstance(results, tuple) else (results,)
    shapes = ", ".join(f"{r}{list(np.shape(x))}" for r, x in zip(op.te.results, results))
    print(f"{op.name} [{_fmt(bindings)}] on {args.target}: {shapes}")
    print(f"first call (compile + run): {first * 1e3:.2f} ms; median of {len(times)} runs: "
          f"{statistics.median(times) * 1e3:.3f} ms")
    if not args.check:
        return 0
    expected = reference_results(op.te, inputs, bindings)
    spec = specialize(op.te, bindings)
    status = 0
    for name, got, want in zip(op.te.results, results, expected):
        got = got.to_numpy() if hasattr(got, "to_numpy") else np.asarray(got)
        dtype = op.te.tensors[name].dtype
        err = max_relative_error(got, want)
        bound = tolerance(spec, name, tf32=bool(op.options.get("tf32")))
        ok = err <= bound if dtype.is_float else bool(np.array_equal(got, want))
        print(f"check {name}: max relative error {err:.3g} (bound {bound:.2g}) vs reference: "
              f"{'ok' if ok else 'MISMATCH'}")
        status |= 0 if ok else 1
    return status


def cmd_tune(args: argparse.Namespace) -> int:
    trials = args.trials if args.trials is not None else DEFAULT_TRIALS
    if trials < 1:
        raise TccArgumentError(f"--trials {trials}: needs at least 1")
    op = _select_op(args)
    bindings = _bindings(op, args, need_all=True)
    lowered = op.lowered(bindings)
    if not tunable(lowered):
        print(f"{op.name} [{_fmt(bindings)}]: nothing to tune (on the CPU: no matrix multiply or convolution "
              "large enough)")
        return 0
    result = search(op, lowered, trials, progress=sys.stderr.isatty())
    print(f"{op.name} [{_fmt(bindings)}]: {len(result.timings)} candidates")
    for tuning, seconds in result.timings:
        print(f"  {seconds * 1e3:9.3f} ms  {tuning}")
    store_tuning(op, lowered, result)
    print(f"best: {result.best} at {result.best_time * 1e3:.3f} ms "
          f"({result.default_time / result.best_time:.2f}x the default's speed); stored in the cache, "
          f"used by tcc.compile(..., tune=True)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``tcc bench FILE``: each op's median time on random inputs (device arrays on CUDA, each run
    synchronised), then, with ``--roofline``, each against the machine's ceilings and a plot."""
    if args.repeat < 1:
        raise TccArgumentError(f"--repeat {args.repeat}: needs at least 1 timed run")
    lib = _library(args)
    names = args.ops or list(lib.ops)
    unknown = [n for n in names if n not in lib.ops]
    if unknown:
        raise TccArgumentError(f"no op {unknown[0]!r} in {args.file}", hint=f"ops: {', '.join(lib.ops) or 'none'}")
    measured = []
    for name in names:
        op = lib.ops[name]
        bindings = _bindings(op, _known_to(op, args), need_all=True)
        seconds = _median_time(op, bindings, args.repeat)
        print(f"{name} [{_fmt(bindings)}] on {args.target}: median of {args.repeat} runs {seconds * 1e3:.4g} ms")
        if args.roofline or args.measure_peaks:
            lowered = op.lowered(bindings)
            measured.append((op, lowered.target, roofline.cost(lowered.te, lowered.target), seconds))
    if measured:
        _roofline(args, measured)
    return 0


def _roofline(args: argparse.Namespace, measured: list[tuple[Op, Target, roofline.Cost, float]]) -> None:
    """The roofline table and plot of the ops timed: against the target's ceilings, measured again
    with ``--measure-peaks`` or when a kernel computed faster than the stored ones allow."""
    op, target = measured[0][0], measured[0][1]
    reached = roofline.reached([(c, seconds) for _, _, c, seconds in measured])
    peak = roofline.peaks(target, op.machine_key(), measure=args.measure_peaks, at_least=reached)
    points = [roofline.place(o.name, c, seconds, peak) for o, _, c, seconds in measured]
    print(roofline.report(points, peak))
    roofline.plot(points, peak, args.png, f"{args.file} on {args.target}")
    print(f"wrote {args.png}")


def _median_time(op: Op, bindings: dict[str, int | float], repeat: int) -> float:
    inputs = random_args(op.te, bindings, np.random.default_rng(0))
    on_gpu = op.target.is_gpu
    if on_gpu:
        inputs = [tcc.cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in inputs]
    cparams = {k: v for k, v in bindings.items() if k in op.te.cparams}
    out = op(*inputs, **cparams)  # compiles; its results are the outputs of the timed runs
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        op(*inputs, out=out, **cparams)
        if on_gpu:
            tcc.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _known_to(op: Op, args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with only the ``-D`` and ``--shape`` items that name something of ``op`` (one
    command line sizes several ops)."""
    names = {*op.te.symbols, *op.te.cparams}
    return argparse.Namespace(**{**vars(args), "defines": [d for d in args.defines if _split(d, "-D", "")[0] in names],
                                 "shape": [s for s in args.shape if _split(s, "--shape", "")[0] in op.te.inputs]})


def cmd_onnx(args: argparse.Namespace) -> int:
    """``tcc onnx MODEL``: the graph as tcc source (or any stage), or a run checked against onnxruntime."""
    shapes = {}
    for item in args.shape:
        name, value = _split(item, "--shape", "INPUT=1x3x224x224")
        shapes[name] = tuple(int(d) for d in value.lower().split("x")) if value else ()
    model = tcc.onnx.load(args.model, target=args.target, input_shapes=shapes or None, compile_now=False)
    if not args.run:
        stage = args.stage or "fused"
        if stage == "fused":  # the graph as tcc source, then the op after fusion with each decision
            print(model.source)
        print(model.lower(stage))
        for note in model.notes():
            print(f"import: {note}")
        return 0
    return run_against_onnxruntime(model, args.model, args.check, args.seed)


def cmd_cache(args: argparse.Namespace) -> int:
    """``tcc cache info``: the directory, its entries by kind and the cap; ``tcc cache clear``:
    remove every file tcc keeps there."""
    root = cache_dir()
    if root is None:
        print("the disk cache is off (TCC_CACHE_DIR is empty)")
        return 0
    if args.action == "info":
        print(cache_size.report(root))
        return 0
    files, nbytes = cache_size.clear(root)
    print(f"removed {files} file{'s' if files != 1 else ''} ({cache_size.format_bytes(nbytes)}) from {root}")
    return 0


# ---------------------------------------------------------------- helpers

def _library(args: argparse.Namespace) -> Library:
    if args.arch is not None and args.target != "cuda":
        raise TccArgumentError(f"--arch {args.arch} is for --target cuda", hint="drop --arch on the CPU")
    if args.tf32 and args.target != "cuda":
        raise TccArgumentError("--tf32 is for --target cuda", hint="drop --tf32 on the CPU")
    options: dict[str, object] = {"arch": args.arch} if args.arch else {}
    if args.tf32:
        options["tf32"] = True
    return tcc.compile(args.file, target=args.target, **options)


def _select_op(args: argparse.Namespace) -> Op:
    lib = _library(args)
    ops = lib.ops
    if args.op is None:
        if len(ops) != 1:
            raise TccArgumentError(f"{args.file} has {len(ops)} ops; choose one with --op",
                                   hint=f"ops: {', '.join(ops)}")
        op = next(iter(ops.values()))
    elif args.op not in ops:
        raise TccArgumentError(f"no op {args.op!r} in {args.file}", hint=f"ops: {', '.join(ops) or 'none'}")
    else:
        op = ops[args.op]
    schedule = getattr(args, "schedule", None)
    return op.schedule(schedule) if schedule is not None else op


def _bindings(op: Op, args: argparse.Namespace, need_all: bool) -> dict[str, int | float]:
    te = op.te
    values: dict[str, int | float] = dict(te.cparams)
    for item in args.defines:
        name, value = _split(item, "-D", "NAME=VALUE")
        if sum(d.partition("=")[0].strip() == name for d in args.defines) > 1:
            raise TccArgumentError(f"-D {name} is given more than once")
        if name not in te.symbols and name not in te.cparams:
            known = ", ".join([*te.symbols, *te.cparams]) or "none"
            raise TccArgumentError(f"-D {name}: {op.name} has no symbol or parameter {name!r}",
                                   hint=f"it has: {known}")
        number = _number(value, f"-D {item}")
        if name in te.cparams:
            values[name] = bind_cparams(te, {name: number})[name]
        elif not isinstance(number, int) or number < 0:
            raise TccArgumentError(f"-D {item}: {name} is a size and needs a non-negative integer")
        else:
            values[name] = number
    shapes = {}
    for item in args.shape:
        name, value = _split(item, "--shape", "TENSOR=64x32")
        if name in shapes:
            raise TccArgumentError(f"--shape {name} is given more than once")
        if name not in te.inputs:
            raise TccArgumentError(f"--shape {name}: {op.name} has no input tensor {name!r}",
                                   hint=f"inputs: {', '.join(te.inputs)}")
        try:
            shapes[name] = tuple(int(d) for d in value.lower().split("x")) if value else ()
        except ValueError:
            raise TccArgumentError(f"--shape {item}: dims must be integers like 64x32") from None
    bindings = bind_shapes(te, shapes, values)
    missing = [s for s in te.symbols if s not in bindings]
    if need_all and missing:
        raise TccArgumentError(f"no size for {', '.join(missing)} of {op.name}",
                               te.span, "give them with -D NAME=VALUE or --shape TENSOR=AxB")
    if need_all:
        check_sizes(te, bindings)
    return bindings


def _split(item: str, flag: str, form: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name:
        raise TccArgumentError(f"{flag} {item}: expected {form}")
    return name.strip(), value.strip()


def _number(text: str, what: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise TccArgumentError(f"{what}: not a number") from None


def _fmt(bindings: dict[str, int | float]) -> str:
    return ", ".join(f"{k}={v}" for k, v in bindings.items())


if __name__ == "__main__":
    sys.exit(main())
