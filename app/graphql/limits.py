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
"""

from __future__ import annotations

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

from app.graphql.resolvers import DEFAULT_AGG_VALUES, DEFAULT_COUNT, MAX_AGG_VALUES


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
                inner = (fragment(selection.name.value) if isinstance(selection, FragmentSpreadNode)
                         else selection_set(selection.selection_set) if isinstance(selection, InlineFragmentNode)
                         else _Cost())
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
            errors.append(GraphQLError(f"{name} is nested {cost.depth} fields deep; the limit is {limits.max_depth}",
                                       definition))
        if cost.aliases > limits.max_aliases:
            errors.append(GraphQLError(f"{name} has {cost.aliases} aliased fields; the limit is {limits.max_aliases}",
                                       definition))
        if cost.fields > limits.max_fields:
            errors.append(GraphQLError(f"{name} selects {cost.fields} fields (fragments expanded); the limit is "
                                       f"{limits.max_fields}", definition))
    return errors



# The root fields that answer a page of results, and what their cost depends on (app.graphql.resolvers)
PAGED_FIELDS = frozenset({"searchAcrossEntities", "scrollAcrossEntities", "searchAcrossLineage", "scrollAcrossLineage",
                          "aggregateAcrossEntities"})
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


def _page_scope(field: FieldNode, variables: Mapping[str, Any], max_count: int) -> Scope:
    """What a paged field's page resolves: its `searchResults` once per result, its facets unless skipped."""
    inputs = next((value_from_ast_untyped(a.value, variables) for a in field.arguments if a.name.value == "input"), None)
    inputs = inputs if isinstance(inputs, dict) else {}
    count, start = _int(inputs.get("count"), DEFAULT_COUNT), max(_int(inputs.get("start"), 0), 0)
    page = max(0, min(count, max_count - start))
    flags = inputs.get("searchFlags") if isinstance(inputs.get("searchFlags"), dict) else {}
    if flags.get("skipAggregates") is True:
        return (RESULTS_FIELD, page, 0, ()), (FACETS_FIELD, 0, 0, ())
    values = min(max(_int(flags.get("maxAggValues"), DEFAULT_AGG_VALUES) or DEFAULT_AGG_VALUES, 1), MAX_AGG_VALUES)
    return (RESULTS_FIELD, page, 0, ()), (FACETS_FIELD, FACET_FIELDS, FACET_AGGREGATION_COST,
                                          ((AGGREGATIONS_FIELD, values, 0, ()),))


def query_cost(document: DocumentNode, operation_name: str | None, variables: Mapping[str, Any] | None,
               max_count: int) -> tuple[int, OperationDefinitionNode] | None:
    """The cost of the operation the request runs (`operation_name`, with `variables` and the operation's defaults),
    and that operation; None when no single operation runs (graphql-core answers that). `max_count`: the page size
    searches are cut to."""
    chosen = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)
              and (operation_name is None or (d.name is not None and d.name.value == operation_name))]
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
