"""One step of a schedule: a primitive and its words, as a ``schedule`` block or ``op.schedule``
text says it. It is data that the frontend makes and the loop passes apply, so it lives beneath both."""

from __future__ import annotations

from dataclasses import dataclass, field

from tcc.errors import Span


@dataclass(frozen=True)
class Step:
    prim: str
    words: tuple[str | int, ...]
    names: tuple[str, ...] = ()
    span: Span | None = field(default=None, compare=False)

    def __str__(self) -> str:
        text = " ".join([self.prim, *map(str, self.words)])
        return text + (f" -> {', '.join(self.names)}" if self.names else "")
