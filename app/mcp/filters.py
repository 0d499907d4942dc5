"""DataHub's MCP filter syntax (a SQL-like WHERE clause: `platform = snowflake AND (env = PROD OR tag IS NOT NULL)`)
as DataHub's `orFilters`: an OR of AND groups, the form `searchAcrossEntities` and `searchAcrossLineage` take. The
field names are the tools' (`entity_type`, `tag`, `glossary_term`, `owner`, ...), mapped to the search index's.
A filter that does not parse is a 400 naming `$.arguments.filter` and the position."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.errors import Issue, ValidationFailed
from app.limits import clip

MAX_GROUPS = 32  # OR groups after distributing: a filter of a few terms never needs more
_TOKEN = re.compile(
    r"""\s*(?:(?P<lp>\()|(?P<rp>\))|(?P<comma>,)|(?P<op>>=|<=|!=|=|>|<)"""
    r"""|(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<word>[^\s(),=<>!"']+))"""
)
# the tools' field names -> the search index's (app.search.filters)
_FIELDS = {
    "entity_type": "_entityType",
    "entity_subtype": "typeNames",
    "subtype": "typeNames",
    "platform": "platform",
    "domain": "domains",
    "container": "container",
    "tag": "tags",
    "glossary_term": "glossaryTerms",
    "owner": "owners",
    "env": "origin",
    "deprecated": "deprecated",
    "urn": "urn",
}
_CONDITIONS = {"=": "EQUAL", ">": "GREATER_THAN", ">=": "GREATER_THAN_OR_EQUAL_TO", "<": "LESS_THAN"}
_CONDITIONS["<="] = "LESS_THAN_OR_EQUAL_TO"
# DataHub's EntityType names for the tools' entity_type values (dataset, corp_user, dataProduct, ...)
_SPECIAL_TYPES = {"corp_user": "CORP_USER", "corpuser": "CORP_USER", "corp_group": "CORP_GROUP"}


@dataclass(frozen=True, slots=True)
class Criterion:
    field: str
    values: tuple[str, ...]
    condition: str
    negated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "values": list(self.values), "condition": self.condition, "negated": self.negated}


Groups = list[list[Criterion]]  # OR of ANDs


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        position = 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None or match.end() == position:
                if text[position:].strip() == "":
                    break
                raise self.error("unexpected character", position)
            kind = match.lastgroup or ""
            self.tokens.append((kind, match.group(kind), match.start(kind)))
            position = match.end()
        self.at = 0

    def error(self, message: str, position: int | None = None) -> ValidationFailed:
        if position is None:
            position = self.tokens[self.at][2] if self.at < len(self.tokens) else len(self.text)
        text = f"the filter does not parse at character {position}: {message}"
        return ValidationFailed(text, [Issue(text, path="$.arguments.filter", found=clip(self.text, 200))])

    def peek(self, kind: str | None = None, word: str | None = None) -> bool:
        if self.at >= len(self.tokens):
            return False
        token_kind, value, _ = self.tokens[self.at]
        if kind is not None and token_kind != kind:
            return False
        return word is None or (token_kind == "word" and value.upper() == word)

    def take(self, kind: str, word: str | None = None, what: str = "") -> str:
        if not self.peek(kind, word):
            raise self.error(f"expected {what or word or kind}")
        value = self.tokens[self.at][1]
        self.at += 1
        return value

    def parse(self) -> Groups:
        groups = self.disjunction()
        if self.at < len(self.tokens):
            raise self.error("expected AND, OR or the end")
        return groups

    def disjunction(self) -> Groups:
        groups = self.conjunction()
        while self.peek("word", "OR"):
            self.at += 1
            groups = groups + self.conjunction()
            self.bounded(groups)
        return groups

    def conjunction(self) -> Groups:
        groups = self.negation()
        while self.peek("word", "AND"):
            self.at += 1
            right = self.negation()
            groups = [left + other for left in groups for other in right]
            self.bounded(groups)
        return groups

    def negation(self) -> Groups:
        if self.peek("word", "NOT"):
            self.at += 1
            return self.negate(self.negation())
        if self.peek("lp"):
            self.at += 1
            groups = self.disjunction()
            self.take("rp", what="')'")
            return groups
        return [[self.criterion()]]

    def negate(self, groups: Groups) -> Groups:
        # De Morgan: NOT (a AND b OR c) = (NOT a OR NOT b) AND NOT c
        result: Groups = [[]]
        for group in groups:
            result = [left + [_negated(c)] for left in result for c in group]
            self.bounded(result)
        return result

    def bounded(self, groups: Groups) -> None:
        if len(groups) > MAX_GROUPS:
            raise self.error(f"it makes more than {MAX_GROUPS} OR groups; simplify it")

    def criterion(self) -> Criterion:
        name = self.take("word", what="a field name")
        field = _field(name)
        if self.peek("word", "IS"):
            self.at += 1
            negated = self.peek("word", "NOT")
            if negated:
                self.at += 1
            self.take("word", "NULL")
            return Criterion(field, (), "EXISTS", negated=not negated)
        if self.peek("word", "IN") or self.peek("word", "NOT"):
            negated = self.peek("word", "NOT")
            if negated:
                self.at += 1
            self.take("word", "IN")
            self.take("lp", what="'('")
            values = [self.value(field)]
            while self.peek("comma"):
                self.at += 1
                values.append(self.value(field))
            self.take("rp", what="')'")
            return Criterion(field, tuple(values), "EQUAL", negated)
        operator = self.take("op", what="=, !=, IN, IS, <, <=, > or >=")
        value = self.value(field)
        if operator == "!=":
            return Criterion(field, (value,), "EQUAL", True)
        return Criterion(field, (value,), _CONDITIONS[operator])

    def value(self, field: str) -> str:
        if self.peek("str"):
            raw = self.take("str")
            text = re.sub(r"\\(.)", r"\1", raw[1:-1])
        else:
            text = self.take("word", what="a value")
        return _value(field, text)


def _negated(criterion: Criterion) -> Criterion:
    return Criterion(criterion.field, criterion.values, criterion.condition, not criterion.negated)


def _field(name: str) -> str:
    if name.startswith("structuredProperties."):
        return name
    return _FIELDS.get(name, _FIELDS.get(name.lower(), name))


def _value(field: str, text: str) -> str:
    if field == "_entityType":
        lowered = text.lower()
        if lowered in _SPECIAL_TYPES:
            return _SPECIAL_TYPES[lowered]
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text).upper()  # dataProduct -> DATA_PRODUCT
    if field == "platform" and not text.startswith("urn:li:"):
        return f"urn:li:dataPlatform:{text}"
    return text


def parse_filter(text: str | None) -> Groups:
    """The OR groups of `text` (none for an empty filter). `status` is DataHub's soft-delete switch: `status =
    ONLY_SOFT_DELETED` becomes `removed = true`, `ALL` both, `NOT_SOFT_DELETED` (the default) nothing."""
    if text is None or not text.strip():
        return []
    groups = _Parser(text).parse()
    return [[_status(c) for c in group if not _is_default_status(c)] for group in groups]


def _is_default_status(criterion: Criterion) -> bool:
    return criterion.field == "status" and criterion.values == ("NOT_SOFT_DELETED",) and not criterion.negated


def _status(criterion: Criterion) -> Criterion:
    if criterion.field != "status":
        return criterion
    if criterion.values == ("ALL",):
        return Criterion("removed", ("true", "false"), "EQUAL")
    if criterion.values == ("ONLY_SOFT_DELETED",):
        return Criterion("removed", ("true",), "EQUAL", criterion.negated)
    raise ValidationFailed(
        "status is one of NOT_SOFT_DELETED, ALL, ONLY_SOFT_DELETED",
        [Issue("unknown status", path="$.arguments.filter", found=", ".join(criterion.values))],
    )


def or_filters(groups: Groups, *extra: Criterion) -> list[dict[str, Any]] | None:
    """`orFilters` of the groups, each ANDed with `extra`; None when there is nothing to filter on."""
    if not groups:
        return [{"and": [c.to_json() for c in extra]}] if extra else None
    return [{"and": [c.to_json() for c in [*group, *extra]]} for group in groups]
