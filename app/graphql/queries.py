"""DataHub's queries over GraphQL (schema: queries.graphql): `listQueries`, DataHub's ListQueriesResolver, a search of
the `query` entities (through the request's read-scoped search backend, as every search here) filtered by `source`,
by `datasetUrn` (the `entities` field, querySubjects' Searchable subject URNs: a dataset's or a schema field's) and by
`orFilters`, newest first (createdAt) unless `sortInput` says otherwise; and the query entity's fields, as DataHub's
QueryMapper reads them: `properties` (queryProperties), `subjects` (querySubjects: a dataset subject, or a schema
field subject with its dataset), `platform` (dataPlatformInstance). Aspects are read through the request's reader,
so what the caller may not see is absent.

The field resolvers are registered in app.graphql.entities.FIELD_RESOLVERS when this module is imported (by
app.graphql.resolvers, before any schema is built), so that bind_entities attaches them."""

from __future__ import annotations

from typing import Any

from app.graphql.entities import (
    FIELD_RESOLVERS,
    NO_STAMP,
    EntityRef,
    _custom_properties,
    _platform,
    entity_ref,
    resolved_stamp,
)
from app.graphql.paging import declare_paged
from app.registry.errors import RegistryError
from app.search.across import TypeSearch, search_across
from app.search.filters import InvalidFilter, both, criteria_groups
from app.search.model import Criterion
from app.urns import InvalidUrnError, entity_type_of

QUERY_ENTITY = "query"
DEFAULT_QUERIES = 100  # a page's queries when `count` is not given (DataHub's ListQueriesResolver)
declare_paged("listQueries", "queries", DEFAULT_QUERIES)
CREATED_AT_FIELD = "createdAt"  # queryProperties.created.time, as the search document names it
SOURCE_FIELD, ENTITIES_FIELD = "source", "entities"


async def resolve_list_queries(_root: Any, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    """One page of the query entities the caller may see that meet `source`, `datasetUrn` and `orFilters` (each of
    its groups ANDed with the first two); `count` is what the page holds, `total` how many meet them."""
    # the search helpers of app.graphql.resolvers, which imports this module
    from app.graphql.resolvers import OR_FILTERS_PATH, _count, _or_filters, _query, _sort

    context = info.context
    if QUERY_ENTITY not in context.registry.entities:
        return {"start": input.get("start") or 0, "count": 0, "total": 0, "queries": []}
    placed = _or_filters(input)
    await context.refuse_deleted_property_filters(placed, OR_FILTERS_PATH)
    fixed: list[Criterion] = []
    if input.get("source"):
        fixed.append(Criterion(SOURCE_FIELD, (input["source"],)))
    if input.get("datasetUrn"):
        fixed.append(Criterion(ENTITIES_FIELD, (input["datasetUrn"],)))
    try:
        groups = both(criteria_groups(placed), (tuple(fixed),) if fixed else ())
    except InvalidFilter as error:
        raise error.at(OR_FILTERS_PATH) from None
    start = input.get("start") or 0
    count = _count(input.get("count"), DEFAULT_QUERIES, context.max_count)
    sort = _sort(input.get("sortInput")) or [(CREATED_AT_FIELD, "desc")]
    page = await search_across(
        await context.backend(),
        [TypeSearch(QUERY_ENTITY, groups or None)],
        _query(input.get("query")),
        start=start,
        count=min(count, max(context.max_count - start, 0)),
        sort=sort,
    )
    return {
        "start": start,
        "count": len(page.hits),
        "total": page.total,
        "queries": [EntityRef(hit.urn, QUERY_ENTITY) for hit in page.hits],
    }


# --- QueryEntity's fields (obj: the EntityRef) -----------------------------------------------------------------------


def _stamp(value: Any) -> dict[str, Any]:
    stamp = value if isinstance(value, dict) else {}
    return {"time": stamp.get("time") or 0, "actor": stamp.get("actor")}


async def _query_properties(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await info.context.aspect(ref.urn, "queryProperties")
    if value is None:
        return None
    statement = value.get("statement") or {}
    origin = value.get("origin")

    async def resolve_origin(_info: Any) -> EntityRef | None:
        """The asset the query came from, unless the caller may not see it (the read rule: a PERSONAL view)."""
        ref = entity_ref(origin) if origin else None
        if ref is None or origin in await info.context.unreadable([origin]):
            return None
        return ref

    return {
        "statement": {"value": statement.get("value") or "", "language": statement.get("language") or "SQL"},
        "source": value.get("source"),
        "name": value.get("name"),
        "description": value.get("description"),
        "created": _stamp(value.get("created")),
        "lastModified": _stamp(value.get("lastModified")),
        "createdOn": resolved_stamp(value.get("created")) or NO_STAMP,
        "origin": resolve_origin,
        "customProperties": _custom_properties(value),
    }


def _subject(urn: str, info: Any) -> dict[str, Any] | None:
    """A subject as DataHub's QuerySubject: a dataset; a schema field with its dataset (the field key's parent).
    A subject of any other type has no place in it (its `dataset` is non-null) and is left out."""
    try:
        entity = entity_type_of(urn)
    except InvalidUrnError:
        return None
    if entity == "dataset":
        return {"dataset": EntityRef(urn, "dataset"), "schemaField": None}
    if entity == "schemaField":
        try:
            parent = info.context.registry.urn_to_key("schemaField", urn).get("parent")
        except RegistryError:  # a URN in an aspect that is no valid key (a lenient registry let it in)
            return None
        if isinstance(parent, str) and parent.startswith("urn:li:dataset:"):
            return {"dataset": EntityRef(parent, "dataset"), "schemaField": EntityRef(urn, "schemaField")}
    return None


async def _query_subjects(ref: EntityRef, info: Any) -> list[dict[str, Any]] | None:
    value = await info.context.aspect(ref.urn, "querySubjects")
    if value is None:
        return None
    subjects = (_subject(s.get("entity") or "", info) for s in value.get("subjects") or () if isinstance(s, dict))
    return [s for s in subjects if s is not None]


async def _query_platform(ref: EntityRef, info: Any) -> EntityRef | None:
    value = await info.context.aspect(ref.urn, "dataPlatformInstance") or {}
    return _platform(value.get("platform"))


FIELD_RESOLVERS.setdefault("QueryEntity", {}).update(
    {"properties": _query_properties, "subjects": _query_subjects, "platform": _query_platform}
)
