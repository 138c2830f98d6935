"""lark's contextual lexer, with one scanner tried first in every parser state.

lark's ``ContextualLexer`` gives each set of terminals a parser state accepts its own scanner: a
regular expression over those terminals, compiled on first use. Parsing ``examples/conv2d.tc``
visits 34 such sets, and compiling them (Python's ``re``) was ~20 ms of a ~300 ms cold compile.
:class:`FirstGuessLexer` first asks the scanner of *all* terminals (lark's ``root_lexer``, built
anyway, compiled once) and keeps its token when the state accepts that terminal; only otherwise
(a keyword written where a name is expected, a syntax error) does it rewind and ask the state's
own scanner, as lark would have.

Why the first guess, when the state accepts it, is the state's own answer: every scanner tries
the same terminals in the same order (lark sorts them by priority, width and name), so the
state's scanner tries a subset of what the full one tried before it matched, all of which
failed here. The only terminals the full scanner does not try on their own are keywords, folded
into NAME (a NAME that spells a keyword becomes that keyword); a state that accepts the keyword
has it folded the same way where it accepts NAME too, or, without NAME, matches the same letters
with the keyword itself (no other terminal starts with a letter at priority 1). Ignored
terminals (spaces, comments) are in every state. tests/test_lexer.py compares both lexers'
tokens on every example and many generated programs.
"""

from __future__ import annotations

from collections.abc import Iterator
from copy import copy
from typing import Any

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedToken
from lark.lexer import ContextualLexer, LexerState


class FirstGuessLexer(ContextualLexer):
    """A contextual lexer that tries the scanner of all terminals first (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._accepts = {id(lexer): frozenset(t.name for t in lexer.terminals) for lexer in self.lexers.values()}

    def lex(self, lexer_state: LexerState, parser_state: Any) -> Iterator[Token]:
        root, lexers, accepts = self.root_lexer, self.lexers, self._accepts
        while True:
            lexer = lexers[parser_state.position]
            line_ctr, last = copy(lexer_state.line_ctr), lexer_state.last_token
            try:
                token = root.next_token(lexer_state, parser_state)
            except EOFError:  # only ignored text left: the state's scanner would skip it too
                return
            except UnexpectedCharacters:
                token = None
            if token is None or token.type not in accepts[id(lexer)]:
                lexer_state.line_ctr, lexer_state.last_token = line_ctr, last  # rewind: ask the state's own
                try:
                    token = lexer.next_token(lexer_state, parser_state)
                except EOFError:
                    return
                except UnexpectedCharacters as e:
                    raise self._unexpected(e, lexer_state, parser_state) from None
            yield token

    def _unexpected(self, e: UnexpectedCharacters, lexer_state: LexerState, parser_state: Any) -> Exception:
        """lark's error for a character no terminal of the state matches (as ``ContextualLexer.lex``
        makes it): an unexpected token where some terminal matches there, else ``e``."""
        last_token = lexer_state.last_token
        try:
            token = self.root_lexer.next_token(lexer_state, parser_state)
        except UnexpectedCharacters:
            return e
        return UnexpectedToken(token, e.allowed, state=parser_state, token_history=[last_token],
                               terminals_by_name=self.root_lexer.terminals_by_name)
