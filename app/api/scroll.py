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

Scroll ids are keyset cursors (app.search.across for entities, the edge's key for edges): exact under concurrent
writes. Accepted and ignored (meaningless without Elasticsearch's point in time and cache): `pitKeepAlive`,
`skipCache`, `skipAggregation`, `scrollIdPerEntity`. `sliceId`/`sliceMax` are a 400 (slices would need a
partitioned cursor).
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import ALLOW_READ, Backend, Registry, Session, SettingsDep
from app.api.http import check_batch_size, invalid_at, json_response, read_json, stored_envelope
from app.api.search import RelationshipItem, ScrollEntity
from app.errors import ERROR_RESPONSES, Issue, ValidationFailed, clip
from app.registry import EntityRegistry
from app.search.across import TypeSearch, scroll_across
from app.search.model import (
    CONDITIONS, MAX_FILTER_VALUES, MAX_PATTERN_CHARS, Edge, EdgeQuery, criterion_problem, upstream_downstream,
)
from app.search.model import Criterion as SearchCriterion
from app.urns import InvalidUrnError, entity_type_of
from app.write.reader import EntityReader

log = logging.getLogger("metaledger.api.scroll")

router = APIRouter(tags=["scroll"], dependencies=[ALLOW_READ])

# DataHub's ceiling on a search page (Elasticsearch's index.max_result_window, 10,000); over it is a 400 naming it.
MAX_SCROLL_COUNT = 10_000
Count = Annotated[int, Query(ge=1, le=MAX_SCROLL_COUNT, description=f"Page size, 1..{MAX_SCROLL_COUNT}")]
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.@]{0,199}")


def _bad(message: str, path: str, found: Any = None, expected: str | None = None) -> ValidationFailed:
    shown = None if found is None else clip(found if isinstance(found, str) else orjson.dumps(found).decode(), 100)
    return ValidationFailed(message, [Issue(message, path=path, expected=expected, found=shown)])


def _strings(value: Any, path: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(f"{path[2:] or path} must be an array of strings", path, value)
    for position, item in enumerate(value):
        if "\x00" in item:
            raise _bad("a NUL character (\\u0000)", f"{path}[{position}]")
    return value


def _object(body: Any, fields: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object", "$", body)
    unknown = sorted(set(body) - fields)
    if unknown:
        raise _bad(f"unknown field {unknown[0]!r}", f"$.{unknown[0]}", expected=", ".join(sorted(fields)))
    return body


# DataHub's OpenAPI v3 spells two conditions its own way (its Criterion.Condition enum); both spellings are taken.
_CONDITION_ALIASES = {"STARTS_WITH": "START_WITH", "ENDS_WITH": "END_WITH"}
_FILTER_FORMS = '{"and": [{"criteria": [...]}, ...]}, {"or": [{"and": [...]}, ...]} or {"criteria": [...]}'


def _criterion(criterion: Any, where: str) -> SearchCriterion:
    """One criterion `{"field", "values" (or the deprecated "value"), "condition"?, "negated"?}`."""
    if not isinstance(criterion, dict):
        raise _bad("a criterion is {\"field\", \"values\", \"condition\"?, \"negated\"?}", where, criterion)
    field = criterion.get("field")
    if not isinstance(field, str) or not _FIELD_NAME.fullmatch(field):
        raise _bad("not a field name", f"{where}.field", field)
    condition = criterion.get("condition") or "EQUAL"
    if not isinstance(condition, str):
        raise _bad("a condition is a string", f"{where}.condition", condition, ", ".join(sorted(CONDITIONS)))
    condition = _CONDITION_ALIASES.get(condition, condition)
    negated = criterion.get("negated") or False
    if not isinstance(negated, bool):
        raise _bad("negated must be true or false", f"{where}.negated", negated)
    values = criterion.get("values")
    if values is None and isinstance(criterion.get("value"), str):
        values = [criterion["value"]]
    elif values is None and condition == "EXISTS":
        values = []
    values = _strings(values, f"{where}.values")
    problem = criterion_problem(condition, values)
    if problem is not None:
        if problem.value is None:
            raise _bad(f"field {clip(field, 100)!r}: {problem.message}", f"{where}.condition", condition, problem.expected)
        raise _bad(f"field {clip(field, 100)!r}: {problem.message}", f"{where}.values[{problem.value}]",
                   values[problem.value], problem.expected)
    if field.endswith(".keyword"):  # DataHub's exact sub-field; metaledger's filters are exact already
        field = field[: -len(".keyword")]
    return SearchCriterion(field, tuple(values), negated, "EQUAL" if condition == "IN" else condition)


def _filter_groups(filter_: Any, path: str) -> list[list[tuple[str, SearchCriterion]]]:
    """A filter as an OR of AND groups of (where, criterion). DataHub's OpenAPI v3 filter (what the SDK sends) is
    `{"and": [{"criteria": [...]}, ...]}`: despite the name, an OR of its clauses, each an AND of its criteria.
    Its Rest.li `Filter` shapes are taken too: `{"or": [{"and": [...]}, ...]}` and the deprecated
    `{"criteria": [...]}` (one AND). No groups (`{}`, `{"and": null}`, `{"and": []}`, no filter): no condition."""
    if filter_ is None:
        return []
    given = {key: value for key, value in filter_.items() if value is not None} if isinstance(filter_, dict) else None
    if given is None or len(given) > 1 or set(given) - {"and", "or", "criteria"}:
        raise _bad(f"a filter is one of {_FILTER_FORMS}", path, filter_)
    if not given:
        return []
    form, items = next(iter(given.items()))
    if not isinstance(items, list):
        raise _bad(f"`{form}` must be an array", f"{path}.{form}", items)
    if form == "criteria":
        clauses = [(f"{path}.criteria", items)]
    else:
        inner = "criteria" if form == "and" else "and"
        clauses = []
        for position, clause in enumerate(items):
            where = f"{path}.{form}[{position}]"
            criteria = clause.get(inner) if isinstance(clause, dict) else None
            if not isinstance(criteria, list):
                raise _bad(f"a clause is {{\"{inner}\": [...]}}", where, clause)
            clauses.append((f"{where}.{inner}", criteria))
    values = sum(len(c.get("values") or ()) for _, criteria in clauses for c in criteria
                 if isinstance(c, dict) and isinstance(c.get("values"), list))
    if values > MAX_FILTER_VALUES:
        raise _bad(f"the filter carries {values} values; the limit is {MAX_FILTER_VALUES}", path)
    return [[(f"{where}[{position}]", _criterion(criterion, f"{where}[{position}]"))
             for position, criterion in enumerate(criteria)] for where, criteria in clauses]


def _conjunction(filter_: Any, path: str) -> list[tuple[str, str, list[str]]]:
    """A relationship scroll's filter: one clause of EQUAL/IN criteria, as (where, field, values); every other
    form is a 400 naming where it is."""
    groups = _filter_groups(filter_, path)
    if len(groups) > 1:
        form = next(key for key, value in filter_.items() if value is not None)
        raise _bad("an OR of several clauses is not supported here: send one clause", f"{path}.{form}[1]")
    out: list[tuple[str, str, list[str]]] = []
    for where, criterion in groups[0] if groups else ():
        if criterion.condition != "EQUAL":
            raise _bad(f"condition {criterion.condition} is not supported here", f"{where}.condition",
                       criterion.condition, "EQUAL or IN")
        if criterion.negated:
            raise _bad("negated criteria are not supported here", f"{where}.negated", True)
        out.append((where, criterion.field, list(criterion.values)))
    return out


# --- entities -----------------------------------------------------------------------------------------------------


class SortCriterion(BaseModel):
    field: str
    order: Literal["ASCENDING", "DESCENDING"] = "ASCENDING"


class Criterion(BaseModel):
    field: str = Field(description="A filter or document field (`urn` and `removed` included); a `.keyword` suffix is dropped")
    values: list[str] | None = Field(None, description="Any one of them matches (not needed for EXISTS)")
    value: str | None = Field(None, deprecated=True, description="DataHub's deprecated single value, read when `values` is absent")
    condition: Literal[
        "EQUAL", "IN", "IEQUAL", "CONTAIN", "START_WITH", "STARTS_WITH", "END_WITH", "ENDS_WITH", "EXISTS",
        "GREATER_THAN", "GREATER_THAN_OR_EQUAL_TO", "LESS_THAN", "LESS_THAN_OR_EQUAL_TO",
    ] = Field("EQUAL", description=(
        "EQUAL/IN: the field has one of the values (exact). IEQUAL: the same, case-insensitively. CONTAIN, "
        "START_WITH, END_WITH (also spelled STARTS_WITH, ENDS_WITH, as DataHub's v3 enum has them): a string value "
        "contains, starts or ends with one of the values, case-insensitively, every character literal (at most "
        f"{MAX_PATTERN_CHARS} characters). EXISTS: the field has a value. GREATER_THAN, ...: a number (datetimes: "
        "epoch milliseconds) compares numerically with the numeric values, a string as text with every value. A "
        "field holding an array matches when one of its elements does. Values are trimmed except for EQUAL/IN. "
        "DESCENDANTS_INCL, ANCESTORS_INCL and RELATED_INCL are a 400."
    ))
    negated: bool = Field(False, description="The criterion must not hold (entities without the field included)")


class ConjunctiveCriterion(BaseModel):
    criteria: list[Criterion] = Field(description="Every criterion must hold (AND)")


class AndCriteria(BaseModel):
    and_: list[Criterion] = Field(alias="and", description="Every criterion must hold (AND)")


class Filter(BaseModel):
    model_config = ConfigDict(json_schema_extra={"description": (
        "DataHub's v3 filter, exactly one of: `and` (what DataHub's OpenAPI v3 and its SDK send; despite the name, "
        "an OR of its clauses, each an AND of its `criteria`), `or` (DataHub's Rest.li Filter: an OR of `and` "
        f"clauses) or `criteria` (deprecated by DataHub: one AND). At most {MAX_FILTER_VALUES} values in all. The "
        "relationship scroll's filters take one clause of EQUAL/IN `urn` criteria."
    )})
    and_: list[ConjunctiveCriterion] | None = Field(None, alias="and", description="OR of these clauses")
    or_: list[AndCriteria] | None = Field(None, alias="or", description="OR of these clauses")
    criteria: list[Criterion] | None = Field(None, deprecated=True, description="One AND clause")


class ScrollEntitiesBody(BaseModel):
    entities: list[str] | None = Field(None, description="Entity types; absent: every type")
    aspects: list[str] | None = Field(None, description="Aspects to return; absent: URNs only; []: every aspect")
    filter: Filter | None = Field(None, description="Which entities: an OR of AND clauses of criteria (Filter)")
    sortCriteria: list[SortCriterion] | None = None


class ScrollEntitiesResponse(BaseModel):
    scrollId: str | None = Field(None, description="Pass back as `scrollId` for the next page; absent on the last page")
    entities: list[ScrollEntity]
    totalCount: int


def _entity_types(registry: EntityRegistry, names: Any) -> list[str]:
    if names is None:
        return list(registry.entities)
    types: list[str] = []
    for position, name in enumerate(_strings(names, "$.entities")):
        with invalid_at(f"$.entities[{position}]"):
            resolved = registry.entity(name).name
        if resolved not in types:
            types.append(resolved)
    if not types:
        raise _bad("entities is empty: name at least one entity type, or leave it out for every type", "$.entities")
    return types


def _aspects(registry: EntityRegistry, types: list[str], names: Any) -> list[str] | None:
    if names is None:
        return None
    known = {a for t in types for a in registry.entities[t].aspect_names}
    for position, name in enumerate(_strings(names, "$.aspects")):
        if name not in known:
            raise _bad(f"aspect {clip(name, 100)!r} is not an aspect of {', '.join(types[:5])}"
                       f"{'...' if len(types) > 5 else ''}", f"$.aspects[{position}]", name)
    return list(names)


def _sort(body_criteria: Any, fields: list[str] | None, sort: str, order: str) -> list[tuple[str, str]]:
    """DataHub's precedence: the body's `sortCriteria`, else the `sortCriteria` parameters (each in `sortOrder`),
    else `sort` (default `urn`). Each as (field, order, where the field is, where the order is)."""
    given: list[tuple[Any, Any, str, str]]
    if body_criteria is not None:
        if not isinstance(body_criteria, list):
            raise _bad("sortCriteria must be an array of {\"field\", \"order\"?}", "$.sortCriteria", body_criteria)
        given = []
        for position, item in enumerate(body_criteria):
            where = f"$.sortCriteria[{position}]"
            if not isinstance(item, dict):
                raise _bad("a sort criterion is {\"field\", \"order\"?}", where, item)
            given.append((item.get("field"), item.get("order") or "ASCENDING", f"{where}.field", f"{where}.order"))
    elif fields:
        given = [(field, order, f"$sortCriteria[{position}]", "$sortOrder") for position, field in enumerate(fields)]
    else:
        given = [(sort, order, "$sort", "$sortOrder")]
    out = []
    for field, direction, field_path, order_path in given:
        if not isinstance(field, str) or not _FIELD_NAME.fullmatch(field):
            raise _bad("not a field to sort on", field_path, field)
        if direction not in ("ASCENDING", "DESCENDING"):
            raise _bad("a sort order is ASCENDING or DESCENDING", order_path, direction, "ASCENDING or DESCENDING")
        out.append((field, "desc" if direction == "DESCENDING" else "asc"))
    return out


def _refuse_slices(slice_id: int | None, slice_max: int | None) -> None:
    if slice_id is not None or slice_max is not None:
        raise _bad("sliced scrolls are not supported: scroll without sliceId/sliceMax",
                   "$sliceId" if slice_id is not None else "$sliceMax")


@router.post(
    "/openapi/v3/entity/scroll",
    response_model=ScrollEntitiesResponse,
    responses=ERROR_RESPONSES,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ScrollEntitiesBody"}}}}},
    summary="Scroll entities of several types (DataHub's POST /openapi/v3/entity/scroll)",
    description=(
        "Pages through the entities of the body's `entities` types (default: every type) matching `query` and "
        "`filter`, type after type, each in `sortCriteria` order (default: by URN). `scrollId` is a keyset cursor: "
        "an entity that matches throughout the scroll and keeps its sort key is returned exactly once, whatever is "
        f"written meanwhile. `count` is at most {MAX_SCROLL_COUNT}. Soft-deleted entities are left out unless "
        "`includeSoftDelete=true`."
    ),
)
async def scroll_entities(
    request: Request, session: Session, registry: Registry, backend: Backend, settings: SettingsDep,
    count: Count = 10,
    query: Annotated[str, Query()] = "*",
    scrollId: Annotated[str | None, Query()] = None,
    sort: Annotated[str, Query(description="Deprecated by DataHub: use sortCriteria")] = "urn",
    sortCriteria: Annotated[list[str] | None, Query()] = None,
    sortOrder: Annotated[str, Query()] = "ASCENDING",
    systemMetadata: Annotated[bool, Query()] = False,
    includeSoftDelete: Annotated[bool, Query()] = False,
    skipCache: Annotated[bool, Query(description="Accepted; there is no cache")] = False,
    skipAggregation: Annotated[bool, Query(description="Accepted; scrolls never aggregate")] = True,
    scrollIdPerEntity: Annotated[bool, Query(description="Accepted; ignored")] = False,
    sliceId: Annotated[int | None, Query(description="Not supported")] = None,
    sliceMax: Annotated[int | None, Query(description="Not supported")] = None,
    pitKeepAlive: Annotated[str | None, Query(description="Accepted; ignored: cursors need no point in time")] = "5m",
) -> Response:
    body = _object(await read_json(request, settings), {"entities", "aspects", "aspectNames", "filter", "sortCriteria"})
    _refuse_slices(sliceId, sliceMax)
    if "\x00" in query:
        raise _bad("a NUL character (\\u0000)", "$query")
    types = _entity_types(registry, body.get("entities"))
    aspects = _aspects(registry, types, body["aspects"] if "aspects" in body else body.get("aspectNames"))
    sort_by = _sort(body.get("sortCriteria"), sortCriteria, sort, sortOrder)
    # The body's OR of AND groups, the same in every type (the backends hide soft-deleted entities unless asked:
    # `include_removed`, or a criterion on `removed`).
    groups = _filter_groups(body.get("filter"), "$.filter")
    any_of = tuple(tuple(criterion for _, criterion in group) for group in groups) or None
    searches = [TypeSearch(entity_type, any_of, include_removed=includeSoftDelete) for entity_type in types]
    page = await scroll_across(backend, searches, query or "*", count=count, scroll_id=scrollId or None, sort=sort_by)
    entities: list[dict[str, Any]] = [{"urn": hit.urn} for hit in page.hits]
    if aspects is not None:
        wanted = [(e["urn"], aspects or None) for e in entities]
        found = await EntityReader(session, registry).repo.entities_latest(wanted)
        for entity in entities:
            for row in found.get(entity["urn"], ()):
                entity[row.aspect] = stored_envelope(row, systemMetadata)
    log.debug("entity scroll page", extra={"types": len(types), "count": count, "hits": len(entities), "more": page.scroll_id is not None})
    out: dict[str, Any] = {"entities": entities, "totalCount": page.total}
    if page.scroll_id:
        out["scrollId"] = page.scroll_id
    return json_response(out)


# --- relationships and lineage -------------------------------------------------------------------------------------


class ScrollRelationshipsBody(BaseModel):
    sourceFilter: Filter | None = Field(None, description="One clause with one `urn` criterion (EQUAL/IN) on the source")
    destinationFilter: Filter | None = Field(None, description="One clause with one `urn` criterion (EQUAL/IN) on the destination")
    edgeFilter: Filter | None = Field(None, description="Not supported: absent or empty")


class ScrollLineageBody(BaseModel):
    urns: list[str] | None = Field(None, description="Anchors: edges with one of them at either end; absent: every lineage edge")


class RelationshipsPage(BaseModel):
    scrollId: str | None = None
    results: list[RelationshipItem]


class LineageItem(RelationshipItem):
    upstream: str
    downstream: str


class LineagePage(BaseModel):
    scrollId: str | None = None
    results: list[LineageItem]


def _edge_cursor(scroll_id: str | None) -> tuple[str, str, str, str] | None:
    """An edge scroll id is URL-safe base64 of the last edge's key [source, aspect, relationship, destination]."""
    if not scroll_id:
        return None
    try:
        key = orjson.loads(base64.urlsafe_b64decode(scroll_id + "=" * (-len(scroll_id) % 4)))
    except (binascii.Error, ValueError):
        key = None
    if (len(scroll_id) > 16_384 or not isinstance(key, list) or len(key) != 4
            or not all(isinstance(k, str) and "\x00" not in k for k in key)):
        raise _bad("scrollId is not one this scroll returned", "$scrollId", scroll_id, "the scrollId of a previous page")
    return tuple(key)  # type: ignore[return-value]


def _edge_scroll_id(after: tuple[str, str, str, str] | None) -> str | None:
    return base64.urlsafe_b64encode(orjson.dumps(list(after))).decode().rstrip("=") if after else None


def _urn_criteria(filter_: Any, path: str) -> list[str]:
    """The URNs a source/destination filter allows (empty: any): its one `urn` criterion's values."""
    criteria = _conjunction(filter_, path)
    for position, (where, field, _) in enumerate(criteria):
        if field != "urn" or position > 0:
            raise _bad("only one `urn` criterion is supported here", f"{where}.field", field)
    if not criteria:
        return []
    where, _, urns = criteria[0]
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
    for key, value in (("createdOn", edge.created_on), ("createdActor", edge.created_actor), ("updatedOn", edge.updated_on),
                       ("updatedActor", edge.updated_actor), ("via", edge.via), ("properties", edge.properties or None)):
        if value is not None:
            item[key] = value
    return item


def _types(values: list[str] | None, path: str) -> tuple[str, ...]:
    return tuple(_strings(values or [], path))


@router.post(
    "/openapi/v3/relationship/scroll",
    response_model=RelationshipsPage,
    response_model_exclude_none=True,
    responses=ERROR_RESPONSES,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ScrollRelationshipsBody"}}}}},
    summary="Scroll relationships of every entity (DataHub's POST /openapi/v3/relationship/scroll)",
    description=(
        "Edges in key order, filtered by relationship, source and destination types and the source/destination "
        "URNs of the body's filters. OUTGOING (default): the filters' source is the edge's source; INCOMING: roles "
        "swapped. `scrollId` is a keyset cursor: an edge that exists throughout the scroll is returned once."
    ),
)
async def scroll_relationships(
    request: Request, backend: Backend, settings: SettingsDep,
    relationshipTypes: Annotated[list[str] | None, Query()] = None,
    sourceTypes: Annotated[list[str] | None, Query()] = None,
    destinationTypes: Annotated[list[str] | None, Query()] = None,
    direction: Annotated[Literal["OUTGOING", "INCOMING"], Query()] = "OUTGOING",
    count: Count = 10,
    scrollId: Annotated[str | None, Query()] = None,
    includeSoftDelete: Annotated[bool, Query(description="Accepted; edges of soft-deleted entities are kept")] = False,
    sliceId: Annotated[int | None, Query(description="Not supported")] = None,
    sliceMax: Annotated[int | None, Query(description="Not supported")] = None,
    pitKeepAlive: Annotated[str | None, Query(description="Accepted; ignored")] = "5m",
) -> Response:
    body = _object(await read_json(request, settings), {"sourceFilter", "destinationFilter", "edgeFilter"})
    _refuse_slices(sliceId, sliceMax)
    edge_criteria = _conjunction(body.get("edgeFilter"), "$.edgeFilter")
    if edge_criteria:
        raise _bad("edgeFilter criteria are not supported", edge_criteria[0][0])
    sources = _urn_criteria(body.get("sourceFilter"), "$.sourceFilter")
    destinations = _urn_criteria(body.get("destinationFilter"), "$.destinationFilter")
    check_batch_size(sources + destinations, settings, "$.sourceFilter", what="URNs")
    source_types, destination_types = _types(sourceTypes, "$sourceTypes"), _types(destinationTypes, "$destinationTypes")
    if direction == "INCOMING":  # the filters' source is the entity the edge comes into
        sources, destinations = destinations, sources
        source_types, destination_types = destination_types, source_types
    edge_query = EdgeQuery(
        relationship_types=_types(relationshipTypes, "$relationshipTypes"), source_types=source_types,
        destination_types=destination_types, source_urns=tuple(sources), destination_urns=tuple(destinations),
    )
    page = await backend.scroll_edges(edge_query, after=_edge_cursor(scrollId), count=count)
    out: dict[str, Any] = {"results": [_edge_item(e) for e in page.edges]}
    if page.after:
        out["scrollId"] = _edge_scroll_id(page.after)
    return json_response(out)


@router.post(
    "/openapi/v3/lineage/scroll",
    response_model=LineagePage,
    response_model_exclude_none=True,
    responses=ERROR_RESPONSES,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ScrollLineageBody"}}}}},
    summary="Scroll lineage edges touching a set of URNs (DataHub's POST /openapi/v3/lineage/scroll)",
    description=(
        "Lineage edges with one of the body's `urns` at either end (absent: every lineage edge), each with its "
        "`upstream` and `downstream` URN. `direction` keeps, after the page is read, the edges running that way "
        "from an anchor (UPSTREAM: the anchor is the downstream end), so a page may hold fewer than `count`: "
        "scroll until there is no `scrollId`."
    ),
)
async def scroll_lineage(
    request: Request, backend: Backend, settings: SettingsDep,
    relationshipTypes: Annotated[list[str] | None, Query()] = None,
    direction: Annotated[Literal["UPSTREAM", "DOWNSTREAM"] | None, Query()] = None,
    count: Count = 10,
    scrollId: Annotated[str | None, Query()] = None,
    includeSoftDelete: Annotated[bool, Query(description="Accepted; edges of soft-deleted entities are kept")] = False,
    sliceId: Annotated[int | None, Query(description="Not supported")] = None,
    sliceMax: Annotated[int | None, Query(description="Not supported")] = None,
    pitKeepAlive: Annotated[str | None, Query(description="Accepted; ignored")] = "5m",
) -> Response:
    body = _object(await read_json(request, settings), {"urns"})
    _refuse_slices(sliceId, sliceMax)
    anchors = _strings(body.get("urns") or [], "$.urns")
    check_batch_size(anchors, settings, "$.urns", what="URNs")
    for position, urn in enumerate(anchors):
        with invalid_at(f"$.urns[{position}]", urn=urn):
            entity_type_of(urn)
    edge_query = EdgeQuery(
        relationship_types=_types(relationshipTypes, "$relationshipTypes"), either_urns=tuple(anchors), lineage_only=True,
    )
    page = await backend.scroll_edges(edge_query, after=_edge_cursor(scrollId), count=count)
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
        out["scrollId"] = _edge_scroll_id(page.after)
    return json_response(out)


# --- v2 batch get ---------------------------------------------------------------------------------------------------


class BatchGetUrnRequestV2(BaseModel):
    urns: list[str]
    aspectNames: list[str] = Field(default_factory=list, description="Aspects to return; empty: every aspect")
    withSystemMetadata: bool = False


class GenericEntityV2(BaseModel):
    urn: str
    aspects: dict[str, Any] = Field(description="aspect name -> {\"value\", \"systemMetadata\"?}")


class BatchGetUrnResponseV2(BaseModel):
    entities: list[GenericEntityV2]


@router.post(
    "/openapi/v2/entity/batch/{entityName}",
    response_model=BatchGetUrnResponseV2,
    responses=ERROR_RESPONSES,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/BatchGetUrnRequestV2"}}}}},
    summary="Get a batch of entities (DataHub's v2 batch get)",
    description="One entity per requested URN (in request order, once each), with the named aspects (all when "
    "`aspectNames` is empty) it has; `aspects` is empty for an entity with none of them.",
)
async def batch_get_v2(entityName: str, request: Request, session: Session, registry: Registry, settings: SettingsDep) -> Response:
    body = _object(await read_json(request, settings), {"urns", "aspectNames", "withSystemMetadata"})
    with invalid_at("$entityName"):
        entity = registry.entity(entityName).name
    if "urns" not in body:
        raise _bad("urns is required", "$.urns")
    urns = list(dict.fromkeys(_strings(body["urns"], "$.urns")))
    check_batch_size(urns, settings, "$.urns", what="URNs")
    for position, urn in enumerate(urns):
        try:
            entity_type_of(urn)
        except InvalidUrnError as error:
            raise ValidationFailed(str(error), [Issue(str(error), urn=urn, path=f"$.urns[{position}]")]) from None
    aspects = _strings(body.get("aspectNames") or [], "$.aspectNames")
    for position, aspect in enumerate(aspects):
        with invalid_at(f"$.aspectNames[{position}]", aspect=aspect):
            registry.aspect(entity, aspect)
    with_sm = body.get("withSystemMetadata", False)
    if not isinstance(with_sm, bool):
        raise _bad("withSystemMetadata must be true or false", "$.withSystemMetadata", with_sm)
    found = await EntityReader(session, registry).repo.entities_latest([(urn, aspects or None) for urn in urns])
    entities = [
        {"urn": urn, "aspects": {row.aspect: stored_envelope(row, with_sm) for row in found.get(urn, ())}}
        for urn in urns
    ]
    return json_response({"entities": entities})
