"""tcc ops as PyTorch operators: ``tcc.torch.op(lib.conv2d)`` or ``tcc.torch.library("ops.tc")``.

Each op becomes ``torch.ops.<namespace>.<name>``, defined with ``torch.library`` (schema: the
tensor and scalar parameters positionally, compile-time parameters as keyword-only ints or
floats with their defaults), with

- CPU and CUDA kernels that run the tcc op on the tensors' memory: the torch tensors go to the
  tcc op as they are (inputs read in place, results allocated by PyTorch with ``torch.empty`` and
  written through ``out=``; a repeat CPU call with the same shapes takes the op's cached plan);
  CUDA work goes on PyTorch's current stream (tcc's CUDA runtime reads it from the tensors);
- a fake (meta) kernel: result shapes from the op's result-shape expressions, so that
  ``torch.compile`` traces through the op without a graph break;
- autograd: the backward calls one derived gradient op per float input (``tcc.grad(op, [X])``),
  each itself a ``torch.ops`` operator with a fake kernel, run only for the inputs whose
  gradient autograd asks for (``torch.library.register_autograd``); the gradient operators have a
  backward of their own, derived on first use (double backward);
- an eager path: ``ops.NAME(...)`` on plain CPU tensors that record no graph, with nothing
  watching torch's dispatcher, runs the CPU kernel without dispatching (``TorchOp.__call__``).

This module imports PyTorch; ``import tcc`` does not import it (``tcc.torch`` loads it on first use).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch  # the optional dependency this module exists for

from tcc import dtypes
from tcc.autodiff import grad as derive_grad
from tcc.compiler import Library, Op
from tcc.compiler import compile as tcc_compile
from tcc.errors import TccArgumentError, TccError
from tcc.runtime.binding import bind_cparams, bind_shapes, result_shapes
from tcc.runtime.cpu import raise_out_of_memory

_TORCH_DTYPES = {dtypes.f16: torch.float16, dtypes.bf16: torch.bfloat16, dtypes.f32: torch.float32,
                 dtypes.f64: torch.float64, dtypes.i8: torch.int8, dtypes.i32: torch.int32,
                 dtypes.i64: torch.int64, dtypes.boolean: torch.bool}
_LIBRARIES: dict[str, torch.library.Library] = {}  # namespace -> its fragment (kept alive: it owns the ops)
_REGISTERED: dict[tuple[str, int], TorchOp] = {}  # (namespace, id of the tcc op) -> its torch op
_Tensor = torch.Tensor
_empty = torch.empty
# What makes a call need torch's dispatcher rather than the eager path of TorchOp.__call__:
_compiling = torch.compiler.is_compiling  # dynamo tracing (it folds this to True)
_has_torch_function = torch.overrides.has_torch_function  # tensor subclasses (fake, functional), function modes
_jit_tracing = torch.jit.is_tracing
# no public query for these: torch-dispatch modes (make_fx, FlopCounterMode), functorch transforms (vmap, grad)
_dispatch_modes = torch._C._len_torch_dispatch_stack
_transforms = torch._C._functorch.peek_interpreter_stack
_profiler = torch.autograd.profiler  # ._is_profiler_enabled: the profiler records dispatched ops
_forward_ad = torch.autograd.forward_ad  # ._current_level >= 0 inside dual_level(): tangents need the dispatcher


class TorchOp:
    """A tcc op registered as ``torch.ops.<namespace>.<name>``; call it like the tcc op."""

    def __init__(self, op: Op, namespace: str, name: str):
        self.op = op
        self.te = op.te
        self.namespace, self.name = namespace, name
        self.qualname = f"{namespace}::{name}"
        self._cuda_op: Op | None = None
        self._tensors = [p in op.te.tensors for p in op.te.params]
        self._positions = [i for i, is_t in enumerate(self._tensors) if is_t]  # of the tensor arguments
        self._dtypes = [_TORCH_DTYPES[op.te.tensors[r].dtype] for r in op.te.results]
        self._shapes: dict[tuple, list[tuple[Any, Any]]] = {}  # input shapes + parameters -> results
        self._direct: dict[tuple, _Direct | None] = {}  # the same -> the eager path's kernel call
        self.grads: dict[str, TorchOp | TccError] = {}
        self._derived = False
        lib = _LIBRARIES.setdefault(namespace, torch.library.Library(namespace, "FRAGMENT"))
        lib.define(f"{name}{self.schema()}")
        lib.impl(name, self._run_cpu, "CPU")
        lib.impl(name, self._run_cuda, "CUDA")
        torch.library.register_fake(self.qualname, self._fake, lib=lib)
        self.overload = getattr(getattr(torch.ops, namespace), name).default

    def __repr__(self) -> str:
        return f"<tcc.torch op {self.qualname}>"

    def __call__(self, *args: Any, **cparams: Any) -> Any:
        """Plain CPU tensors that record no graph, with nothing watching the dispatcher (no tracing,
        compiling, mode, transform or profiler), go straight to the CPU kernel: torch's dispatch to a
        Python kernel costs more than the kernel's own call (benchmarks/torch_overhead.py). Every
        other call, and any call of ``torch.ops.<namespace>.<name>``, goes through the dispatcher."""
        if _compiling() or self._needs_dispatch(args):
            return self.overload(*args, **cparams)
        shapes = tuple([args[i].shape for i in self._positions])
        key = (shapes, tuple(cparams.items())) if cparams else shapes
        direct = self._direct.get(key)
        outs = _run_direct(direct, args) if direct is not None else None
        if outs is None:
            outs = [_empty(shape, dtype=dt) for shape, dt in self._results(shapes, cparams)]
            try:
                self.op(*args, out=outs[0] if len(outs) == 1 else outs, **cparams)
            except TccArgumentError:
                self._check_readable(args)
                raise
            self._direct[key] = _learn_direct(self.op, args, cparams, outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _needs_dispatch(self, args: tuple[Any, ...]) -> bool:
        tensors = [args[i] for i in self._positions]
        for t in tensors:
            if type(t) is not _Tensor or t.requires_grad or not t.is_cpu:
                return True
        return (_has_torch_function(tensors) or _dispatch_modes() > 0 or _transforms() is not None
                or _jit_tracing() or _profiler._is_profiler_enabled or _forward_ad._current_level >= 0)

    def schema(self) -> str:
        """``(Tensor X, float a, *, int S=1) -> Tensor`` from the op's parameters and results."""
        te = self.te
        params = [f"Tensor {p}" if p in te.tensors else f"{_scalar_type(te.scalars[p].dtype)} {p}"
                  for p in te.params]
        if te.cparams:
            params.append("*")
            params += [f"{'float' if isinstance(v, float) else 'int'} {k}={v!r}" for k, v in te.cparams.items()]
        results = ", ".join("Tensor" for _ in te.results)
        return f"({', '.join(params)}) -> {results if len(te.results) == 1 else f'({results})'}"

    # ------------------------------------------------------------ kernels
    def _results(self, shapes: tuple[tuple[int, ...], ...], cparams: dict[str, Any]) -> list[tuple[Any, Any]]:
        """(shape, torch dtype) of each result for these input shapes, evaluated once per signature:
        the shape expressions cost tens of microseconds, a dictionary look-up well under one."""
        key = (shapes, tuple(cparams.items())) if cparams else shapes
        known = self._shapes.get(key)
        if known is None:
            te = self.te
            named = dict(zip([p for p in te.params if p in te.tensors], shapes))
            found = result_shapes(te, bind_shapes(te, named, bind_cparams(te, cparams)))
            known = self._shapes[key] = [(found[r], dt) for r, dt in zip(te.results, self._dtypes)]
        return known

    def _empty(self, args: tuple[Any, ...], cparams: dict[str, Any], device: torch.device) -> list[torch.Tensor]:
        """The results, allocated. The fake kernel's shapes may be symbolic: ``int`` makes them
        concrete, as tcc needs."""
        return [torch.empty(shape, dtype=dt, device=device) for shape, dt in self._results(
            tuple(tuple(int(d) for d in args[i].shape) for i in self._positions), cparams)]

    def _device(self, args: tuple[Any, ...]) -> torch.device:
        return args[self._positions[0]].device if self._positions else torch.device("cpu")

    def _fake(self, *args: Any, **cparams: Any) -> Any:
        return _one(self._empty(args, cparams, self._device(args)))

    def _run_cpu(self, *args: Any, **cparams: Any) -> Any:
        """Torch tensors go straight to the tcc op: its plan (``tcc/runtime/cpu.py``) reads their
        pointers on a repeat call. Concrete shapes are ``torch.Size``, tuples already: no conversion."""
        outs = [torch.empty(shape, dtype=dt) for shape, dt in
                self._results(tuple([args[i].shape for i in self._positions]), cparams)]
        if any(is_t and a.requires_grad for a, is_t in zip(args, self._tensors)):  # tcc reads the data, not the graph
            args = tuple(a.detach() if is_t else a for a, is_t in zip(args, self._tensors))
        try:
            self.op(*args, out=outs[0] if len(outs) == 1 else outs, **cparams)
        except TccArgumentError:
            self._check_readable(args)
            raise
        return _one(outs)

    def _check_readable(self, args: tuple[Any, ...]) -> None:
        """Raise the clearer error for a CPU tensor NumPy cannot view (so tcc cannot read it)."""
        for a, is_t in zip(args, self._tensors):
            try:
                if is_t:
                    a.numpy()
            except TypeError as exc:  # e.g. bfloat16, which NumPy (and tcc's CPU target) lacks
                raise TccArgumentError(f"{self.name}: a CPU tensor tcc cannot read ({exc})",
                                       hint="use float16/32/64 or integer tensors on the CPU") from None

    def _run_cuda(self, *args: Any, **cparams: Any) -> Any:
        outs = self._empty(args, cparams, self._device(args))
        self.cuda_op(*args, out=outs, **cparams)  # in place, on torch's current stream
        return _one(outs)

    @property
    def cuda_op(self) -> Op:
        """The same op compiled for target ``cuda`` (from the op's source, on first use)."""
        if self._cuda_op is None:
            source = self.te.source
            self._cuda_op = tcc_compile(source.text, target="cuda")[self.op.name]
        return self._cuda_op

    # ------------------------------------------------------------ autograd
    def enable_grad(self, lazy: bool = False) -> None:
        """Register the backward: one derived gradient op per float tensor input, derived now, or
        with ``lazy`` on the first backward that needs them. Gradient ops get a lazy backward of
        their own, so a double backward (``create_graph=True``, ``gradgradcheck``) derives the
        gradients of the gradients when it first runs, and nothing is derived ahead of use."""
        if not lazy:
            self._derive_grads()
        torch.library.register_autograd(self.qualname, self._backward, setup_context=self._setup,
                                        lib=_LIBRARIES[self.namespace])

    def _derive_grads(self) -> None:
        te = self.te
        for p in te.inputs:
            if te.tensors[p].dtype.is_float:
                try:
                    grad_op = derive_grad(self.op, [p], name=f"{self.op.name}_grad_{p}")
                    self.grads[p] = register(grad_op, self.namespace, autograd=True, lazy=True)
                except TccError as exc:
                    self.grads[p] = exc  # raised if autograd ever asks for this gradient
        self._derived = True

    def _setup(self, ctx: Any, inputs: tuple[Any, ...], output: Any,
               keyword_only_inputs: dict[str, Any] | None = None) -> None:
        ctx.scalars = [None if is_t else a for a, is_t in zip(inputs, self._tensors)]
        ctx.cparams = dict(keyword_only_inputs or {})
        ctx.save_for_backward(*(a for a, is_t in zip(inputs, self._tensors) if is_t))

    def _backward(self, ctx: Any, *upstream: Any) -> tuple[Any, ...]:
        if not self._derived:
            self._derive_grads()
        saved = iter(ctx.saved_tensors)
        args = [next(saved) if is_t else s for s, is_t in zip(ctx.scalars, self._tensors)]
        outs = self._empty(tuple(args), ctx.cparams, self._device(tuple(args)))
        upstream = [torch.zeros_like(o) if g is None else g for g, o in zip(upstream, outs)]
        grads: list[Any] = []
        for i, p in enumerate(self.te.params):
            if not (self._tensors[i] and ctx.needs_input_grad[i] and p in self.grads):
                grads.append(None)
                continue
            op = self.grads[p]
            if isinstance(op, TccError):
                raise op
            grads.append(op(*args, *upstream, **ctx.cparams))
        return tuple(grads)


class _Direct(NamedTuple):
    """The eager path's call for one signature (input shapes and parameters), taken from the plan
    that tcc's CPU runtime made for it (``tcc.runtime.cpu.Plan``: the kernel, its argument slots and
    pooled argument arrays). The eager path has checked what else the plan checks (plain CPU
    tensors, no gradient), the key the shapes, and results are fresh: what is left per call is
    each input's dtype and layout, its pointer, the results' allocation and one foreign call."""

    plan: Any
    inputs: tuple[tuple[int, int, Any], ...]  # (argument position, slot, torch dtype)
    results: tuple[tuple[int, tuple[int, ...], Any], ...]  # (slot, shape, torch dtype)


def _learn_direct(op: Op, args: tuple[Any, ...], cparams: dict[str, Any], outs: list[Any]) -> _Direct | None:
    """The direct call for a signature that ``op`` just ran through its plan, if it made one (None
    for ops with runtime scalars, strided inputs, or a backend without plans)."""
    for plan in getattr(op._plans, "plans", ()):
        ins, targets = plan.inputs, plan.outs
        if (plan.scalars or getattr(plan, "constants", None) is not None or targets is None
                or plan.nargs != len(args) or plan.cparams != cparams or len(targets) != len(outs)):
            continue
        if all(not t.numpy and t.dtype is args[t.pos].dtype and t.shape == tuple(args[t.pos].shape) for t in ins) \
                and all(t.shape == tuple(o.shape) and t.dtype is o.dtype for t, o in zip(targets, outs)):
            return _Direct(plan, tuple((t.pos, t.slot, t.dtype) for t in ins),
                           tuple((t.slot, t.shape, t.dtype) for t in targets))
    return None


def _run_direct(direct: _Direct, args: tuple[Any, ...]) -> list[Any] | None:
    """The results of ``direct``'s kernel on ``args``; None when an input's dtype or layout differs."""
    for pos, _, dtype in direct.inputs:
        a = args[pos]
        if a.dtype is not dtype or not a.is_contiguous():
            return None
    plan = direct.plan
    try:
        buffer = plan.pool.pop()
    except IndexError:  # none free: the first call, or other threads hold them all
        buffer = plan.new_buffer()
    ptrs, _, address = buffer
    try:
        for pos, slot, _ in direct.inputs:
            ptrs[slot] = args[pos].data_ptr()
        outs = []
        for slot, shape, dtype in direct.results:
            r = _empty(*shape, dtype=dtype)  # sizes as arguments: parsed faster than a tuple
            ptrs[slot] = r.data_ptr()
            outs.append(r)
        status = plan.kernel.fn(address)
    finally:
        plan.pool.append(buffer)
    if status != 0:
        raise_out_of_memory(plan.kernel.name)
    return outs


def register(op: Op, namespace: str = "tcc", name: str | None = None, autograd: bool = False,
             lazy: bool = False) -> TorchOp:
    """``op`` as ``torch.ops.<namespace>.<name>`` (registered once per op and namespace), with
    autograd if asked (its gradient ops derived now, or on first use with ``lazy``)."""
    known = _REGISTERED.get((namespace, id(op)))
    if known is not None:
        return known
    base = name or op.name
    name, n = base, 1
    while _defined(namespace, name):
        n += 1
        name = f"{base}_{n}"
    made = _REGISTERED[(namespace, id(op))] = TorchOp(op, namespace, name)
    if autograd:
        made.enable_grad(lazy)
    return made


def op(tcc_op: Op, namespace: str = "tcc", name: str | None = None) -> TorchOp:
    """A tcc op as a PyTorch operator with autograd (see the module's docstring)."""
    if not isinstance(tcc_op, Op):
        raise TccArgumentError(f"tcc.torch.op takes a tcc op (lib.NAME), got {type(tcc_op).__name__}",
                               hint="compile first: lib = tcc.compile(source); tcc.torch.op(lib.NAME)")
    return register(tcc_op, namespace, name, autograd=True)


def library(source: str | os.PathLike | Library, namespace: str = "tcc", **options: Any) -> SimpleNamespace:
    """Every op of a ``.tc`` file, source text or compiled library, as PyTorch operators."""
    lib = source if isinstance(source, Library) else tcc_compile(source, **options)
    return SimpleNamespace(**{o.name: op(o, namespace) for o in lib})


def _defined(namespace: str, name: str) -> bool:
    return hasattr(getattr(torch.ops, namespace), name)


def _scalar_type(dt: dtypes.DType) -> str:
    return "float" if dt.is_float else "bool" if dt.is_bool else "int"


def _one(outs: list[torch.Tensor]) -> Any:
    return outs[0] if len(outs) == 1 else tuple(outs)


__all__ = ["TorchOp", "library", "op", "register"]
