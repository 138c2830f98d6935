"""The backends: one per target kind, registered once (TVM's target-kind registry is the model).

A :class:`Backend` is everything tcc does differently for one kind of machine: the stages it
prints, the schedule primitives and cache scopes its schedules may use, the options of
``tcc.compile`` it takes, how it picks the machine to compile for, its half of the pipeline
(``schedule``), and how it builds, loads and calls a kernel. Everyone else asks the backend or
the :class:`~tcc.target.Target` value (``target.is_gpu``, ``target.shared_memory_per_block``)
and never compares kind names: :data:`REGISTRY` is the one place that lists them.

Each backend lives in its own module, imported on first use rather than by ``import tcc``: the
CPU backend loads LLVM, the CUDA one the driver bindings, and a process needs only its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tcc.errors import TccArgumentError
from tcc.ir.loops import LoopFunc
from tcc.passes.pipeline import Scheduler
from tcc.runtime.plans import MakePlan
from tcc.target import Target

# kind -> the module whose BACKEND implements it; a new target kind is its folders plus a line here
REGISTRY: dict[str, str] = {
    "cpu": "tcc.runtime.cpu",
    "cuda": "tcc.runtime.cuda",
}


@dataclass(frozen=True)
class Backend:
    """What one target kind provides (the list in docs/architecture.md)."""

    kind: str  # the name users write: tcc.compile(..., target=KIND), ``schedule OP KIND { }``
    target_type: type  # its Target value
    stages: tuple[str, ...]  # what op.lower(stage=...) prints
    primitives: frozenset[str]  # schedule primitives its schedules may use
    cache_scopes: frozenset[str]  # memory scopes cache(T, L, SCOPE) may name
    options: frozenset[str]  # keywords of tcc.compile it takes
    defaults: Mapping[str, Any]  # options it sets where the user did not
    resolve: Callable[[Target | None, Mapping[str, Any]], Target]  # the given or found machine
    schedule: Scheduler  # its half of the pipeline: user steps, then its auto-scheduler
    build: Callable[[LoopFunc, Any], bytes]  # scheduled loops -> the artifact the cache stores
    load: Callable[[str, bytes], Any]  # artifact -> a loaded kernel
    invoke: Callable[[Any, Any, Any, Any], list[Any]]  # (kernel, op TE, bound call, out) -> results
    make_plan: MakePlan  # a checked call -> the plan that repeats it (the fast path)
    as_array: Callable[[Any, str], Any]  # an argument -> the array kind its kernels take
    stage_text: Callable[[LoopFunc, str, Any], str]  # the stages after "scheduled"
    cache_key: Callable[[Any], str]  # what of the machine and toolchain a kernel depends on

    @property
    def is_gpu(self) -> bool:
        return bool(self.target_type.is_gpu)


def backend_for(target: str | Target) -> Backend:
    """The backend of a kind's name or of a Target value (an unknown one is an argument error)."""
    kind = target if isinstance(target, str) else getattr(type(target), "kind", None)
    module = REGISTRY.get(kind) if isinstance(kind, str) else None
    if module is None:
        raise TccArgumentError(f"unknown target {target!r}",
                               hint=f"use one of {', '.join(map(repr, REGISTRY))} or a tcc.target value "
                                    "(CpuTarget, CudaTarget)")
    backend: Backend = importlib.import_module(module).BACKEND
    if not isinstance(target, str | backend.target_type):
        raise TccArgumentError(f"unknown target {target!r}", hint=f"target={kind!r} takes a "
                                                                    f"{backend.target_type.__name__}")
    return backend


def kinds() -> tuple[str, ...]:
    """The names of the registered target kinds."""
    return tuple(REGISTRY)


def kinds_taking(option: str) -> list[str]:
    """The kinds whose ``tcc.compile`` takes ``option`` (for an error message: loads every backend)."""
    return [kind for kind in REGISTRY if option in backend_for(kind).options]
