"""Parse tcc source text into an AST (:mod:`tcc.frontend.ast`) with source spans.

The grammar lives in ``grammar.lark``; its LALR(1) tables ship beside it in ``grammar.tables``
(rebuilt by ``make tables``), so no process builds them; where they do not match
(another lark), lark builds them once and keeps them in the user cache. Newlines end
statements only inside an op body and outside brackets; :class:`_StatementNewlines` drops the
others before the parser sees them, the way Python's tokenizer joins bracketed lines.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from pathlib import Path

import lark
from lark import Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from tcc.errors import Source, Span, TccSyntaxError
from tcc.frontend import ast
from tcc.frontend.lexer import FirstGuessLexer
from tcc.paths import cache_dir

_GRAMMAR = Path(__file__).with_name("grammar.lark")
_TABLES = Path(__file__).with_name("grammar.tables")  # the LALR tables, built by write_tables()
_STARTS = ("start", "steps")  # a whole file; the steps of a schedule given from Python
_PLUGINS = {"ContextualLexer": FirstGuessLexer}  # lark's contextual lexer, one scanner tried first
_OPEN = {"(": ")", "[": "]"}
_PRETTY = {"LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "LBRACE": "'{'",
           "RBRACE": "'}'", "COMMA": "','", "COLON": "':'", "SEMICOLON": "';'", "EQUAL": "'='",
           "_NL": "a newline", "NAME": "a name", "NUMBER": "a number", "DTYPE": "a dtype",
           "REDUCER": "a reduction", "FLOAT_WORD": "a number", "$END": "the end of the file",
           "MINUS": "'-'", "PLUS": "'+'",
           "STAR": "'*'", "SLASH": "'/'", "__ANON_0": "'->'"}


class _StatementNewlines:
    """Post-lexer: keep a newline only where it ends a statement."""

    always_accept = ("_NL",)

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        brackets = 0
        braces = 0
        for tok in stream:
            if tok.type == "_NL":
                if braces > 0 and brackets == 0:
                    yield tok
                continue
            if tok.value in ("(", "["):
                brackets += 1
            elif tok.value in (")", "]"):
                brackets = max(0, brackets - 1)
            elif tok.value == "{":
                braces += 1
            elif tok.value == "}":
                braces = max(0, braces - 1)
            yield tok


@functools.cache
def _parser() -> lark.Lark:
    """The LALR parser: from the tables shipped beside the grammar when they were built from this
    grammar by this lark, else built (once per process) and kept in the user cache by lark."""
    shipped = _shipped_parser()
    if shipped is not None:
        return shipped
    root = cache_dir()
    cache: bool | str = False
    if root is not None:
        try:
            root.mkdir(parents=True, exist_ok=True)
            cache = str(root / f"grammar-{lark.__version__}-{_grammar_digest()}.lark-cache")
        except OSError:
            cache = False
    return _build_parser(cache)


def _build_parser(cache: bool | str = False, plugins: dict[str, type] | None = None) -> lark.Lark:
    return lark.Lark(_GRAMMAR.read_text(), parser="lalr", propagate_positions=True,
                     postlex=_StatementNewlines(), maybe_placeholders=True, cache=cache, start=list(_STARTS),
                     _plugins=_PLUGINS if plugins is None else plugins)


def _grammar_digest() -> str:
    """What the parser's tables depend on: the grammar, its start symbols and lark's version."""
    text = _GRAMMAR.read_bytes() + repr(_STARTS).encode() + lark.__version__.encode()
    return hashlib.sha256(text).hexdigest()[:16]


def _shipped_parser() -> lark.Lark | None:
    """The parser from ``_TABLES`` (``Lark.save``'s format after a line with the grammar's digest),
    or None when they are missing or were built from another grammar or lark."""
    try:
        with _TABLES.open("rb") as f:
            if f.readline().decode(errors="replace").strip() != _grammar_digest():
                return None
            return lark.Lark.__new__(lark.Lark)._load(f, _plugins=_PLUGINS)  # (Lark.load takes no options)
    except Exception:  # noqa: BLE001 - unreadable tables of any kind only cost building the parser
        return None


def write_tables(path: Path = _TABLES) -> None:
    """Build the parser and ship its tables (``make tables`` after changing the grammar;
    ``tests/test_parser_tables.py`` checks that they are current)."""
    with path.open("wb") as f:
        f.write(_grammar_digest().encode() + b"\n")
        _build_parser(plugins={}).save(f)  # (the lexer class is given at load)


def parse(text: str, filename: str = "<string>") -> ast.Module:
    """Parse a whole source file; raises :class:`TccSyntaxError` pointing at the problem."""
    return _parse(text, filename, "start")


def parse_steps(text: str, filename: str = "<schedule>") -> list[ast.SchedStep]:
    """Parse the steps of a schedule given from Python (``op.schedule("split(i, 32); ...")``)."""
    return _parse(text, filename, "steps")


def _parse(text: str, filename: str, start: str):
    source = Source(text, filename)
    try:
        tree = _parser().parse(text, start=start)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, source) from None
    return _ToAst(source).transform(tree)


def _syntax_error(exc: UnexpectedInput, source: Source) -> TccSyntaxError:
    line, col = max(1, exc.line or 1), max(1, exc.column or 1)
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        lines = source.text.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
        message = "unexpected end of file"
        width = 1
    elif isinstance(exc, UnexpectedToken):
        tok = exc.token
        shown = "newline" if tok.type == "_NL" else repr(str(tok))
        message = f"unexpected {shown}"
        width = 1 if tok.type == "_NL" else max(1, len(str(tok)))
    elif isinstance(exc, UnexpectedCharacters):
        message = f"unexpected character {source.text[exc.pos_in_stream]!r}"
        width = 1
    else:
        message, width = "invalid syntax", 1
    expected = sorted(getattr(exc, "accepts", None) or getattr(exc, "expected", None) or ())
    hint = None
    if expected:
        names = sorted({_PRETTY.get(e, repr(e.lower()) if e.isupper() else e) for e in expected
                        if not e.startswith("__")})
        if names:
            hint = "expected " + ", ".join(names[:8]) + (" or more" if len(names) > 8 else "")
    return TccSyntaxError(message, Span(source, line, col, line, col + width), hint)


def _number(tok: Token) -> ast.Num:
    text = str(tok)
    is_float = any(c in text for c in ".eEn")  # "inf" and "nan" are float literals
    return ast.Num(float(text) if is_float else int(text), is_float)


@v_args(meta=True, inline=True)
class _ToAst(Transformer):
    """lark tree -> AST dataclasses, attaching spans."""

    def __init__(self, source: Source):
        super().__init__()
        self.source = source

    def _span(self, meta: object) -> Span | None:
        if getattr(meta, "empty", True):
            return None
        return Span(self.source, meta.line, meta.column, meta.end_line, meta.end_column)

    def _with(self, node: ast.Node, meta: object) -> ast.Node:
        node.span = self._span(meta)
        return node

    # -- module and op headers
    def start(self, meta, *items):
        ops = [i for i in items if isinstance(i, ast.OpDef)]
        schedules = [i for i in items if isinstance(i, ast.ScheduleDef)]
        return self._with(ast.Module(ops, schedules), meta)

    def op_def(self, meta, name, cparams, *rest):
        *params, results, body = rest
        params = [p for p in params if p is not None]
        return self._with(ast.OpDef(str(name), cparams or [], params, results, body), meta)

    def cparams(self, meta, *items):
        return list(items)

    def cparam(self, meta, name, value):
        return self._with(ast.CParam(str(name), value.value), meta)

    def type_param(self, meta, name, kind):
        return self._with(ast.TypeParam(str(name), str(kind)), meta)

    def neg_number(self, meta, tok):
        num = _number(tok)
        num.value = -num.value
        return self._with(num, meta)

    def param(self, meta, name, dtype, shape):
        return self._with(ast.Param(str(name), str(dtype), shape), meta)

    def shape(self, meta, *dims):
        return [d for d in dims if d is not None]

    def results(self, meta, *params):
        return list(params)

    def body(self, meta, *stmts):
        return [s for s in stmts if s is not None]

    # -- schedules
    def schedule_def(self, meta, op, target, steps):
        return self._with(ast.ScheduleDef(op, target, steps), meta)

    def steps(self, meta, *steps):
        return [s for s in steps if s is not None]

    def sched_step(self, meta, prim, *args):
        return self._with(ast.SchedStep(str(prim), [a for a in args if a is not None]), meta)

    def word(self, meta, tok):
        value = _number(tok).value if tok.type == "NUMBER" else str(tok)
        return self._with(ast.Word(value), meta)

    def neg_word(self, meta, tok):
        return self._with(ast.Word(-_number(tok).value), meta)

    def dotted_word(self, meta, *parts):  # an instruction name: mma.sync.tf32
        return self._with(ast.Word(".".join(map(str, parts))), meta)

    # -- statements
    def assign(self, meta, name, *rest):
        *indices, value = rest
        return self._with(ast.Assign(str(name), [i for i in indices if i is not None], value), meta)

    def accumulate(self, meta, name, *rest):
        *indices, value = rest
        return self._with(ast.Accumulate(str(name), [i for i in indices if i is not None], value), meta)

    def decl(self, meta, name, dtype, shape):
        return self._with(ast.Decl(str(name), str(dtype), shape), meta)

    def pad_stmt(self, meta, name, source, lo, hi, value):
        return self._with(ast.PadStmt(str(name), str(source), lo, hi, value), meta)

    def list(self, meta, *items):
        return [i for i in items if i is not None]

    # -- expressions
    def number(self, meta, tok):
        return self._with(_number(tok), meta)

    def name(self, meta, tok):
        return self._with(ast.Name(str(tok)), meta)

    def access(self, meta, name, *indices):
        return self._with(ast.Access(str(name), [i for i in indices if i is not None]), meta)

    def call(self, meta, fn, *args):
        return self._with(ast.CallExpr(str(fn), [a for a in args if a is not None]), meta)

    def reduce(self, meta, op, *rest):
        *axes, body = rest
        return self._with(ast.ReduceExpr(str(op), list(axes), body), meta)

    def axis(self, meta, name, extent):
        return self._with(ast.Axis(str(name), extent), meta)

    def neg(self, meta, a):
        return self._with(ast.UnaryOp("neg", a), meta)

    def not_op(self, meta, a):
        return self._with(ast.UnaryOp("not", a), meta)


def _binary(op: str):
    def build(self, meta, a, b):
        return self._with(ast.BinOp(op, a, b), meta)
    return build


for _op, _rule in [("add", "add"), ("sub", "sub"), ("mul", "mul"), ("div", "div"),
                   ("floordiv", "floordiv"), ("mod", "mod"), ("pow", "pow"), ("lt", "lt"),
                   ("le", "le"), ("gt", "gt"), ("ge", "ge"), ("eq", "eq"), ("ne", "ne"),
                   ("and", "and_op"), ("or", "or_op")]:
    setattr(_ToAst, _rule, v_args(meta=True, inline=True)(_binary(_op)))

