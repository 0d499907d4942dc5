"""What the pages show, as the signed-in principal: search and the edit forms' choosers through DataHub's GraphQL
executed in-process (`graphql`: app.graphql.service.run, as app.mcp.call runs a tool's operations — the same limits,
cost, read rule and policies as `POST /api/graphql`; the edits themselves run through it too, in app.web.edits), an
entity's aspects and the names of what it references through the aspect store as that principal may read it
(app.write.reader.EntityReader: its system metadata too, which GraphQL's RawAspect does not carry).

The handlers (app.web.routes) parse the request, call one function here and render what it returns."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, cast

from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request

from app.api.deps import scoped_search_backend
from app.auth.model import Principal
from app.graphql.curation import SYSTEM_OWNERSHIP_PREFIX, SYSTEM_OWNERSHIP_TYPES, type_urn_of
from app.graphql.resolvers import Context
from app.graphql.service import GraphQLRequest, run
from app.ingest.gateway import AttributedGateway, IngestGateway
from app.registry.errors import RegistryError
from app.search.model import SearchBackend
from app.search.structured_properties import FIELD_PREFIX
from app.settings import Settings
from app.web.paths import Filter, entity_url
from app.write.reader import EntityReader

ORIGIN = "web"


class GraphQLRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def graphql(
    request: Request, session: AsyncSession, principal: Principal, query: str, variables: dict[str, Any]
) -> dict[str, Any]:
    """`data` of `query` run as `principal`; GraphQLRefused with DataHub's error code (403 for a refused mutation)."""
    state = request.app.state
    settings = cast(Settings, state.settings)

    async def backend() -> SearchBackend:
        return await scoped_search_backend(request, principal)

    context = Context(
        session,
        state.registry,
        cast(IngestGateway, AttributedGateway(state.gateway, ORIGIN)),
        principal,
        backend,
        settings.graphql_max_count,
        request.headers,
    )
    body, _ = await run(GraphQLRequest(query, variables, None), context, settings)
    errors = body.get("errors") or []
    if errors:
        codes = [(e.get("extensions") or {}).get("code") for e in errors]
        status = next((c for c in codes if isinstance(c, int)), 500)
        raise GraphQLRefused(status, "; ".join(str(e.get("message")) for e in errors[:3]))
    return cast(dict[str, Any], body.get("data") or {})


# --- search

PAGE_SIZE = 20
FACET_FIELDS = ("_entityType", "platform", "tags", "glossaryTerms", "domains", "owners")
FACET_LABELS = {
    "_entityType": "Type",
    "platform": "Platform",
    "tags": "Tags",
    "glossaryTerms": "Glossary terms",
    "domains": "Domain",
    "owners": "Owners",
}
FACET_VALUES = 20  # per facet (DataHub's search page asks for as many)
# The structured properties offered as facets: those whose settings say showInSearchFilters (DataHub's search page
# lists them the same way), at most this many.
MAX_PROPERTY_FACETS = 20

PROPERTY_FILTERS = f"""
query webPropertyFilters {{
  searchAcrossEntities(input: {{types: [STRUCTURED_PROPERTY], query: "*", start: 0, count: {MAX_PROPERTY_FACETS},
                               orFilters: [{{and: [{{field: "showInSearchFilters", values: ["true"]}}]}}],
                               searchFlags: {{skipAggregates: true, skipHighlighting: true}}}}) {{
    searchResults {{ entity {{ urn ... on StructuredPropertyEntity {{ definition {{ qualifiedName displayName }} }} }} }}
  }}
}}
"""

_HIT = """
fragment webOwners on Ownership {
  owners {
    owner { ... on CorpUser { urn username properties { displayName } } ... on CorpGroup { urn name properties { displayName } } }
  }
}

fragment webHit on SearchResult {
  entity {
    urn type
    ... on Dataset { name platform { name } properties { name description } editableProperties { description }
                     ownership { ...webOwners } }
    ... on Chart { platform { name } properties { name description } editableProperties { description }
                   ownership { ...webOwners } }
    ... on Dashboard { platform { name } properties { name description } editableProperties { description }
                       ownership { ...webOwners } }
    ... on DataFlow { platform { name } properties { name description } editableProperties { description }
                      ownership { ...webOwners } }
    ... on DataJob { properties { name description } editableProperties { description }
                     ownership { ...webOwners } }
    ... on Container { properties { name description } editableProperties { description }
                       ownership { ...webOwners } }
    ... on Tag { name properties { name description } }
    ... on GlossaryTerm { properties { name description } }
    ... on Domain { properties { name description } }
    ... on CorpGroup { name }
  }
}
"""

# The facets, structured properties' among them, in one aggregation beside the page: the page's own query asks for
# none (a scroll's facets would be counted again on every page).
_FACETS = f"""
  aggregates: aggregateAcrossEntities(input: {{query: $query, orFilters: $orFilters, facets: $facets,
                                               searchFlags: {{maxAggValues: {FACET_VALUES}}}}}) {{
    facets {{
      field displayName
      aggregations {{
        value count displayName
        entity {{
          urn
          ... on Tag {{ properties {{ name }} }}
          ... on GlossaryTerm {{ properties {{ name }} }}
          ... on Domain {{ properties {{ name }} }}
          ... on CorpUser {{ username properties {{ displayName }} }}
          ... on CorpGroup {{ name properties {{ displayName }} }}
          ... on DataPlatform {{ name }}
        }}
      }}
    }}
  }}
"""

# The first page and the pages after it, by cursor (scrollAcrossEntities' scrollId): the only way past the
# searches' window of 10,000 results.
SCROLL = (
    _HIT
    + """
query webScroll($query: String!, $count: Int!, $scrollId: String, $orFilters: [AndFilterInput!], $facets: [String]) {
  page: scrollAcrossEntities(input: {query: $query, count: $count, scrollId: $scrollId, orFilters: $orFilters,
                                     searchFlags: {skipHighlighting: true}}) {
    total nextScrollId searchResults { ...webHit }
  }"""
    + _FACETS
    + "}\n"
)

# DataHub's `page=N`, as the links DataHub prints carry it: within the window only.
SEARCH = (
    _HIT
    + """
query webSearch($query: String!, $start: Int!, $count: Int!, $orFilters: [AndFilterInput!], $facets: [String]) {
  page: searchAcrossEntities(input: {query: $query, start: $start, count: $count, orFilters: $orFilters,
                                     searchFlags: {skipHighlighting: true}}) {
    total searchResults { ...webHit }
  }"""
    + _FACETS
    + "}\n"
)


@dataclass(frozen=True, slots=True)
class Hit:
    urn: str
    url: str | None
    entity_type: str
    name: str
    platform: str | None
    description: str
    owners: list[tuple[str, str | None]]  # (name, page)


@dataclass(frozen=True, slots=True)
class FacetValue:
    value: str
    label: str
    count: int
    selected: bool


@dataclass(frozen=True, slots=True)
class Facet:
    field: str
    label: str
    values: list[FacetValue]


@dataclass(slots=True)
class SearchPage:
    query: str
    filters: list[Filter]
    start: int  # the results before this page (a cursor's page: as its link said)
    total: int = 0
    hits: list[Hit] = field(default_factory=list)
    facets: list[Facet] = field(default_factory=list)
    next_cursor: str | None = None  # the scrollId of the next page, for a page read by cursor


def short_name(urn: str) -> str:
    """A readable name from a URN alone: a dataset's name, else what follows the entity type."""
    parts = urn.split(":", 3)
    if len(parts) < 4:
        return urn
    key = parts[3]
    if key.startswith("(") and key.endswith(")"):
        inner = [p for p in key[1:-1].split(",")]
        return inner[1] if len(inner) >= 2 else key
    return key


def snippet(text: str | None, length: int = 200) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= length else text[: length - 1].rstrip() + "…"


def _owners(entity: dict[str, Any]) -> list[tuple[str, str | None]]:
    owners = ((entity.get("ownership") or {}).get("owners")) or []
    found = []
    for owner in owners:
        who = owner.get("owner") or {}
        urn = who.get("urn")
        if urn:
            shown = (who.get("properties") or {}).get("displayName") or who.get("username") or who.get("name")
            found.append((shown or short_name(urn), entity_url(urn)))
    return found


def _entity_name(entity: dict[str, Any] | None) -> str | None:
    """What people call a facet value's entity (a tag's name, a user's display name, a platform's name)."""
    if not entity:
        return None
    properties = entity.get("properties") or {}
    name = properties.get("displayName") or properties.get("name") or entity.get("username") or entity.get("name")
    return name if isinstance(name, str) and name else None


def _hit(entity: dict[str, Any]) -> Hit:
    urn = entity["urn"]
    properties = entity.get("properties") or {}
    name = properties.get("name") or entity.get("name") or short_name(urn)
    platform = (entity.get("platform") or {}).get("name")
    return Hit(
        urn=urn,
        url=entity_url(urn),
        entity_type=urn.split(":", 3)[2] if urn.count(":") >= 3 else "",
        name=name,
        platform=platform,
        # what a person wrote stands over what ingestion brought, as on DataHub's result cards
        description=snippet(
            (entity.get("editableProperties") or {}).get("description") or properties.get("description")
        ),
        owners=_owners(entity),
    )


async def property_filters(request: Request, session: AsyncSession, principal: Principal) -> dict[str, str]:
    """The structured properties whose settings show them in search filters: their filter field
    (`structuredProperties.<qualified name>`, as DataHub's search page names it) and label."""
    data = await graphql(request, session, principal, PROPERTY_FILTERS, {})
    found: dict[str, str] = {}
    for result in (data.get("searchAcrossEntities") or {}).get("searchResults") or []:
        definition = result["entity"].get("definition") or {}
        name = definition.get("qualifiedName")
        if name:
            found[FIELD_PREFIX + name] = definition.get("displayName") or name
    return found


async def search(
    request: Request,
    session: AsyncSession,
    principal: Principal,
    query: str,
    filters: list[Filter],
    start: int = 0,
    cursor: str | None = None,
    by_page: bool = False,
) -> SearchPage:
    """A page of results with the facets: by cursor (`cursor`: a previous page's scrollId, None for the first
    page), or at `start` when `by_page` (DataHub's page numbers)."""
    properties = await property_filters(request, session, principal)
    variables: dict[str, Any] = {
        "query": query or "*",
        "count": PAGE_SIZE,
        "orFilters": [{"and": [f.to_graphql() for f in filters]}] if filters else None,
        "facets": [*FACET_FIELDS, *properties],
    }
    if by_page:
        data = await graphql(request, session, principal, SEARCH, variables | {"start": start})
    else:
        data = await graphql(request, session, principal, SCROLL, variables | {"scrollId": cursor})
    found = data.get("page") or {}
    page = SearchPage(query=query, filters=filters, start=start, total=int(found.get("total") or 0))
    page.hits = [_hit(r["entity"]) for r in found.get("searchResults") or []]
    page.next_cursor = None if by_page else found.get("nextScrollId")
    labels = FACET_LABELS | properties
    chosen = {(f.field, v) for f in filters if not f.negated for v in f.values}
    by_field = {f["field"]: f for f in (data.get("aggregates") or {}).get("facets") or []}
    for name in labels:
        facet = by_field.get(name)
        if not facet or not facet.get("aggregations"):
            continue
        values = [
            FacetValue(
                value=a["value"],
                label=a.get("displayName") or _entity_name(a.get("entity")) or short_name(a["value"]),
                count=int(a["count"]),
                selected=(name, a["value"]) in chosen,
            )
            for a in facet["aggregations"]
            if int(a["count"]) > 0
        ]
        if values:
            page.facets.append(Facet(name, labels[name], values))
    return page


# --- an entity's page


@dataclass(frozen=True, slots=True)
class Chip:
    """A tag, term, domain (or any entity) shown by name, linked to its page; `editable`: a person's edit may
    remove it (a schema field's tags and terms that ingestion wrote are not the edit's to remove, as in DataHub)."""

    urn: str
    name: str
    url: str | None
    editable: bool = True


@dataclass(frozen=True, slots=True)
class OwnerView:
    urn: str
    name: str  # a display name, else `handle`
    handle: str  # the id in the URN: a username, a group's name
    url: str | None
    type_urn: str  # the ownership type, as a removal names it
    type_name: str


@dataclass(frozen=True, slots=True)
class FieldRow:
    path: str  # DataHub's fieldPath as written
    name: str  # its last part, without the [version=2.0]/[type=…] tokens of the v2 paths
    depth: int
    type: str
    description: str
    tags: list[Chip]
    terms: list[Chip]


@dataclass(frozen=True, slots=True)
class RawAspectView:
    name: str
    version: str | None
    run_id: str | None
    trace_id: str | None
    created_by: str
    created_on: str
    json: str


@dataclass(slots=True)
class EntityView:
    urn: str
    entity_type: str
    name: str
    platform: str | None = None
    description: str | None = None
    description_source: str | None = None  # "edited" when a person's description stands over the ingested one
    custom_properties: list[tuple[str, str]] = field(default_factory=list)
    properties: list[tuple[str, str]] = field(default_factory=list)
    fields: list[FieldRow] = field(default_factory=list)
    owners: list[OwnerView] = field(default_factory=list)
    tags: list[Chip] = field(default_factory=list)
    terms: list[Chip] = field(default_factory=list)
    domains: list[Chip] = field(default_factory=list)
    structured: list[tuple[str, str]] = field(default_factory=list)
    deprecation: dict[str, Any] | None = None
    links: list[tuple[str, str]] = field(default_factory=list)
    aspects: list[RawAspectView] = field(default_factory=list)


def _field_name(path: str) -> tuple[str, int]:
    """The name and depth of a field path; v2 paths' `[version=2.0].[type=struct]` tokens are not names."""
    parts = [p for p in path.split(".") if not (p.startswith("[") and p.endswith("]"))]
    return (parts[-1] if parts else path), max(len(parts) - 1, 0)


def _chips(urns: list[str], editable: bool = True) -> list[Chip]:
    return [Chip(u, short_name(u), entity_url(u), editable) for u in urns]


# Where an entity's name for people is, by entity type: (aspect, field), the first one present wins (DataHub's
# display names: a person's edited one over the ingested one).
NAME_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "tag": (("tagProperties", "name"),),
    "glossaryTerm": (("glossaryTermInfo", "name"),),
    "domain": (("domainProperties", "name"),),
    "corpuser": (
        ("corpUserEditableInfo", "displayName"),
        ("corpUserInfo", "displayName"),
        ("corpUserInfo", "fullName"),
    ),
    "corpGroup": (("corpGroupInfo", "displayName"),),
    "structuredProperty": (("propertyDefinition", "displayName"), ("propertyDefinition", "qualifiedName")),
}


async def display_names(reader: EntityReader, urns: list[str]) -> dict[str, str]:
    """The names of the entities a page shows by reference (tags, terms, domains, owners, properties), read in one
    query, as the reader may see them; an entity without one (or not there) keeps its URN's short name."""
    wanted: list[tuple[str, list[str] | None]] = []
    for urn in dict.fromkeys(urns):
        fields = NAME_FIELDS.get(urn.split(":", 3)[2] if urn.count(":") >= 3 else "")
        if fields:
            wanted.append((urn, sorted({aspect for aspect, _ in fields})))
    if not wanted:
        return {}
    names = {}
    for urn, rows in (await reader.latest_of_many(wanted)).items():
        values = {row.aspect: row.value for row in rows}
        for aspect, key in NAME_FIELDS[urn.split(":", 3)[2]]:
            text = (values.get(aspect) or {}).get(key)
            if isinstance(text, str) and text.strip():
                names[urn] = text
                break
    return names


def _renamed(chips: list[Chip], names: dict[str, str]) -> list[Chip]:
    return [replace(c, name=names.get(c.urn, c.name)) for c in chips]


def ownership_type_name(type_urn: str) -> str:
    """DataHub's name of a system ownership type (Technical Owner, …); a custom type's id."""
    if type_urn.startswith(SYSTEM_OWNERSHIP_PREFIX):
        key = type_urn.removeprefix(SYSTEM_OWNERSHIP_PREFIX)
        return SYSTEM_OWNERSHIP_TYPES.get(key) or key.replace("_", " ").capitalize()
    return short_name(type_urn)


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _describe(view: EntityView, values: dict[str, dict[str, Any]]) -> None:
    """The description as DataHub shows it: the edited one (editable*Properties) over the ingested one."""
    for aspect, data in values.items():
        if aspect.endswith("Properties") or aspect.endswith("Info"):
            editable = aspect.startswith("editable") or aspect == "corpUserEditableInfo"
            text = data.get("description") or data.get("definition")
            if isinstance(text, str) and text and (editable or view.description is None):
                view.description = text
                view.description_source = "edited" if editable else "ingested"


async def entity(reader: EntityReader, entity_type: str, urn: str) -> EntityView | None:
    """The entity as the reader may see it; None when it does not exist (or is not the reader's to see)."""
    try:
        rows = await reader.latest_of(urn, None)
    except RegistryError:
        return None
    if not rows:
        return None
    values = {row.aspect: row.value for row in rows}
    view = EntityView(urn=urn, entity_type=entity_type, name=short_name(urn))
    for aspect, data in values.items():
        if aspect.endswith("Properties") or aspect.endswith("Info"):
            if isinstance(data.get("name"), str) and not aspect.startswith("editable"):
                view.name = data["name"]
            custom = data.get("customProperties")
            if isinstance(custom, dict):
                view.custom_properties.extend(sorted((str(k), str(v)) for k, v in custom.items()))
            for key in ("qualifiedName", "externalUrl", "displayName", "title", "email"):
                if isinstance(data.get(key), str):
                    view.properties.append((key, data[key]))
    _describe(view, values)
    if urn.startswith("urn:li:dataset:(urn:li:dataPlatform:"):
        view.platform = urn.split(",", 1)[0].rsplit(":", 1)[1]
    view.fields = _schema(values.get("schemaMetadata"), values.get("editableSchemaMetadata"))
    ownership = values.get("ownership") or {}
    for owner in ownership.get("owners") or []:
        kind = type_urn_of(owner)  # the type batchRemoveOwners matches it by
        who = owner["owner"]
        handle = short_name(who)
        view.owners.append(OwnerView(who, handle, handle, entity_url(who), kind, ownership_type_name(kind)))
    view.tags = _chips([t["tag"] for t in (values.get("globalTags") or {}).get("tags") or []])
    view.terms = _chips([t["urn"] for t in (values.get("glossaryTerms") or {}).get("terms") or []])
    view.domains = _chips(list((values.get("domains") or {}).get("domains") or []))
    assignments = (values.get("structuredProperties") or {}).get("properties") or []
    names = await display_names(
        reader,
        [c.urn for c in view.tags + view.terms + view.domains]
        + [o.urn for o in view.owners]
        + [c.urn for f in view.fields for c in f.tags + f.terms]
        + [str(a.get("propertyUrn", "")) for a in assignments],
    )
    view.tags, view.terms, view.domains = (_renamed(c, names) for c in (view.tags, view.terms, view.domains))
    view.owners = [replace(o, name=names.get(o.urn, o.name)) for o in view.owners]
    view.fields = [replace(f, tags=_renamed(f.tags, names), terms=_renamed(f.terms, names)) for f in view.fields]
    for assignment in assignments:
        shown = ", ".join(_value_text(v.get("string", v.get("double", v))) for v in assignment.get("values") or [])
        property_urn = str(assignment.get("propertyUrn", ""))
        view.structured.append((names.get(property_urn, short_name(property_urn)), shown))
    deprecation = values.get("deprecation")
    if deprecation and deprecation.get("deprecated"):
        view.deprecation = deprecation
    for link in (values.get("institutionalMemory") or {}).get("elements") or []:
        view.links.append((link.get("description") or link.get("url", ""), link.get("url", "")))
    for row in sorted(rows, key=lambda r: r.aspect):
        system = row.system_metadata
        props = system.get("properties") or {}
        view.aspects.append(
            RawAspectView(
                name=row.aspect,
                version=system.get("version"),
                run_id=system.get("runId"),
                trace_id=props.get("telemetryTraceId") if isinstance(props, dict) else None,
                created_by=row.created_by,
                created_on=row.created_on.isoformat(timespec="seconds"),
                json=json.dumps({"value": row.value, "systemMetadata": system}, indent=2, sort_keys=True),
            )
        )
    return view


def _schema(schema: dict[str, Any] | None, editable: dict[str, Any] | None) -> list[FieldRow]:
    """The schema's fields in their order, each with what people edited of it (editableSchemaMetadata) over what
    was ingested, as DataHub's schema tab shows them."""
    if not schema:
        return []
    edits = {f.get("fieldPath"): f for f in (editable or {}).get("editableSchemaFieldInfo") or []}
    rows = []
    for f in schema.get("fields") or []:
        path = f.get("fieldPath", "")
        edit = edits.get(path) or {}
        tags = [t["tag"] for t in ((f.get("globalTags") or {}).get("tags") or [])]
        edited_tags = [t["tag"] for t in ((edit.get("globalTags") or {}).get("tags") or []) if t["tag"] not in tags]
        terms = [t["urn"] for t in ((f.get("glossaryTerms") or {}).get("terms") or [])]
        edited_terms = [
            t["urn"] for t in ((edit.get("glossaryTerms") or {}).get("terms") or []) if t["urn"] not in terms
        ]
        data_type = f.get("nativeDataType") or next(iter((f.get("type") or {}).get("type") or {}), "")
        name, depth = _field_name(path)
        rows.append(
            FieldRow(
                path=path,
                name=name,
                depth=depth,
                type=str(data_type).rsplit(".", 1)[-1],
                description=edit.get("description") or f.get("description") or "",
                tags=_chips(tags, editable=False) + _chips(edited_tags),
                terms=_chips(terms, editable=False) + _chips(edited_terms),
            )
        )
    return rows


# --- what an edit chooses from

MAX_CHOICES = 25  # a chooser's results: a search narrows them
# The entity types a chooser searches, by what it chooses (the edit forms' names)
CHOOSABLE = {"tag": ["TAG"], "term": ["GLOSSARY_TERM"], "owner": ["CORP_USER", "CORP_GROUP"], "domain": ["DOMAIN"]}
# The URNs only: their names are read in one query of the aspect store (display_names), a fraction of what resolving
# each result's fields through GraphQL costs.
CHOOSE = f"""
query webChoose($types: [EntityType!], $query: String!) {{
  searchAcrossEntities(input: {{types: $types, query: $query, start: 0, count: {MAX_CHOICES},
                               searchFlags: {{skipAggregates: true, skipHighlighting: true}}}}) {{
    total searchResults {{ entity {{ urn }} }}
  }}
}}
"""
OWNERSHIP_TYPES = """
query webOwnershipTypes { listOwnershipTypes(input: {start: 0, count: 50}) { ownershipTypes { urn info { name } } } }
"""


@dataclass(frozen=True, slots=True)
class Choice:
    value: str  # a URN
    label: str
    handle: str  # the id in the URN, which tells apart two of one name


@dataclass(frozen=True, slots=True)
class Chooser:
    """The existing tags (terms, users and groups, domains) a search found for an edit to choose from."""

    kind: str  # a key of CHOOSABLE
    query: str
    found: list[Choice]
    total: int


SYSTEM_OWNERSHIP_CHOICES = [
    Choice(SYSTEM_OWNERSHIP_PREFIX + key, name, key) for key, name in SYSTEM_OWNERSHIP_TYPES.items()
]


async def choose(request: Request, session: AsyncSession, principal: Principal, kind: str, query: str) -> Chooser:
    """The first MAX_CHOICES of `kind` matching `query` (all of them for an empty one), by their names, as DataHub's
    edit dialogs search them; a search that fails finds none (the forms still take a name or a URN typed in)."""
    query = " ".join(query.split())[:200]
    try:
        data = await graphql(request, session, principal, CHOOSE, {"types": CHOOSABLE[kind], "query": query or "*"})
    except GraphQLRefused:
        return Chooser(kind, query, [], 0)
    found = data.get("searchAcrossEntities") or {}
    urns = [r["entity"]["urn"] for r in found.get("searchResults") or []]
    names = await display_names(EntityReader(session, request.app.state.registry, principal), urns)
    choices = [Choice(urn, names.get(urn) or short_name(urn), short_name(urn)) for urn in urns]
    return Chooser(kind, query, choices, int(found.get("total") or 0))


async def ownership_types(request: Request, session: AsyncSession, principal: Principal) -> list[Choice]:
    """DataHub's system ownership types, then the ones made here (ownershipType entities)."""
    try:
        data = await graphql(request, session, principal, OWNERSHIP_TYPES, {})
    except GraphQLRefused:
        return SYSTEM_OWNERSHIP_CHOICES
    custom = [
        Choice(t["urn"], (t.get("info") or {}).get("name") or short_name(t["urn"]), short_name(t["urn"]))
        for t in (data.get("listOwnershipTypes") or {}).get("ownershipTypes") or []
        if not t["urn"].startswith(SYSTEM_OWNERSHIP_PREFIX)
    ]
    return SYSTEM_OWNERSHIP_CHOICES + custom
