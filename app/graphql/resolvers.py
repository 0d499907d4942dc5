"""The root fields: searches (through app.search.across), entity lookups, and the tag mutations (through the ingest
gateway, with the caller's principal, as every other write)."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from weakref import WeakMethod

import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.model import Permission, Principal
from app.db import SessionOrConnection
from app.errors import Issue, NotFound, ValidationFailed
from app.graphql import lineage  # registers the lineage and assertions fields (lineage.graphql)
from app.graphql.curation import CURATION_MUTATIONS, CURATION_QUERIES
from app.graphql.entities import (
    ENTITY_TYPES,
    GRAPHQL_TYPE_OF_ENTITY,
    OTHER,
    SEARCHABLE_TYPES,
    EntityRef,
    entity_ref,
    readable,
    type_of_entity,
)
from app.graphql.loader import AspectLoader
from app.graphql.queries import resolve_list_queries
from app.graphql.views import VIEW_PATH, apply_view
from app.ingest.gateway import IngestGateway
from app.limits import clip
from app.registry import EntityRegistry
from app.search import query_syntax
from app.search.across import (
    LineageAsked,
    LineageHit,
    TypeSearch,
    facets_across,
    lineage_hops,
    scroll_across,
    scroll_lineage,
    search_across,
    search_lineage,
)
from app.search.cursors import InvalidCursor
from app.search.filters import Groups, InvalidFilter, Placed, both, criteria_groups, json_path, placed_or_filters
from app.search.model import (
    REMOVED_FIELD,
    TOMBSTONE_FIELD,
    URN_FIELD,
    VERSIONS_FIELD,
    Criterion,
    SearchBackend,
    SearchHit,
)
from app.search.structured_properties import (
    is_property_field,
    refuse_deleted_property_facets,
    refuse_deleted_property_filters,
)
from app.urns import InvalidUrnError, entity_type_of
from app.write.proposal import ChangeType, Draft
from app.write.reader import EntityReader

if TYPE_CHECKING:
    from app.graphql.limits import AnswerBudget
    from app.write.repository import StoredAspect

log = logging.getLogger("metaledger.graphql")

ENTITY_TYPE_FIELD = "_entityType"  # DataHub's virtual filter field: the entity type (its EntityType value)
TYPE_CONDITIONS = frozenset({"EQUAL", "IEQUAL"})  # what `_entityType` takes (IN is EQUAL)
OR_FILTERS_PATH = "$input.orFilters"
FACETS_PATH = "$input.facets"
SCROLL_ID_PATH = "$input.scrollId"
# Bounds on what variables carry past the query's own limits: the query text (filter values: app.search.filters).
MAX_QUERY_TEXT = 10_000
READ_CHUNK = 100  # entities whose aspects one query of the aspect store reads (DataHub's clients ask for pages of 100)


@dataclass
class Context:
    """Per request: the caller, the services, and the aspects read so far (batched, each read once)."""

    session: AsyncSession
    registry: EntityRegistry
    gateway: IngestGateway
    caller: Principal
    backend: Callable[[], Awaitable[SearchBackend]]  # the started search backend, or ServiceUnavailable
    max_count: int
    request_headers: Mapping[str, str]
    # A session for a query's reads (app.api.deps `ReadSession`: a read replica's); `session` (the primary's) serves
    # mutations, their reads included. None: `session` serves everything (the web view, the MCP tools).
    read_session: Callable[[], Awaitable[SessionOrConnection]] | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    loader: AspectLoader = field(init=False)
    # The entity types registered at run time that the request's schema has (app.graphql.service.served_schema):
    # entity name -> object type.
    runtime_types: Mapping[str, str] = field(default_factory=dict)
    # The bytes the answer may still take (set by app.graphql.service.run, counted by its executor).
    answer: AnswerBudget | None = None

    def __post_init__(self) -> None:
        # The loader reads through a weak reference to this context: a bound method would close a cycle (context →
        # loader → method → context) that kept every request's context and the aspects it read alive until a garbage
        # collection found them (a collection of 10-47 ms every forty `getDataset` queries).
        read = WeakMethod(self._read_latest)

        async def read_latest(wanted: Sequence[tuple[str, Sequence[str] | None]]) -> dict[str, dict[str, Any]]:
            method = read()
            assert method is not None  # the context outlives its loader's reads: they run inside its request
            return await method(wanted)

        self.loader = AspectLoader(read_latest, self._lock)

    async def _read_latest(self, wanted: Sequence[tuple[str, Sequence[str] | None]]) -> dict[str, dict[str, Any]]:
        """The rows as read (StoredAspect): an aspect's JSON text is parsed when a field asks for its value, and
        `aspects` answers the text itself. READ_CHUNK entities a query, the JSON text of each chunk's rows spent
        from the answer's budget (app.graphql.limits.AnswerBudget): a read that takes the request past it stops
        there (AnswerTooLarge), however many entities a page asked for."""
        reader = EntityReader(self.session, self.registry, self.caller)
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(wanted), READ_CHUNK):
            chunk = [
                (urn, None if aspects is None else list(aspects)) for urn, aspects in wanted[start : start + READ_CHUNK]
            ]
            rows = await reader.latest_of_many(chunk)
            found.update((urn, {row.aspect: row for row in urn_rows}) for urn, urn_rows in rows.items())
            if self.answer is not None:
                self.answer.spend(sum(len(row.metadata) for urn_rows in rows.values() for row in urn_rows))
        return found

    async def require_write_access(self) -> None:
        """Every mutation's gate: a writer, or a reader an access policy grants an edit (each write it makes is then
        decided by the ingest gateway's authorizer, per aspect and entity)."""
        if self.gateway.authorizer is None:
            self.caller.require(Permission.WRITE)
        else:
            await self.gateway.authorizer.require_write_access(self.caller)

    async def refuse_deleted_property_facets(self, facets: Sequence[str], base: str) -> None:
        """A 400 when a requested facet names a soft-deleted structured property, at its index below `base`."""
        async with self._lock:
            try:
                await refuse_deleted_property_facets(EntityReader(self.session, self.registry, self.caller), facets)
            except InvalidFilter as error:
                raise error.at(base) from None

    async def refuse_deleted_property_filters(self, placed: list[list[Placed]], base: str) -> None:
        """A 400 when the filter names a soft-deleted structured property (app.write.structured_properties): at the
        criterion's field below `base`, or at `base` for criteria without a place in the request (a view's)."""
        async with self._lock:
            try:
                await refuse_deleted_property_filters(
                    EntityReader(self.session, self.registry, self.caller), (p for group in placed for p in group)
                )
            except InvalidFilter as error:
                if error.loc[:-1]:
                    raise error.at(base) from None
                raise ValidationFailed(str(error), [Issue(str(error), path=base, found=error.found)]) from None

    def forget_aspects(self) -> None:
        """After a write: what this request read before may have changed."""
        self.loader.forget()

    async def aspect(self, urn: str, aspect: str) -> dict[str, Any] | None:
        """The latest value of one aspect of `urn` (None: absent)."""
        row = cast("StoredAspect | None", await self.loader.aspect(urn, aspect))
        return None if row is None else row.value

    async def aspect_json(self, urn: str, aspect: str) -> str | None:
        """The latest value of one aspect of `urn` as its stored JSON text, unparsed (None: absent)."""
        row = cast("StoredAspect | None", await self.loader.aspect(urn, aspect))
        return None if row is None else row.metadata

    async def aspects(self, urn: str) -> dict[str, Any]:
        """The latest value of each aspect of `urn` (empty: the entity does not exist)."""
        rows = cast("dict[str, StoredAspect]", await self.loader.entity(urn))
        return {name: row.value for name, row in rows.items()}

    async def exists(self, urn: str) -> bool:
        """Whether `urn` has any aspect (its values are read, not parsed)."""
        return bool(await self.loader.entity(urn))

    async def unreadable(self, urns: Sequence[str]) -> set[str]:
        """The entities among `urns` the caller may not see at all (the read rule, app.auth.reads): no query for an
        admin, nor for URNs of entity types the rule does not guard."""
        if not urns:
            return set()
        async with self._lock:
            return await EntityReader(self.session, self.registry, self.caller).unreadable(list(dict.fromkeys(urns)))

    async def aspect_version(self, ref: EntityRef, aspect: str, version: int) -> dict[str, Any] | None:
        """One version of an aspect (0: the latest), None when there is no such version."""
        if version == 0:
            return await self.aspect(ref.urn, aspect)
        async with self._lock:
            try:
                reader = EntityReader(self.session, self.registry, self.caller)
                row = await reader.aspect(ref.entity_name, ref.urn, aspect, version)
            except NotFound:
                return None
        if self.answer is not None:
            self.answer.spend(len(row.metadata))
        return row.value


# --- searches -----------------------------------------------------------------------------------------------------


def _entity_names(types: list[str] | None, context: Context) -> list[str]:
    """The registry entities of the EntityType values asked for (DataHub's searchable set when none); OTHER: the
    entity types registered at run time."""
    registry = context.registry
    names: list[str] = []
    for value in types or SEARCHABLE_TYPES:
        if value == OTHER and types:
            names.extend(name for name in context.runtime_types if name not in names)
            continue
        entity = ENTITY_TYPES.get(value, (None,))[0]
        if entity is None or entity not in registry.entities:
            if types:  # asked for by name: say it is not searchable here
                raise ValidationFailed(
                    f"entity type {value} is not searchable in this service",
                    [Issue("not searchable", path="$input.types", found=value)],
                )
            continue
        if entity not in names:
            names.append(entity)
    return names


def _matches_type(criterion: Criterion, entity: str) -> bool:
    hit = type_of_entity(entity) in criterion.values or entity.lower() in {v.lower() for v in criterion.values}
    return hit != criterion.negated


def _check_type_criterion(criterion: Criterion, path: str) -> None:
    """A `_entityType` criterion is resolved here, per type: EQUAL, IN or IEQUAL (type names match in any case).
    `path`: where its condition is."""
    if criterion.field == ENTITY_TYPE_FIELD and criterion.condition not in TYPE_CONDITIONS:
        raise ValidationFailed(
            f"filter condition {criterion.condition} on field {ENTITY_TYPE_FIELD!r} is not supported "
            "(EQUAL, IN and IEQUAL are)",
            [Issue("unsupported condition", path=path, expected="EQUAL, IN or IEQUAL", found=criterion.condition)],
        )


def _or_filters(inputs: dict[str, Any]) -> list[list[Placed]]:
    """The search's orFilters (the deprecated AND-only `filters` joined to each of their groups), placed."""
    or_filters = list(inputs.get("orFilters") or ())
    if inputs.get("filters"):
        or_filters = [{"and": [*(g.get("and") or ()), *inputs["filters"]]} for g in or_filters or [{"and": []}]]
    try:
        placed = placed_or_filters(or_filters)
    except InvalidFilter as error:
        raise error.at(OR_FILTERS_PATH) from None
    for group in placed:
        for criterion in group:
            _check_type_criterion(criterion.criterion, json_path(OR_FILTERS_PATH, (*criterion.loc, "condition")))
    return placed


def type_searches(entity_names: list[str], groups: Groups, include_soft_deleted: bool) -> list[TypeSearch]:
    """The search's OR of AND groups per entity type: `_entityType` criteria decide which groups apply to which type
    (a type no group applies to is not searched); the other criteria go to the backend."""
    if not groups:
        return [TypeSearch(entity, None, include_soft_deleted) for entity in entity_names]
    split = [
        ([c for c in group if c.field == ENTITY_TYPE_FIELD], tuple(c for c in group if c.field != ENTITY_TYPE_FIELD))
        for group in groups
    ]
    searches = []
    for entity in entity_names:
        applying = tuple(
            criteria for type_criteria, criteria in split if all(_matches_type(c, entity) for c in type_criteria)
        )
        if applying:
            searches.append(TypeSearch(entity, applying, include_soft_deleted))
    return searches


def _sort(sort_input: dict[str, Any] | None) -> list[tuple[str, str]] | None:
    if not sort_input:
        return None
    criteria = list(sort_input.get("sortCriteria") or ())
    if sort_input.get("sortCriterion"):
        criteria.insert(0, sort_input["sortCriterion"])
    # each field is a field name, checked with the other arguments (app.graphql.limits.check_arguments)
    sort = [(c["field"], "desc" if c["sortOrder"] == "DESCENDING" else "asc") for c in criteria]
    return sort or None


def _query(text: str | None) -> str:
    """The query text a search runs; a structured one (DataHub's `/q ` prefix, app.search.query_syntax) must
    parse, or it is a 400 naming `$input.query`."""
    if text and len(text) > MAX_QUERY_TEXT:
        raise ValidationFailed(
            f"the query text is {len(text)} characters; the limit is {MAX_QUERY_TEXT}",
            [Issue("too long", path="$input.query", found=clip(text, 100))],
        )
    query_syntax.check(text, "$input.query")
    return (text or "*").strip() or "*"


DEFAULT_COUNT = 10  # a search's page size when its input has no `count` (DataHub's)


def _count(value: int | None, default: int, maximum: int) -> int:
    if value is None:
        return default
    if value < 0:
        raise ValidationFailed("count must not be negative", [Issue("negative", path="$input.count", found=str(value))])
    return min(value, maximum)  # as DataHub: a count over the limit is cut to it


MAX_MATCHED_FIELDS = 10
INTERNAL_FIELDS = {URN_FIELD, REMOVED_FIELD, VERSIONS_FIELD, TOMBSTONE_FIELD}
_QUERY_TERMS = re.compile(r"[^\W_]+")


def _terms(query: str, flags: dict[str, Any]) -> list[str]:
    """The words of a text query that highlighting looks for (none for `*` or when highlighting is skipped)."""
    text = query_syntax.plain_text(query)
    if flags.get("skipHighlighting") or text == "*":
        return []
    return [t for t in _QUERY_TERMS.findall(text.lower()) if t not in {"and", "or", "not"}]


def _matched_fields(hit: SearchHit, terms: list[str]) -> list[dict[str, str]]:
    """DataHub's matchedFields: the document fields (text values, or text elements of lists) holding a word of the
    query, case-insensitively, each value once."""
    matched: list[dict[str, str]] = []
    for name, value in hit.fields.items():
        if name in INTERNAL_FIELDS:
            continue
        for text in value if isinstance(value, list) else (value,):
            if isinstance(text, str) and any(term in text.lower() for term in terms):
                matched.append({"name": name, "value": clip(text, 500)})
                if len(matched) == MAX_MATCHED_FIELDS:
                    return matched
    return matched


def _result(hit: SearchHit, flags: dict[str, Any], terms: list[str]) -> dict[str, Any]:
    extra = [
        {"name": name, "value": orjson.dumps(hit.fields[name]).decode()}
        for name in flags.get("fetchExtraFields") or ()
        if name in hit.fields
    ]
    return {
        "entity": EntityRef(hit.urn, hit.entity_type),
        "extraProperties": extra,
        "matchedFields": (lambda _info: _matched_fields(hit, terms)) if terms else [],
    }


# DataHub's display names of the facets its UI and CLI show; any other facet is shown by its field name
FACET_DISPLAY_NAMES = {
    ENTITY_TYPE_FIELD: "Type",
    "platform": "Platform",
    "origin": "Environment",
    "tags": "Tag",
    "glossaryTerms": "Glossary Term",
    "owners": "Owned By",
    "domains": "Domain",
    "container": "Container",
    "typeNames": "Sub Type",
    "fieldTags": "Column Tag",
}
DEFAULT_AGG_VALUES = 20  # values per facet when searchFlags.maxAggValues is not given (DataHub's default)
MAX_AGG_VALUES = 1_000


def _facets(
    context: Context, searches: list[TypeSearch], query: str, flags: dict[str, Any], wanted: Sequence[str] = ()
):
    """The `facets` of a search result, computed only when the query selects them (graphql-core calls a callable
    field value): `_entityType` first, then each filter field, the most frequent values first; only the `wanted`
    ones when any is named (structured properties' among them: `structuredProperties.<qualified name>`)."""

    async def resolve(_info: Any) -> list[dict[str, Any]]:
        if flags.get("skipAggregates"):
            return []
        limit = min(max(flags.get("maxAggValues") or DEFAULT_AGG_VALUES, 1), MAX_AGG_VALUES)
        found = await facets_across(
            await context.backend(), searches, query, [name for name in wanted if is_property_field(name)]
        )
        types = [(type_of_entity(entity), entity, n) for entity, n in found.totals.items() if n]
        facets = [
            {
                "field": ENTITY_TYPE_FIELD,
                "displayName": FACET_DISPLAY_NAMES[ENTITY_TYPE_FIELD],
                "aggregations": [
                    {"value": value, "count": n, "displayName": entity, "entity": None}
                    for value, entity, n in sorted(types, key=lambda t: (-t[2], t[0]))[:limit]
                ],
            }
        ]
        if wanted:
            facets = [f for f in facets if f["field"] in wanted]
        for name, counts in sorted(found.values.items()):
            if wanted and name not in wanted:
                continue
            top = sorted(((v, n) for v, n in counts.items() if n), key=lambda vn: (-vn[1], vn[0]))[:limit]
            if not top:  # a field no match has a value in
                continue
            facets.append(
                {
                    "field": name,
                    "displayName": FACET_DISPLAY_NAMES.get(name, name),
                    "aggregations": [
                        {"value": value, "count": n, "displayName": None, "entity": entity_ref(value)}
                        for value, n in top
                    ],
                }
            )
        return facets

    return resolve


def _results(
    context: Context,
    searches: list[TypeSearch],
    query: str,
    inputs: dict[str, Any],
    hits: list[SearchHit],
) -> dict[str, Any]:
    """What both entity searches answer about their hits: the results and the (lazily computed) facets."""
    flags = inputs.get("searchFlags") or {}
    terms = _terms(query, flags)
    return {
        "searchResults": [_result(hit, flags, terms) for hit in hits],
        "facets": _facets(context, searches, query, flags),
    }


async def _searches_of(context: Context, inputs: dict[str, Any]) -> list[TypeSearch]:
    flags = inputs.get("searchFlags") or {}
    placed = _or_filters(inputs)
    await context.refuse_deleted_property_filters(placed, OR_FILTERS_PATH)
    groups = criteria_groups(placed)
    entity_names = _entity_names(inputs.get("types"), context)
    if inputs.get("viewUrn"):
        entity_names, view_groups = await apply_view(context, inputs["viewUrn"], entity_names)
        for group in view_groups:
            for criterion in group:
                _check_type_criterion(criterion, VIEW_PATH)
        await context.refuse_deleted_property_filters(
            [[Placed((), c) for c in group] for group in view_groups], VIEW_PATH
        )
        try:
            groups = both(groups, view_groups)
        except InvalidFilter as error:
            raise error.at(OR_FILTERS_PATH) from None
    return type_searches(entity_names, groups, bool(flags.get("includeSoftDeleted")))


async def resolve_scroll_across_entities(_root: Any, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    context: Context = info.context
    searches = await _searches_of(context, input)
    count = _count(input.get("count"), DEFAULT_COUNT, context.max_count)
    query = _query(input.get("query"))
    try:
        page = await scroll_across(
            await context.backend(),
            searches,
            query,
            count=count,
            scroll_id=input.get("scrollId") or None,
            sort=_sort(input.get("sortInput")),
        )
    except InvalidCursor as error:
        raise error.at(SCROLL_ID_PATH) from None
    return {
        "nextScrollId": page.scroll_id,
        "count": len(page.hits),
        "total": page.total,
        **_results(context, searches, query, input, page.hits),
    }


async def resolve_aggregate_across_entities(_root: Any, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    """DataHub's aggregateAcrossEntities: a search's facets and no results. A soft-deleted property's facet is
    refused, as its filters are."""
    context: Context = info.context
    searches = await _searches_of(context, input)
    wanted = [name for name in input.get("facets") or () if name]
    await context.refuse_deleted_property_facets(wanted, FACETS_PATH)
    return {"facets": _facets(context, searches, _query(input.get("query")), input.get("searchFlags") or {}, wanted)}


async def resolve_search_across_entities(_root: Any, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    context: Context = info.context
    searches = await _searches_of(context, input)
    start = input.get("start") or 0
    count = _count(input.get("count"), DEFAULT_COUNT, context.max_count)
    query = _query(input.get("query"))
    page = await search_across(
        await context.backend(),
        searches,
        query,
        start=start,
        count=min(count, max(context.max_count - start, 0)),
        sort=_sort(input.get("sortInput")),
    )
    return {
        "start": start,
        "count": len(page.hits),
        "total": page.total,
        **_results(context, searches, query, input, page.hits),
    }


# --- lineage ------------------------------------------------------------------------------------------------------

MAX_LINEAGE_HOPS = 20  # a walk without a degree bound ("3+", or none) stops here (as /openapi/v1/lineage)


async def _lineage_asked(context: Context, input: dict[str, Any]) -> LineageAsked:
    """What a lineage search asks (app.search.across.LineageAsked): a walk with no degree bound goes to
    MAX_LINEAGE_HOPS, and one hop further to tell whether the cap cut it (then DataHub's `isPartial`)."""
    urn = input.get("urn")
    if not urn:
        raise ValidationFailed(
            "a lineage search needs the `urn` to start from", [Issue("missing urn", path="$input.urn")]
        )
    _entity_of(urn, context.registry)  # a URN, or a 400 naming it
    searches = await _searches_of(context, input)
    hops = lineage_hops(searches, MAX_LINEAGE_HOPS)
    return LineageAsked(
        urn,
        input["direction"],
        searches,
        _query(input.get("query")),
        hops,
        tell_cap=hops == MAX_LINEAGE_HOPS,
        group_fields=lineage.groups_fields(input.get("searchFlags")),
        caller=context.caller.actor,
    )


def _lineage_results(context: Context, hits: Sequence[LineageHit]) -> list[dict[str, Any]]:
    return [
        {
            "entity": EntityRef(hit.urn, hit.entity_type),
            "matchedFields": [],
            "degree": hit.degree,
            "degrees": [hit.degree],
            "explored": True,
            "truncatedChildren": False,
            "ignoredAsHop": False,
            "paths": lineage.entity_paths(hit.paths, context.registry),
        }
        for hit in hits
    ]


async def resolve_scroll_across_lineage(_root: Any, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    """A page of the walk: cut by the request's read budget, the results it found within it and DataHub's
    `isPartial`, with a `nextScrollId` that continues the walk where it stopped (app.search.across.scroll_lineage);
    `total` counts the results found so far, all of them once the walk is complete."""
    context: Context = info.context
    count = _count(input.get("count"), DEFAULT_COUNT, context.max_count)
    asked = await _lineage_asked(context, input)
    try:
        page = await scroll_lineage(await context.backend(), asked, count=count, scroll_id=input.get("scrollId"))
    except InvalidCursor as error:
        raise error.at(SCROLL_ID_PATH) from None
    return {
        "nextScrollId": page.scroll_id,
        "count": len(page.hits),
        "total": page.total,
        "searchResults": _lineage_results(context, page.hits),
        "facets": None,
        "isPartial": page.partial,
    }


async def resolve_search_across_lineage(_root: Any, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    """Offset paging of the walk, whole within the request's read budget (cut by it: what it found, `isPartial`)."""
    context: Context = info.context
    start = max(input.get("start") or 0, 0)
    count = _count(input.get("count"), DEFAULT_COUNT, context.max_count)
    page = await search_lineage(await context.backend(), await _lineage_asked(context, input), start=start, count=count)
    return {
        "start": start,
        "count": len(page.hits),
        "total": page.total,
        "searchResults": _lineage_results(context, page.hits),
        "facets": None,
        "isPartial": page.partial,
    }


# --- entities -----------------------------------------------------------------------------------------------------


def _entity_of(
    urn: str, registry: EntityRegistry, runtime_types: Collection[str] = (), path: str = "$urn"
) -> str | None:
    """The registry entity of `urn`, when it is one DataHub's GraphQL has a type for (or one of `runtime_types`);
    a 400 naming `path` when it is no URN."""
    try:
        name = entity_type_of(urn)
    except InvalidUrnError as error:
        raise ValidationFailed(f"not a URN: {error}", [Issue("invalid urn", path=path, found=clip(urn, 100))]) from None
    entity = registry.entities.get(name)
    if entity is None or (entity.name not in GRAPHQL_TYPE_OF_ENTITY and entity.name not in runtime_types):
        return None
    return entity.name


async def resolve_entity(_root: Any, info: Any, urn: str) -> EntityRef | None:
    entity = _entity_of(urn, info.context.registry, info.context.runtime_types)
    if entity is None or not await info.context.exists(urn):
        return None
    return EntityRef(urn, entity)


async def resolve_entities(
    _root: Any, info: Any, urns: list[str], checkForExistence: bool | None = None
) -> list[EntityRef | None]:
    """DataHub's BatchGetEntitiesResolver: one answer per URN, in their order (a URN given twice answered twice), null
    where there is no such entity, where the caller may not see it (the read rule), or where DataHub's GraphQL has
    no type for its entity type. Every answer is checked, so `checkForExistence` changes nothing. A string that is
    no URN is a 400 naming its place (`$urns[i]`)."""
    context: Context = info.context
    names = [_entity_of(urn, context.registry, context.runtime_types, f"$urns[{i}]") for i, urn in enumerate(urns)]
    found = await asyncio.gather(*(readable(info, urn, name) if name else _absent() for urn, name in zip(urns, names)))
    return list(found)


async def _absent() -> None:
    return None


# DataHub's other root lookups by URN (lookups.graphql): Query field -> registry entity type.
TYPED_LOOKUPS = {
    **{
        name: name
        for name in (
            "dataPlatform corpGroup dashboard notebook chart dataFlow dataJob form role structuredProperty "
            "erModelRelationship glossaryTerm glossaryNode container domain assertion mlModel mlModelGroup mlFeature "
            "mlFeatureTable mlPrimaryKey dataProduct dataPlatformInstance businessAttribute dataProcessInstance "
            "application test versionSet"
        ).split()
    },
    "corpUser": "corpuser",
    "view": "dataHubView",
}


def _typed_lookup(wanted: str):
    async def resolve(root: Any, info: Any, urn: str) -> EntityRef | None:
        ref = await resolve_entity(root, info, urn)
        return ref if ref is not None and ref.entity_name == wanted else None

    return resolve


# --- tag mutations ------------------------------------------------------------------------------------------------


async def _write(context: Context, drafts: list[Draft]) -> None:
    await context.gateway.submit(context.session, drafts, context.caller, request_headers=context.request_headers)
    context.forget_aspects()


async def resolve_create_tag(_root: Any, info: Any, input: dict[str, Any]) -> str:
    """DataHub's CreateTagResolver: `urn:li:tag:<id or a UUID>` with its tagProperties; an existing tag is refused."""
    context: Context = info.context
    await context.require_write_access()
    tag_id = input.get("id") or str(uuid.uuid4())
    urn = f"urn:li:tag:{tag_id}"
    if await context.exists(urn):
        raise ValidationFailed("This Tag already exists!", [Issue("exists", path="$input.id", found=clip(tag_id, 100))])
    properties = {"name": input["name"], **({"description": input["description"]} if input.get("description") else {})}
    await _write(context, [Draft(0, "tag", "tagProperties", ChangeType.UPSERT.value, urn=urn, value=properties)])
    log.info("tag created", extra={"urn": urn, "actor": context.caller.actor})
    return urn


def _tag_urn(urn: str, path: str) -> str:
    try:
        if entity_type_of(urn) == "tag":
            return urn
    except InvalidUrnError:
        pass
    raise ValidationFailed(
        f"{clip(urn, 100)} is not a tag URN", [Issue("not a tag urn", path=path, found=clip(urn, 100))]
    )


async def resolve_delete_tag(_root: Any, info: Any, urn: str) -> bool:
    """Deleting a tag deletes its key aspect: a hard delete of the entity, which metaledger's policy gives to ADMIN
    (the gateway checks it; DataHub asks for its Manage Tags privilege). References to the tag in other entities'
    globalTags stay (DataHub removes them in the background)."""
    context: Context = info.context
    await context.require_write_access()
    _tag_urn(urn, "$urn")
    if not await context.exists(urn):
        raise NotFound(f"tag {clip(urn, 100)} does not exist", [Issue("not found", path="$urn", found=clip(urn, 100))])
    key_aspect = context.registry.entity("tag").key_aspect
    await _write(context, [Draft(0, "tag", key_aspect, ChangeType.DELETE.value, urn=urn)])
    log.info("tag deleted", extra={"urn": urn, "actor": context.caller.actor})
    return True


async def resolve_remove_tag(_root: Any, info: Any, input: dict[str, Any]) -> bool:
    """DataHub's RemoveTagResolver on the entity's globalTags (a field's tags, `subResource`, are not served)."""
    context: Context = info.context
    await context.require_write_access()
    tag = _tag_urn(input["tagUrn"], "$input.tagUrn")
    resource = input["resourceUrn"]
    if input.get("subResource") or input.get("subResourceType"):
        raise ValidationFailed(
            "removing a tag from a field (subResource) is not supported",
            [Issue("unsupported", path="$input.subResource")],
        )
    entity = _entity_of(resource, context.registry) or entity_type_of(resource)
    current = await context.aspect(resource, "globalTags")
    if current is None:
        return True
    kept = [t for t in current.get("tags") or () if t.get("tag") != tag]
    if len(kept) != len(current.get("tags") or ()):
        await _write(
            context,
            [Draft(0, entity, "globalTags", ChangeType.UPSERT.value, urn=resource, value={**current, "tags": kept})],
        )
    return True


# --- the caller and the platform's settings ---------------------------------------------------------------------

# DataHub's platform privileges (PlatformPrivileges), by the role that holds them here: a writer those of creating and
# editing metadata, an admin every one (the service's administration, deletes of entities, tokens, policies); a
# reader none. A writer's write policies (app.auth) may still refuse one of its writes.
WRITER_PRIVILEGES = (
    "createDomains",
    "manageDomains",
    "manageGlossaries",
    "manageDocuments",
    "createTags",
    "viewManageTags",
    "manageStructuredProperties",
    "viewStructuredPropertiesPage",
    "createBusinessAttributes",
    "manageBusinessAttributes",
    "manageApplications",
    "generatePersonalAccessTokens",  # a writer makes its own at /settings/tokens (app.web.tokens)
)
ADMIN_PRIVILEGES = (
    "viewAnalytics",
    "managePolicies",
    "manageIdentities",
    "manageIngestion",
    "manageSecrets",
    "manageTokens",
    "viewTests",
    "manageTests",
    "manageUserCredentials",
    "manageTags",
    "manageGlobalViews",
    "manageGlobalSettings",
    "manageOwnershipTypes",
    "manageGlobalAnnouncements",
    "manageFeatures",
    "manageHomePageTemplates",
    "manageServiceAccounts",
)
GLOBAL_SETTINGS_URN = "urn:li:globalSettings:0"  # DataHub's one global settings entity
GLOBAL_SETTINGS_ENTITY, GLOBAL_SETTINGS_INFO = "globalSettings", "globalSettingsInfo"


def platform_privileges(caller: Principal) -> dict[str, bool]:
    writer, admin = caller.allows(Permission.WRITE), caller.allows(Permission.ADMIN)
    return {
        **{name: writer for name in WRITER_PRIVILEGES},
        **{name: admin for name in ADMIN_PRIVILEGES},
    }


async def resolve_me(_root: Any, info: Any) -> dict[str, Any]:
    """DataHub's MeResolver: the user the request's bearer token names (its actor), whether or not that user has
    been written as an entity (`exists` tells), and what the caller's role allows."""
    caller: Principal = info.context.caller
    return {"corpUser": EntityRef(caller.actor, "corpuser"), "platformPrivileges": platform_privileges(caller)}


async def resolve_global_views_settings(_root: Any, info: Any) -> dict[str, Any]:
    """DataHub's GlobalViewsSettingsResolver: the global default view of the global settings' globalSettingsInfo
    (null when there is none, or when the registry has no global settings), through the caller's reader."""
    context: Context = info.context
    entity = context.registry.entities.get(GLOBAL_SETTINGS_ENTITY)
    if entity is None or GLOBAL_SETTINGS_INFO not in entity.aspect_names:
        return {"defaultView": None}
    settings = await context.aspect(GLOBAL_SETTINGS_URN, GLOBAL_SETTINGS_INFO) or {}
    return {"defaultView": (settings.get("views") or {}).get("defaultView")}


async def resolve_app_config(_root: Any, _info: Any) -> dict[str, Any]:
    """What DataHub's AppConfigResolver answers for the fields served: no third-party telemetry, no semantic search."""
    return {
        "telemetryConfig": {"enableThirdPartyLogging": False},
        "semanticSearchConfig": {"enabled": False, "enabledEntities": [], "embeddingConfig": None},
    }


QUERY_RESOLVERS = {
    "scrollAcrossEntities": resolve_scroll_across_entities,
    "searchAcrossEntities": resolve_search_across_entities,
    "aggregateAcrossEntities": resolve_aggregate_across_entities,
    "scrollAcrossLineage": resolve_scroll_across_lineage,
    "searchAcrossLineage": resolve_search_across_lineage,
    "entity": resolve_entity,
    "entities": resolve_entities,
    "me": resolve_me,
    "globalViewsSettings": resolve_global_views_settings,
    "dataset": _typed_lookup("dataset"),
    "tag": _typed_lookup("tag"),
    **{field: _typed_lookup(entity) for field, entity in TYPED_LOOKUPS.items()},
    "appConfig": resolve_app_config,
    "listQueries": resolve_list_queries,
    **CURATION_QUERIES,
}
MUTATION_RESOLVERS = {
    "createTag": resolve_create_tag,
    "deleteTag": resolve_delete_tag,
    "removeTag": resolve_remove_tag,
    **CURATION_MUTATIONS,
}
