"""DataHub's MCP tools (mcp-server-datahub 0.8.0's names, parameters, defaults and answers), each running DataHub's
GraphQL operation in-process as the caller (app.mcp.call.ToolCall.graphql), or metaledger's services where GraphQL
has no operation for it yet (aspect history, documents).

Where DataHub's tool cuts a list silently (its search caps `num_results` at 50 and says nothing: mcp-server-datahub
#215), these say so: every list answer carries its `total`, and when a limit cut it `truncated: true` with the
`nextOffset` to continue from (app.mcp.tools.Page)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StringConstraints, WithJsonSchema

from app.auth.model import Permission
from app.errors import Issue, NotFound, ValidationFailed
from app.graphql.curation import DESCRIPTION_ASPECTS, SYSTEM_OWNERSHIP_PREFIX, SYSTEM_OWNERSHIP_TYPES
from app.limits import clip
from app.mcp.call import ToolCall, operation
from app.mcp.filters import Criterion, or_filters, parse_filter
from app.mcp.tools import MAX_TEXT, MAX_URN, MAX_URNS, Page, ToolError, ToolInput, tool
from app.timeline.repository import TimelineRepository
from app.urns import InvalidUrnError, entity_type_of
from app.write.proposal import ChangeType, Draft

Urn = Annotated[str, StringConstraints(min_length=1, max_length=MAX_URN)]


def _coerce_list(value: Any) -> Any:
    """What agents send for a list, as DataHub's tools take it (arg_validation): a JSON array in a string parsed,
    `""` and `"null"` as absent."""
    if isinstance(value, str):
        text = value.strip()
        if text in ("", "null"):
            return None
        if text.startswith("["):
            try:
                return json.loads(text)
            except ValueError:
                return value
    return value


def _as_list(value: Any) -> Any:
    """A list argument DataHub's tools also take as one string (`urns`, `aspect_names`, `keywords`)."""
    value = _coerce_list(value)
    return [value] if isinstance(value, str) else value


Urns = Annotated[list[Urn], Field(min_length=1, max_length=MAX_URNS), BeforeValidator(_coerce_list)]
# DataHub's StrListOrStr: an array in the schema; a single URN is taken too (and answered as one entity)
UrnsOrUrn = Annotated[
    Annotated[list[Urn], Field(min_length=1, max_length=MAX_URNS)] | Urn,
    BeforeValidator(_coerce_list),
    WithJsonSchema({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_URNS}),
]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
MAX_SEARCH_RESULTS = 50  # DataHub's tool's cap, kept; a cut page says so
MAX_LINEAGE_RESULTS = 100
ENTITY_FIELDS = 100  # schema fields get_entities shows; list_schema_fields pages through the rest


def clean(response: Any) -> Any:
    """DataHub's clean_gql_response: no `__typename`, nulls, empty lists or empty objects."""
    if isinstance(response, dict):
        cleaned = {}
        for key, value in response.items():
            if key == "__typename" or value is None or value == []:
                continue
            value = clean(value)
            if value is not None and value != {}:
                cleaned[key] = value
        return cleaned
    if isinstance(response, list):
        return [clean(item) for item in response]
    return response


def _entity_type(urn: str, path: str) -> str:
    try:
        return entity_type_of(urn)
    except InvalidUrnError:
        raise ValidationFailed(
            f"{clip(urn, 100)} is not a URN", [Issue("not a URN", path=path, found=clip(urn, 200))]
        ) from None


def _schema_field_urn(urn: str, column: str | None) -> str:
    return urn if not column else f"urn:li:schemaField:({urn},{column})"


# --- search ------------------------------------------------------------------------------------------------------


class SearchInput(ToolInput):
    query: Text = Field("*", description="The search query; `/q <query>` for DataHub's structured query syntax")
    filter: Text | None = Field(
        None,
        description="SQL-like filter: `entity_type = dataset AND platform IN (snowflake, bigquery)`, `tag = "
        "urn:li:tag:PII`, `owner IS NULL`, `NOT env = DEV`; fields entity_type, entity_subtype, platform, domain, "
        "container, tag, glossary_term, owner, env, status, deprecated, structuredProperties.<name>",
    )
    num_results: int = Field(
        10,
        ge=0,
        le=10_000,
        description="Results per page (at most 50: a larger page is cut, and says so); 0 for facets only",
    )
    sort_by: Text | None = Field(None, description="A field to sort by (default: relevance)")
    sort_order: Literal["asc", "desc"] | None = Field("desc", description="asc or desc")
    offset: int = Field(0, ge=0, le=10_000, description="Where the page starts")


@tool(
    "search",
    SearchInput,
    "Search across DataHub entities (datasets, dashboards, charts, users, domains, glossary terms, ...) with "
    "structured full-text search: start queries with /q (`/q user+transaction`, `/q tag:PII`, `/q revenue*`, `/q "
    "(sales OR revenue) AND quarterly`). Results are ordered by relevance. Pages: `num_results` (at most 50) and "
    "`offset`; the answer's `total`, and `truncated`/`nextOffset` when more results are left. `num_results=0` "
    "returns only the facets (the tags, terms, platforms and domains in use). Then get_entities on the results.",
)
async def search(call: ToolCall, arguments: SearchInput) -> Any:
    asked = arguments.num_results
    count = min(asked, MAX_SEARCH_RESULTS)
    sort_by = arguments.sort_by
    variables: dict[str, Any] = {
        "query": arguments.query,
        "types": None,
        "orFilters": or_filters(parse_filter(arguments.filter)),
        "count": max(count, 1),
        "start": arguments.offset,
        "viewUrn": None,
    }
    if sort_by is not None and sort_by.strip().lower() != "relevance":
        order = "ASCENDING" if arguments.sort_order == "asc" else "DESCENDING"
        variables["sortInput"] = {"sortCriteria": [{"field": sort_by, "sortOrder": order}]}
    data = await call.graphql(operation("search.gql"), variables, "search")
    result = data["searchAcrossEntities"] or {}
    returned = len(result.get("searchResults") or []) if count else 0
    if count == 0:
        result.pop("searchResults", None)
        result.pop("count", None)
    cut_by = f"num_results is at most {MAX_SEARCH_RESULTS}" if asked > MAX_SEARCH_RESULTS else None
    page = Page(result.get("total") or 0, returned, arguments.offset, cut_by if count else None)
    return {**clean(result), **page.to_json()}


# --- entities ----------------------------------------------------------------------------------------------------


class EntitiesInput(ToolInput):
    urns: UrnsOrUrn = Field(
        description="The URNs of the entities (pass several at once: 3-10 search results to compare)"
    )


def _cut_schema(entity: dict[str, Any]) -> dict[str, Any]:
    fields = (entity.get("schemaMetadata") or {}).get("fields")
    if isinstance(fields, list) and len(fields) > ENTITY_FIELDS:
        entity["schemaMetadata"]["fields"] = fields[:ENTITY_FIELDS]
        entity["schemaFieldsTruncated"] = {
            **Page(len(fields), ENTITY_FIELDS, 0, f"get_entities shows {ENTITY_FIELDS} fields").to_json(),
            "message": "use list_schema_fields for the others",
        }
    return entity


async def _entity(call: ToolCall, urn: str) -> dict[str, Any] | None:
    if urn.startswith("urn:li:query:"):
        data = await call.graphql(operation("query_entity.gql"), {"urn": urn}, "GetQueryEntity")
    else:
        data = await call.graphql(operation("entity_details.gql"), {"urn": urn}, "GetEntity")
    return data.get("entity")


@tool(
    "get_entities",
    EntitiesInput,
    "Get detailed information about one or more entities by their DataHub URNs: description, owners, tags, "
    "glossary terms, domain, deprecation, structured properties, schema fields (the first 100: list_schema_fields "
    "pages through the rest) and more; the fields vary with the entity type. Supports all entity types (datasets, "
    "dashboards, charts, users, groups, queries, ...). An entity that does not exist answers `{urn, error}`.",
)
async def get_entities(call: ToolCall, arguments: EntitiesInput) -> Any:
    single = isinstance(arguments.urns, str)
    urns = [arguments.urns] if isinstance(arguments.urns, str) else arguments.urns
    results: list[dict[str, Any]] = []
    for index, raw in enumerate(urns):
        urn = raw.strip()
        _entity_type(urn, "$.arguments.urns" if single else f"$.arguments.urns[{index}]")
        entity = await _entity(call, urn) if await call.reader.exists(urn) else None
        if entity is None and single:
            raise NotFound(f"Entity {urn} not found", [Issue("not found", urn=urn, path="$.arguments.urns")])
        results.append(_cut_schema(clean(entity)) if entity else {"error": f"Entity {urn} not found", "urn": urn})
    return results[0] if single else results


class SchemaFieldsInput(ToolInput):
    urn: Urn = Field(description="Dataset URN")
    keywords: Annotated[list[Annotated[str, StringConstraints(max_length=200)]] | None, BeforeValidator(_as_list)] = (
        Field(
            None,
            max_length=50,
            description="Keywords (any of them): fields whose path, description, tags or terms hold one come first, "
            "by how many they hold",
        )
    )
    limit: int = Field(100, ge=1, le=1000, description="At most this many fields")
    offset: int = Field(0, ge=0, description="Fields to skip")


def _field_texts(field: dict[str, Any]) -> list[str]:
    texts = [field.get("fieldPath") or "", field.get("description") or "", field.get("label") or ""]
    for tag in ((field.get("tags") or {}).get("tags")) or []:
        texts.append(((tag.get("tag") or {}).get("properties") or {}).get("name") or "")
    for term in ((field.get("glossaryTerms") or {}).get("terms")) or []:
        texts.append(((term.get("term") or {}).get("properties") or {}).get("name") or "")
    return [t.lower() for t in texts if t]


@tool(
    "list_schema_fields",
    SchemaFieldsInput,
    "List a dataset's schema fields, with optional keyword filtering (OR: matching fields first, by match count) "
    "and paging (`limit`, `offset`). Answers `fields`, `totalFields`, `returned`, `remainingCount`, `matchingCount` "
    "(with keywords), and `truncated`/`nextOffset` while fields are left.",
)
async def list_schema_fields(call: ToolCall, arguments: SchemaFieldsInput) -> Any:
    urn = arguments.urn.strip()
    _entity_type(urn, "$.arguments.urn")
    entity = await _entity(call, urn) if await call.reader.exists(urn) else None
    if entity is None:
        raise NotFound(f"Entity {urn} not found", [Issue("not found", urn=urn, path="$.arguments.urn")])
    fields: list[dict[str, Any]] = list(((entity.get("schemaMetadata") or {}).get("fields")) or [])
    matching = None
    keywords = [k.lower() for k in arguments.keywords or [] if k]
    if keywords:
        scored = [(sum(1 for k in keywords if any(k in t for t in _field_texts(f))), f) for f in fields]
        matching = sum(1 for score, _ in scored if score)
        scored.sort(key=lambda pair: (-pair[0], pair[1].get("fieldPath") or ""))
        fields = [f for _, f in scored]
    page = fields[arguments.offset : arguments.offset + arguments.limit]
    cut = Page(len(fields), len(page), arguments.offset)
    return {
        "urn": urn,
        "fields": clean(page),
        "totalFields": len(fields),
        "returned": len(page),
        "remainingCount": max(0, len(fields) - arguments.offset - len(page)),
        "matchingCount": matching,
        "offset": arguments.offset,
        **cut.to_json(),
    }


# --- lineage -----------------------------------------------------------------------------------------------------


class LineageInput(ToolInput):
    urn: Urn = Field(description="The entity whose lineage to read")
    column: Annotated[str, StringConstraints(max_length=MAX_URN)] | None = Field(
        None, description="A column (field path) of the dataset: column-level lineage"
    )
    query: Text | None = Field(None, description="A search query among the lineage's entities")
    filter: Text | None = Field(None, description="A filter, as search's (`platform = snowflake`)")
    upstream: bool = Field(True, description="True: upstreams (what it is made from); false: downstreams")
    max_hops: int = Field(1, ge=1, le=100, description="1, 2, or 3 and more (every hop)")
    max_results: int = Field(30, ge=1, le=10_000, description=f"Results per page (at most {MAX_LINEAGE_RESULTS})")
    offset: int = Field(0, ge=0, le=10_000, description="Where the page starts")


def _degree(max_hops: int) -> Criterion:
    values = ("1",) if max_hops == 1 else ("1", "2") if max_hops == 2 else ("1", "2", "3+")
    return Criterion("degree", values, "EQUAL")


async def _lineage(
    call: ToolCall, urn: str, direction: str, groups: Any, query: str, start: int, count: int, extra: list[Criterion]
) -> dict[str, Any]:
    variables = {
        "input": {
            "urn": urn,
            "direction": direction,
            "query": query,
            "start": start,
            "count": count,
            "types": None,
            "orFilters": or_filters(groups, *extra),
            "searchFlags": {"skipHighlighting": True, "maxAggValues": 3},
        }
    }
    data = await call.graphql(operation("entity_details.gql"), variables, "GetEntityLineage")
    return data.get("searchAcrossLineage") or {}


def _lineage_columns(result: dict[str, Any]) -> dict[str, Any]:
    """DataHub's column-level answer: a dataset's `paths` (column chains) replaced by the columns they end at
    (`lineageColumns`), the last schema field of each path."""
    paths = result.get("paths") or []
    if not paths:
        return result
    columns: list[str] = []
    for path in paths:
        last = (path.get("path") or [None])[-1] or {}
        if last.get("type") == "SCHEMA_FIELD" and last.get("fieldPath") and last["fieldPath"] not in columns:
            columns.append(last["fieldPath"])
    kept = {"entity": result.get("entity"), "degree": result.get("degree", 0)}
    return {**kept, "lineageColumns": columns} if columns else kept


@tool(
    "get_lineage",
    LineageInput,
    "Get the upstream (`upstream=true`) or downstream lineage of an entity, or of one of a dataset's columns "
    "(`column`): the entities within `max_hops` (1, 2, or 3+: all), each with its `degree` and path, filtered by "
    "`query` and `filter` as search is. Paged by `max_results` and `offset`: the answer's `total`, and "
    "`truncated`/`nextOffset` when entities are left.",
)
async def get_lineage(call: ToolCall, arguments: LineageInput) -> Any:
    urn = _schema_field_urn(arguments.urn.strip(), arguments.column)
    _entity_type(arguments.urn, "$.arguments.urn")
    count = min(arguments.max_results, MAX_LINEAGE_RESULTS)
    direction = "UPSTREAM" if arguments.upstream else "DOWNSTREAM"
    result = await _lineage(
        call,
        urn,
        direction,
        parse_filter(arguments.filter),
        arguments.query or "*",
        arguments.offset,
        count,
        [_degree(arguments.max_hops)],
    )
    if arguments.column:
        result["searchResults"] = [_lineage_columns(r) for r in result.get("searchResults") or []]
    returned = len(result.get("searchResults") or [])
    cut_by = f"max_results is at most {MAX_LINEAGE_RESULTS}" if arguments.max_results > count else None
    page = Page(result.get("total") or 0, returned, arguments.offset, cut_by)
    body = {**clean(result), **page.to_json(), "hasMore": page.to_json()["truncated"]}
    return {"upstreams" if arguments.upstream else "downstreams": body}


class LineagePathsInput(ToolInput):
    source_urn: Urn = Field(description="Where the paths start")
    target_urn: Urn = Field(description="Where the paths end")
    source_column: Annotated[str, StringConstraints(max_length=MAX_URN)] | None = Field(
        None, description="A column of the source (with target_column: column-level paths)"
    )
    target_column: Annotated[str, StringConstraints(max_length=MAX_URN)] | None = Field(
        None, description="A column of the target"
    )
    direction: Literal["upstream", "downstream"] | None = Field(
        None, description="downstream: the target is derived from the source; upstream: the reverse; none: both tried"
    )


@tool(
    "get_lineage_paths_between",
    LineagePathsInput,
    "The lineage paths between two entities (or two columns): each path the chain of entities (and the queries "
    "between them) from the source to the target. Without `direction`, downstream is tried first, then upstream.",
)
async def get_lineage_paths_between(call: ToolCall, arguments: LineagePathsInput) -> Any:
    if (arguments.source_column is None) != (arguments.target_column is None):
        raise ValidationFailed(
            "source_column and target_column are given together (column-level paths) or not at all",
            [Issue("both or neither", path="$.arguments.target_column")],
        )
    source = _schema_field_urn(arguments.source_urn.strip(), arguments.source_column)
    target = _schema_field_urn(arguments.target_urn.strip(), arguments.target_column)
    directions = [arguments.direction] if arguments.direction else ["downstream", "upstream"]
    for direction in directions:
        result = await _lineage(
            call, source, direction.upper(), [], "*", 0, 1, [_degree(3), Criterion("urn", (target,), "EQUAL")]
        )
        hits = [r for r in result.get("searchResults") or [] if (r.get("entity") or {}).get("urn") == target]
        if hits:
            paths = clean(hits[0].get("paths") or [])
            discovered = arguments.direction is None
            return {
                "metadata": {
                    "queryType": "lineage-path-trace",
                    "direction": f"auto-discovered-{direction}" if discovered else direction,
                    "pathType": "column-level" if arguments.source_column else "dataset-level",
                },
                "source": {
                    "urn": arguments.source_urn,
                    **({"column": arguments.source_column} if arguments.source_column else {}),
                },
                "target": {
                    "urn": arguments.target_urn,
                    **({"column": arguments.target_column} if arguments.target_column else {}),
                },
                "pathCount": len(paths),
                "paths": paths,
            }
    raise NotFound(
        f"No lineage path found between {source} and {target}"
        + ("" if arguments.direction else " in either upstream or downstream direction"),
        [Issue("no path", path="$.arguments.target_urn")],
    )


# --- queries -----------------------------------------------------------------------------------------------------


class DatasetQueriesInput(ToolInput):
    urn: Urn = Field(description="Dataset URN")
    column: Annotated[str, StringConstraints(max_length=MAX_URN)] | None = Field(
        None, description="A column: the queries that use it"
    )
    source: Literal["MANUAL", "SYSTEM"] | None = Field(
        None, description="MANUAL (written by users) or SYSTEM (from usage); default both"
    )
    start: int = Field(0, ge=0, le=10_000, description="Where the page starts")
    count: int = Field(10, ge=0, le=1000, description="Queries per page")


@tool(
    "get_dataset_queries",
    DatasetQueriesInput,
    "The SQL queries that use a dataset (or one of its columns), newest first: each query's statement, language, "
    "source (MANUAL, SYSTEM), name, platform and the datasets it touches. Paged by `start` and `count`: `total`, "
    "and `truncated`/`nextOffset` when queries are left.",
)
async def get_dataset_queries(call: ToolCall, arguments: DatasetQueriesInput) -> Any:
    urn = _schema_field_urn(arguments.urn.strip(), arguments.column)
    query_input: dict[str, Any] = {
        "start": arguments.start,
        "count": arguments.count,
        "orFilters": or_filters([], Criterion("entities", (urn,), "EQUAL")),
    }
    if arguments.source is not None:
        query_input["source"] = arguments.source
    data = await call.graphql(operation("queries.gql"), {"input": query_input}, "listQueries")
    result = data.get("listQueries") or {}
    for query in result.get("queries") or []:
        subjects = query.get("subjects") or []
        seen = dict.fromkeys(
            ((s.get("dataset") or {}).get("urn") or ((s.get("schemaField") or {}).get("parent") or {}).get("urn"))
            for s in subjects
        )
        query["subjects"] = [u for u in seen if u]
    page = Page(result.get("total") or 0, len(result.get("queries") or []), arguments.start)
    return {**clean(result), **page.to_json()}


# --- aspect history ----------------------------------------------------------------------------------------------


class AspectHistoryInput(ToolInput):
    urns: Annotated[list[Urn], Field(min_length=1, max_length=10), BeforeValidator(_as_list)] = Field(
        description="The entities (1 to 10)"
    )
    aspect_names: Annotated[
        list[Annotated[str, StringConstraints(max_length=200)]],
        Field(min_length=1, max_length=10),
        BeforeValidator(_as_list),
    ] = Field(description="The aspects (1 to 10), e.g. globalTags, ownership, schemaMetadata")
    from_version: int | None = Field(
        None, ge=0, description="Start at this logical version and go back (default: the newest)"
    )
    limit: int = Field(10, ge=1, le=50, description="Versions per aspect (1 to 50)")
    include_current: bool = Field(True, description="Include the current version")


def _version_of(row: Any) -> int:
    try:
        return int(row.system_metadata.get("version") or 0)
    except (TypeError, ValueError):
        return 0


def version_json(row: Any) -> dict[str, Any]:
    sm = row.system_metadata
    return {
        "version": _version_of(row),
        "value": row.value,
        "created": {"time": int(row.created_on.timestamp() * 1000), "actor": row.created_by},
        "systemMetadata": {k: sm[k] for k in ("runId", "lastObserved", "properties") if k in sm},
    }


async def aspect_versions(call: ToolCall, urn: str, aspect: str, path: str) -> list[Any]:
    """Every kept version of the aspect, newest first, as the caller may read it (NotFound when it may not)."""
    entity_type = _entity_type(urn, path)
    await call.reader.aspect(entity_type, urn, aspect)  # the registry's names and the read rule, a 404 otherwise
    rows = await TimelineRepository(call.session).versions_in_range(
        urn,
        [aspect],
        datetime(1970, 1, 1),
        datetime.now(UTC).replace(tzinfo=None),  # createdon is UTC, naive
    )
    return sorted(rows, key=_version_of, reverse=True)


@tool(
    "get_aspect_history",
    AspectHistoryInput,
    "The kept versions of aspects of entities, newest first: each version's value, when and by whom it was "
    "written, its run and system properties (the tool or trace that wrote it). Per (urn, aspect): `total` kept, "
    "and `truncated`/`nextFromVersion` when older versions are left. metaledger keeps the last 20 history versions.",
)
async def get_aspect_history(call: ToolCall, arguments: AspectHistoryInput) -> Any:
    results: list[dict[str, Any]] = []
    for u, raw in enumerate(arguments.urns):
        for aspect in arguments.aspect_names:
            urn = raw.strip()
            try:
                rows = await aspect_versions(call, urn, aspect, f"$.arguments.urns[{u}]")
            except NotFound as error:
                results.append({"urn": urn, "aspect": aspect, "error": error.message})
                continue
            newest = _version_of(rows[0]) if rows else 0
            start = arguments.from_version if arguments.from_version is not None else newest
            kept = [
                r for r in rows if _version_of(r) <= start and (arguments.include_current or _version_of(r) != newest)
            ]
            page = kept[: arguments.limit]
            entry: dict[str, Any] = {
                "urn": urn,
                "aspect": aspect,
                "versions": [version_json(r) for r in page],
                "total": len(kept),
            }
            entry["truncated"] = len(kept) > len(page)
            if entry["truncated"]:
                entry["nextFromVersion"] = _version_of(kept[len(page)])
            results.append(entry)
    return {"results": results}


# --- the user ----------------------------------------------------------------------------------------------------

_ME = """
query getMe {
  me {
    corpUser {
      type urn username exists
      info { active displayName title firstName lastName fullName email }
      editableProperties { displayName title pictureLink teams skills }
    }
    platformPrivileges { viewAnalytics managePolicies manageIdentities generatePersonalAccessTokens }
  }
}
"""


class NoInput(ToolInput):
    pass


@tool(
    "get_me",
    NoInput,
    "Information about the authenticated user (the token's actor): urn, username, profile, and platform "
    "privileges. Use it for 'my' questions: my datasets, what I own.",
)
async def get_me(call: ToolCall, arguments: NoInput) -> Any:
    data = await call.graphql(_ME, {}, "getMe")
    me = data.get("me")
    if not me:
        raise ToolError("No authenticated user found")
    return {"success": True, "data": me, "message": "Successfully retrieved authenticated user information"}


# --- documents (GraphQL has no document operations yet: the search is searchAcrossEntities over DOCUMENT) -------

_DOCUMENT_SEARCH = """
query documentSearch($query: String!, $orFilters: [AndFilterInput!], $count: Int!, $start: Int!) {
  searchAcrossEntities(input: {query: $query, types: [DOCUMENT], orFilters: $orFilters, count: $count, start: $start,
                               searchFlags: {skipHighlighting: true}}) {
    start count total
    searchResults { entity { urn type ... on Document { subType info { title } } } }
  }
}
"""


class SearchDocumentsInput(ToolInput):
    query: Text = Field("*", description="Keywords (`/q` syntax as search's)")
    semantic_query: Text | None = Field(None, description="Not served by metaledger (no semantic search): refused")
    filter: Text | None = Field(None, description="A filter, as search's")
    num_results: int = Field(10, ge=1, le=10_000, description=f"Results per page (at most {MAX_SEARCH_RESULTS})")
    offset: int = Field(0, ge=0, le=10_000, description="Where the page starts")


@tool(
    "search_documents",
    SearchDocumentsInput,
    "Search the knowledge documents (saved insights, decisions, FAQs, runbooks) by keywords and filters: each "
    "result's urn, type and title; then grep_documents or get_entities to read them. `total`, and "
    "`truncated`/`nextOffset` when results are left.",
)
async def search_documents(call: ToolCall, arguments: SearchDocumentsInput) -> Any:
    if arguments.semantic_query:
        raise ValidationFailed(
            "metaledger has no semantic search: use `query`", [Issue("not served", path="$.arguments.semantic_query")]
        )
    count = min(arguments.num_results, MAX_SEARCH_RESULTS)
    variables = {
        "query": arguments.query,
        "orFilters": or_filters(parse_filter(arguments.filter)),
        "count": count,
        "start": arguments.offset,
    }
    result = (await call.graphql(_DOCUMENT_SEARCH, variables, "documentSearch")).get("searchAcrossEntities") or {}
    cut_by = f"num_results is at most {MAX_SEARCH_RESULTS}" if arguments.num_results > count else None
    page = Page(result.get("total") or 0, len(result.get("searchResults") or []), arguments.offset, cut_by)
    return {**clean(result), **page.to_json()}


class GrepDocumentsInput(ToolInput):
    urns: Urns = Field(description="The documents to search in")
    pattern: Annotated[str, StringConstraints(min_length=1, max_length=1000)] = Field(
        description="A regular expression (Python syntax), matched case-insensitively"
    )
    context_chars: int = Field(200, ge=0, le=2000, description="Characters of context either side of a match")
    max_matches_per_doc: int = Field(5, ge=1, le=100, description="Matches shown per document")
    start_offset: int = Field(0, ge=0, description="Start matching at this character of each document")


@tool(
    "grep_documents",
    GrepDocumentsInput,
    "Find a pattern (a regular expression) in the text of documents: per document its matches with context, "
    "`totalMatches`, and `truncated` when more matches than `max_matches_per_doc` were found.",
)
async def grep_documents(call: ToolCall, arguments: GrepDocumentsInput) -> Any:
    try:
        pattern = re.compile(arguments.pattern, re.IGNORECASE)
    except re.error as error:
        raise ValidationFailed(
            f"pattern is not a regular expression: {error}", [Issue(str(error), path="$.arguments.pattern")]
        ) from None
    results: list[dict[str, Any]] = []
    for urn in arguments.urns:
        rows = await call.reader.latest_of(urn, ["documentInfo"])
        if not rows:
            results.append({"urn": urn, "error": f"Document {urn} not found"})
            continue
        info = rows[0].value
        text = str(((info.get("contents") or {}).get("text")) or "")
        matches = list(pattern.finditer(text, arguments.start_offset))
        shown = matches[: arguments.max_matches_per_doc]
        context = arguments.context_chars
        results.append(
            {
                "urn": urn,
                "title": info.get("title"),
                "totalMatches": len(matches),
                "truncated": len(matches) > len(shown),
                "matches": [
                    {
                        "position": m.start(),
                        "excerpt": text[max(0, m.start() - context) : m.end() + context],
                    }
                    for m in shown
                ],
            }
        )
    return {"results": results}


class SaveDocumentInput(ToolInput):
    document_type: Literal["Insight", "Decision", "FAQ", "Analysis", "Summary", "Recommendation", "Note", "Context"]
    title: Annotated[str, StringConstraints(min_length=1, max_length=500)] = Field(description="The document's title")
    content: Annotated[str, StringConstraints(min_length=1, max_length=100_000)] = Field(
        description="The document's text (markdown)"
    )
    urn: Urn | None = Field(None, description="A document to update (default: a new one)")
    topics: list[Annotated[str, StringConstraints(max_length=100)]] | None = Field(
        None, max_length=20, description="Topics, kept as tags"
    )
    related_documents: list[Urn] | None = Field(None, max_length=MAX_URNS, description="Related documents' URNs")
    related_assets: list[Urn] | None = Field(None, max_length=MAX_URNS, description="Related assets' URNs")


@tool(
    "save_document",
    SaveDocumentInput,
    "Save a knowledge document (an insight, a decision, an FAQ, an analysis, ...) to the catalog, new or updated "
    "(`urn`), with its related assets and documents; search_documents finds it. Needs the WRITE permission.",
    writes=True,
)
async def save_document(call: ToolCall, arguments: SaveDocumentInput) -> Any:
    call.require(Permission.WRITE)
    urn = arguments.urn or f"urn:li:document:{datetime.now(UTC).strftime('%Y%m%d%H%M%S%f')}"
    if _entity_type(urn, "$.arguments.urn") != "document":
        raise ValidationFailed(f"{urn} is not a document's URN", [Issue("not a document", path="$.arguments.urn")])
    stamp = {"time": int(datetime.now(UTC).timestamp() * 1000), "actor": call.caller.actor}
    existing = await call.reader.latest_of(urn, ["documentInfo"]) if arguments.urn else []
    info: dict[str, Any] = {
        "title": arguments.title,
        "contents": {"text": arguments.content},
        "status": {"state": "PUBLISHED"},
        "created": existing[0].value.get("created", stamp) if existing else stamp,
        "lastModified": stamp,
    }
    if arguments.related_assets:
        info["relatedAssets"] = [{"asset": a} for a in arguments.related_assets]
    if arguments.related_documents:
        info["relatedDocuments"] = [{"document": d} for d in arguments.related_documents]
    drafts = [
        Draft(0, "document", "documentInfo", ChangeType.UPSERT.value, urn=urn, value=info),
        Draft(
            1, "document", "subTypes", ChangeType.UPSERT.value, urn=urn, value={"typeNames": [arguments.document_type]}
        ),
    ]
    if arguments.topics:
        tags = [{"tag": f"urn:li:tag:{t}"} for t in arguments.topics]
        drafts.append(Draft(2, "document", "globalTags", ChangeType.UPSERT.value, urn=urn, value={"tags": tags}))
    await call.gateway.submit(call.session, drafts, call.caller)
    return {"success": True, "urn": urn, "message": f"Document {'updated' if arguments.urn else 'saved'}: {urn}"}


# --- curation: DataHub's batch mutations ---------------------------------------------------------------------------

ColumnPaths = list[Annotated[str, StringConstraints(max_length=MAX_URN)] | None] | None


def _resources(entity_urns: list[str], column_paths: ColumnPaths) -> list[dict[str, Any]]:
    if column_paths is not None and len(column_paths) != len(entity_urns):
        raise ValidationFailed(
            f"column_paths length ({len(column_paths)}) must match entity_urns length ({len(entity_urns)})",
            [Issue("length differs from entity_urns", path="$.arguments.column_paths")],
        )
    resources = []
    for index, urn in enumerate(entity_urns):
        _entity_type(urn, f"$.arguments.entity_urns[{index}]")
        resource: dict[str, Any] = {"resourceUrn": urn}
        column = column_paths[index] if column_paths else None
        if column:
            resource |= {"subResource": column, "subResourceType": "DATASET_FIELD"}
        resources.append(resource)
    return resources


async def _mutate(call: ToolCall, name: str, input_type: str, variables: dict[str, Any]) -> Any:
    call.require(Permission.WRITE)  # before anything is read: the refusal names the permission
    query = f"mutation {name}($input: {input_type}!) {{ {name}(input: $input) }}"
    data = await call.graphql(query, {"input": variables}, name)
    if not data.get(name):
        raise ToolError(f"{name} changed nothing: the operation returned false")
    return data[name]


class TagsInput(ToolInput):
    tag_urns: Urns = Field(description="The tags' URNs (urn:li:tag:<name>)")
    entity_urns: Urns = Field(description="The entities to change")
    column_paths: ColumnPaths = Field(
        None, description="Per entity, a column (field path) to change instead of the entity itself (or null)"
    )


def _success(verb: str, what: str, count: int, entities: int, preposition: str) -> dict[str, Any]:
    return {"success": True, "message": f"Successfully {verb} {count} {what} {preposition} {entities} entit(ies)"}


@tool(
    "add_tags",
    TagsInput,
    "Add tags to entities, or to columns of datasets (`column_paths`, one per entity). The tags must exist. Needs "
    "the WRITE permission; the change is attributed to the caller and this tool.",
    writes=True,
)
async def add_tags(call: ToolCall, arguments: TagsInput) -> Any:
    resources = _resources(arguments.entity_urns, arguments.column_paths)
    await _mutate(call, "batchAddTags", "BatchAddTagsInput", {"tagUrns": arguments.tag_urns, "resources": resources})
    return _success("added", "tag(s)", len(arguments.tag_urns), len(resources), "to")


@tool(
    "remove_tags",
    TagsInput,
    "Remove tags from entities, or from columns of datasets (`column_paths`). Needs the WRITE permission.",
    writes=True,
)
async def remove_tags(call: ToolCall, arguments: TagsInput) -> Any:
    resources = _resources(arguments.entity_urns, arguments.column_paths)
    variables = {"tagUrns": arguments.tag_urns, "resources": resources}
    await _mutate(call, "batchRemoveTags", "BatchRemoveTagsInput", variables)
    return _success("removed", "tag(s)", len(arguments.tag_urns), len(resources), "from")


class TermsInput(ToolInput):
    term_urns: Urns = Field(description="The glossary terms' URNs (urn:li:glossaryTerm:<id>)")
    entity_urns: Urns = Field(description="The entities to change")
    column_paths: ColumnPaths = Field(
        None, description="Per entity, a column (field path) to change instead of the entity itself (or null)"
    )


@tool(
    "add_terms",
    TermsInput,
    "Add glossary terms to entities, or to columns of datasets (`column_paths`). The terms must exist. Needs the "
    "WRITE permission.",
    writes=True,
)
async def add_terms(call: ToolCall, arguments: TermsInput) -> Any:
    resources = _resources(arguments.entity_urns, arguments.column_paths)
    variables = {"termUrns": arguments.term_urns, "resources": resources}
    await _mutate(call, "batchAddTerms", "BatchAddTermsInput", variables)
    return _success("added", "term(s)", len(arguments.term_urns), len(resources), "to")


@tool(
    "remove_terms",
    TermsInput,
    "Remove glossary terms from entities, or from columns of datasets (`column_paths`). Needs the WRITE permission.",
    writes=True,
)
async def remove_terms(call: ToolCall, arguments: TermsInput) -> Any:
    resources = _resources(arguments.entity_urns, arguments.column_paths)
    variables = {"termUrns": arguments.term_urns, "resources": resources}
    await _mutate(call, "batchRemoveTerms", "BatchRemoveTermsInput", variables)
    return _success("removed", "term(s)", len(arguments.term_urns), len(resources), "from")


def _ownership_type(raw: str) -> str:
    """An ownership type's URN: a URN as given, or one of DataHub's built-in types by name (TECHNICAL_OWNER,
    business owner, Data Steward, ...)."""
    if raw.startswith("urn:li:ownershipType:"):
        return raw
    key = re.sub(r"[\s-]+", "_", raw.strip()).lower()
    if key in SYSTEM_OWNERSHIP_TYPES:
        return f"{SYSTEM_OWNERSHIP_PREFIX}{key}"
    names = ", ".join(t.upper() for t in SYSTEM_OWNERSHIP_TYPES)
    raise ValidationFailed(
        f"unknown ownership type {clip(raw, 100)!r}: one of {names}, or an ownership type's URN",
        [Issue("unknown ownership type", path="$.arguments.ownership_type", found=clip(raw, 200))],
    )


class AddOwnersInput(ToolInput):
    owner_urns: Urns = Field(description="Users' or groups' URNs (urn:li:corpuser:<id>, urn:li:corpGroup:<id>)")
    entity_urns: Urns = Field(description="The entities to change")
    ownership_type: Annotated[str, StringConstraints(min_length=1, max_length=MAX_URN)] = Field(
        description="TECHNICAL_OWNER, BUSINESS_OWNER, DATA_STEWARD, NONE, or an ownership type's URN"
    )


class RemoveOwnersInput(ToolInput):
    owner_urns: Urns = Field(description="Users' or groups' URNs")
    entity_urns: Urns = Field(description="The entities to change")
    ownership_type: Annotated[str, StringConstraints(min_length=1, max_length=MAX_URN)] | None = Field(
        None, description="Only the ownerships of this type (default: every type)"
    )


def _owner_kind(urn: str) -> str:
    return "CORP_USER" if ":corpuser:" in urn.lower() else "CORP_GROUP"


@tool(
    "add_owners",
    AddOwnersInput,
    "Add owners (users or groups) of a type to entities. Needs the WRITE permission.",
    writes=True,
)
async def add_owners(call: ToolCall, arguments: AddOwnersInput) -> Any:
    kind = _ownership_type(arguments.ownership_type)
    owners = [
        {"ownerUrn": o, "ownerEntityType": _owner_kind(o), "ownershipTypeUrn": kind} for o in arguments.owner_urns
    ]
    resources = _resources(arguments.entity_urns, None)
    variables = {"owners": owners, "resources": resources, "ownershipTypeUrn": kind}
    await _mutate(call, "batchAddOwners", "BatchAddOwnersInput", variables)
    return _success("added", "owner(s)", len(owners), len(resources), "to")


@tool(
    "remove_owners",
    RemoveOwnersInput,
    "Remove owners from entities (of one ownership type when given). Needs the WRITE permission.",
    writes=True,
)
async def remove_owners(call: ToolCall, arguments: RemoveOwnersInput) -> Any:
    resources = _resources(arguments.entity_urns, None)
    variables: dict[str, Any] = {"ownerUrns": arguments.owner_urns, "resources": resources}
    if arguments.ownership_type is not None:
        variables["ownershipTypeUrn"] = _ownership_type(arguments.ownership_type)
    await _mutate(call, "batchRemoveOwners", "BatchRemoveOwnersInput", variables)
    return _success("removed", "owner(s)", len(arguments.owner_urns), len(resources), "from")


class SetDomainsInput(ToolInput):
    domain_urn: Urn = Field(description="The domain's URN (urn:li:domain:<id>)")
    entity_urns: Urns = Field(description="The entities to put in it (an entity has one domain)")


@tool(
    "set_domains",
    SetDomainsInput,
    "Set the domain of entities (replacing the one they had). Needs the WRITE permission.",
    writes=True,
)
async def set_domains(call: ToolCall, arguments: SetDomainsInput) -> Any:
    resources = _resources(arguments.entity_urns, None)
    variables = {"domainUrn": arguments.domain_urn, "resources": resources}
    await _mutate(call, "batchSetDomain", "BatchSetDomainInput", variables)
    return {"success": True, "message": f"Successfully set domain for {len(resources)} entit(ies)"}


class RemoveDomainsInput(ToolInput):
    entity_urns: Urns = Field(description="The entities to take out of their domain")


@tool(
    "remove_domains",
    RemoveDomainsInput,
    "Remove the domain of entities. Needs the WRITE permission.",
    writes=True,
)
async def remove_domains(call: ToolCall, arguments: RemoveDomainsInput) -> Any:
    resources = _resources(arguments.entity_urns, None)
    await _mutate(call, "batchSetDomain", "BatchSetDomainInput", {"domainUrn": None, "resources": resources})
    return {"success": True, "message": f"Successfully removed domain from {len(resources)} entit(ies)"}


class DescriptionInput(ToolInput):
    entity_urn: Urn = Field(description="The entity")
    operation: Literal["replace", "append", "remove"] = Field("replace", description="replace, append or remove")
    description: Annotated[str, StringConstraints(max_length=MAX_TEXT)] | None = Field(
        None, description="The text (for replace and append)"
    )
    column_path: Annotated[str, StringConstraints(max_length=MAX_URN)] | None = Field(
        None, description="A column of the dataset: its description instead of the entity's"
    )


async def _current_description(call: ToolCall, urn: str, column: str | None) -> str:
    entity_type = _entity_type(urn, "$.arguments.entity_urn")
    if column:
        rows = await call.reader.latest_of(urn, ["editableSchemaMetadata"])
        infos = rows[0].value.get("editableSchemaFieldInfo") or [] if rows else []
        return next((str(i.get("description") or "") for i in infos if i.get("fieldPath") == column), "")
    aspect, field = DESCRIPTION_ASPECTS.get(entity_type, ("", ""))
    rows = await call.reader.latest_of(urn, [aspect]) if aspect else []
    return str(rows[0].value.get(field) or "") if rows else ""


@tool(
    "update_description",
    DescriptionInput,
    "Replace, append to or remove the description of an entity, or of a dataset's column (`column_path`): the "
    "editable description, which DataHub shows before the ingested one. Needs the WRITE permission.",
    writes=True,
)
async def update_description(call: ToolCall, arguments: DescriptionInput) -> Any:
    call.require(Permission.WRITE)
    if arguments.operation != "remove" and arguments.description is None:
        raise ValidationFailed(
            f"description is required for '{arguments.operation}'", [Issue("missing", path="$.arguments.description")]
        )
    text = arguments.description or ""
    if arguments.operation == "append":
        current = await _current_description(call, arguments.entity_urn, arguments.column_path)
        text = current + text  # DataHub's append: the text as given, after the current description
    elif arguments.operation == "remove":
        text = ""
    variables: dict[str, Any] = {"description": text, "resourceUrn": arguments.entity_urn}
    if arguments.column_path:
        variables |= {"subResource": arguments.column_path, "subResourceType": "DATASET_FIELD"}
    await _mutate(call, "updateDescription", "DescriptionUpdateInput", variables)
    verb = {"replace": "updated", "append": "appended", "remove": "removed"}[arguments.operation]
    return {
        "success": True,
        "urn": arguments.entity_urn,
        "column_path": arguments.column_path,
        "message": f"Description {verb} successfully",
    }


class AddPropertiesInput(ToolInput):
    property_values: dict[
        Urn, Annotated[list[Annotated[str, StringConstraints(max_length=MAX_TEXT)]], Field(max_length=100)]
    ] = Field(
        description="Per structured property's URN, its values (as strings: numbers are converted by the "
        "property's value type)",
        max_length=50,
    )
    entity_urns: Urns = Field(description="The entities to change")


async def _value_inputs(call: ToolCall, property_urn: str, values: list[str]) -> list[dict[str, Any]]:
    rows = await call.reader.latest_of(property_urn, ["propertyDefinition"])
    if not rows:
        raise ValidationFailed(
            f"structured property {property_urn} does not exist",
            [Issue("not found", path=f"$.arguments.property_values[{property_urn}]")],
        )
    numeric = str(rows[0].value.get("valueType", "")).endswith(".number")
    inputs: list[dict[str, Any]] = []
    for value in values:
        if not numeric:
            inputs.append({"stringValue": value})
            continue
        try:
            inputs.append({"numberValue": float(value)})
        except ValueError:
            raise ValidationFailed(
                f"{property_urn} takes numbers; {clip(value, 50)!r} is not one",
                [Issue("not a number", path=f"$.arguments.property_values[{property_urn}]", found=clip(value, 100))],
            ) from None
    return inputs


@tool(
    "add_structured_properties",
    AddPropertiesInput,
    "Set structured properties' values on entities (values are checked against each property's definition: value "
    "type, allowed values, cardinality, entity types). Needs the WRITE permission.",
    writes=True,
)
async def add_structured_properties(call: ToolCall, arguments: AddPropertiesInput) -> Any:
    call.require(Permission.WRITE)
    params = [
        {"structuredPropertyUrn": urn, "values": await _value_inputs(call, urn, values)}
        for urn, values in arguments.property_values.items()
    ]
    query = (
        "mutation upsertStructuredProperties($input: UpsertStructuredPropertiesInput!) {"
        " upsertStructuredProperties(input: $input) { properties { structuredProperty { urn } } } }"
    )
    for index, urn in enumerate(arguments.entity_urns):
        _entity_type(urn, f"$.arguments.entity_urns[{index}]")
        variables = {"input": {"assetUrn": urn, "structuredPropertyInputParams": params}}
        await call.graphql(query, variables, "upsertStructuredProperties")
    return _success("added", "structured propert(ies)", len(params), len(arguments.entity_urns), "to")


class RemovePropertiesInput(ToolInput):
    property_urns: Urns = Field(description="The structured properties' URNs")
    entity_urns: Urns = Field(description="The entities to change")


@tool(
    "remove_structured_properties",
    RemovePropertiesInput,
    "Remove structured properties' values from entities. Needs the WRITE permission.",
    writes=True,
)
async def remove_structured_properties(call: ToolCall, arguments: RemovePropertiesInput) -> Any:
    call.require(Permission.WRITE)
    query = (
        "mutation removeStructuredProperties($input: RemoveStructuredPropertiesInput!) {"
        " removeStructuredProperties(input: $input) { properties { structuredProperty { urn } } } }"
    )
    for index, urn in enumerate(arguments.entity_urns):
        _entity_type(urn, f"$.arguments.entity_urns[{index}]")
        variables = {"input": {"assetUrn": urn, "structuredPropertyUrns": arguments.property_urns}}
        await call.graphql(query, variables, "removeStructuredProperties")
    return _success(
        "removed", "structured propert(ies)", len(arguments.property_urns), len(arguments.entity_urns), "from"
    )
