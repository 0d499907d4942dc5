"""DataHub's documents over GraphQL (schema: documents.graphql): the document entity's fields as DataHub's
DocumentMapper reads them, `relatedDocuments` of an asset as DataHub's RelatedDocumentsResolver answers it, and
`semanticSearchAcrossEntities`, which metaledger declares and refuses as DataHub refuses it where semantic search is
disabled.

* `document(urn:)`: the entity when it exists, is a document and the caller may see it, else null (as every root
  lookup by URN, app.graphql.resolvers `_typed_lookup`).
* `Document.info`: the documentInfo aspect — `contents` and the audit stamps non-null as DataHub declares them (a
  stamp's actor as a CorpUser, whether or not that user exists, as MapperUtils.createResolvedAuditStamp), `source`,
  `status`, and the assets, documents and parent it names, each left out when the caller may not see it (the read
  rule, as every entity an aspect names here); `Document.settings`: documentSettings.
* `relatedDocuments(input:)` on the 17 asset types DataHub declares it on: a search of the `document` entities whose
  `relatedAssets` (documentInfo's Searchable RelatedAsset URNs) name the asset, through the request's read-scoped
  search backend, with the input's filters ANDed (`parentDocuments`/`rootOnly` on `parentDocument`, `types` on the
  sub-types' `typeNames`, `domains`, `sourceType`) and DataHub's visibility rule (DocumentSearchFilterUtils): a
  PUBLISHED document, or an UNPUBLISHED one owned by the caller or a group of theirs; most recently modified first
  (`lastModifiedAt`), 100 by default. A soft-deleted document is left out, as every search leaves it out.
* `semanticSearchAcrossEntities`: metaledger computes no embeddings, so the field answers DataHub's error for a
  deployment without semantic search; DataHub's MCP server catches it and searches by keyword only.

Searching documents by their text needs nothing here: documentInfo's `contents.text` is Searchable (TEXT, queried by
default), so app.search.documents indexes it on both backends as `text`.

The field resolvers are registered in app.graphql.entities.FIELD_RESOLVERS when this module is imported (by
app.graphql.service, before any schema is built), so that bind_entities attaches them."""

from __future__ import annotations

import asyncio
from typing import Any

from app.errors import Issue, ValidationFailed
from app.graphql.entities import (
    FIELD_RESOLVERS,
    NO_STAMP,
    EntityRef,
    _custom_properties,
    _non_negative,
    _urn_of,
    related_entity,
    resolved_stamp,
)
from app.graphql.limits import check_arguments
from app.graphql.paging import declare_paged
from app.graphql.resolvers import _count, _facets, _typed_lookup
from app.search.across import TypeSearch, search_across
from app.search.model import MAX_FILTER_VALUES, Criterion

DOCUMENT_ENTITY = "document"
DOCUMENT_INFO, DOCUMENT_SETTINGS = "documentInfo", "documentSettings"
DEFAULT_RELATED = 100  # a page's documents when `count` is not given (DataHub's RelatedDocumentsResolver)
declare_paged("relatedDocuments", "documents", DEFAULT_RELATED)
# The search document's fields of documentInfo and the aspects it is filtered on (their Searchable annotations)
RELATED_ASSETS, PARENT, STATE, SOURCE_TYPE = "relatedAssets", "parentDocument", "state", "sourceType"
SUB_TYPES, DOMAINS, OWNERS, LAST_MODIFIED = "typeNames", "domains", "owners", "lastModifiedAt"
SOURCE_TYPES, STATES = frozenset({"NATIVE", "EXTERNAL"}), frozenset({"PUBLISHED", "UNPUBLISHED"})
# DataHub's SemanticSearchAcrossEntitiesResolver, on SemanticSearchDisabledException (a BAD_REQUEST)
SEMANTIC_SEARCH_DISABLED = "Semantic search is disabled in this environment"
# The asset types DataHub's entity.graphql declares `relatedDocuments` on
RELATED_DOCUMENTS_TYPES = (
    "Dataset",
    "GlossaryTerm",
    "GlossaryNode",
    "Container",
    "SchemaFieldEntity",
    "Dashboard",
    "Chart",
    "DataFlow",
    "DataJob",
    "MLModel",
    "MLModelGroup",
    "MLFeature",
    "MLPrimaryKey",
    "MLFeatureTable",
    "Domain",
    "DataProduct",
    "Application",
)


async def resolve_semantic_search_across_entities(_root: Any, _info: Any, input: dict[str, Any]) -> None:
    """DataHub's answer where semantic search is disabled: metaledger has none (no embeddings, no vector index)."""
    raise ValidationFailed(SEMANTIC_SEARCH_DISABLED)


# --- Document's fields (obj: the EntityRef) --------------------------------------------------------------------------


def _source(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict) or value.get("sourceType") not in SOURCE_TYPES:
        return None
    return {k: value.get(k) for k in ("sourceType", "externalUrl", "externalId")}


def _named(info: Any, urns: list[str], entity: str | None = None) -> Any:
    """A field value read only when selected: the entities `urns` name (of type `entity` when given) that the
    request's schema has a type for and the caller may see, in their order."""

    async def resolve(_info: Any) -> list[EntityRef]:
        context = info.context
        refs = []
        for urn in urns:
            name = related_entity(context, urn)
            if name is not None and (entity is None or name == entity):
                refs.append(EntityRef(urn, name))
        hidden = await context.unreadable([ref.urn for ref in refs])
        return [ref for ref in refs if ref.urn not in hidden]

    return resolve


def _urns(items: Any, key: str) -> list[str]:
    return [item[key] for item in items or () if isinstance(item, dict) and isinstance(item.get(key), str)]


async def _document_info(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await info.context.aspect(ref.urn, DOCUMENT_INFO)
    if value is None:
        return None
    assets = _named(info, _urns(value.get("relatedAssets"), "asset"))
    documents = _named(info, _urns(value.get("relatedDocuments"), "document"), DOCUMENT_ENTITY)
    parent = _named(info, _urns([value.get("parentDocument")], "document"), DOCUMENT_ENTITY)
    state = (value.get("status") or {}).get("state")

    async def related_assets(i: Any) -> list[dict[str, Any]] | None:
        return [{"asset": a} for a in await assets(i)] if value.get("relatedAssets") is not None else None

    async def related_documents(i: Any) -> list[dict[str, Any]] | None:
        return [{"document": d} for d in await documents(i)] if value.get("relatedDocuments") is not None else None

    async def parent_document(i: Any) -> dict[str, Any] | None:
        found = await parent(i)
        return {"document": found[0]} if found else None

    return {
        "title": value.get("title"),
        "source": _source(value.get("source")),
        "status": {"state": state} if state in STATES else None,
        "contents": {"text": (value.get("contents") or {}).get("text") or ""},
        "created": resolved_stamp(value.get("created")) or NO_STAMP,
        "lastModified": resolved_stamp(value.get("lastModified")) or NO_STAMP,
        "relatedAssets": related_assets,
        "relatedDocuments": related_documents,
        "parentDocument": parent_document,
        # DataHub's mapper sets them only when there are some
        "customProperties": _custom_properties(value) or None,
    }


async def _document_settings(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await info.context.aspect(ref.urn, DOCUMENT_SETTINGS)
    if value is None:
        return None
    return {"showInGlobalContext": value.get("showInGlobalContext") is not False}  # the model's default: true


# --- relatedDocuments of an asset (obj: the asset's EntityRef) -------------------------------------------------------


async def _owners_of_caller(info: Any) -> tuple[str, ...]:
    """The caller and the groups they belong to (corpUser's groupMembership and nativeGroupMembership), as DataHub's
    session actor context holds them: who an UNPUBLISHED document is shown to when it is theirs."""
    context = info.context
    actor = context.caller.actor
    groups, native = await asyncio.gather(
        context.aspect(actor, "groupMembership"), context.aspect(actor, "nativeGroupMembership")
    )
    found = [actor, *_plain(groups, "groups"), *_plain(native, "nativeGroups")]
    return tuple(dict.fromkeys(found))


def _plain(value: Any, key: str) -> list[str]:
    return [u for u in (value or {}).get(key) or () if isinstance(u, str)]


def _related_criteria(urn: str, input: dict[str, Any]) -> list[Criterion]:
    """DataHub's RelatedDocumentsResolver.buildBaseUserCriteria: the asset, then the input's filters."""
    criteria = [Criterion(RELATED_ASSETS, (urn,))]
    if input.get("parentDocuments"):
        criteria.append(Criterion(PARENT, tuple(input["parentDocuments"])))
    elif input.get("rootOnly"):
        criteria.append(Criterion(PARENT, (), negated=True, condition="EXISTS"))  # DataHub's IS_NULL
    if input.get("types"):
        criteria.append(Criterion(SUB_TYPES, tuple(input["types"])))
    if input.get("domains"):
        criteria.append(Criterion(DOMAINS, tuple(input["domains"])))
    if input.get("sourceType"):
        criteria.append(Criterion(SOURCE_TYPE, (input["sourceType"],)))
    return criteria


async def _related_documents(source: Any, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    """One page of the documents related to the asset that the caller may see (module docstring)."""
    check_arguments({"input": input})  # a nested field: its strings reach the search backend from here
    context = info.context
    start = _non_negative(input.get("start"), 0, "start")
    count = _count(input.get("count"), DEFAULT_RELATED, context.max_count)
    urn = _urn_of(source)
    if not urn or DOCUMENT_ENTITY not in context.registry.entities:
        return {"start": start, "count": 0, "total": 0, "documents": [], "facets": []}
    given = sum(len(input.get(name) or ()) for name in ("parentDocuments", "types", "domains"))
    if given > MAX_FILTER_VALUES // 2:  # each is in both groups below
        raise ValidationFailed(
            f"the input carries {given} filter values; the limit is {MAX_FILTER_VALUES // 2}",
            [Issue("too many values", path="$input", expected=f"at most {MAX_FILTER_VALUES // 2} values")],
        )
    base = tuple(_related_criteria(urn, input))
    owners = await _owners_of_caller(info)
    # DataHub's DocumentSearchFilterUtils: (filters AND PUBLISHED) OR (filters AND UNPUBLISHED AND owned by the caller)
    groups = (
        (*base, Criterion(STATE, ("PUBLISHED",))),
        (*base, Criterion(STATE, ("UNPUBLISHED",)), Criterion(OWNERS, owners)),
    )
    searches = [TypeSearch(DOCUMENT_ENTITY, groups)]
    page = await search_across(
        await context.backend(),
        searches,
        "*",
        start=start,
        count=min(count, max(context.max_count - start, 0)),
        sort=[(LAST_MODIFIED, "desc")],
    )
    return {
        "start": start,
        "count": len(page.hits),
        "total": page.total,
        "documents": [EntityRef(hit.urn, DOCUMENT_ENTITY) for hit in page.hits],
        "facets": _facets(context, searches, "*", {}),
    }


FIELD_RESOLVERS.setdefault("Document", {}).update({"info": _document_info, "settings": _document_settings})
for _type in RELATED_DOCUMENTS_TYPES:
    FIELD_RESOLVERS.setdefault(_type, {})["relatedDocuments"] = _related_documents
DOCUMENT_QUERIES = {
    "document": _typed_lookup(DOCUMENT_ENTITY),  # as lookups.graphql's: the entity when it is a document
    "semanticSearchAcrossEntities": resolve_semantic_search_across_entities,
}
