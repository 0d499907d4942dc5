"""DataHub's OpenAPI scroll APIs and the v2 entity batch get, in DataHub's shapes (what `DataHubGraph`'s
`scroll_entities`, `scroll_relationships`, `scroll_lineage` and `get_entities_v2` send and read).

* `POST /openapi/v3/entity/scroll?count=&query=&scrollId=&sort=&sortCriteria=&sortOrder=&systemMetadata=
  &includeSoftDelete=&pitKeepAlive=...` with body `{"entities"?, "aspects"?, "filter"?, "sortCriteria"?}` →
  `{"scrollId"?, "entities": [{"urn", <aspect>: {"value", "systemMetadata"?}}], "totalCount"}`. Without
  `aspects` only URNs come back; `aspects: []` means every aspect (DataHub's expandEmpty).
* `POST /openapi/v3/relationship/scroll?relationshipTypes=&sourceTypes=&destinationTypes=&direction=&count=
  &scrollId=` with body `{"sourceFilter"?, "destinationFilter"?, "edgeFilter"?}` → `{"scrollId"?, "results":
  [{"source": {"urn", "entityType"}, "destination": {...}, "relationshipType", ...}]}`.
* `POST /openapi/v3/lineage/scroll?relationshipTypes=&direction=UPSTREAM|DOWNSTREAM&count=&scrollId=` with body
  `{"urns"?}` → as above, each result with its `upstream` and `downstream` URN.
* `POST /openapi/v2/entity/batch/{entityName}` with body `{"urns", "aspectNames"?, "withSystemMetadata"?}` →
  `{"entities": [{"urn", "aspects": {<aspect>: {"value", "systemMetadata"?}}}]}`, one per requested URN.

Scroll ids are keyset cursors (app.search.cursors: across types for entities, the edge's key for edges): exact
under concurrent writes. Bodies are read by their models, the declarations the OpenAPI document shows; filters
become criteria in app.search.filters. Accepted and ignored (meaningless without Elasticsearch's point in time and
cache): `pitKeepAlive`, `skipCache`, `skipAggregation`, `scrollIdPerEntity`. `sliceId`/`sliceMax` are a 400 (slices
would need a partitioned cursor).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import ALLOW_READ, Backend, JsonBody, Registry, SettingsDep, StoredEntities
from app.api.http import Flag, check_batch_size, invalid_at, json_response, stored_envelope, stored_envelope_v3
from app.api.search_models import RelationshipItem, ScrollEntity
from app.errors import ERROR_RESPONSES, Issue, ValidationFailed, clip
from app.registry import EntityRegistry
from app.search.across import TypeSearch, scroll_across
from app.search.cursors import InvalidCursor, decode_edge, edge_cursor
from app.search.filters import (
    CONDITION_NAMES,
    FIELD_NAME,
    InvalidFilter,
    Placed,
    criteria_groups,
    json_path,
    placed_filter_groups,
    single_clause,
)
from app.search.model import MAX_FILTER_VALUES, MAX_PAGE_SIZE, MAX_PATTERN_CHARS, Edge, EdgeQuery, upstream_downstream
from app.search.structured_properties import refuse_deleted_property_filters
from app.urns import entity_type_of

log = logging.getLogger("metaledger.api.scroll")

router = APIRouter(tags=["scroll"], dependencies=[ALLOW_READ])

Count = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description=f"Page size, 1..{MAX_PAGE_SIZE}")]


def _bad(message: str, path: str, found: Any = None, expected: str | None = None) -> ValidationFailed:
    shown = None if found is None else clip(found if isinstance(found, str) else orjson.dumps(found).decode(), 100)
    return ValidationFailed(message, [Issue(message, path=path, expected=expected, found=shown)])


def _criteria(filter_: FilterBody | None, path: str) -> list[Placed]:
    """A filter that must be one AND clause, its criteria placed; a filter error is a 400 naming its place."""
    try:
        return single_clause(_filter_json(filter_))
    except InvalidFilter as error:
        raise error.at(path) from None


def _filter_json(filter_: FilterBody | None) -> dict[str, Any] | None:
    return None if filter_ is None else filter_.model_dump(by_alias=True, exclude_none=True)


def _refuse_slices(slice_id: int | None, slice_max: int | None) -> None:
    if slice_id is not None or slice_max is not None:
        raise _bad(
            "sliced scrolls are not supported: scroll without sliceId/sliceMax",
            "$sliceId" if slice_id is not None else "$sliceMax",
        )


# --- filters ------------------------------------------------------------------------------------------------------


class CriterionBody(BaseModel):
    field: str = Field(
        description="A filter or document field (`urn` and `removed` included); a `.keyword` suffix is dropped"
    )
    values: list[str] | None = Field(None, description="Any one of them matches (not needed for EXISTS)")
    value: str | None = Field(
        None, deprecated=True, description="DataHub's deprecated single value, read when `values` is absent"
    )
    condition: Literal[CONDITION_NAMES] = Field(  # type: ignore[valid-type]  # a tuple of names: pydantic reads it
        "EQUAL",
        description=(
            "EQUAL/IN: the field has one of the values (exact). IEQUAL: the same, case-insensitively. CONTAIN, "
            "START_WITH, END_WITH (also spelled STARTS_WITH, ENDS_WITH, as DataHub's v3 enum has them): a string value "
            "contains, starts or ends with one of the values, case-insensitively, every character literal (at most "
            f"{MAX_PATTERN_CHARS} characters). EXISTS: the field has a value. GREATER_THAN, ...: a number (datetimes: "
            "epoch milliseconds) compares numerically with the numeric values, a string as text with every value. A "
            "field holding an array matches when one of its elements does. Values are trimmed except for EQUAL/IN. "
            "DESCENDANTS_INCL, ANCESTORS_INCL and RELATED_INCL are a 400."
        ),
    )
    negated: bool = Field(
        False, strict=True, description="The criterion must not hold (entities without the field included)"
    )


class ConjunctiveCriterionBody(BaseModel):
    criteria: list[CriterionBody] = Field(description="Every criterion must hold (AND)")


class AndCriteriaBody(BaseModel):
    and_: list[CriterionBody] = Field(alias="and", description="Every criterion must hold (AND)")


class FilterBody(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "description": (
                "DataHub's v3 filter, exactly one of: `and` (what DataHub's OpenAPI v3 and its SDK send; despite the name, "
                "an OR of its clauses, each an AND of its `criteria`), `or` (DataHub's Rest.li Filter: an OR of `and` "
                f"clauses) or `criteria` (deprecated by DataHub: one AND). At most {MAX_FILTER_VALUES} values in all. The "
                "relationship scroll's filters take one clause of EQUAL/IN `urn` criteria."
            )
        }
    )
    and_: list[ConjunctiveCriterionBody] | None = Field(None, alias="and", description="OR of these clauses")
    or_: list[AndCriteriaBody] | None = Field(None, alias="or", description="OR of these clauses")
    criteria: list[CriterionBody] | None = Field(None, deprecated=True, description="One AND clause")


# --- entities -----------------------------------------------------------------------------------------------------


class SortCriterion(BaseModel):
    field: str
    order: Literal["ASCENDING", "DESCENDING"] = "ASCENDING"


class ScrollEntitiesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    entities: list[str] | None = Field(None, description="Entity types; absent: every type")
    aspects: list[str] | None = Field(None, description="Aspects to return; absent: URNs only; []: every aspect")
    aspectNames: list[str] | None = Field(
        None, description="DataHub's older name of `aspects`, read when `aspects` is absent"
    )
    filter: FilterBody | None = Field(None, description="Which entities: an OR of AND clauses of criteria (Filter)")
    sortCriteria: list[SortCriterion] | None = None


class ScrollEntitiesResponse(BaseModel):
    scrollId: str | None = Field(None, description="Pass back as `scrollId` for the next page; absent on the last page")
    entities: list[ScrollEntity]
    totalCount: int


def _entity_types(registry: EntityRegistry, names: list[str] | None) -> list[str]:
    if names is None:
        return list(registry.entities)
    types: list[str] = []
    for position, name in enumerate(names):
        with invalid_at(f"$.entities[{position}]"):
            resolved = registry.entity(name).name
        if resolved not in types:
            types.append(resolved)
    if not types:
        raise _bad("entities is empty: name at least one entity type, or leave it out for every type", "$.entities")
    return types


def _aspects(registry: EntityRegistry, types: list[str], names: list[str] | None) -> list[str] | None:
    if names is None:
        return None
    known = {a for t in types for a in registry.entities[t].aspect_names}
    for position, name in enumerate(names):
        if name not in known:
            raise _bad(
                f"aspect {clip(name, 100)!r} is not an aspect of {', '.join(types[:5])}"
                f"{'...' if len(types) > 5 else ''}",
                f"$.aspects[{position}]",
                name,
            )
    return names


def _sort(
    body_criteria: list[SortCriterion] | None, fields: list[str] | None, sort: str, order: str
) -> list[tuple[str, str]]:
    """DataHub's precedence: the body's `sortCriteria`, else the `sortCriteria` parameters (each in `sortOrder`),
    else `sort` (default `urn`). Each as (field, order, where the field is)."""
    given: list[tuple[str, str, str]]
    if body_criteria is not None:
        given = [(c.field, c.order, f"$.sortCriteria[{position}].field") for position, c in enumerate(body_criteria)]
    elif fields:
        given = [(field, order, f"$sortCriteria[{position}]") for position, field in enumerate(fields)]
    else:
        given = [(sort, order, "$sort")]
    for field, _, where in given:
        if not FIELD_NAME.fullmatch(field):
            raise _bad("not a field to sort on", where, field)
    return [(field, "desc" if direction == "DESCENDING" else "asc") for field, direction, _ in given]


@router.post(
    "/openapi/v3/entity/scroll",
    response_model=ScrollEntitiesResponse,
    responses=ERROR_RESPONSES,
    summary="Scroll entities of several types (DataHub's POST /openapi/v3/entity/scroll)",
    description=(
        "Pages through the entities of the body's `entities` types (default: every type) matching `query` and "
        "`filter`, type after type, each in `sortCriteria` order (default: by URN). `scrollId` is a keyset cursor: "
        "an entity that matches throughout the scroll and keeps its sort key is returned exactly once, whatever is "
        f"written meanwhile. `count` is at most {MAX_PAGE_SIZE}. Soft-deleted entities are left out unless "
        "`includeSoftDelete=true`."
    ),
)
async def scroll_entities(
    registry: Registry,
    backend: Backend,
    reader: StoredEntities,
    body: Annotated[ScrollEntitiesBody, Depends(JsonBody(ScrollEntitiesBody))],
    count: Count = 10,
    query: Annotated[str, Query()] = "*",
    scrollId: Annotated[str | None, Query()] = None,
    sort: Annotated[str, Query(description="Deprecated by DataHub: use sortCriteria")] = "urn",
    sortCriteria: Annotated[list[str] | None, Query()] = None,
    sortOrder: Annotated[Literal["ASCENDING", "DESCENDING"], Query()] = "ASCENDING",
    systemMetadata: Annotated[Flag, Query()] = False,
    includeSoftDelete: Annotated[Flag, Query()] = False,
    skipCache: Annotated[Flag, Query(description="Accepted; there is no cache")] = False,
    skipAggregation: Annotated[Flag, Query(description="Accepted; scrolls never aggregate")] = True,
    scrollIdPerEntity: Annotated[Flag, Query(description="Accepted; ignored")] = False,
    sliceId: Annotated[int | None, Query(description="Not supported")] = None,
    sliceMax: Annotated[int | None, Query(description="Not supported")] = None,
    pitKeepAlive: Annotated[str | None, Query(description="Accepted; ignored: cursors need no point in time")] = "5m",
) -> Response:
    _refuse_slices(sliceId, sliceMax)
    if "\x00" in query:
        raise _bad("a NUL character (\\u0000)", "$query")
    types = _entity_types(registry, body.entities)
    aspects = _aspects(registry, types, body.aspects if "aspects" in body.model_fields_set else body.aspectNames)
    sort_by = _sort(body.sortCriteria, sortCriteria, sort, sortOrder)
    # The body's OR of AND groups, the same in every type (the backends hide soft-deleted entities unless asked:
    # `include_removed`, or a criterion on `removed`).
    try:
        placed = placed_filter_groups(_filter_json(body.filter))
        await refuse_deleted_property_filters(reader, (p for g in placed for p in g))
    except InvalidFilter as error:
        raise error.at("$.filter") from None
    any_of = criteria_groups(placed) or None
    searches = [TypeSearch(entity_type, any_of, include_removed=includeSoftDelete) for entity_type in types]
    try:
        page = await scroll_across(
            backend, searches, query or "*", count=count, scroll_id=scrollId or None, sort=sort_by
        )
    except InvalidCursor as error:
        raise error.at("$scrollId") from None
    entities: list[dict[str, Any]] = [{"urn": hit.urn} for hit in page.hits]
    if aspects is not None:
        wanted = [(e["urn"], aspects or None) for e in entities]
        found = await reader.latest_of_many(wanted)
        for entity in entities:
            for row in found.get(entity["urn"], ()):
                entity[row.aspect] = stored_envelope_v3(row, systemMetadata)
    log.debug(
        "entity scroll page",
        extra={"types": len(types), "count": count, "hits": len(entities), "more": page.scroll_id is not None},
    )
    out: dict[str, Any] = {"entities": entities, "totalCount": page.total}
    if page.scroll_id:
        out["scrollId"] = page.scroll_id
    return json_response(out)


# --- relationships and lineage -------------------------------------------------------------------------------------


class ScrollRelationshipsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sourceFilter: FilterBody | None = Field(
        None, description="One clause with one `urn` criterion (EQUAL/IN) on the source"
    )
    destinationFilter: FilterBody | None = Field(
        None, description="One clause with one `urn` criterion (EQUAL/IN) on the destination"
    )
    edgeFilter: FilterBody | None = Field(None, description="Not supported: absent or empty")


class ScrollLineageBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    urns: list[str] | None = Field(
        None, description="Anchors: edges with one of them at either end; absent: every lineage edge"
    )


class RelationshipsPage(BaseModel):
    scrollId: str | None = None
    results: list[RelationshipItem]


class LineageItem(RelationshipItem):
    upstream: str
    downstream: str


class LineagePage(BaseModel):
    scrollId: str | None = None
    results: list[LineageItem]


def _edge_after(scroll_id: str | None) -> tuple[str, str, str, str] | None:
    try:
        return decode_edge(scroll_id) if scroll_id else None
    except InvalidCursor as error:
        raise error.at("$scrollId") from None


def _urns_of(filter_: FilterBody | None, path: str) -> list[str]:
    """The URNs a source/destination filter allows (empty: any): its one `urn` criterion's values (EQUAL or IN)."""
    criteria = _criteria(filter_, path)
    for position, placed in enumerate(criteria):
        where, criterion = json_path(path, placed.loc), placed.criterion
        if criterion.condition != "EQUAL":
            raise _bad(
                f"condition {criterion.condition} is not supported here",
                f"{where}.condition",
                criterion.condition,
                "EQUAL or IN",
            )
        if criterion.negated:
            raise _bad("negated criteria are not supported here", f"{where}.negated", True)
        if criterion.field != "urn" or position > 0:
            raise _bad("only one `urn` criterion is supported here", f"{where}.field", criterion.field)
    if not criteria:
        return []
    where, urns = json_path(path, criteria[0].loc), list(criteria[0].criterion.values)
    for position, urn in enumerate(urns):
        with invalid_at(f"{where}.values[{position}]", urn=urn):
            entity_type_of(urn)
    return urns


def _edge_item(edge: Edge) -> dict[str, Any]:
    item: dict[str, Any] = {
        "source": {"urn": edge.source, "entityType": edge.source_type},
        "destination": {"urn": edge.destination, "entityType": edge.destination_type},
        "relationshipType": edge.relationship,
    }
    for key, value in (
        ("createdOn", edge.created_on),
        ("createdActor", edge.created_actor),
        ("updatedOn", edge.updated_on),
        ("updatedActor", edge.updated_actor),
        ("via", edge.via),
        ("properties", edge.properties or None),
    ):
        if value is not None:
            item[key] = value
    return item


def _types(values: list[str] | None, path: str) -> tuple[str, ...]:
    for position, value in enumerate(values or ()):
        if "\x00" in value:
            raise _bad("a NUL character (\\u0000)", f"{path}[{position}]")
    return tuple(values or ())


@router.post(
    "/openapi/v3/relationship/scroll",
    response_model=RelationshipsPage,
    response_model_exclude_none=True,
    responses=ERROR_RESPONSES,
    summary="Scroll relationships of every entity (DataHub's POST /openapi/v3/relationship/scroll)",
    description=(
        "Edges in key order, filtered by relationship, source and destination types and the source/destination "
        "URNs of the body's filters. OUTGOING (default): the filters' source is the edge's source; INCOMING: roles "
        "swapped. `scrollId` is a keyset cursor: an edge that exists throughout the scroll is returned once."
    ),
)
async def scroll_relationships(
    backend: Backend,
    settings: SettingsDep,
    body: Annotated[ScrollRelationshipsBody, Depends(JsonBody(ScrollRelationshipsBody))],
    relationshipTypes: Annotated[list[str] | None, Query()] = None,
    sourceTypes: Annotated[list[str] | None, Query()] = None,
    destinationTypes: Annotated[list[str] | None, Query()] = None,
    direction: Annotated[Literal["OUTGOING", "INCOMING"], Query()] = "OUTGOING",
    count: Count = 10,
    scrollId: Annotated[str | None, Query()] = None,
    includeSoftDelete: Annotated[Flag, Query(description="Accepted; edges of soft-deleted entities are kept")] = False,
    sliceId: Annotated[int | None, Query(description="Not supported")] = None,
    sliceMax: Annotated[int | None, Query(description="Not supported")] = None,
    pitKeepAlive: Annotated[str | None, Query(description="Accepted; ignored")] = "5m",
) -> Response:
    _refuse_slices(sliceId, sliceMax)
    edge_criteria = _criteria(body.edgeFilter, "$.edgeFilter")
    if edge_criteria:
        raise _bad("edgeFilter criteria are not supported", json_path("$.edgeFilter", edge_criteria[0].loc))
    sources = _urns_of(body.sourceFilter, "$.sourceFilter")
    destinations = _urns_of(body.destinationFilter, "$.destinationFilter")
    check_batch_size(sources + destinations, settings, "$.sourceFilter", what="URNs")
    source_types, destination_types = _types(sourceTypes, "$sourceTypes"), _types(destinationTypes, "$destinationTypes")
    if direction == "INCOMING":  # the filters' source is the entity the edge comes into
        sources, destinations = destinations, sources
        source_types, destination_types = destination_types, source_types
    edge_query = EdgeQuery(
        relationship_types=_types(relationshipTypes, "$relationshipTypes"),
        source_types=source_types,
        destination_types=destination_types,
        source_urns=tuple(sources),
        destination_urns=tuple(destinations),
    )
    page = await backend.scroll_edges(edge_query, after=_edge_after(scrollId), count=count)
    out: dict[str, Any] = {"results": [_edge_item(e) for e in page.edges]}
    if page.after:
        out["scrollId"] = edge_cursor(page.after)
    return json_response(out)


@router.post(
    "/openapi/v3/lineage/scroll",
    response_model=LineagePage,
    response_model_exclude_none=True,
    responses=ERROR_RESPONSES,
    summary="Scroll lineage edges touching a set of URNs (DataHub's POST /openapi/v3/lineage/scroll)",
    description=(
        "Lineage edges with one of the body's `urns` at either end (absent: every lineage edge), each with its "
        "`upstream` and `downstream` URN. `direction` keeps, after the page is read, the edges running that way "
        "from an anchor (UPSTREAM: the anchor is the downstream end), so a page may hold fewer than `count`: "
        "scroll until there is no `scrollId`."
    ),
)
async def scroll_lineage(
    backend: Backend,
    settings: SettingsDep,
    body: Annotated[ScrollLineageBody, Depends(JsonBody(ScrollLineageBody))],
    relationshipTypes: Annotated[list[str] | None, Query()] = None,
    direction: Annotated[Literal["UPSTREAM", "DOWNSTREAM"] | None, Query()] = None,
    count: Count = 10,
    scrollId: Annotated[str | None, Query()] = None,
    includeSoftDelete: Annotated[Flag, Query(description="Accepted; edges of soft-deleted entities are kept")] = False,
    sliceId: Annotated[int | None, Query(description="Not supported")] = None,
    sliceMax: Annotated[int | None, Query(description="Not supported")] = None,
    pitKeepAlive: Annotated[str | None, Query(description="Accepted; ignored")] = "5m",
) -> Response:
    _refuse_slices(sliceId, sliceMax)
    anchors = body.urns or []
    check_batch_size(anchors, settings, "$.urns", what="URNs")
    for position, urn in enumerate(anchors):
        with invalid_at(f"$.urns[{position}]", urn=urn):
            entity_type_of(urn)
    edge_query = EdgeQuery(
        relationship_types=_types(relationshipTypes, "$relationshipTypes"),
        either_urns=tuple(anchors),
        lineage_only=True,
    )
    page = await backend.scroll_edges(edge_query, after=_edge_after(scrollId), count=count)
    anchor_set = set(anchors)
    results = []
    for edge in page.edges:
        upstream, downstream = upstream_downstream(edge)
        if anchor_set and direction == "UPSTREAM" and downstream not in anchor_set:
            continue
        if anchor_set and direction == "DOWNSTREAM" and upstream not in anchor_set:
            continue
        results.append({**_edge_item(edge), "upstream": upstream, "downstream": downstream})
    out: dict[str, Any] = {"results": results}
    if page.after:
        out["scrollId"] = edge_cursor(page.after)
    return json_response(out)


# --- v2 batch get ---------------------------------------------------------------------------------------------------


class BatchGetUrnRequestV2(BaseModel):
    model_config = ConfigDict(extra="forbid")
    urns: list[str]
    aspectNames: list[str] = Field(default_factory=list, description="Aspects to return; empty: every aspect")
    withSystemMetadata: bool = Field(False, strict=True)


class GenericEntityV2(BaseModel):
    urn: str
    aspects: dict[str, Any] = Field(description='aspect name -> {"value", "systemMetadata"?}')


class BatchGetUrnResponseV2(BaseModel):
    entities: list[GenericEntityV2]


@router.post(
    "/openapi/v2/entity/batch/{entityName}",
    response_model=BatchGetUrnResponseV2,
    responses=ERROR_RESPONSES,
    summary="Get a batch of entities (DataHub's v2 batch get)",
    description="One entity per requested URN (in request order, once each), with the named aspects (all when "
    "`aspectNames` is empty) it has; `aspects` is empty for an entity with none of them.",
)
async def batch_get_v2(
    entityName: str,
    registry: Registry,
    settings: SettingsDep,
    reader: StoredEntities,
    body: Annotated[BatchGetUrnRequestV2, Depends(JsonBody(BatchGetUrnRequestV2))],
) -> Response:
    with invalid_at("$entityName"):
        entity = registry.entity(entityName).name
    urns = list(dict.fromkeys(body.urns))
    check_batch_size(urns, settings, "$.urns", what="URNs")
    for position, urn in enumerate(urns):
        with invalid_at(f"$.urns[{position}]", urn=urn):
            entity_type_of(urn)
    for position, aspect in enumerate(body.aspectNames):
        with invalid_at(f"$.aspectNames[{position}]", aspect=aspect):
            registry.aspect(entity, aspect)
    wanted = [(urn, body.aspectNames or None) for urn in urns]
    found = await reader.latest_of_many(wanted)
    entities = [
        {
            "urn": urn,
            "aspects": {row.aspect: stored_envelope(row, body.withSystemMetadata) for row in found.get(urn, ())},
        }
        for urn in urns
    ]
    return json_response({"entities": entities})
