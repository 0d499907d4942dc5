"""Execution limits on a GraphQL document, checked after parsing and before graphql-core's own validation, on the
operation the request runs (the one `operationName` names, or the only one; every operation when neither picks one,
and graphql-core then refuses the request):

* depth: the deepest field nesting of the operation, fragments expanded (introspection included);
* aliases: aliased fields, counted as executed (a fragment spread k times counts k times);
* fields: selected fields as executed (the query's complexity: every one is a resolver call per parent).

Measured as the operation executes, for the object type that costs most wherever a value may be of several
(`_Walker`): a field of an interface or union type (`entity`, a search result's `entity`) resolves to one object
type, so what an inline fragment or a fragment spread selects counts only for the object types its type condition
applies to, and such a field costs what its dearest possible type selects, not the sum of every fragment. DataHub's
own clients select each entity type's fields in a fragment of its own (mcp-server-datahub's `GetEntity`: 7,585
fields summed over 20-odd types, 992 for a Dataset, the dearest, in DataHub's schema). A type condition the schema
does not know counts as applying to every type, a field it does not know as of any type (validation refuses such a
document anyway). Each selection set is measured once (memoized, with what it costs per object type), so a document
that multiplies fragments costs the check linear time; a fragment cycle counts as nothing here and is reported by
validation (NoFragmentCyclesRule).

What validation costs is bounded by the document's text (METALEDGER_GRAPHQL_MAX_QUERY_CHARS, _MAX_TOKENS), not by
these limits: graphql-core visits every operation and fragment as written, and meters the comparisons of its
OverlappingFieldsCanBeMergedRule, the one rule whose work grows faster (MAX_COMPLEXITY_BUDGET: past it the
document is refused, "Validation aborted.").

The shape does not say what a document costs to run: 50 aliased searches of 10,000 results each are within every
shape limit. `query_cost` does, per request (it needs the variables): every field resolved costs 1 each time it is
resolved, so what a search's `searchResults` select is paid once per result of its page (the input's `count`, cut
as the resolvers cut it), and `facets` cost an aggregation over every match (FACET_AGGREGATION_COST) plus what each
of their values selects. The pages below the root (`relationships`, `lineage`, `assertions`, `relatedDocuments`,
`listQueries`, …: app.graphql.paging) are paid the same way, per result of the page asked for, and `entities(urns:)`
per URN. Fields of the other lists (tags, owners, schema fields) count once: they are read with their entity's
aspects. Inline fragments are counted as the shape is: for the dearest object type a value may be.

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
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLField,
    GraphQLNamedType,
    GraphQLSchema,
    InlineFragmentNode,
    OperationDefinitionNode,
    SchemaMetaFieldDef,
    SelectionSetNode,
    TypeMetaFieldDef,
    get_named_type,
    is_abstract_type,
    is_object_type,
    value_from_ast_untyped,
)

from app.errors import Issue, ValidationFailed
from app.graphql.paging import PAGED_LISTS, PagedList
from app.graphql.resolvers import DEFAULT_AGG_VALUES, DEFAULT_COUNT, MAX_AGG_VALUES
from app.limits import clip
from app.search.filters import FIELD_NAME


@dataclass(frozen=True, slots=True)
class Limits:
    max_depth: int
    max_aliases: int
    max_fields: int


@dataclass(frozen=True, slots=True)
class Shape:
    """An operation's shape as executed: its depth, aliased fields and fields."""

    depth: int = 0
    aliases: int = 0
    fields: int = 0

    def __add__(self, other: Shape) -> Shape:
        """Two selections run together: the deeper one's depth, the sum of their aliases and fields."""
        return Shape(max(self.depth, other.depth), self.aliases + other.aliases, self.fields + other.fields)

    def dearest(self, other: Shape) -> Shape:
        """Of two selections of which one runs: the most of each measure."""
        return Shape(max(self.depth, other.depth), max(self.aliases, other.aliases), max(self.fields, other.fields))


V = TypeVar("V", int, Shape)


@dataclass(slots=True)
class _Profile(Generic[V]):
    """What a selection set costs by the object type it runs for: `base` whatever the type, plus `extra[name]` for
    the object type of that name (what the inline fragments and fragment spreads whose type conditions apply to
    it select)."""

    base: V
    extra: dict[str, V] = field(default_factory=dict)


class _Walker(Generic[V]):
    """Measures selection sets as they execute (`selection`): a field of an object type runs every selection whose
    type condition applies to that type; a field of an interface or union type runs for one of its possible object
    types, so it costs what the dearest of them runs. Each selection set is measured once per context (`profiles`),
    as a _Profile, whose merging costs at most the schema's number of object types. Without a schema every type
    condition applies (the sum of every fragment, an upper bound); one the schema does not know applies to every
    type, and a field it does not know may be of any type.

    Subclasses say what a field costs (`field`, given its parent type and the context its selection runs in:
    nothing for the shape, the paged fields in scope for the cost), how two selections running together add up
    (`+`), and which of two that may run is dearer (`dearest`)."""

    def __init__(self, document: DocumentNode, schema: GraphQLSchema | None, zero: V) -> None:
        self.schema = schema
        self.zero: V = zero
        self.fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
        self.profiles: dict[tuple[int, Hashable], _Profile[V]] = {}
        self.possible: dict[str, Sequence[str]] = {}
        self.visiting: set[str] = set()

    def field(self, node: FieldNode, parent: GraphQLNamedType | None, context: Any) -> V:
        raise NotImplementedError

    def dearest(self, one: V, other: V) -> V:
        raise NotImplementedError

    def operation(self, operation: OperationDefinitionNode, context: Hashable) -> V:
        root = self.schema.get_root_type(operation.operation) if self.schema is not None else None
        return self.selection(operation.selection_set, root, context)

    def selection(self, node: SelectionSetNode | None, type_: GraphQLNamedType | None, context: Hashable) -> V:
        """What `node` costs where it runs for a value of `type_`: for the dearest object type that value may be
        (of any type the profile names when `type_` is not known)."""
        if node is None:
            return self.zero
        profile = self.profile(node, type_, context)
        if not profile.extra:
            return profile.base
        types = self.object_types(type_)
        extras: Iterable[V] = (
            profile.extra.values() if types is None else (profile.extra[t] for t in types if t in profile.extra)
        )
        dearest = self.zero
        for extra in extras:
            dearest = self.dearest(dearest, extra)
        return profile.base + dearest

    def field_type(self, parent: GraphQLNamedType | None, node: FieldNode) -> GraphQLNamedType | None:
        """The named type of the field `node` selects on `parent`; None when the schema does not know it."""
        if parent is None or self.schema is None:
            return None
        name = node.name.value
        definition: GraphQLField | None
        if parent is self.schema.query_type and name in ("__schema", "__type"):
            definition = SchemaMetaFieldDef if name == "__schema" else TypeMetaFieldDef
        else:
            definition = getattr(parent, "fields", {}).get(name)  # object and interface types have fields
        return get_named_type(definition.type) if definition is not None else None

    def object_types(self, type_: GraphQLNamedType | None) -> Sequence[str] | None:
        """The names of the object types a value of `type_` may be; None when not known (no schema, a type it does
        not know, a type that is not composite)."""
        if self.schema is None or type_ is None:
            return None
        if is_object_type(type_):
            return (type_.name,)
        if not is_abstract_type(type_):
            return None
        known = self.possible.get(type_.name)
        if known is None:
            known = self.possible[type_.name] = tuple(t.name for t in self.schema.get_possible_types(type_))
        return known

    def named(self, name: str) -> GraphQLNamedType | None:
        return self.schema.type_map.get(name) if self.schema is not None else None

    def profile(self, node: SelectionSetNode, scope: GraphQLNamedType | None, context: Hashable) -> _Profile[V]:
        """The profile of `node`, whose fields are `scope`'s."""
        key = (id(node), context)
        known = self.profiles.get(key)
        if known is not None:
            return known
        profile = _Profile(self.zero)
        for selection in node.selections:
            if isinstance(selection, FieldNode):
                profile.base = profile.base + self.field(selection, scope, context)
            elif isinstance(selection, InlineFragmentNode):
                condition = selection.type_condition.name.value if selection.type_condition else None
                inner_scope = self.named(condition) if condition is not None else scope
                self.merge(profile, self.profile(selection.selection_set, inner_scope, context), condition)
            elif isinstance(selection, FragmentSpreadNode):
                name = selection.name.value
                definition = self.fragments.get(name)
                if definition is None or name in self.visiting:
                    continue  # unknown or cyclic: validation says so
                self.visiting.add(name)
                condition = definition.type_condition.name.value
                inner = self.profile(definition.selection_set, self.named(condition), context)
                self.visiting.discard(name)
                self.merge(profile, inner, condition)
        self.profiles[key] = profile
        return profile

    def merge(self, into: _Profile[V], inner: _Profile[V], condition: str | None) -> None:
        """A fragment's profile (`inner`, whose type condition is `condition`) into the profile it is selected in."""
        types = self.object_types(self.named(condition)) if condition is not None else None
        if types is None:  # no type condition, or one not known here: it runs whatever the type
            into.base = into.base + inner.base
            for name, extra in inner.extra.items():
                into.extra[name] = into.extra.get(name, self.zero) + extra
            return
        for name in types:
            into.extra[name] = into.extra.get(name, self.zero) + inner.base + inner.extra.get(name, self.zero)


_LEAF, _ALIASED_LEAF = Shape(1, 0, 1), Shape(1, 1, 1)


class _ShapeWalker(_Walker[Shape]):
    def __init__(self, document: DocumentNode, schema: GraphQLSchema | None) -> None:
        super().__init__(document, schema, Shape())

    def field(self, node: FieldNode, parent: GraphQLNamedType | None, context: Any) -> Shape:
        if node.selection_set is None:
            return _ALIASED_LEAF if node.alias else _LEAF
        inner = self.selection(node.selection_set, self.field_type(parent, node), None)
        return Shape(1 + inner.depth, inner.aliases + (1 if node.alias else 0), inner.fields + 1)

    def dearest(self, one: Shape, other: Shape) -> Shape:
        return one.dearest(other)


def _run(document: DocumentNode, operation_name: str | None) -> list[OperationDefinitionNode]:
    """The operation a request runs: the one named `operation_name`, or the document's only one; none (an empty
    list) when no single one is picked (graphql-core refuses such a request)."""
    chosen = [
        d
        for d in document.definitions
        if isinstance(d, OperationDefinitionNode)
        and (operation_name is None or (d.name is not None and d.name.value == operation_name))
    ]
    return chosen if len(chosen) == 1 else []


def measure(
    document: DocumentNode, schema: GraphQLSchema | None = None, operation_name: str | None = None
) -> dict[OperationDefinitionNode, Shape]:
    """The shape of the operation the request runs (`operation_name`, or the only one), as executed in `schema`
    (every type condition applying without one); of every operation when no single one is picked."""
    walker = _ShapeWalker(document, schema)
    operations = _run(document, operation_name) or [
        d for d in document.definitions if isinstance(d, OperationDefinitionNode)
    ]
    return {operation: walker.operation(operation, None) for operation in operations}


def check_limits(
    document: DocumentNode, limits: Limits, schema: GraphQLSchema | None = None, operation_name: str | None = None
) -> list[GraphQLError]:
    """The limits the operation the request runs is over (see `measure`), as errors naming it."""
    errors: list[GraphQLError] = []
    for definition, shape in measure(document, schema, operation_name).items():
        name = f"operation {definition.name.value!r}" if definition.name else "the operation"
        if shape.depth > limits.max_depth:
            errors.append(
                GraphQLError(f"{name} is nested {shape.depth} fields deep; the limit is {limits.max_depth}", definition)
            )
        if shape.aliases > limits.max_aliases:
            errors.append(
                GraphQLError(
                    f"{name} has {shape.aliases} aliased fields; the limit is {limits.max_aliases}", definition
                )
            )
        if shape.fields > limits.max_fields:
            errors.append(
                GraphQLError(
                    f"{name} selects {shape.fields} fields (fragments expanded, for the dearest type where a value "
                    f"may be of several); the limit is {limits.max_fields}",
                    definition,
                )
            )
    return errors


# The root fields that answer a page of results, and what their cost depends on (app.graphql.resolvers; DataHub's
# semanticSearchAcrossEntities, which metaledger does not serve, pages as searchAcrossEntities does)
PAGED_FIELDS = frozenset(
    {
        "searchAcrossEntities",
        "semanticSearchAcrossEntities",
        "scrollAcrossEntities",
        "searchAcrossLineage",
        "scrollAcrossLineage",
        "aggregateAcrossEntities",
    }
)
RESULTS_FIELD, FACETS_FIELD, AGGREGATIONS_FIELD = "searchResults", "facets", "aggregations"
URNS_ARGUMENT = "urns"  # of `entities(urns:)`
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


def _list_scope(field: FieldNode, paged: PagedList, variables: dict[str, Any], max_count: int) -> Scope:
    """What a paged list below the root (app.graphql.paging) resolves: its results once per result of the page."""
    given = {a.name.value: value_from_ast_untyped(a.value, variables) for a in field.arguments or ()}
    holder = given.get("input") if paged.in_input else given
    inputs: dict[Any, Any] = holder if isinstance(holder, dict) else {}
    page = max(0, min(_int(inputs.get("count"), paged.default_count), max_count))
    return ((paged.results, page, 0, ()),)


class _CostWalker(_Walker[int]):
    """Each field once per time it is resolved: the paged fields in scope (the context) say how many times."""

    def __init__(
        self, document: DocumentNode, schema: GraphQLSchema | None, variables: dict[str, Any], max_count: int
    ) -> None:
        super().__init__(document, schema, 0)
        self.variables = variables
        self.max_count = max_count

    def field(self, node: FieldNode, parent: GraphQLNamedType | None, context: Any) -> int:
        scope: Scope = context
        name = node.name.value
        times, fixed, inner = (
            next(((t, f, s) for n, t, f, s in scope if n == name), (1, 0, ())) if scope else (1, 0, ())
        )
        if name in PAGED_FIELDS:
            inner = _page_scope(node, self.variables, self.max_count)
        elif name in PAGED_LISTS:
            inner = _list_scope(node, PAGED_LISTS[name], self.variables, self.max_count)
        urns = self._argument(node, URNS_ARGUMENT)
        if isinstance(urns, list):  # `entities(urns:)`: one entity read and answered per URN
            times *= len(urns)
        if not times:
            return 0
        if node.selection_set is None:
            return fixed + times
        return fixed + times * (1 + self.selection(node.selection_set, self.field_type(parent, node), inner))

    def dearest(self, one: int, other: int) -> int:
        return max(one, other)

    def _argument(self, node: FieldNode, name: str) -> Any:
        return next(
            (value_from_ast_untyped(a.value, self.variables) for a in node.arguments or () if a.name.value == name),
            None,
        )


def _sized_by_arguments(field: FieldNode) -> bool:
    """Whether what `field` costs depends on its arguments: a page's size, a list of URNs."""
    name = field.name.value
    return (
        name in PAGED_FIELDS or name in PAGED_LISTS or any(a.name.value == URNS_ARGUMENT for a in field.arguments or ())
    )


def _size_of(field: FieldNode, variables: dict[str, Any], max_count: int) -> Hashable:
    """What the arguments make of a field's cost (_sized_by_arguments), as a key part of the cost's cache."""
    name = field.name.value
    urns = next((a for a in field.arguments or () if a.name.value == URNS_ARGUMENT), None)
    return (
        _page_scope(field, variables, max_count) if name in PAGED_FIELDS else (),
        _list_scope(field, PAGED_LISTS[name], variables, max_count) if name in PAGED_LISTS else (),
        len(found)
        if urns is not None and isinstance(found := value_from_ast_untyped(urns.value, variables), list)
        else 0,
    )


def _paged_fields(document: DocumentNode, operation: OperationDefinitionNode) -> list[FieldNode]:
    """The fields `operation` selects whose cost depends on their arguments (_sized_by_arguments), fragments expanded, each once: what its variables can
    change of its cost."""
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    found: dict[int, FieldNode] = {}
    spread: set[str] = set()
    pending: list[SelectionSetNode | None] = [operation.selection_set]
    while pending:
        node = pending.pop()
        for selection in node.selections if node else ():
            if isinstance(selection, FieldNode):
                if _sized_by_arguments(selection):
                    found[id(selection)] = selection
                pending.append(selection.selection_set)
            elif isinstance(selection, InlineFragmentNode):
                pending.append(selection.selection_set)
            elif isinstance(selection, FragmentSpreadNode) and selection.name.value not in spread:
                spread.add(selection.name.value)
                definition = fragments.get(selection.name.value)
                pending.append(definition.selection_set if definition else None)
    return list(found.values())


# An operation's paged fields, kept with it (by its identity; an entry holds it, so that its id stays its own): they
# depend on its document alone, which clients send again and again, and walking a large one on every request (DataHub's
# getDataset: some 1,000 selections, fragments expanded) was ~5 % of the request's CPU.
_PAGED: OrderedDict[int, tuple[OperationDefinitionNode, list[FieldNode]]] = OrderedDict()


def _paged_fields_kept(document: DocumentNode, operation: OperationDefinitionNode) -> list[FieldNode]:
    kept = _PAGED.get(id(operation))
    if kept is not None and kept[0] is operation:
        _PAGED.move_to_end(id(operation))
        return kept[1]
    fields = _paged_fields(document, operation)
    _PAGED[id(operation)] = (operation, fields)
    if len(_PAGED) > COSTS_KEPT:
        _PAGED.popitem(last=False)
    return fields


# Costs computed, by document, schema, operation and what the variables made of its paged fields' pages: clients
# send the same few documents again and again (app.graphql.service.ValidatedDocuments keeps them), and measuring a
# large one as executed costs more than finding its pages (mcp-server-datahub's GetEntity: 6 ms against 0.3 ms).
# An entry holds its document and schema, so that their ids in its key stay theirs.
COSTS_KEPT = 256
_COSTS: OrderedDict[tuple[int, int, int, tuple[Hashable, ...]], tuple[DocumentNode, GraphQLSchema | None, int]] = (
    OrderedDict()
)


def query_cost(
    document: DocumentNode,
    operation_name: str | None,
    variables: Mapping[str, Any] | None,
    max_count: int,
    schema: GraphQLSchema | None = None,
) -> tuple[int, OperationDefinitionNode] | None:
    """The cost of the operation the request runs (`operation_name`, with `variables` and the operation's defaults),
    and that operation; None when no single operation runs (graphql-core answers that). `max_count`: the page size
    searches are cut to. In `schema`, a fragment costs only for the object types its type condition applies to (the
    dearest where a value may be of several); without one, every fragment counts."""
    chosen = _run(document, operation_name)
    if not chosen:
        return None
    operation = chosen[0]
    values: dict[str, Any] = {}
    for definition in operation.variable_definitions or ():
        name = definition.variable.name.value
        if variables is not None and name in variables:
            values[name] = variables[name]
        elif definition.default_value is not None:
            values[name] = value_from_ast_untyped(definition.default_value)
    pages = tuple(_size_of(field, values, max_count) for field in _paged_fields_kept(document, operation))
    key = (id(document), id(schema), id(operation), pages)
    kept = _COSTS.get(key)
    if kept is not None and kept[0] is document and kept[1] is schema:
        _COSTS.move_to_end(key)
        return kept[2], operation
    empty: Scope = ()
    cost = _CostWalker(document, schema, values, max_count).operation(operation, empty)
    _COSTS[key] = (document, schema, cost)
    if len(_COSTS) > COSTS_KEPT:
        _COSTS.popitem(last=False)
    return cost, operation


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
