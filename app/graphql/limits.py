"""Execution limits on a GraphQL document, checked after parsing and before graphql-core's own validation (some of
whose rules, e.g. OverlappingFieldsCanBeMerged, cost more than linear time in the number of fields).

* depth: the deepest field nesting of an operation, fragments expanded (introspection included);
* aliases: aliased fields, counted as executed (a fragment spread k times counts k times);
* fields: selected fields as executed (the query's complexity: every one is a resolver call per parent).

Fragments are measured once each (memoized), so a document that multiplies fragments costs the check linear time;
a fragment cycle counts as nothing here and is reported by validation (NoFragmentCyclesRule).

The shape does not say what a document costs to run: 50 aliased searches of 10,000 results each are within every
shape limit. `query_cost` does, per request (it needs the variables): every field resolved costs 1 each time it is
resolved, so what a search's `searchResults` select is paid once per result of its page (the input's `count`, cut
as the resolvers cut it), and `facets` cost an aggregation over every match (FACET_AGGREGATION_COST) plus what each
of their values selects. Fields of the other lists (tags, owners, schema fields) count once: they are read with
their entity's aspects. Inline fragments on different types count in full (an upper bound).

Two checks hold while an operation runs:

* `check_arguments`: what the arguments of a root field carry, before its resolver runs (every search, lookup and
  mutation reads its arguments there, and they reach Postgres and the search backends from there): no string holds
  a NUL character, and the strings that name a search field (a filter's or a sort criterion's `field`, a facet) are
  field names;
* `AnswerBudget`: the bytes of the answer (METALEDGER_GRAPHQL_MAX_RESPONSE_BYTES), counted as they come: the JSON
  text of the aspects read to answer it (app.graphql.resolvers.Context, a page's entities read in chunks) and each
  value of the answer as it is produced (app.graphql.service's executor). Past the budget no further field is
  resolved and the request is refused whole instead of answered, so what a request holds in memory is bounded for
  every resolver, whatever the cost of the operation (a few aliased `aspects` over a page of large entities cost
  little and answer a lot; a page of 10,000 entities' schemas costs little and reads a lot).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    value_from_ast_untyped,
)

from app.errors import Issue, ValidationFailed
from app.graphql.resolvers import DEFAULT_AGG_VALUES, DEFAULT_COUNT, MAX_AGG_VALUES
from app.limits import clip
from app.search.filters import FIELD_NAME


@dataclass(frozen=True, slots=True)
class Limits:
    max_depth: int
    max_aliases: int
    max_fields: int


@dataclass(frozen=True, slots=True)
class _Cost:
    depth: int = 0
    aliases: int = 0
    fields: int = 0


def check_limits(document: DocumentNode, limits: Limits) -> list[GraphQLError]:
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    measured: dict[str, _Cost] = {}
    visiting: set[str] = set()

    def selection_set(node: SelectionSetNode | None) -> _Cost:
        depth = aliases = fields = 0
        for selection in node.selections if node else ():
            if isinstance(selection, FieldNode):
                inner = selection_set(selection.selection_set)
                depth = max(depth, 1 + inner.depth)
                aliases += inner.aliases + (1 if selection.alias else 0)
                fields += inner.fields + 1
            else:
                inner = (
                    fragment(selection.name.value)
                    if isinstance(selection, FragmentSpreadNode)
                    else selection_set(selection.selection_set)
                    if isinstance(selection, InlineFragmentNode)
                    else _Cost()
                )
                depth = max(depth, inner.depth)
                aliases += inner.aliases
                fields += inner.fields
        return _Cost(depth, aliases, fields)

    def fragment(name: str) -> _Cost:
        if name in measured:
            return measured[name]
        definition = fragments.get(name)
        if definition is None or name in visiting:
            return _Cost()
        visiting.add(name)
        cost = measured[name] = selection_set(definition.selection_set)
        visiting.discard(name)
        return cost

    errors: list[GraphQLError] = []
    for definition in document.definitions:
        if not isinstance(definition, OperationDefinitionNode):
            continue
        cost = selection_set(definition.selection_set)
        name = f"operation {definition.name.value!r}" if definition.name else "the operation"
        if cost.depth > limits.max_depth:
            errors.append(
                GraphQLError(f"{name} is nested {cost.depth} fields deep; the limit is {limits.max_depth}", definition)
            )
        if cost.aliases > limits.max_aliases:
            errors.append(
                GraphQLError(f"{name} has {cost.aliases} aliased fields; the limit is {limits.max_aliases}", definition)
            )
        if cost.fields > limits.max_fields:
            errors.append(
                GraphQLError(
                    f"{name} selects {cost.fields} fields (fragments expanded); the limit is {limits.max_fields}",
                    definition,
                )
            )
    return errors


# The root fields that answer a page of results, and what their cost depends on (app.graphql.resolvers)
PAGED_FIELDS = frozenset(
    {
        "searchAcrossEntities",
        "scrollAcrossEntities",
        "searchAcrossLineage",
        "scrollAcrossLineage",
        "aggregateAcrossEntities",
    }
)
RESULTS_FIELD, FACETS_FIELD, AGGREGATIONS_FIELD = "searchResults", "facets", "aggregations"
# Facets: one aggregation over every match of the search, weighed as reading this many results, answering
# `_entityType` and the searched types' filter fields that have values (about this many), each with up to
# `searchFlags.maxAggValues` values.
FACET_AGGREGATION_COST = 1_000
FACET_FIELDS = 12

# Per selection set: the child fields resolved more than once per parent, as (name, times, fixed cost, their scope)
Scope = tuple[tuple[str, int, int, "Scope"], ...]


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _page_scope(field: FieldNode, variables: dict[str, Any], max_count: int) -> Scope:
    """What a paged field's page resolves: its `searchResults` once per result, its facets unless skipped."""
    given = next(
        (value_from_ast_untyped(a.value, variables) for a in field.arguments or () if a.name.value == "input"), None
    )
    inputs: dict[Any, Any] = given if isinstance(given, dict) else {}
    count, start = _int(inputs.get("count"), DEFAULT_COUNT), max(_int(inputs.get("start"), 0), 0)
    page = max(0, min(count, max_count - start))
    given_flags = inputs.get("searchFlags")
    flags: dict[Any, Any] = given_flags if isinstance(given_flags, dict) else {}
    if flags.get("skipAggregates") is True:
        return (RESULTS_FIELD, page, 0, ()), (FACETS_FIELD, 0, 0, ())
    values = min(max(_int(flags.get("maxAggValues"), DEFAULT_AGG_VALUES) or DEFAULT_AGG_VALUES, 1), MAX_AGG_VALUES)
    return (RESULTS_FIELD, page, 0, ()), (
        FACETS_FIELD,
        FACET_FIELDS,
        FACET_AGGREGATION_COST,
        ((AGGREGATIONS_FIELD, values, 0, ()),),
    )


def query_cost(
    document: DocumentNode, operation_name: str | None, variables: Mapping[str, Any] | None, max_count: int
) -> tuple[int, OperationDefinitionNode] | None:
    """The cost of the operation the request runs (`operation_name`, with `variables` and the operation's defaults),
    and that operation; None when no single operation runs (graphql-core answers that). `max_count`: the page size
    searches are cut to."""
    chosen = [
        d
        for d in document.definitions
        if isinstance(d, OperationDefinitionNode)
        and (operation_name is None or (d.name is not None and d.name.value == operation_name))
    ]
    if len(chosen) != 1:
        return None
    operation = chosen[0]
    values: dict[str, Any] = {}
    for definition in operation.variable_definitions or ():
        name = definition.variable.name.value
        if variables is not None and name in variables:
            values[name] = variables[name]
        elif definition.default_value is not None:
            values[name] = value_from_ast_untyped(definition.default_value)
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    measured: dict[tuple[str, Scope], int] = {}
    visiting: set[str] = set()

    def selection_set(node: SelectionSetNode | None, scope: Scope) -> int:
        cost = 0
        for selection in node.selections if node else ():
            if isinstance(selection, FieldNode):
                name = selection.name.value
                times, fixed, inner = next(((t, f, s) for n, t, f, s in scope if n == name), (1, 0, ()))
                if name in PAGED_FIELDS:
                    inner = _page_scope(selection, values, max_count)
                if times:
                    cost += fixed + times * (1 + selection_set(selection.selection_set, inner))
            elif isinstance(selection, FragmentSpreadNode):
                cost += fragment(selection.name.value, scope)
            elif isinstance(selection, InlineFragmentNode):
                cost += selection_set(selection.selection_set, scope)
        return cost

    def fragment(name: str, scope: Scope) -> int:
        key = (name, scope)
        if key in measured:
            return measured[key]
        definition = fragments.get(name)
        if definition is None or name in visiting:
            return 0
        visiting.add(name)
        cost = measured[key] = selection_set(definition.selection_set, scope)
        visiting.discard(name)
        return cost

    return selection_set(operation.selection_set, ()), operation


# --- the arguments of a root field ------------------------------------------------------------------------------

# Where a search input names a document field: a filter's and a sort criterion's `field` (FacetFilterInput,
# SortCriterion), and each of an aggregation's `facets` (one field, or two joined by DataHub's nested-facet
# separator, e.g. `_entityType␞typeNames`).
FIELD_KEYS = frozenset({"field"})
FACET_KEYS = frozenset({"facets"})
FACET_NAME = re.compile(rf"{FIELD_NAME.pattern}(?:\u241e{FIELD_NAME.pattern})?")


def _refuse(message: str, path: str, value: str, expected: str) -> ValidationFailed:
    found = clip(value.replace("\x00", "\\u0000"), 100)
    return ValidationFailed(f"{path}: {message}", [Issue(message, path=path, expected=expected, found=found)])


def _check(value: Any, path: str, key: str) -> None:
    if isinstance(value, str):
        if "\x00" in value:
            raise _refuse(
                "a NUL character (\\u0000): Postgres text and the search backends cannot hold one",
                path,
                value,
                "text without \\u0000",
            )
        if key in FIELD_KEYS and not FIELD_NAME.fullmatch(value):
            raise _refuse(f"not a field name ({len(value)} characters)", path, value, FIELD_NAME.pattern)
        if key in FACET_KEYS and value and not FACET_NAME.fullmatch(value):
            raise _refuse(f"not a facet name ({len(value)} characters)", path, value, FACET_NAME.pattern)
    elif isinstance(value, Mapping):
        for name, item in value.items():
            _check(item, f"{path}.{name}", name)
    elif isinstance(value, list | tuple):
        for position, item in enumerate(value):
            _check(item, f"{path}[{position}]", key)  # a list's items are what its key names (`facets`)


def check_arguments(arguments: Mapping[str, Any]) -> None:
    """The one check of what a root field's arguments carry (as graphql-core coerced them, literals and variables
    alike), before its resolver runs: a 400 (ValidationFailed) naming the argument's place (`$input.facets[0]`) and
    the reason when a string holds a NUL character (Postgres text and the search backends cannot hold one), or a
    string naming a search field (FIELD_KEYS, FACET_KEYS) is not a field name (at most 200 characters of
    `FIELD_NAME`)."""
    for name, value in arguments.items():
        _check(value, f"${name}", name)


# --- the answer's bytes -------------------------------------------------------------------------------------------

LEAF_BYTES = 8  # what a leaf value costs besides a string's characters: its name, quotes and separators, a number


class AnswerTooLarge(Exception):
    """Raised where a value would take the answer past its budget (and answered by app.graphql.service)."""


class AnswerBudget:
    """The bytes one answer may take: the JSON text of the aspects read for it (`spend`, as each chunk is read) and
    its leaf values as they are produced (`charge`: a string's length, its characters, escaping comes on top in the
    JSON text, and LEAF_BYTES for every leaf). Once past `limit`, everything further is refused (`exceeded`, and
    AnswerTooLarge where it was asked for); `path` says where the request crossed it."""

    __slots__ = ("limit", "path", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.path: str | None = None

    @property
    def exceeded(self) -> bool:
        return self.used > self.limit

    def spend(self, size: int) -> None:
        """`size` more bytes (AnswerTooLarge when that is past the limit)."""
        self.used += size
        if self.used > self.limit:
            raise AnswerTooLarge

    def charge(self, value: Any) -> None:
        """A leaf value of the answer."""
        self.spend(LEAF_BYTES + len(value) if isinstance(value, str) else LEAF_BYTES)
