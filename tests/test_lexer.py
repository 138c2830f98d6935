"""tcc/frontend/lexer.py's FirstGuessLexer against lark's own contextual lexer: the same tokens
(type, text, place) and the same errors, on the examples, generated programs, mutated and
random sources, and names that spell keywords."""

from __future__ import annotations

import random

import pytest
from fuzz.generate import generate
from hostile.cases import base_programs, mutate, random_unicode
from lark.exceptions import UnexpectedInput

from tcc.frontend import parser
from tcc.frontend.lexer import FirstGuessLexer

KEYWORD_NAMES = [
    "op value(pad: f32[N], op: f32[N]) -> schedule: f32[N] { schedule[i] = pad[i] + op[i] }\n",
    "op f(X: f32[N]) -> Y: f32[N] {\n  value[i] = X[i] # a comment\n  Y[i] = value[i] * 2 \\\n + 1\n}\n",
    "op g(and: f32[N]) -> Y: f32[N] { Y[i] = select(and[i] > 0 and not and[i] > 1, and[i], -inf) }\n",
    "op h(maxi: f32[N], f32x: f32[N], nanny: f32[N]) -> Y: f32[N] { Y[i] = maxi[i] + f32x[i] + nanny[i] }\n",
    "op p(X: f32[N]) -> Y: f32[N] { Xp = pad(X, [1, 1], value=0.0); Y[i] = Xp[i + 1] }\n",
    "schedule mm cpu { split(i, 4, io, ii) }\n", "op\n", "op f(", "op f(X: f33[N]) -> Y: f32[N] {}",
    "op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] $ 2 }", "", "   # only a comment\n",
]


@pytest.fixture(scope="module")
def lexers():
    """(lark's contextual lexer, FirstGuessLexer): the same tables, two lexer classes."""
    plain = parser._build_parser(plugins={})
    guess = parser._parser()
    assert isinstance(guess.parser.lexer.lexer, FirstGuessLexer)
    assert type(plain.parser.lexer.lexer) is not FirstGuessLexer
    return plain, guess


def _outcome(lark_parser, text: str, start: str):
    """Every token of the parse (type, text, line, column), or the error lark raised."""
    try:
        tree = lark_parser.parse(text, start=start)
    except UnexpectedInput as exc:  # (what tcc's syntax errors read: the expected set sorted)
        expected = sorted(getattr(exc, "accepts", None) or getattr(exc, "expected", None) or ())
        token = getattr(exc, "token", None)
        return type(exc).__name__, exc.line, exc.column, expected, token and (token.type, str(token))
    return [(t.type, str(t), t.line, t.column) for t in tree.scan_values(lambda v: hasattr(v, "type"))], tree


def _sources() -> list[str]:
    rnd = random.Random(12)
    bases = base_programs()
    out = list(bases) + KEYWORD_NAMES
    out += [generate(seed).source for seed in range(40)]
    out += [mutate(rnd.choice(bases), rnd, gentle=i % 2 == 0) for i in range(150)]
    out += [random_unicode(rnd) for _ in range(30)]
    return out


def test_first_guess_tokens_are_lark_contextual_tokens(lexers):
    plain, guess = lexers
    for text in _sources():
        assert _outcome(guess, text, "start") == _outcome(plain, text, "start"), text
    for steps in ("split(i, 32, io, ii); vectorize(ii)", "bind(bx, block.x) unroll(k)", "split(i, 4", "op(x)"):
        assert _outcome(guess, steps, "steps") == _outcome(plain, steps, "steps"), steps
