"""User-facing errors.

Every error tcc raises on bad input is a :class:`TccError`. It carries the source span it
came from, so that ``str(err)`` prints ``file:line:col``, the offending line and a caret,
followed by what to do about it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """A piece of tcc source text and the name it was read from."""

    text: str
    filename: str = "<string>"

    def line(self, lineno: int) -> str:
        lines = self.text.splitlines()
        return lines[lineno - 1] if 0 < lineno <= len(lines) else ""


EXCERPT_WIDTH = 120  # characters of a source line shown in an error


@dataclass(frozen=True)
class Span:
    """A region of source text: 1-based line and column, end exclusive."""

    source: Source
    line: int
    col: int
    end_line: int
    end_col: int

    def location(self) -> str:
        return f"{self.source.filename}:{self.line}:{self.col}"

    def excerpt(self) -> str:
        """The line and a caret under the span; a long line is cut to a window around it."""
        text = self.source.line(self.line)
        width = max(1, (self.end_col - self.col) if self.end_line == self.line else len(text) - self.col + 1)
        start = 0
        if len(text) > EXCERPT_WIDTH:
            start = max(0, min(self.col - 1 - EXCERPT_WIDTH // 4, len(text) - EXCERPT_WIDTH))
            text = ("..." if start else "") + text[start:start + EXCERPT_WIDTH] + \
                ("..." if start + EXCERPT_WIDTH < len(text) else "")
            start -= 3 if start else 0
            width = min(width, EXCERPT_WIDTH - (self.col - 1 - start) + 3)
        caret = " " * (self.col - 1 - start) + "^" * max(1, width)
        return f"    {text}\n    {caret}"

    def __repr__(self) -> str:
        return f"Span({self.location()})"


class TccError(Exception):
    """Base class of every error tcc reports to a user."""

    kind = "error"

    def __init__(self, message: str, span: Span | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.span = span
        self.hint = hint

    def __str__(self) -> str:
        parts = []
        if self.span is not None:
            parts.append(f"{self.span.location()}: {self.kind}: {self.message}")
            parts.append(self.span.excerpt())
        else:
            parts.append(f"{self.kind}: {self.message}")
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)


class TccSyntaxError(TccError):
    kind = "syntax error"


class TccNameError(TccError):
    kind = "name error"


class TccTypeError(TccError):
    kind = "type error"


class TccShapeError(TccError):
    kind = "shape error"


class TccBoundsError(TccError):
    kind = "bounds error"


class TccArgumentError(TccError):
    kind = "argument error"


class TccIndexError(TccError):
    """An index read from data (or a runtime scalar) that falls outside its tensor at a call."""

    kind = "index error"


class TccScheduleError(TccError):
    kind = "schedule error"


class TccCompileError(TccError):
    kind = "compile error"


class TccRuntimeError(TccError):
    kind = "runtime error"
