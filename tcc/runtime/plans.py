"""Call plans shared by the backends: a few argument signatures remembered per op.

A backend's ``make_plan(kernel, op, bound, args, cparams, out)`` turns one checked call into a
plan whose ``run(args, cparams, out)`` repeats it for calls of the same signature (and answers
None for any other); :class:`Plans` keeps the newest few and tries them most recent first.

This is the fast call path that interop builds on (``tcc.interop.torch`` and its C++): an op's
``plans`` (newest first in ``plans.plans``); a CPU plan's ``kernel.address`` (the entry point),
argument ``slots``, ``inputs``, ``scalars`` and ``results`` (``tcc.runtime.cpu.Plan``); a CUDA
plan's ``launchers`` (function, grid, block, shared bytes, parameter order) and the stream it
launches on, ``tcc.runtime.cuda_plan.stream_getter`` (``tcc.runtime.cuda_plan.Plan``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

MAX_PLANS = 8  # argument signatures remembered per op


class Plan(Protocol):
    def run(self, args: tuple[Any, ...], cparams: dict[str, Any], out: Any) -> list[Any] | None: ...


MakePlan = Callable[[Any, Any, Any, tuple[Any, ...], dict[str, Any], Any], Plan | None]


def same_params(cparams: dict[str, Any], planned: dict[str, Any]) -> bool:
    """Whether a call's compile-time parameters are the plan's, in value and type."""
    if not cparams:
        return not planned
    return cparams.keys() == planned.keys() and all(
        type(v) is type(planned[k]) and v == planned[k] for k, v in cparams.items())


class Plans:
    """The plans of one op, newest first; a call runs the first that matches."""

    def __init__(self, make_plan: MakePlan) -> None:
        self.make_plan = make_plan
        self.plans: list[Plan] = []
        # run(args, cparams, out) -> results or None: the only plan's own run when there is one
        # (a Python call less per call), else the search below
        self.run: Callable[[tuple[Any, ...], dict[str, Any], Any], list[Any] | None] = self._first_match

    def __bool__(self) -> bool:
        return bool(self.plans)

    def _first_match(self, args: tuple[Any, ...], cparams: dict[str, Any], out: Any) -> list[Any] | None:
        plans = self.plans
        for plan in plans:
            results = plan.run(args, cparams, out)
            if results is not None:
                if plan is not plans[0]:  # most recently used first: a loop's calls match at once
                    self.plans = [plan, *(p for p in plans if p is not plan)]
                return results
        return None

    def learn(self, kernel: Any, op: Any, bound: Any, args: tuple[Any, ...], cparams: dict[str, Any],
              out: Any) -> None:
        """Remember a plan for calls like this checked one, where one can be made."""
        plan = self.make_plan(kernel, op, bound, args, cparams, out)
        if plan is not None:
            self.plans = [plan, *self.plans[:MAX_PLANS - 1]]  # replaced whole: threads may be reading it
            self.run = plan.run if len(self.plans) == 1 else self._first_match
