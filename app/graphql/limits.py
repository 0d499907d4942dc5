"""Execution limits on a GraphQL document, checked after parsing and before graphql-core's own validation (some of
whose rules, e.g. OverlappingFieldsCanBeMerged, cost more than linear time in the number of fields).

* depth: the deepest field nesting of an operation, fragments expanded (introspection included);
* aliases: aliased fields, counted as executed (a fragment spread k times counts k times);
* fields: selected fields as executed (the query's complexity: every one is a resolver call per parent).

Fragments are measured once each (memoized), so a document that multiplies fragments costs the check linear time;
a fragment cycle counts as nothing here and is reported by validation (NoFragmentCyclesRule).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
)


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
