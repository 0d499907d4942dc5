"""DataHub's structured query: a search query starting with `/q ` (SearchQueryBuilder.STRUCTURED_QUERY_PREFIX) is
not full text but a Lucene query string, which DataHub hands to Elasticsearch's `query_string` with AND as the
default operator, over the entity's default search fields (DataHub's MCP server tells agents to start every query
with it: `/q user+transaction`, `/q wizard OR pet`, `/q revenue*`, `/q tags:pii`, `/q "exact phrase"`,
`/q (sales OR revenue) AND quarterly`).

Both backends parse it here, into one tree each renders (app.search.postgres, app.search.elastic), so the two answer
the same query alike. What is understood, as Lucene's classic syntax has it:

* words are required by default (AND); `AND`/`&&`, `OR`/`||`, `NOT`/`!`, `+word` (required), `-word` (excluded);
  NOT binds tighter than AND, AND tighter than OR; parentheses group;
* `"a phrase"` (its words adjacent, in order); `word*` (words starting with it), `*` and `?` anywhere in a word;
  `*` alone (or `*:*`) is every document;
* `field:word`, `field:"phrase"`, `field:(a OR b)`: a word of that document field's values (any case; an URN's
  parts are words, so `tags:pii` finds `urn:li:tag:PII`); `field:*`: the field has a value; a field the entity type
  does not have matches nothing;
* `\\` escapes the next character; a boost (`^2`), a fuzziness or a phrase slop (`~`, `~2`) is read and ignored.

Refused with a 400 naming the place (InvalidQuery): unbalanced parentheses or quotes, an operator without an operand,
ranges (`[a TO b]`, `{a TO b}`), regular expressions (`/ab+c/`), more than MAX_TERMS words, groups nested deeper than
MAX_DEPTH. A word without a letter or digit (`&`, `_`) matches like nothing, as an analyzer leaves no term of it: it
is dropped from its group (a query left with no word matches nothing). `/q` with nothing after it is every document.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from app.errors import Issue, ValidationFailed
from app.limits import clip

STRUCTURED_PREFIX = "/q "
MAX_TERMS = 32  # words (and phrases) of one query: each is a clause per searched field in Elasticsearch
MAX_DEPTH = 16  # nested groups and negations
FIELD_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.@")
WILDCARDS = frozenset("*?")
# what ends a word (unescaped); `+`, `-` and `/` may continue one, not start it (the lexer reads them first)
_WORD_STOP = frozenset('!():^[]"{}~')


def _split(query: str | None) -> tuple[str, int] | None:
    """(the Lucene query string after DataHub's `/q ` prefix, where it starts in `query`), None when `query` is not a
    structured query."""
    text = query or ""
    lead = len(text) - len(text.lstrip())
    if text.strip() == STRUCTURED_PREFIX.strip():  # `/q` alone (a query text may be stripped before it gets here)
        return "", len(text)
    if not text.startswith(STRUCTURED_PREFIX, lead):
        return None
    rest = text[lead + len(STRUCTURED_PREFIX) :]
    return rest.strip(), len(text) - len(rest.lstrip())


def structured(query: str | None) -> str | None:
    """The Lucene query string after DataHub's `/q ` prefix (`*` when nothing follows it), or None when `query` is
    not a structured query."""
    split = _split(query)
    return None if split is None else split[0] or "*"


def plain_text(query: str) -> str:
    """The query's text without DataHub's `/q ` prefix (what highlighting looks for)."""
    rest = structured(query)
    return query if rest is None else rest


class InvalidQuery(ValueError):
    """A structured query the parser refuses; `position`: where in the query text given (the prefix counted)."""

    def __init__(self, message: str, position: int, query: str) -> None:
        super().__init__(f"{message} (at character {position} of the query)")
        self.position = position
        self.found = clip(query, 100)

    def at(self, path: str) -> ValidationFailed:
        """The 400 answering it, the query being at `path` in the request (`$input.query`, `$query`)."""
        return ValidationFailed(
            str(self),
            [Issue(str(self), path=path, expected="a Lucene query string after `/q `", found=self.found)],
        )


# --- the tree -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Term:
    """A word or a phrase, of the default fields or of `field`. `wild`: the positions in `text` of wildcard
    characters (`*`, `?`); an escaped one is a literal character (a phrase has none)."""

    text: str
    field: str | None = None
    phrase: bool = False
    wild: frozenset[int] = frozenset()

    @property
    def literal_prefix(self) -> str:
        """The text before the first wildcard (all of it without one)."""
        return self.text[: min(self.wild)] if self.wild else self.text

    @property
    def is_prefix(self) -> bool:
        """A word ending in its only wildcard, a `*`: the words starting with the rest."""
        return self.wild == frozenset({len(self.text) - 1}) and self.text.endswith("*") and len(self.text) > 1


@dataclass(frozen=True, slots=True)
class Every:
    """Every document (`*`, `*:*`), or every one with a value in `field` (`field:*`)."""

    field: str | None = None


@dataclass(frozen=True, slots=True)
class Nothing:
    """No document: what a query without any word matches."""


@dataclass(frozen=True, slots=True)
class Not:
    child: Node


@dataclass(frozen=True, slots=True)
class And:
    children: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    children: tuple[Node, ...]


Node = Term | Every | Nothing | Not | And | Or


def terms(node: Node) -> Iterator[Term]:
    """The terms of a tree, in order."""
    if isinstance(node, Term):
        yield node
    elif isinstance(node, Not):
        yield from terms(node.child)
    elif isinstance(node, And | Or):
        for child in node.children:
            yield from terms(child)


def positive_terms(node: Node, negated: bool = False) -> Iterator[Term]:
    """The terms a matching document holds (not those under a negation): what a score ranks by."""
    if isinstance(node, Term) and not negated:
        yield node
    elif isinstance(node, Not):
        yield from positive_terms(node.child, not negated)
    elif isinstance(node, And | Or):
        for child in node.children:
            yield from positive_terms(child, negated)


# --- tokens -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # AND OR NOT PLUS MINUS LPAREN RPAREN FIELD WORD PHRASE
    position: int
    text: str = ""
    wild: frozenset[int] = frozenset()


class _Lexer:
    def __init__(self, text: str, offset: int, query: str) -> None:
        self.text = text
        self.offset = offset  # of `text` in the query given (the prefix)
        self.query = query
        self.i = 0

    def fail(self, message: str, at: int | None = None) -> InvalidQuery:
        return InvalidQuery(message, self.offset + (self.i if at is None else at), self.query)

    def tokens(self) -> list[_Token]:
        out: list[_Token] = []
        text = self.text
        while True:
            while self.i < len(text) and text[self.i].isspace():
                self.i += 1
            if self.i >= len(text):
                return out
            start, c = self.i, text[self.i]
            if c in "()":
                out.append(_Token("LPAREN" if c == "(" else "RPAREN", start))
                self.i += 1
            elif text.startswith("&&", start) or text.startswith("||", start):
                out.append(_Token("AND" if c == "&" else "OR", start))
                self.i += 2
            elif c in "!+-":
                out.append(_Token({"!": "NOT", "+": "PLUS", "-": "MINUS"}[c], start))
                self.i += 1
            elif c == '"':
                out.append(self._phrase())
                self._modifiers()
            elif c in "[{":
                raise self.fail("range queries ([a TO b], {a TO b}) are not supported")
            elif c == "/":
                raise self.fail("regular expressions (/.../) are not supported")
            elif c in ":^~}]":
                raise self.fail(f"unexpected {c!r}")
            else:
                word = self._word()
                if self.i < len(text) and text[self.i] == ":":
                    self.i += 1
                    if word.text == "*" and word.wild:  # `*:*`, `*:word`: any field, as no field
                        continue
                    if word.wild or not set(word.text) <= FIELD_NAME_CHARS:
                        raise self.fail(f"{clip(word.text, 50)!r} is not a field name", start)
                    out.append(_Token("FIELD", start, word.text))
                    continue
                if not word.wild and word.text in ("AND", "OR", "NOT"):
                    out.append(_Token(word.text, start))
                else:
                    out.append(word)
                self._modifiers()

    def _word(self) -> _Token:
        text, start = self.text, self.i
        chars: list[str] = []
        wild: set[int] = set()
        while self.i < len(text):
            c = text[self.i]
            if c == "\\":
                if self.i + 1 >= len(text):
                    raise self.fail("a `\\` at the end escapes nothing")
                chars.append(text[self.i + 1])
                self.i += 2
                continue
            if c in _WORD_STOP or c.isspace():
                break
            if c in WILDCARDS:
                wild.add(len(chars))
            chars.append(c)
            self.i += 1
        if not chars:
            raise self.fail(f"unexpected {text[start]!r}")
        return _Token("WORD", start, "".join(chars), frozenset(wild))

    def _phrase(self) -> _Token:
        text, start = self.text, self.i
        self.i += 1
        chars: list[str] = []
        while self.i < len(text):
            c = text[self.i]
            if c == "\\" and self.i + 1 < len(text):
                chars.append(text[self.i + 1])
                self.i += 2
                continue
            if c == '"':
                self.i += 1
                return _Token("PHRASE", start, "".join(chars))
            chars.append(c)
            self.i += 1
        raise self.fail("a phrase's quote is not closed", start)

    def _modifiers(self) -> None:
        """A boost (`^2`) or a fuzziness/slop (`~`, `~2`) after a word or phrase: read, not acted on."""
        text = self.text
        while self.i < len(text) and text[self.i] in "^~":
            self.i += 1
            while self.i < len(text) and (text[self.i].isdigit() or text[self.i] == "."):
                self.i += 1


# --- the parser ---------------------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, tokens: list[_Token], lexer: _Lexer) -> None:
        self.tokens = tokens
        self.lexer = lexer
        self.at = 0
        self.terms = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def fail(self, message: str, token: _Token | None) -> InvalidQuery:
        return self.lexer.fail(message, token.position if token else len(self.lexer.text))

    def parse(self) -> Node:
        node = self.or_expr(None, 0)
        extra = self.peek()
        if extra is not None:
            raise self.fail("a `)` without its `(`" if extra.kind == "RPAREN" else "unexpected input", extra)
        return node

    def or_expr(self, field: str | None, depth: int) -> Node:
        children = [self.and_expr(field, depth)]
        while (token := self.peek()) is not None and token.kind == "OR":
            self.at += 1
            children.append(self.and_expr(field, depth))
        return _combine(Or, children)

    def and_expr(self, field: str | None, depth: int) -> Node:
        children = [self.clause(field, depth)]
        while (token := self.peek()) is not None and token.kind not in ("OR", "RPAREN"):
            if token.kind == "AND":
                self.at += 1
            children.append(self.clause(field, depth))
        return _combine(And, children)

    def clause(self, field: str | None, depth: int) -> Node:
        token = self.peek()
        if token is None:
            raise self.fail("an operator without an operand after it", token)
        if depth > MAX_DEPTH:
            raise self.fail(f"groups and negations are nested more than {MAX_DEPTH} deep", token)
        if token.kind in ("NOT", "MINUS"):
            self.at += 1
            child = self.clause(field, depth + 1)
            return Nothing() if isinstance(child, Nothing) else Not(child)
        if token.kind == "PLUS":
            self.at += 1
            return self.clause(field, depth + 1)
        if token.kind == "FIELD":
            if field is not None:
                raise self.fail("a field inside a field's group (a `:` that is no field's is escaped: `\\:`)", token)
            self.at += 1
            return self.clause(token.text, depth + 1)
        if token.kind == "LPAREN":
            self.at += 1
            if (inner := self.peek()) is not None and inner.kind == "RPAREN":
                raise self.fail("an empty group `()`", inner)
            node = self.or_expr(field, depth + 1)
            closing = self.peek()
            if closing is None or closing.kind != "RPAREN":
                raise self.fail("a `(` without its `)`", token)
            self.at += 1
            return node
        if token.kind in ("WORD", "PHRASE"):
            self.at += 1
            self.terms += 1
            if self.terms > MAX_TERMS:
                raise self.fail(f"more than {MAX_TERMS} words", token)
            return _term(token, field)
        raise self.fail(f"{token.kind} without an operand before it", token)


def _term(token: _Token, field: str | None) -> Node:
    if token.kind == "PHRASE":
        return Term(token.text, field, phrase=True) if _has_word(token.text) else Nothing()
    if token.wild and all(c in WILDCARDS for c in token.text):
        return Every(field)
    if not _has_word(token.text):
        return Nothing()
    return Term(token.text, field, wild=token.wild)


def _has_word(text: str) -> bool:
    return any(c.isalnum() for c in text)


def _combine(kind: type[And] | type[Or], children: list[Node]) -> Node:
    """A group of `children`, without those that match like nothing (a word an analyzer leaves no term of)."""
    kept = [c for c in children if not isinstance(c, Nothing)]
    if not kept:
        return Nothing()
    return kept[0] if len(kept) == 1 else kind(tuple(kept))


def parse(query: str) -> Node:
    """The tree of a structured query (`query` with or without its `/q ` prefix); InvalidQuery when it is not one
    the module docstring describes."""
    split = _split(query)
    text, offset = split if split is not None else (query.strip(), len(query) - len(query.lstrip()))
    lexer = _Lexer(text, offset, query)
    tokens = lexer.tokens()
    if not tokens:
        return Every()
    return _Parser(tokens, lexer).parse()


def check(query: str | None, path: str) -> None:
    """A 400 naming `path` when `query` is a structured query that does not parse (nothing for any other query)."""
    if query is None or structured(query) is None:
        return
    try:
        parse(query)
    except InvalidQuery as error:
        raise error.at(path) from None


def parsed(query: str) -> Node | None:
    """The tree of a structured query, None for any other query; a query that does not parse is a 400 naming
    `$query` (the search routes' parameter; GraphQL checks its `$input.query` first, with `check`)."""
    if structured(query) is None:
        return None
    try:
        return parse(query)
    except InvalidQuery as error:
        raise error.at("$query") from None


# --- Lucene's query string, escaped (what Elasticsearch's query_string parses) --------------------------------------

_LUCENE_RESERVED = frozenset('+-=&|!(){}[]^"~*?:\\/')


def lucene_word(term: Term) -> str:
    """A word as a Lucene query string term: reserved characters escaped but its wildcards; `<` and `>` (which no
    escape keeps from starting a range) left out, as an analyzer leaves them out of its terms."""
    if term.phrase:
        return '"' + term.text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    out = []
    for i, c in enumerate(term.text):
        if c in "<>":
            continue
        out.append(c if i in term.wild else ("\\" + c if c in _LUCENE_RESERVED or c.isspace() else c))
    return "".join(out)
