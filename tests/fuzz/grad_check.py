"""Check ``tcc.grad`` on one generated program: first and second order, against central finite
differences in float64.

The program's float dtypes become ``f64``. For each op with a float input, ``G = tcc.grad(op)``
runs compiled (outputs poisoned with NaN) on random inputs and upstream gradients ``dR``; for
each input ``X`` and a random direction ``v``, ``<dX, v>`` must equal ``d/dh <R(X + h v), dR>``
at ``h = 0``, by central differences of the reference interpreter's forward. Second order is the
same check one level up: ``GG = tcc.grad(G)`` against differences of ``<G(...), w>`` for random
``w``, over every float input of ``G`` (the op's inputs and ``dR``). With PyTorch installed,
``--torch`` adds ``gradcheck`` and ``gradgradcheck`` of the op registered through ``tcc.torch``.

Outcomes as in :mod:`fuzz.check`, plus ``refused``: ``tcc.grad`` raised a ``TccError`` on an op
whose forward runs (a gradient tcc does not derive: a failure of this fuzzer); and ``singular``:
a non-finite gradient of an op with a pole (``sqrt(abs(x))`` where ``x`` is exactly 0, as the
generator's pads and index values make it), where no finite answer is right: counted apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

import tcc
from fuzz.check import FRONTEND_ERRORS, _describe, _draw_indices
from fuzz.constructs import Annotations, annotations
from fuzz.generate import Program, generate
from tcc.errors import TccError, TccIndexError
from tcc.ir.expr import Binary, Call, Reduce, walk
from tcc.passes.te.grad_scan import prefix_of
from tcc.passes.te.specialize import specialize
from tcc.testing import random_args, reference_results

STEP = 1e-6
TOLERANCE = 1e-4


@dataclass
class GradOutcome:
    seed: int
    status: str  # ok | skipped (no float input) | singular | mismatch | internal | refused | rejected
    detail: str = ""
    ops: int = 0  # ops whose gradients were checked


def check_grad_seed(seed: int, orders: int = 2, torch_check: bool = False) -> GradOutcome:
    """The program of ``seed`` in float64, its gradients checked to ``orders`` (1 or 2)."""
    return check_grad_program(generate(seed), orders, torch_check)


def underivable(te) -> bool:
    """Whether ``te`` holds what ``tcc.grad`` refuses by design: a reduction whose extent moves with an
    outer index other than a prefix sum or product (``sum[j: i + c](f(j))``, ``f`` not using ``i``)."""
    for c in te.computes:
        for r in (n for n in walk(c.body) if isinstance(n, Reduce)):
            try:
                prefix_of(replace(c, body=r))
            except TccError:
                return True
    return False


def as_f64(source: str) -> str:
    return re.sub(r"\b(f16|bf16|f32)\b", "f64", source)


def check_grad_program(prog: Program, orders: int = 2, torch_check: bool = False) -> GradOutcome:
    try:
        lib = tcc.compile(as_f64(prog.source))
    except TccError as exc:
        return GradOutcome(prog.seed, "rejected", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - anything else is a bug to report
        return GradOutcome(prog.seed, "internal", _describe(exc))
    checked = 0
    for case in prog.cases:
        ann = annotations(as_f64(prog.source), case.name)
        op = lib[case.name]
        op = op.bound(**ann.types) if ann.types else op  # a generic op: its binding (floats made f64)
        status, detail = check_op_gradients(op, case.bindings, prog.seed, orders, torch_check,
                                            ann=replace(ann, poison=None))
        if status not in ("ok", "skipped"):
            return GradOutcome(prog.seed, status, f"{case.name}: {detail}", checked)
        checked += status == "ok"
    return GradOutcome(prog.seed, "ok" if checked else "skipped", "", checked)


def check_op_gradients(op, bindings: dict[str, int], seed: int, orders: int, torch_check: bool,
                       args: list | None = None, ann: Annotations | None = None) -> tuple[str, str]:
    """``op``'s gradients to ``orders`` at ``args`` (default: random ones, index inputs drawn in the
    ranges ``ann`` gives) against central differences."""
    if not any(op.te.tensors[p].dtype.is_float for p in op.te.inputs):
        return "skipped", ""
    if underivable(op.te):
        return "skipped", ""  # +=, recurrences, moving extents: tcc.grad says it does not derive them yet
    rng = np.random.default_rng(seed)
    full = {**op.te.cparams, **bindings}
    cparams = {k: v for k, v in bindings.items() if k in op.te.cparams}
    try:
        if args is None:
            args = _draw_indices(op.te, random_args(op.te, full, rng), ann or Annotations(), rng)
        results = reference_results(op.te, args, full)
    except (*FRONTEND_ERRORS, TccIndexError):
        return "skipped", ""  # an op the forward refuses at these sizes (or data) has no gradient to check
    if not all(np.isfinite(r).all() for r in results if r.dtype.kind == "f"):
        return "skipped", ""  # a log or a division that the random data made infinite
    upstream = [rng.standard_normal(r.shape) if r.dtype.kind == "f" else np.zeros_like(r) for r in results]
    op_now, args_now = op, list(args)
    for order in range(1, orders + 1):
        try:
            grad = tcc.grad(op_now)
        except TccError as exc:
            return "refused", f"order {order}: {type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001
            return "internal", f"order {order}: tcc.grad: {_describe(exc)}"
        status, detail, outs = _compare_directions(op_now, grad, args_now, upstream, full, cparams, rng)
        if status != "ok":
            return status, f"order {order}: {detail}"
        args_now = [*args_now, *upstream]
        upstream = [rng.standard_normal(o.shape) for o in outs]
        op_now = grad
    if torch_check:
        return _torch_check(op, args, cparams)
    return "ok", ""


def _compare_directions(op, grad, args: list, upstream: list, full: dict, cparams: dict, rng
                        ) -> tuple[str, str, tuple]:
    """Run ``grad`` compiled and compare ``<dX, v>`` with central differences of ``op`` (compiled:
    the reference interpreter's grids outgrow NumPy's 64 dimensions on second derivatives)."""
    try:
        got = run_poisoned(grad, [*args, *upstream], full, cparams)
    except FRONTEND_ERRORS as exc:
        return "internal", f"{grad.name} refused: {type(exc).__name__}: {exc}", ()
    except Exception as exc:  # noqa: BLE001
        return "internal", f"{grad.name}: {_describe(exc)}", ()
    floats = [p for p in op.te.inputs if op.te.tensors[p].dtype.is_float]
    for name, g in zip(floats, got):
        i = op.te.params.index(name)
        v = rng.standard_normal(args[i].shape)
        numeric = _directional(op, args, full, cparams, upstream, i, v)
        analytic = float(np.sum(g * v))
        if not np.isfinite(numeric):
            continue  # the step crossed a pole (log, division): no reference value
        if not np.isfinite(analytic) and _has_poles(op):
            return "singular", f"d{name} of {op.name} is {analytic!r} (differences: {numeric!r})", ()
        if not abs(numeric - analytic) <= TOLERANCE * max(1.0, abs(numeric)):
            return "mismatch", f"d{name} of {op.name}: <grad, v> = {analytic!r}, differences {numeric!r}", ()
    return "ok", "", got


def _has_poles(op) -> bool:
    """Whether ``op`` has a function whose derivative is infinite somewhere (``sqrt`` at 0): there
    tcc's gradient is inf or NaN (``0 * inf``), as PyTorch's is, where differences may be finite."""
    for c in op.te.computes:
        for n in walk(c.body):
            if isinstance(n, Call) and n.fn in ("sqrt", "rsqrt", "log"):
                return True
            if isinstance(n, Binary) and n.op in ("div", "pow"):
                return True
    return False


def run_poisoned(op, args: list, full: dict, cparams: dict) -> tuple[np.ndarray, ...]:
    """``op``'s results, written into NaN-filled (99 for integers) arrays."""
    spec = specialize(op.te, full)
    outs = []
    for r in op.te.results:
        t = spec.tensors[r]
        outs.append(np.full(t.concrete_shape(), np.nan if t.dtype.is_float else 99, t.dtype.numpy))
    got = op(*args, out=tuple(outs) if len(outs) > 1 else outs[0], **cparams)
    return got if isinstance(got, tuple) else (got,)


def _directional(op, args: list, full: dict, cparams: dict, upstream: list, i: int, v: np.ndarray) -> float:
    """``d/dh sum(<R(args[i] + h v), dR>)`` at ``h = 0``, by central differences."""
    def loss(sign: int) -> float:
        moved = [a + sign * STEP * v if k == i else a for k, a in enumerate(args)]
        outs = run_poisoned(op, moved, full, cparams)
        return sum(float(np.sum(r * u)) for r, u in zip(outs, upstream) if r.dtype.kind == "f")

    with np.errstate(all="ignore"):
        return (loss(1) - loss(-1)) / (2 * STEP)


def _torch_check(op, args: list, cparams: dict) -> tuple[str, str]:
    """``gradcheck`` and ``gradgradcheck`` of the op as a PyTorch operator (its float inputs)."""
    import torch  # optional: only a --torch run needs it

    fn = tcc.torch.op(op, namespace="tcc_grad_fuzz", name=f"{op.name}_{abs(hash(op.te.source)) % 10**8}")
    floats = {p for p in op.te.inputs if op.te.tensors[p].dtype.is_float}
    leaves = [torch.tensor(a, requires_grad=p in floats) if p in op.te.tensors else a
              for p, a in zip(op.te.params, args)]
    tensor_at = [k for k, p in enumerate(op.te.params) if p in floats]

    def call(*xs):
        full = list(leaves)
        for k, x in zip(tensor_at, xs):
            full[k] = x
        out = fn(*full, **cparams)
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(o for o in outs if o.dtype.is_floating_point)

    xs = tuple(leaves[k] for k in tensor_at)
    try:
        ok = torch.autograd.gradcheck(call, xs, atol=1e-5, rtol=1e-4, raise_exception=False) and \
            torch.autograd.gradgradcheck(call, xs, atol=1e-5, rtol=1e-4, raise_exception=False)
    except TccError as exc:
        return "refused", f"torch: {type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001
        return "internal", f"torch: {_describe(exc)}"
    return ("ok", "") if ok else ("mismatch", "torch gradcheck/gradgradcheck failed")
