"""What each pass did, for ``--print-after-all`` and ``op.lower(..., stage=S)``.

Every pass of the pipeline, and every step of an auto-scheduler, goes through one
:class:`Trace`: ``func = trace("split i by 64", split(func, "i", 64))``. With a listener the
trace prints the IR after the pass, or ``(unchanged)`` when the pass left its text as it was;
without one it only hands the value on (no text is made, so a plain compile pays nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tcc.ir.loops import LoopFunc, format_func
from tcc.ir.te import OpTE, format_op
from tcc.passes.te.fusion import format_fused

AfterPass = Callable[[str, str], None]
IR = TypeVar("IR", OpTE, LoopFunc)
UNCHANGED = "(unchanged)"


class Trace:
    """Reports ``(pass name, IR text)`` to ``after_pass`` after each pass, if one is given."""

    def __init__(self, after_pass: AfterPass | None = None):
        self.after_pass = after_pass
        self._last: dict[type, str] = {}  # the text after the previous pass, by kind of IR

    def __bool__(self) -> bool:
        return self.after_pass is not None

    def __call__(self, name: str, ir: IR) -> IR:
        """``ir``, after reporting it as the result of pass ``name``."""
        if self.after_pass is not None:
            text = format_func(ir) if isinstance(ir, LoopFunc) else _te_text(ir)
            unchanged = self._last.get(type(ir)) == text
            self._last[type(ir)] = text
            self.after_pass(name, UNCHANGED if unchanged else text)
        return ir

    def note(self, name: str, text: str) -> None:
        """Report a pass that checks rather than rewrites (a proof, a verifier)."""
        if self.after_pass is not None:
            self.after_pass(name, text)


def _te_text(op: OpTE) -> str:
    """The TE, with fusion's decisions once there are any."""
    return format_fused(op) if op.fusion_notes else format_op(op)


SILENT = Trace()
