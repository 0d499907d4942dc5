"""Read APIs of the search, lineage-graph and timeseries indices (DataHub's shapes where DataHub has them).

* `GET /openapi/v3/entity/{entityName}?query=&count=&scrollId=&sortCriteria=&sortOrder=&aspects=&systemMetadata=
  &includeSoftDelete=&filter_<field>=<value>` → DataHub's scroll shape `{"scrollId", "entities": [{"urn",
  <aspect>: {"value", "systemMetadata"?}}], "totalCount"}` (entities read from the aspect store, as GET entity).
  Filters: one query parameter `filter_<name>=<value>` per `addToFilters` field (its filter name, e.g.
  `filter_platform=urn:li:dataPlatform:hive`); repeat it for OR within a field; different fields AND.
  Soft-deleted entities are hidden unless `includeSoftDelete=true`.
* `GET /openapi/v1/search/{entityName}/autocomplete?query=&limit=` → `{"query", "suggestions", "entities"}`.
* `GET /openapi/v3/relationship/{entityName}/{urn}?relationshipType[]=&direction=&count=&scrollId=` → DataHub's
  v3 shape `{"scrollId", "results": [{"source": {"urn", "entityType"}, "destination": {...}, "relationshipType",
  "createdOn"?, "createdActor"?, "updatedOn"?, "updatedActor"?, "via"?, "properties"?}]}`.
* `GET /openapi/v1/lineage/{urn}?direction=UPSTREAM|DOWNSTREAM&maxHops=3` → `{"urn", "direction", "entities":
  [{"urn", "entityType", "hop", "via"?}]}` (each entity once, at its smallest hop, by hop then URN: the walk of
  app.search.lineage, which GraphQL's lineage searches read too; a schema field's lineage is its fields').
* `GET /openapi/v1/timeseries/{entityName}/{aspect}/latest?urn=` and `.../daily?urn=&field=&start=&end=`.
* `GET /openapi/v1/trace/write/{urn}?aspect=` → per aspect primary and search storage status.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from app.api.deps import ALLOW_READ, Backend, Registry, Session, StoredEntities
from app.api.http import Flag, UrnPath, UrnQuery, checked_urn, entity_of_urn, invalid_at, stored_envelope
from app.api.search_models import RelationshipItem, ScrollEntity
from app.errors import ERROR_RESPONSES, Issue, NotFound, ValidationFailed
from app.limits import check_long, clip
from app.read_deadline import CUT_RESPONSES, PARTIAL_HEADER
from app.read_deadline import HEADER as DEADLINE_HEADER
from app.registry import EntityRegistry
from app.search.cursors import InvalidCursor, decode_offset, offset_cursor
from app.search.documents import indexed_aspects
from app.search.failures import FailureReader
from app.search.filters import InvalidFilter, Placed
from app.search.lineage import walk as lineage_walk
from app.search.model import MAX_PAGE_SIZE, REMOVED_FIELD, Criterion, TimeseriesQuery
from app.search.structured_properties import refuse_deleted_property_filters

router = APIRouter(tags=["search"], dependencies=[ALLOW_READ])

FILTER_PREFIX = "filter_"


def _entity_name(registry: EntityRegistry, name: str, path: str = "$entityName") -> str:
    with invalid_at(path):
        return registry.entity(name).name


# --- search -----------------------------------------------------------------------------------------------------


class ScrollResponse(BaseModel):
    scrollId: str | None = Field(None, description="Pass back as `scrollId` for the next page; absent on the last page")
    entities: list[ScrollEntity]
    totalCount: int | None = None


def _filters(request: Request) -> dict[str, list[str]]:
    filters: dict[str, list[str]] = {}
    for key, value in request.query_params.multi_items():
        if key.startswith(FILTER_PREFIX) and len(key) > len(FILTER_PREFIX):
            if "\x00" in key or "\x00" in value:
                raise ValidationFailed(
                    "a filter contains a NUL character (\\u0000)", [Issue("NUL character", path=f"${clip(key, 100)}")]
                )
            filters.setdefault(key[len(FILTER_PREFIX) :], []).append(value)
    return filters


@router.get(
    "/openapi/v3/entity/{entityName}",
    response_model=ScrollResponse,
    responses=ERROR_RESPONSES,
    summary="Search and scroll entities of one type (filters: filter_<field>=<value>)",
    description=(
        "Full-text search over the entity type's `Searchable` fields (`query=*` or empty: every entity). "
        "Filters on `addToFilters` fields as query parameters `filter_<filterName>=<value>` (repeat for OR within a "
        "field; fields AND). `sortCriteria` (repeatable) with `sortOrder` ASCENDING|DESCENDING; without it, by "
        "relevance. Soft-deleted entities (status.removed) are hidden unless `includeSoftDelete=true`."
    ),
)
async def scroll_entities(
    entityName: str,
    request: Request,
    registry: Registry,
    backend: Backend,
    reader: StoredEntities,
    query: Annotated[str, Query()] = "*",
    count: Annotated[int, Query(ge=0, le=MAX_PAGE_SIZE)] = 10,
    scrollId: Annotated[str | None, Query()] = None,
    sortCriteria: Annotated[list[str] | None, Query()] = None,
    sortOrder: Annotated[Literal["ASCENDING", "DESCENDING"], Query()] = "ASCENDING",
    aspects: Annotated[list[str] | None, Query()] = None,
    systemMetadata: Annotated[Flag, Query()] = False,
    includeSoftDelete: Annotated[Flag, Query()] = False,
) -> Any:
    entity = _entity_name(registry, entityName)
    for aspect in aspects or []:
        with invalid_at("$aspects", aspect=aspect):
            registry.aspect(entity, aspect)
    filters = _filters(request)
    if includeSoftDelete:
        # The backends hide soft-deleted entities unless the filters name `removed`; an empty list means "either".
        filters.setdefault(REMOVED_FIELD, [])
    order = "desc" if sortOrder == "DESCENDING" else "asc"
    sort = [(field, order) for field in sortCriteria] if sortCriteria else None
    if "\x00" in query or any("\x00" in field for field in sortCriteria or ()):
        raise ValidationFailed("the query contains a NUL character (\\u0000)", [Issue("NUL character", path="$query")])
    try:
        await refuse_deleted_property_filters(
            reader, (Placed((), Criterion(name, tuple(values))) for name, values in filters.items())
        )
    except InvalidFilter as error:
        raise ValidationFailed(str(error), [Issue(str(error), path=f"${FILTER_PREFIX}{error.found}")]) from None
    try:
        page = await backend.search(
            entity, query or "*", filters=filters, count=count, scroll_id=scrollId or None, sort=sort
        )
    except InvalidCursor as error:
        raise error.at("$scrollId") from None
    shown = [hit for hit in page.hits if includeSoftDelete or hit.fields.get(REMOVED_FIELD) is not True]
    found = await reader.latest_of_many([(hit.urn, aspects) for hit in shown])
    entities = []
    for hit in shown:
        row_entity: dict[str, Any] = {"urn": hit.urn}
        for row in found.get(hit.urn, ()):
            row_entity[row.aspect] = stored_envelope(row, systemMetadata)
        entities.append(row_entity)
    body: dict[str, Any] = {"entities": entities, "totalCount": page.total}
    if page.scroll_id:
        body["scrollId"] = page.scroll_id
    return body


class AutocompleteEntity(BaseModel):
    urn: str
    entityType: str
    score: float | None = None


class AutocompleteResponse(BaseModel):
    query: str
    suggestions: list[str]
    entities: list[AutocompleteEntity]


def _suggestion(prefix: str, fields: dict[str, Any], urn: str) -> str:
    wanted = prefix.lower()
    texts: list[str] = []
    for value in fields.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and not item.startswith("urn:li:"):
                texts.append(item)
    for text in texts:
        if text.lower().startswith(wanted):
            return text
    for text in texts:
        if wanted in text.lower():
            return text
    return urn


@router.get(
    "/openapi/v1/search/{entityName}/autocomplete",
    response_model=AutocompleteResponse,
    responses=ERROR_RESPONSES,
    summary="Autocomplete on the entity type's autocomplete fields",
)
async def autocomplete(
    entityName: str,
    registry: Registry,
    backend: Backend,
    query: Annotated[str, Query()] = "",
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
) -> Any:
    entity = _entity_name(registry, entityName)
    if "\x00" in query:
        raise ValidationFailed("the query contains a NUL character (\\u0000)", [Issue("NUL character", path="$query")])
    hits = await backend.autocomplete(entity, query, limit=limit)
    suggestions: list[str] = []
    for hit in hits:
        text = _suggestion(query, hit.fields, hit.urn)
        if text not in suggestions:
            suggestions.append(text)
    return {
        "query": query,
        "suggestions": suggestions,
        "entities": [{"urn": h.urn, "entityType": h.entity_type, "score": h.score} for h in hits],
    }


# --- relationships and lineage ------------------------------------------------------------------------------------


class RelationshipResponse(BaseModel):
    scrollId: str | None = None
    results: list[RelationshipItem]
    totalCount: int | None = None


@router.get(
    "/openapi/v3/relationship/{entityName}/{urn}",
    response_model=RelationshipResponse,
    response_model_exclude_none=True,
    responses=ERROR_RESPONSES,
    summary="Relationships of an entity, OUTGOING (it is the source) or INCOMING (it is the destination)",
)
async def relationships(
    entityName: str,
    urn: UrnPath,
    registry: Registry,
    backend: Backend,
    relationship_types: Annotated[list[str] | None, Query(alias="relationshipType[]")] = None,
    # also accepted without the brackets; documented once (both would be one identifier in a generated client)
    relationship_type: Annotated[list[str] | None, Query(alias="relationshipType", include_in_schema=False)] = None,
    direction: Annotated[Literal["INCOMING", "OUTGOING"], Query()] = "OUTGOING",
    count: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 100,
    scrollId: Annotated[str | None, Query()] = None,
) -> Any:
    _entity_name(registry, entityName)
    checked_urn(urn)
    types = (relationship_types or []) + (relationship_type or [])
    if any("\x00" in t for t in types):
        raise ValidationFailed(
            "relationshipType contains a NUL character (\\u0000)", [Issue("NUL character", path="$relationshipType")]
        )
    try:
        start = decode_offset(scrollId) if scrollId else 0
    except InvalidCursor as error:
        raise error.at("$scrollId") from None
    edges, total = await backend.relationships(urn, direction=direction, types=types or None, start=start, count=count)
    results = []
    for e in edges:
        item: dict[str, Any] = {
            "source": {"urn": e.source, "entityType": e.source_type},
            "destination": {"urn": e.destination, "entityType": e.destination_type},
            "relationshipType": e.relationship,
            "createdOn": e.created_on,
            "createdActor": e.created_actor,
            "updatedOn": e.updated_on,
            "updatedActor": e.updated_actor,
            "via": e.via,
            "properties": e.properties or None,
        }
        results.append(item)
    body: dict[str, Any] = {"results": results, "totalCount": total}
    if start + len(edges) < total and edges:
        body["scrollId"] = offset_cursor(start + len(edges))
    return body


class LineageEntity(BaseModel):
    urn: str
    entityType: str
    hop: int
    via: str | None = None


class LineageResponse(BaseModel):
    urn: str
    direction: Literal["UPSTREAM", "DOWNSTREAM"]
    entities: list[LineageEntity]


@router.get(
    "/openapi/v1/lineage/{urn}",
    response_model=LineageResponse,
    response_model_exclude_none=True,
    responses={**ERROR_RESPONSES, **CUT_RESPONSES},
    summary="Upstream or downstream lineage of an entity, up to maxHops",
    description="Walked hop by hop within the request's read budget (METALEDGER_READ_TIMEOUT_S, shortened by "
    f"`{DEADLINE_HEADER}`): cut by it, the hops it finished and `{PARTIAL_HEADER}: true`; nothing found within it: "
    "504 with Retry-After.",
)
async def lineage(
    urn: UrnPath,
    registry: Registry,
    backend: Backend,
    direction: Annotated[Literal["UPSTREAM", "DOWNSTREAM"], Query()] = "DOWNSTREAM",
    maxHops: Annotated[int, Query(ge=1, le=20)] = 3,
) -> Any:
    entity_of_urn(registry, urn)
    # the one walk every lineage surface reads (app.search.lineage): a job between two datasets is on it both ways
    # cut by the request's read budget: the hops it finished, and `X-Metaledger-Partial: true` (app.read_deadline)
    walked = await lineage_walk(backend, urn, direction=direction, max_hops=maxHops)
    entities = [{"urn": s.urn, "entityType": s.entity_type, "hop": s.degree, "via": s.edge.via} for s in walked.steps]
    return {"urn": urn, "direction": direction, "entities": entities}


# --- timeseries ---------------------------------------------------------------------------------------------------


def _timeseries_aspect(registry: EntityRegistry, entity_name: str, aspect: str) -> tuple[str, str]:
    entity = _entity_name(registry, entity_name)
    with invalid_at("$aspect", aspect=aspect):
        spec = registry.aspect(entity, aspect)
    if not spec.is_timeseries:
        raise ValidationFailed(
            f"aspect {aspect!r} is not a timeseries aspect",
            [Issue("not a timeseries aspect", aspect=aspect, path="$aspect")],
        )
    return entity, spec.name


class TimeseriesLatest(BaseModel):
    urn: str
    aspect: str
    timestampMillis: int
    value: dict[str, Any]
    systemMetadata: dict[str, Any] | None = None


@router.get(
    "/openapi/v1/timeseries/{entityName}/{aspect}/latest",
    response_model=TimeseriesLatest,
    response_model_exclude_none=True,
    responses=ERROR_RESPONSES,
    summary="The latest point of a timeseries aspect of an entity (e.g. the latest datasetProfile); 404 when none",
)
async def timeseries_latest(
    entityName: str,
    aspect: str,
    registry: Registry,
    backend: Backend,
    urn: UrnQuery,
) -> Any:
    _, aspect_name = _timeseries_aspect(registry, entityName, aspect)
    points = await backend.timeseries(TimeseriesQuery(urn=checked_urn(urn), aspect=aspect_name, limit=1))
    if not points:
        raise NotFound(f"no {aspect_name} points for {urn}", [Issue("not found", urn=urn, aspect=aspect_name)])
    p = points[0]
    return {
        "urn": urn,
        "aspect": aspect_name,
        "timestampMillis": p.timestamp_ms,
        "value": p.value,
        "systemMetadata": p.system_metadata,
    }


class DailyBucket(BaseModel):
    date: str = Field(description="UTC day, YYYY-MM-DD")
    startMillis: int
    count: int = Field(description="points that day")
    sum: float | None = Field(None, description="sum of `field` over the day's points (when `field` is given)")
    latest: float | None = Field(None, description="`field` of the day's latest point (when `field` is given)")


class DailyResponse(BaseModel):
    urn: str
    aspect: str
    field: str | None = None
    buckets: list[DailyBucket]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _path(value: dict[str, Any], field: str) -> Any:
    node: Any = value
    for part in field.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


@router.get(
    "/openapi/v1/timeseries/{entityName}/{aspect}/daily",
    response_model=DailyResponse,
    response_model_exclude_none=True,
    responses=ERROR_RESPONSES,
    summary="Daily aggregation of a timeseries aspect: points per UTC day, and the sum/latest of a numeric field",
    description="E.g. usage counts per day: `.../dataset/datasetUsageStatistics/daily?urn=...&field=totalSqlQueries`. "
    "`start`/`end`: epoch millis, inclusive. Days without points are omitted; oldest first.",
)
async def timeseries_daily(
    entityName: str,
    aspect: str,
    registry: Registry,
    backend: Backend,
    urn: Annotated[str, Query()],
    field: Annotated[str | None, Query()] = None,
    start: Annotated[int | None, Query()] = None,
    end: Annotated[int | None, Query()] = None,
) -> Any:
    _, aspect_name = _timeseries_aspect(registry, entityName, aspect)
    check_long(start, "start")
    check_long(end, "end")
    points = await backend.timeseries(
        TimeseriesQuery(urn=checked_urn(urn), aspect=aspect_name, start_ms=start, end_ms=end, limit=MAX_PAGE_SIZE * 10)
    )
    days: dict[str, dict[str, Any]] = {}
    for p in sorted(points, key=lambda p: p.timestamp_ms):
        try:
            day = datetime.fromtimestamp(p.timestamp_ms / 1000, tz=UTC).date()
        except (ValueError, OverflowError, OSError):
            continue  # a valid long, but not a day of years 1-9999: no bucket holds it
        key = day.isoformat()
        bucket = days.get(key)
        if bucket is None:
            midnight = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)
            bucket = days[key] = {"date": key, "startMillis": midnight, "count": 0}
            if field:
                bucket["sum"] = 0.0
        bucket["count"] += 1
        if field:
            number = _number(_path(p.value, field))
            if number is not None:
                bucket["sum"] += number
                bucket["latest"] = number
    return {"urn": urn, "aspect": aspect_name, "field": field, "buckets": list(days.values())}


# --- trace --------------------------------------------------------------------------------------------------------


class StorageStatus(BaseModel):
    writeStatus: Literal["ACTIVE_STATE", "PENDING", "NO_OP", "ERROR"]
    version: str | None = None
    writeMessage: str | None = Field(
        None, description="ERROR: why the search backend refused this version, its attempts and the next retry"
    )


class AspectTrace(BaseModel):
    primaryStorage: StorageStatus
    searchStorage: StorageStatus


class TraceResponse(BaseModel):
    urn: str
    aspects: dict[str, AspectTrace]


@router.get(
    "/openapi/v1/trace/write/{urn}",
    response_model=TraceResponse,
    response_model_exclude_none=True,
    responses=ERROR_RESPONSES,
    summary="Where a write stands: primary storage (the aspect store) and the search index",
    description="Per aspect (`aspect` repeatable; default every stored aspect): `primaryStorage.writeStatus` "
    "ACTIVE_STATE with the stored version; `searchStorage.writeStatus` ACTIVE_STATE when the index holds that "
    "version (or a newer one), PENDING when it does not yet, ERROR (with `writeMessage`: the reason, the attempts, "
    "the next retry) when the search backend refused that version (it is retried later), NO_OP for an aspect the "
    "index does not use.",
)
async def trace_write(
    urn: UrnPath,
    session: Session,
    registry: Registry,
    backend: Backend,
    reader: StoredEntities,
    aspect: Annotated[list[str] | None, Query()] = None,
) -> Any:
    entity = entity_of_urn(registry, urn)
    if any("\x00" in a for a in aspect or ()):
        raise ValidationFailed("aspect contains a NUL character (\\u0000)", [Issue("NUL character", path="$aspect")])
    rows = await reader.latest_of(urn, aspect)  # an entity the caller may not see has no stored aspects
    if not rows:
        raise NotFound(
            f"entity {urn} has no stored aspects" + (f" named {aspect}" if aspect else ""),
            [Issue("not found", urn=urn)],
        )
    indexed = await backend.document_versions(urn)
    failing = await FailureReader(session).of_urn(urn)  # change logs the search backend refused (app.search.failures)
    used, _ = indexed_aspects(registry, entity)  # the document's aspects, those with edges among them
    out: dict[str, Any] = {}
    for row in rows:
        stored = str((row.system_metadata or {}).get("version", "1"))
        primary = {"writeStatus": "ACTIVE_STATE", "version": stored}
        in_index = indexed.get(row.aspect)
        failure = failing.get(row.aspect)
        search: dict[str, str | None]
        if in_index is not None and int(in_index) >= int(stored):
            search = {"writeStatus": "ACTIVE_STATE", "version": str(in_index)}
        elif failure is not None and failure["version"] >= int(stored):
            search = {
                "writeStatus": "ERROR",
                "version": None if in_index is None else str(in_index),
                "writeMessage": (
                    f"the search backend refused version {failure['version']} "
                    f"({failure['attempts']} attempts since {failure['first_failed_at'].isoformat()}; "
                    f"next retry {failure['next_retry_at'].isoformat()}): {failure['reason']}"
                ),
            }
        elif in_index is None and used is not None and row.aspect not in used:
            search = {"writeStatus": "NO_OP"}
        else:
            search = {"writeStatus": "PENDING", "version": None if in_index is None else str(in_index)}
        out[row.aspect] = {"primaryStorage": primary, "searchStorage": search}
    return {"urn": urn, "aspects": out}
