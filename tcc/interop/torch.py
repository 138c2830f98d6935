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
- an eager path: ``ops.NAME(...)`` on plain CPU or CUDA tensors, with nothing watching torch's
  dispatcher, runs the kernel without dispatching (``TorchOp.__call__``), and records the graph of
  a call that needs one itself, with the same backward. A repeat signature is served in C++
  (``torch_native``: built once against the installed PyTorch; its graph node is
  ``torch_autograd.cpp``'s, whose backward calls ``_native_backward``); ``TCC_TORCH_NATIVE=0`` or
  a failed build leave the Python path: ``_Direct`` on the CPU, the CUDA op's plan on CUDA: inputs
  in place, ``torch.empty`` results, torch's current stream; its graph: ``_Graph``).

This module imports PyTorch; ``import tcc`` does not import it (``tcc.torch`` loads it on first use).
"""

from __future__ import annotations

import ctypes
import os
from types import SimpleNamespace
from typing import Any

import torch  # the optional dependency this module exists for

from tcc import dtypes
from tcc.autodiff import grad as derive_grad
from tcc.compiler import Library, Op
from tcc.compiler import compile as tcc_compile
from tcc.errors import TccArgumentError, TccError
from tcc.interop import torch_native
from tcc.runtime.binding import bind_cparams, bind_shapes, result_shapes
from tcc.runtime.cpu import raise_out_of_memory
from tcc.runtime.plans import CpuFastPath, CudaFastPath, CudaLaunch, same_params

_TORCH_DTYPES = {dtypes.f16: torch.float16, dtypes.bf16: torch.bfloat16, dtypes.f32: torch.float32,
                 dtypes.f64: torch.float64, dtypes.i8: torch.int8, dtypes.i32: torch.int32,
                 dtypes.i64: torch.int64, dtypes.boolean: torch.bool, dtypes.f8e4m3: torch.float8_e4m3fn,
                 dtypes.f8e5m2: torch.float8_e5m2}
_LIBRARIES: dict[str, torch.library.Library] = {}  # namespace -> its fragment (kept alive: it owns the ops)
_REGISTERED: dict[tuple[str, int], TorchOp] = {}  # (namespace, id of the tcc op) -> its torch op
_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter  # the tensor types the eager path takes (exactly)
_empty = torch.empty
_default_dtype = torch.get_default_dtype
_grad_enabled = torch.is_grad_enabled
MAX_SIGNATURES = 64  # eager-path calls remembered per op (input shapes and parameters)
# What makes a call need torch's dispatcher rather than the eager path of TorchOp.__call__:
_compiling = torch.compiler.is_compiling  # dynamo tracing (it folds this to True)
_function_mode = torch._C._is_torch_function_mode_enabled  # torch-function modes (set_default_device, ...)
_jit_tracing = torch._C._is_tracing  # torch.jit.is_tracing without its Python wrapper
# no public query for these: torch-dispatch modes (make_fx, FlopCounterMode), functorch transforms (vmap, grad)
_dispatch_modes = torch._C._len_torch_dispatch_stack
_transforms = torch._C._functorch.peek_interpreter_stack
_profiler = torch.autograd.profiler  # ._is_profiler_enabled: the profiler records dispatched ops
_forward_ad = torch.autograd.forward_ad  # ._current_level >= 0 inside dual_level(): tangents need the dispatcher


# the C++ eager path's argument cells (torch_native.cpp's Cell), by the ctypes type of tcc's CPU
# plan's scalar cells and of its CUDA launchers' parameters (c_uint64: a device pointer)
_CELLS = {ctypes.c_float: 0, ctypes.c_double: 1, ctypes.c_int8: 2, ctypes.c_int32: 3, ctypes.c_int64: 4,
          ctypes.c_bool: 5, ctypes.c_uint64: 6}
_cuda_ready: list[bool] = []  # [True] once the C++ path knows cuLaunchKernel and torch's stream query

_native_call: Any = None  # the C++ eager path's call(signatures, args), once it loaded


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
        self._int_results = any(not dt.is_floating_point for dt in self._dtypes)
        self._scalars = not all(self._tensors)  # runtime scalar parameters
        self._no_scalars = [None] * len(self._tensors)  # ctx.scalars of an op without them
        self._shapes: dict[tuple, list[tuple[Any, Any]]] = {}  # input shapes + parameters -> results
        self._direct: dict[tuple, _Direct] = {}  # the same -> the eager path's kernel call
        self._last: _Direct | None = None  # the most recent one, tried first
        self._native: Any = None  # the C++ eager path's table of this op's signatures (torch_native)
        self.grads: dict[str, TorchOp | TccError] = {}
        self._derived = False
        self._autograd = False  # a backward registered (enable_grad): eager calls may record a graph
        lib = _LIBRARIES.setdefault(namespace, torch.library.Library(namespace, "FRAGMENT"))
        lib.define(f"{name}{self.schema()}")
        lib.impl(name, self._run_cpu, "CPU")
        lib.impl(name, self._run_cuda, "CUDA")
        torch.library.register_fake(self.qualname, self._fake, lib=lib)
        self.overload = getattr(getattr(torch.ops, namespace), name).default

    def __repr__(self) -> str:
        return f"<tcc.torch op {self.qualname}>"

    def __call__(self, *args: Any, **cparams: Any) -> Any:
        """The eager path: CPU or CUDA tensors (plain or parameters) with nothing watching torch's
        dispatcher (no compiling, tracing, mode, transform, profiler or forward AD) skip it, since
        its dispatch to a Python kernel costs more than the kernel's own call
        (benchmarks/torch_overhead.py): a call that records no graph goes straight to the kernel,
        one that does through ``_Graph``.
        Every other call, and any call of ``torch.ops.<namespace>.<name>``, goes through the
        dispatcher. A repeat of a known signature is the C++ eager path's (``torch_native.cpp``: the
        same checks, the results and the kernel call in C++; a graph to record, its node from
        ``torch_autograd.cpp``) where it is built, else costs its ``_Direct.run``."""
        native = self._native
        if native is not None and not cparams and not _compiling():
            outs = _native_call(native, args)
            if outs is not None:
                return outs
        if (_compiling() or _function_mode() or _dispatch_modes() or _transforms() is not None or _jit_tracing()
                or _profiler._is_profiler_enabled or _forward_ad._current_level >= 0):
            return self.overload(*args, **cparams)
        last = self._last
        if last is not None:
            outs = last.run(args, cparams)
            if outs is not None:
                return outs[0] if len(outs) == 1 else tuple(outs)
        if len(args) != len(self._tensors):
            self.op(*args, **cparams)  # raises the tcc op's error (how many arguments, which)
        graph = cuda = False
        for i in self._positions:
            t = args[i]
            if type(t) is not _Tensor and type(t) is not _Parameter:
                return self.overload(*args, **cparams)
            if not t.is_cpu:
                if not t.is_cuda:
                    return self.overload(*args, **cparams)
                cuda = True
            graph = graph or t.requires_grad
        if graph and _grad_enabled():
            return _record(self, cparams, *args) if self._autograd else self.overload(*args, **cparams)
        return _one(self._no_graph_cuda(args, cparams) if cuda else self._no_graph(args, cparams))

    def _plain(self, args: tuple[Any, ...], cparams: dict[str, Any]) -> list[torch.Tensor]:
        """The results, recording no graph, on the device of the first tensor argument."""
        if self._positions and args[self._positions[0]].is_cuda:
            return self._no_graph_cuda(args, cparams)
        return self._no_graph(args, cparams)

    def _no_graph_cuda(self, args: tuple[Any, ...], cparams: dict[str, Any]) -> list[torch.Tensor]:
        """The results of the CUDA op on CUDA tensors, recording no graph: its plan for the signature
        (inputs read in place, results from ``torch.empty``, kernels on torch's current stream:
        ``tcc.runtime.cuda.Plan``), else its checked call, which leaves that plan for the next."""
        op = self.cuda_op
        outs = op.plans.run(args, cparams, None)
        if outs is None:
            before = op.plans.plans
            got = op(*args, **cparams)
            outs = list(got) if type(got) is tuple else [got]
            if op.plans.plans is not before and not cparams:  # a new plan: the C++ path may take it
                self._teach_cuda(op.plans.plans[0].fast_path(), len(args))
        return outs

    def _teach_cuda(self, path: CudaFastPath, nargs: int) -> None:
        """Give the C++ eager path a CUDA plan's signature: its kernels, launched by C++ on torch's
        current stream (not a plan with intermediates: their workspace is Python's)."""
        if (not path.allocates or path.nargs != nargs or path.cparams or path.intermediates or path.synchronous
                or path.checked):  # (the C++ launches run no index checks)
            return
        module = self._native_module()
        if module is None:
            return
        if not _cuda_ready:
            module.setup_cuda(path.launch_kernel, path.stream)
            _cuda_ready.append(True)

        def launch(k: CudaLaunch) -> tuple[int, int, int, int]:
            return k.function, k.grid, k.block, k.shared
        launches = [(launch(k), None if k.fallback is None else launch(k.fallback),
                     [(pos, _CELLS.get(cell, -1)) for pos, cell in k.params]) for k in path.launches]
        module.learn_cuda(self._native, path.op, nargs, path.device, [(t.pos, t.dtype, t.shape) for t in path.inputs],
                          list(path.scalars), [(t.dtype, t.shape) for t in path.results], launches)

    def _no_graph(self, args: tuple[Any, ...], cparams: dict[str, Any]) -> list[torch.Tensor]:
        """The results of the CPU kernel on plain CPU tensors, recording no graph: the signature's
        ``_Direct`` call when it has one (then also the next call's first try), else the tcc op's
        checked call, which leaves a ``_Direct`` for the next."""
        shapes = tuple([args[i].shape for i in self._positions])
        key = (shapes, tuple(cparams.items())) if cparams else shapes
        direct = self._direct.get(key)
        outs = direct.run(args, cparams) if direct is not None else None
        if outs is None:
            outs = [_empty(shape, dtype=dt) for shape, dt in self._results(shapes, cparams)]
            if any(is_t and a.requires_grad for a, is_t in zip(args, self._tensors)):  # tcc reads data, not graphs
                args = tuple(a.detach() if is_t else a for a, is_t in zip(args, self._tensors))
            try:
                self.op(*args, out=outs[0] if len(outs) == 1 else outs, **cparams)
            except TccArgumentError:
                self._check_readable(args)
                raise
            direct = _learn_direct(self.op, args, cparams, outs)
            if direct is not None:
                if len(self._direct) >= MAX_SIGNATURES:
                    self._direct.clear()
                    if self._native is not None:
                        torch_native.load().forget(self._native)  # it must not outlive the kernels
                self._direct[key] = direct
                self._teach(direct)
        self._last = direct
        return outs

    def _teach(self, direct: _Direct) -> None:
        """Give the C++ eager path this signature (it builds on first use; nothing where it cannot)."""
        if direct.path.symbols:  # a dynamic kernel's shape symbols: the C++ path lays out no cells for them
            return
        module = None if direct.cparams else self._native_module()
        if module is None:
            return
        path = direct.path
        scalars = [(pos, slot, kind, _CELLS[cell_type]) for pos, slot, kind, cell_type in path.scalars]
        module.learn(self._native, path.address, path.name, path.nargs, path.params,
                     [(pos, slot, dtype, tuple(shape)) for pos, slot, dtype, shape in direct.inputs],
                     scalars, [(slot, dtype, shape) for slot, shape, dtype in direct.results],
                     None if path.guard is None else path.guard.native())

    def _native_module(self) -> Any:
        """The C++ eager path's module, this op's signature table made (None where it is not built)."""
        global _native_call
        module = torch_native.load()
        if module is not None:
            if _native_call is None:
                module.setup(raise_out_of_memory)
                _native_call = module.call
            if self._native is None:
                self._native = module.new_op()
                if self._autograd:
                    self._teach_backward(module)
        return module

    def _teach_backward(self, module: Any) -> None:
        """Let the C++ eager path take calls that record a graph: their node's backward is
        ``_native_backward`` (held by this op's C++ table, which this op holds: a cycle that is
        never collected, like the op itself, which torch's registration keeps for good)."""
        module.learn_backward(self._native, self._native_backward, f"{self.qualname}Backward",
                              len(self._tensors), self._positions)

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
        """Torch's CPU kernel: the eager path's, below autograd (whose inputs may still ask for a
        gradient: tcc reads their data, not the graph)."""
        if any(is_t and a.requires_grad for a, is_t in zip(args, self._tensors)):
            args = tuple(a.detach() if is_t else a for a, is_t in zip(args, self._tensors))
        return _one(self._no_graph(args, cparams))

    def _check_readable(self, args: tuple[Any, ...]) -> None:
        """Raise the clearer error for a CPU tensor NumPy cannot view (so tcc cannot read it), and
        for a tensor given for a runtime scalar: the schema's ``float`` is a Python number, which
        autograd cannot track (torch's dispatcher would take the value and drop the gradient)."""
        for p, a, is_t in zip(self.te.params, args, self._tensors):
            if not is_t and isinstance(a, _Tensor):
                raise TccArgumentError(
                    f"{self.name}: argument {p} is a runtime scalar, a Python number, got a tensor",
                    self.te.span, f"pass {p}.item(); for a gradient with respect to it, declare it as "
                    f"a one-element tensor ({p}: {self.te.scalars[p].dtype}[1]) and read {p}[0]")
            try:
                if is_t:
                    a.numpy()
            except TypeError as exc:  # e.g. bfloat16, which NumPy (and tcc's CPU target) lacks
                raise TccArgumentError(f"{self.name}: a CPU tensor tcc cannot read ({exc})",
                                       hint="use float16/32/64 or integer tensors on the CPU") from None

    def _run_cuda(self, *args: Any, **cparams: Any) -> Any:
        """Torch's CUDA kernel: the eager path's, below autograd (tcc reads the tensors' memory)."""
        return _one(self._no_graph_cuda(args, cparams))

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
        self._autograd = True
        if self._native is not None:
            self._teach_backward(torch_native.load())

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
        ctx.scalars = self._scalars_of(inputs)
        ctx.cparams = dict(keyword_only_inputs or {})
        ctx.save_for_backward(*(a for a, is_t in zip(inputs, self._tensors) if is_t))

    def _scalars_of(self, args: tuple[Any, ...]) -> list[Any]:
        """The runtime scalars among ``args``, None in place of each tensor (kept by autograd)."""
        if not self._scalars:
            return self._no_scalars
        return [None if is_t else a for a, is_t in zip(args, self._tensors)]

    def _backward(self, ctx: Any, *upstream: Any) -> tuple[Any, ...]:
        return self._gradients(ctx, ctx.needs_input_grad, upstream)

    def _gradients(self, ctx: Any, needs: tuple[bool, ...], upstream: tuple[Any, ...]) -> tuple[Any, ...]:
        """The gradient of each parameter whose gradient autograd asks for (``needs``), else None,
        from what ``_setup`` (or ``_Graph.forward``) saved in ``ctx``."""
        saved = iter(ctx.saved_tensors)
        args = tuple([next(saved) if is_t else s for s, is_t in zip(ctx.scalars, self._tensors)])
        return self._gradients_of(args, ctx.cparams, needs, upstream)

    def _native_backward(self, args: tuple[Any, ...], upstream: tuple[Any, ...],
                         needs: tuple[bool, ...]) -> tuple[Any, ...]:
        """The backward of a call whose graph the C++ eager path recorded (``torch_autograd.cpp``:
        its node calls this with the call's arguments, the tensors as saved)."""
        return self._gradients_of(args, {}, needs, upstream)

    def _gradients_of(self, args: tuple[Any, ...], cparams: dict[str, Any], needs: tuple[bool, ...],
                      upstream: tuple[Any, ...]) -> tuple[Any, ...]:
        """The gradient of each parameter in ``needs``, else None, running the gradient ops on the
        call's arguments and the upstream gradients (zeros for those autograd has none of)."""
        if not self._derived:
            self._derive_grads()
        if any(g is None for g in upstream):
            outs = self._empty(args, cparams, self._device(args))
            upstream = tuple([torch.zeros_like(o) if g is None else g for g, o in zip(upstream, outs)])
        grads: list[Any] = []
        for i, p in enumerate(self.te.params):
            if not (self._tensors[i] and needs[i] and p in self.grads):
                grads.append(None)
                continue
            op = self.grads[p]
            if isinstance(op, TccError):
                raise op
            grads.append(op(*args, *upstream, **cparams))
        return tuple(grads)


class _Graph(torch.autograd.Function):
    """The eager path's call that records a graph: the same backward as the one registered with
    ``torch.library.register_autograd`` (``TorchOp._gradients``), without the dispatcher's autograd
    kernel, which costs about three times this Function's ``apply`` (benchmarks/torch_overhead.py).
    Only eager calls that the C++ eager path does not take come here (a first call of a signature,
    or no C++ path); torch.compile, modes and transforms see the registered operator."""

    @staticmethod
    def forward(ctx: Any, op: TorchOp, cparams: dict[str, Any], *args: Any) -> Any:
        ctx.op, ctx.cparams = op, cparams
        ctx.scalars = op._scalars_of(args)
        ctx.save_for_backward(*[args[i] for i in op._positions])
        native = op._native  # grad mode is off in here: plain calls, the C++ path's first
        got = _native_call(native, args) if native is not None and not cparams else None
        if got is not None:
            outs = list(got) if type(got) is tuple else [got]
        else:
            last = op._last
            outs = last.run(args, cparams) if last is not None else None
            if outs is None:
                outs = op._plain(args, cparams)
        if op._int_results:
            ctx.mark_non_differentiable(*(o for o in outs if not o.is_floating_point()))
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    def backward(ctx: Any, *upstream: Any) -> tuple[Any, ...]:
        op: TorchOp = ctx.op
        return (None, None, *op._gradients(ctx, ctx.needs_input_grad[2:], upstream))


# autograd.Function.apply without its Python wrapper, which only binds default arguments (the
# Function has none) and unwraps functorch's tensors (the eager path runs with no transform
# active): about a fifth of a call that records a graph (benchmarks/torch_overhead.py)
_record = super(torch.autograd.Function, _Graph).apply  # bound to _Graph


class _Direct:
    """The eager path's call for one signature (input shapes and parameters), taken from the
    fast path of the plan that tcc's CPU runtime made for it (``tcc.runtime.plans.CpuFastPath``:
    the kernel, its argument slots, scalar cells and pooled argument arrays). Per call: each
    input's type, dtype, shape, layout, device and gradient flag, its pointer, each scalar's type
    (and range), the results' allocation and one foreign call; nothing else is looked up
    (benchmarks/torch_overhead.py)."""

    __slots__ = ("path", "nargs", "cparams", "inputs", "results")

    def __init__(self, path: CpuFastPath, inputs: tuple[tuple[int, int, Any, Any], ...],
                 results: tuple[tuple[int, tuple[int, ...], Any], ...]):
        self.path = path
        self.nargs, self.cparams = path.nargs, path.cparams
        self.inputs = inputs  # (argument position, slot, torch dtype, torch.Size)
        self.results = results  # (slot, shape, torch dtype)

    def run(self, args: tuple[Any, ...], cparams: dict[str, Any]) -> list[Any] | None:
        """The results, or None when this call differs from the signature (or needs a graph)."""
        if len(args) != self.nargs or ((cparams or self.cparams) and not same_params(cparams, self.cparams)):
            return None
        path = self.path
        try:
            buffer = path.pool.pop()
        except IndexError:  # none free: the first call, or other threads hold them all
            buffer = path.new_buffer()
        ptrs, cells, address = buffer
        try:
            for pos, slot, dtype, shape in self.inputs:
                a = args[pos]
                if ((type(a) is not _Tensor and type(a) is not _Parameter) or a.dtype is not dtype
                        or a.shape != shape or not a.is_cpu or not a.is_contiguous()
                        or (a.requires_grad and _grad_enabled())):
                    return None
                ptrs[slot] = a.data_ptr()
            for pos, kind, bounds, cell in cells:
                if pos < 0:
                    break  # (a dynamic kernel's shape symbols, last: set once)
                value = args[pos]
                if type(value) is not kind or (bounds is not None and not bounds[0] <= value <= bounds[1]):
                    return None
                cell.value = value
            if path.guard is not None and not path.guard(ptrs):  # an index out of range: the op's call names it
                return None
            outs = []
            default = _default_dtype()
            for slot, shape, dtype in self.results:  # sizes as arguments, dtype only if needed: parsed fastest
                sizes = shape or ((),)  # a 0-d result: torch.empty(()) (torch.empty() is refused)
                r = _empty(*sizes) if dtype is default else _empty(*sizes, dtype=dtype)
                ptrs[slot] = r.data_ptr()
                outs.append(r)
            status = path.call(address)
        finally:
            path.pool.append(buffer)
        if status != 0:
            raise_out_of_memory(path.name)
        return outs


def _learn_direct(op: Op, args: tuple[Any, ...], cparams: dict[str, Any], outs: list[Any]) -> _Direct | None:
    """The direct call for a signature that ``op`` just ran through its plan, if it made one (None
    for strided inputs, or a backend without plans)."""
    for plan in op.plans.plans:
        path = plan.fast_path()
        ins, targets = path.inputs, path.results
        if (not isinstance(path, CpuFastPath) or path.constants or targets is None or path.nargs != len(args)
                or path.cparams != cparams or len(targets) != len(outs)):
            continue
        if all(not t.numpy and t.dtype is args[t.pos].dtype and t.shape == tuple(args[t.pos].shape) for t in ins) \
                and all(t.shape == tuple(o.shape) and t.dtype is o.dtype for t, o in zip(targets, outs)):
            return _Direct(path, tuple((t.pos, t.slot, t.dtype, torch.Size(t.shape)) for t in ins),
                           tuple((t.slot, t.shape, t.dtype) for t in targets))
    return None


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


def native_status() -> str:
    """Which eager path serves repeat calls (CPU and CUDA): "native" (the C++ one) or "python (why)"."""
    return torch_native.status()


def is_registered(target: Any) -> bool:
    """Whether ``target`` (an operator overload of an FX graph) is a tcc op registered here."""
    return getattr(target, "namespace", None) in _LIBRARIES


def _defined(namespace: str, name: str) -> bool:
    return hasattr(getattr(torch.ops, namespace), name)


def _scalar_type(dt: dtypes.DType) -> str:
    return "float" if dt.is_float else "bool" if dt.is_bool else "int"


def _one(outs: list[torch.Tensor]) -> Any:
    return outs[0] if len(outs) == 1 else tuple(outs)


__all__ = ["TorchOp", "library", "native_status", "op", "register"]
