"""Run one generated program with tcc and compare it with the reference interpreter.

This is what a fuzz worker process does for each seed. The outcome is one of:
``ok``; ``mismatch`` (a wrong answer: the worst case is in the detail); ``internal`` (an
exception that is not a ``TccError``, or a ``TccError`` from past the frontend on a valid
program); ``rejected`` (the frontend or the bounds proof refused the program: a generator bug
or a tcc bug, reviewed by hand; counted apart). A random schedule that tcc refuses with a
``TccScheduleError`` is fine; one it accepts must give the right answer. Where the reference
raises ``TccIndexError`` (an index input the generator poisoned with a value out of range), the
op must raise it too and leave its poisoned ``out=`` untouched.

With ``dynamic``, every shape symbol is dynamic (``tcc.compile(..., dynamic=True)``) and each op
is called at its program's sizes and at sizes drawn around them, one kernel for all: every call
must match the reference. A ``TccError`` where the dynamic kernel refuses an op or a size (a read
it cannot prove for every value, a pass that cannot take a symbolic extent) counts as refused.
"""

from __future__ import annotations

import random
import traceback
from dataclasses import dataclass

import numpy as np

import tcc
from fuzz.constructs import Annotations, annotations
from fuzz.generate import Program, generate
from tcc.errors import (
    TccBoundsError,
    TccError,
    TccIndexError,
    TccNameError,
    TccScheduleError,
    TccShapeError,
    TccSyntaxError,
    TccTypeError,
)
from tcc.ir.loops import For, walk_stmts
from tcc.passes.te.specialize import specialize
from tcc.testing import max_relative_error, random_args, reference_results, tolerance

FRONTEND_ERRORS = (TccSyntaxError, TccTypeError, TccBoundsError, TccNameError, TccShapeError)


@dataclass
class Outcome:
    seed: int
    status: str  # ok | mismatch | internal | rejected
    detail: str = ""
    schedules: int = 0  # random schedules tried
    refused: int = 0  # ... that tcc refused with a TccScheduleError


def check_seed(seed: int, target: str = "cpu", schedules: int = 0, bf16: bool = False,
               dynamic: bool = False) -> Outcome:
    """Generate the program of ``seed``, run every op on fresh random data (and under
    ``schedules`` random user schedules each, or with ``dynamic`` shape symbols at several
    sizes), compare with the reference."""
    return check_program(generate(seed, bf16=bf16), target, schedules, dynamic)


def check_program(prog: Program, target: str = "cpu", schedules: int = 0, dynamic: bool = False) -> Outcome:
    seed = prog.seed
    deterministic = any(annotations(prog.source, c.name).deterministic for c in prog.cases)
    try:
        lib = tcc.compile(prog.source, target=target, deterministic=deterministic,
                          **({"dynamic": True} if dynamic else {}))
    except TccError as exc:  # compile() only parses and checks: the frontend refused it
        return Outcome(seed, "rejected", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - anything else is a bug to report
        return Outcome(seed, "internal", _describe(exc))
    out = Outcome(seed, "ok")
    rnd = random.Random(seed)
    for case in prog.cases:
        op = lib[case.name]
        ann = annotations(prog.source, case.name)
        bound = op.bound(**ann.types) if ann.types else op  # a generic op's binding: the te to check
        if dynamic:
            status, detail = _run_sizes(op, bound.te, ann, case.bindings, seed, rnd)
            out.refused += status == "refused"
            out.schedules += 1
            if status not in ("ok", "refused"):
                return Outcome(seed, status, f"{case.name} (dynamic): {detail}", out.schedules, out.refused)
            continue
        variants = [op] + [_random_schedule(op, case.bindings, rnd) for _ in range(schedules)]
        for k, variant in enumerate(variants):
            if variant is None:
                continue
            out.schedules += k > 0
            status, detail = _run_case(variant, bound.te, ann, case.bindings, seed * 1000 + k)
            if status == "refused":
                out.refused += 1
                continue
            if status != "ok":
                what = f"{case.name}" + (f" with schedule {variant.user_schedule}" if k else "")
                return Outcome(seed, status, f"{what}: {detail}", out.schedules, out.refused)
    return out


def _run_sizes(op, te, ann: Annotations, bindings: dict[str, int], seed: int,
               rnd: random.Random) -> tuple[str, str]:
    """The op of dynamic shape symbols at the program's sizes, then at up to three sizes drawn
    around them (each symbol moved by -2 to +5; sizes the program does not allow are skipped)."""
    sizes = [bindings]
    for _ in range(6):
        moved = {k: max(1, v + rnd.randint(-2, 5)) if k in te.symbols else v for k, v in bindings.items()}
        try:
            specialize(te, {**te.cparams, **moved})
        except TccError:
            continue
        sizes.append(moved)
        if len(sizes) == 4:
            break
    for k, size in enumerate(sizes):
        try:
            status, detail = _run_case(op, te, ann, size, seed * 1000 + k, dynamic=True)
        except TccError:
            status, detail = "refused", ""
        if status == "rejected" and k:  # sizes the program's reads do not allow
            continue
        if status != "ok":
            return status, f"{detail} at {size}"
    return "ok", ""


def _run_case(op, te, ann: Annotations, bindings: dict[str, int], data_seed: int,
              dynamic: bool = False) -> tuple[str, str]:
    """Call ``op`` (of tensor expressions ``te``) on fresh data, index inputs drawn as ``ann``
    says, against the reference: the same results, or the same ``TccIndexError``."""
    rng = np.random.default_rng(data_seed)
    cparams = {k: v for k, v in bindings.items() if k in te.cparams}
    full = {**te.cparams, **bindings}
    try:
        args = _draw_indices(te, random_args(te, full, rng), ann, rng)
        expected = _expected(te, args, full)
    except FRONTEND_ERRORS as exc:
        return "rejected", f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001
        return "internal", "reference: " + _describe(exc)
    spec = specialize(te, full)
    outs = tuple(np.full(spec.tensors[r].concrete_shape(), np.nan if spec.tensors[r].dtype.is_float else 99,
                         spec.tensors[r].dtype.numpy if spec.tensors[r].dtype.name != "bf16" else np.float32)
                 for r in te.results)
    if op.target.is_gpu:
        args, outs, expected = _on_device(te, args, outs, full)
    try:
        got = op(*args, out=outs[0] if len(outs) == 1 else outs, **cparams)
    except TccScheduleError:
        return "refused", ""
    except TccIndexError as exc:
        if expected is None:
            return _untouched(te, outs)
        return "mismatch", f"TccIndexError where the reference gives results: {exc}"
    except TccError as exc:
        if dynamic:  # the dynamic kernel refused the op or these sizes (a static one would take them)
            return "refused", ""
        if isinstance(exc, FRONTEND_ERRORS):
            return "rejected", f"{type(exc).__name__}: {exc}"
        return "internal", _describe(exc)
    except Exception as exc:  # noqa: BLE001
        return "internal", _describe(exc)
    if expected is None:
        return "mismatch", "no TccIndexError where the reference raises one"
    got = got if isinstance(got, tuple) else (got,)
    if op.target.is_gpu:
        got = tuple(_host(g) for g in got)
    for r, g, e in zip(te.results, got, expected):
        problem = _compare(np.asarray(g), e, tolerance(spec, r))
        if problem:
            return "mismatch", f"result {r}: {problem}"
    return "ok", ""


def _expected(te, args: list, full: dict) -> list[np.ndarray] | None:
    """The reference's results; None where it raises ``TccIndexError``."""
    try:
        return reference_results(te, args, full)
    except TccIndexError:
        return None


def _draw_indices(te, args: list, ann: Annotations, rng: np.random.Generator) -> list:
    """Index inputs (tensors and scalars) drawn in their ranges; the poisoned one gets one value
    just out of range (-1 or the range's end)."""
    for i, name in enumerate(te.params):
        if name not in ann.ranges:
            continue
        lo, hi = ann.ranges[name]
        bad = int(rng.choice([lo - 1, hi]))
        if name in te.scalars:
            args[i] = bad if name == ann.poison else int(rng.integers(lo, max(hi, lo + 1)))
            continue
        a = rng.integers(lo, max(hi, lo + 1), size=np.shape(args[i])).astype(args[i].dtype)
        if name == ann.poison and a.size:
            a.flat[int(rng.integers(a.size))] = bad
        args[i] = a
    return args


def _untouched(te, outs: tuple) -> tuple[str, str]:
    """``ok`` if every poisoned output still holds its poison after a ``TccIndexError``."""
    for r, o in zip(te.results, outs):
        o = _host(o)
        if not (np.isnan(o).all() if o.dtype.kind == "f" else (o == np.asarray(99).astype(o.dtype)).all()):
            return "mismatch", f"TccIndexError raised, but result {r} was written"
    return "ok", ""


def _host(a) -> np.ndarray:
    """A NumPy copy of a result (a CUDA tensor copied back; bf16 as f32)."""
    if isinstance(a, np.ndarray):
        return a
    return (a.float() if str(a.dtype) == "torch.bfloat16" else a).cpu().numpy()


def _on_device(te, args: list, outs: tuple, bindings: dict) -> tuple[list, tuple, list | None]:
    """PyTorch CUDA tensors for a CUDA run (bf16 has no NumPy type): inputs rounded to their
    dtype first, so that the reference sees the very values the GPU does; poisoned outputs."""
    import torch  # only where a GPU run needs it

    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
              "i8": torch.int8, "i32": torch.int32, "i64": torch.int64, "bool": torch.bool}
    device_args, host_args = [], []
    for name, a in zip(te.params, args):
        if name not in te.tensors:
            device_args.append(a)
            host_args.append(a)
            continue
        t = torch.from_numpy(np.ascontiguousarray(a)).to(dtypes[te.tensors[name].dtype.name]).cuda()
        device_args.append(t)
        host_args.append(t.float().cpu().numpy() if t.dtype == torch.bfloat16 else t.cpu().numpy())
    expected = _expected(te, host_args, bindings)
    device_outs = tuple(torch.from_numpy(o).to(dtypes[te.tensors[r].dtype.name]).cuda()
                        for r, o in zip(te.results, outs))
    return device_args, device_outs, expected


def _compare(got: np.ndarray, want: np.ndarray, bound: float) -> str:
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if want.dtype.kind in "biu":
        bad = np.flatnonzero(got.ravel() != want.ravel())
        if bad.size:
            i = bad[0]
            return f"{bad.size} of {want.size} differ, first at {np.unravel_index(i, want.shape)}: " \
                   f"{got.ravel()[i]} != {want.ravel()[i]}"
        return ""
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    if (nan_g != nan_w).any():
        i = np.flatnonzero((nan_g != nan_w).ravel())[0]
        return f"NaN at {np.unravel_index(i, want.shape)} differs: {g.ravel()[i]} vs {w.ravel()[i]}"
    inf = np.isinf(w) | np.isinf(g)
    if (g[inf] != w[inf]).any():
        i = np.flatnonzero((inf & (g != w)).ravel())[0]
        return f"inf at {np.unravel_index(i, want.shape)} differs: {g.ravel()[i]} vs {w.ravel()[i]}"
    fin = ~(nan_w | inf)
    err = max_relative_error(np.where(fin, g, 0), np.where(fin, w, 0))
    if err > bound:
        diff = np.where(fin, np.abs(g - w), 0)
        i = int(np.argmax(diff))
        return f"max relative error {err:.3g} > {bound:g} at {np.unravel_index(i, want.shape)}: " \
               f"{g.ravel()[i]} vs {w.ravel()[i]}"
    return ""


def _random_schedule(op, bindings: dict[str, int], rnd: random.Random):
    """A random user schedule over the op's loop names and tensors (legal or not: tcc must
    either refuse it with a TccScheduleError or give the right answer)."""
    try:
        loops = op.lowered({**op.te.cparams, **bindings}).loops
    except TccError:
        return None
    fors = [s for s in walk_stmts(loops.body) if isinstance(s, For)]
    names = [f.var.name for f in fors]
    tensors = [t for t in op.te.tensors if t not in op.te.inputs]
    if not names:
        return None
    steps = []
    for _ in range(rnd.randint(1, 4)):
        kind = rnd.choice(["split", "unroll", "vectorize", "parallel", "reorder", "fuse", "cache",
                           "compute_at", "inline", "decompose", "tile", "conv"])
        loop = rnd.choice(names)
        if kind == "split":
            steps.append(f"split({loop}, {rnd.choice([2, 3, 4, 8])})")
            names += [f"{loop}_o", f"{loop}_i"]
        elif kind == "tile" and len(names) > 1:
            a, b = rnd.sample(names, 2)
            steps.append(f"tile({a}, {b}, {rnd.choice([2, 4])}, {rnd.choice([4, 8])})")
            names += [f"{a}_o", f"{a}_i", f"{b}_o", f"{b}_i"]
        elif kind == "unroll":
            steps.append(f"unroll({loop}, {rnd.choice([2, 4])})")
        elif kind == "vectorize":
            steps.append(f"vectorize({loop})")
        elif kind == "parallel":
            steps.append(f"parallel({loop})")
        elif kind == "reorder" and len(names) > 1:
            steps.append(f"reorder({', '.join(rnd.sample(names, 2))})")
        elif kind == "fuse" and len(names) > 1:
            a, b = rnd.sample(names, 2)
            steps.append(f"fuse({a}, {b})")
            names.append(f"{a}_{b}")
        elif kind in ("cache", "compute_at") and tensors:
            steps.append(f"{kind}({rnd.choice(tensors + list(op.te.inputs))}, {loop})")
        elif kind in ("inline", "decompose") and tensors:
            steps.append(f"{kind}({rnd.choice(tensors)})")
        elif kind == "conv":
            steps.append(f"conv({rnd.choice(['im2col', 'direct', 'auto'])})")
    if not steps:
        return None
    try:
        return op.schedule("; ".join(steps))
    except TccScheduleError:
        return None


def _describe(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {tb[-1].filename.split('tcc/')[-1]}:{tb[-1].lineno} ({tb[-1].name})" if tb else ""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{where}"
