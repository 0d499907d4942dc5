"""DataHub's entity read model over aspects (issue 41 step 6): the fields of entity_read_model.graphql, resolved
generically. ASPECT_FIELDS is the table — GraphQL field -> the aspect it reads -> the converter that turns the
aspect's value into DataHub's GraphQL object — bound on every entity type of the schema that declares the field and
has no resolver of its own for it (app.graphql.entities.bind_entities). Every read goes through the request's
loader, so through the caller's reader (an entity the caller may not see reads as absent); an entity an aspect names
(a parent node or domain, a deprecation's actor, a structured property's value entity, a browse path's entry) is
answered only when the caller may see it, as DataHub's resolvers answer an entity they may not read: left out.

Not served, answered empty: `health` (metaledger computes none: no assertion results or incidents feed it, so the
list is empty, a valid DataHub answer). DataHub's own GraphQL does not merge a field's editable tags and terms into
`SchemaField.tags/glossaryTerms` (its SchemaFieldMapper reads schemaMetadata's; clients merge
`editableSchemaMetadata`), and neither does metaledger."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from app.graphql.entities import (
    EntityRef,
    _custom_properties,
    _domain,
    _glossary_terms,
    _key,
    _ownership,
    _tags,
    readable,
    related_entity,
    resolved_stamp,
    type_of_entity,
)
from app.graphql.paging import declare_paged

Converter = Callable[[EntityRef, Any, dict[str, Any]], Awaitable[Any]]

# editableProperties: DataHub's editable<Entity>Properties aspect of each object type
EDITABLE_ASPECTS = {
    "Dataset": "editableDatasetProperties",
    "Container": "editableContainerProperties",
    "Chart": "editableChartProperties",
    "Dashboard": "editableDashboardProperties",
    "DataFlow": "editableDataFlowProperties",
    "DataJob": "editableDataJobProperties",
    "MLModel": "editableMlModelProperties",
    "MLModelGroup": "editableMlModelGroupProperties",
    "MLFeatureTable": "editableMlFeatureTableProperties",
    "MLPrimaryKey": "editableMlPrimaryKeyProperties",
    "MLFeature": "editableMlFeatureProperties",
    "Notebook": "editableNotebookProperties",
}
MAX_ANCESTORS = 100  # a parent chain longer than this is a cycle (a lenient write let it in): the walk stops


async def _seen(info: Any, urn: str | None) -> EntityRef | None:
    """The entity `urn` names when the caller may see it and it exists (else None: left out)."""
    if not urn:
        return None
    return await readable(info, urn)


async def _seen_all(info: Any, urns: Iterable[str]) -> list[EntityRef]:
    found = await asyncio.gather(*(_seen(info, urn) for urn in urns))
    return [ref for ref in found if ref is not None]


def _lazy(info: Any, urn: str | None) -> Callable[[Any], Awaitable[EntityRef | None]] | None:
    """A field value read only when selected: the entity `urn` names, when the caller may see it."""
    if not urn:
        return None

    async def resolve(_info: Any) -> EntityRef | None:
        return await _seen(info, urn)

    return resolve


# --- converters: (the entity, info, the aspect's value) -> DataHub's object ----------------------------------------


async def _as_is(_ref: EntityRef, _info: Any, value: dict[str, Any]) -> dict[str, Any]:
    return value


async def _deprecation(_ref: EntityRef, info: Any, value: dict[str, Any]) -> dict[str, Any]:
    return {
        **value,
        "deprecated": bool(value.get("deprecated")),
        "actorEntity": _lazy(info, value.get("actor")),
        "replacement": _lazy(info, value.get("replacement")),
    }


def property_value(value: Any) -> dict[str, Any] | None:
    """A PrimitivePropertyValue (`{"string": ...}` or `{"double": ...}`) as DataHub's PropertyValue union member."""
    if isinstance(value, dict):
        if "string" in value:
            return {"__typename": "StringValue", "stringValue": value["string"]}
        if "double" in value:
            return {"__typename": "NumberValue", "numberValue": value["double"]}
    return None


async def _structured_properties(ref: EntityRef, info: Any, value: dict[str, Any]) -> dict[str, Any]:
    """DataHub's StructuredPropertiesMapper: an entry per property the caller may see, its values, and the
    entities its string values name."""
    entries = [p for p in value.get("properties") or () if p.get("propertyUrn")]
    properties = await _seen_all(info, [p["propertyUrn"] for p in entries])
    seen = {p.urn for p in properties}
    out = []
    for entry in entries:
        if entry["propertyUrn"] not in seen:
            continue
        values = [property_value(v) for v in entry.get("values") or ()]
        named = [v["stringValue"] for v in values if v and v["__typename"] == "StringValue"]
        out.append(
            {
                "structuredProperty": EntityRef(entry["propertyUrn"], "structuredProperty"),
                "values": values,
                "valueEntities": _value_entities(info, [u for u in named if u.startswith("urn:li:")]),
                "associatedUrn": ref.urn,
            }
        )
    return {"properties": out}


def _value_entities(info: Any, urns: list[str]) -> Callable[[Any], Awaitable[list[EntityRef]]]:
    async def resolve(_info: Any) -> list[EntityRef]:
        return await _seen_all(info, urns)

    return resolve


def _tag_list(owner: str, value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    tags = [
        {"tag": EntityRef(t["tag"], "tag"), "associatedUrn": owner, "context": t.get("context")}
        for t in value.get("tags") or ()
        if t.get("tag")
    ]
    return {"tags": tags}


def _term_list(owner: str, value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    terms = [
        {
            "term": EntityRef(t["urn"], "glossaryTerm"),
            "associatedUrn": owner,
            "context": t.get("context"),
            "actor": EntityRef(t["actor"], "corpuser") if t.get("actor") else None,
        }
        for t in value.get("terms") or ()
        if t.get("urn")
    ]
    return {"terms": terms, "auditStamp": value.get("auditStamp")}


def schema_field_extras(dataset: str, field: dict[str, Any]) -> dict[str, Any]:
    """DataHub's SchemaFieldMapper: the field's own tags and terms (of schemaMetadata), its partitioning flag and
    the schemaField entity it is."""
    path = field.get("fieldPath") or ""
    return {
        "tags": _tag_list(dataset, field.get("globalTags")),
        "glossaryTerms": _term_list(dataset, field.get("glossaryTerms")),
        "isPartitioningKey": field.get("isPartitioningKey"),
        "schemaFieldEntity": EntityRef(f"urn:li:schemaField:({dataset},{path})", "schemaField"),
    }


async def _editable_schema_metadata(ref: EntityRef, _info: Any, value: dict[str, Any]) -> dict[str, Any]:
    infos = []
    for field in value.get("editableSchemaFieldInfo") or ():
        tags = _tag_list(ref.urn, field.get("globalTags"))
        infos.append(
            {
                "fieldPath": field.get("fieldPath") or "",
                "description": field.get("description"),
                "globalTags": tags,
                "tags": tags,
                "glossaryTerms": _term_list(ref.urn, field.get("glossaryTerms")),
            }
        )
    return {"editableSchemaFieldInfo": infos}


async def _view_properties(_ref: EntityRef, _info: Any, value: dict[str, Any]) -> dict[str, Any]:
    return {
        "materialized": bool(value.get("materialized")),
        "logic": value.get("viewLogic") or "",
        "formattedLogic": value.get("formattedViewLogic"),
        "language": value.get("viewLanguage") or "",
    }


async def _browse_path(_ref: EntityRef, info: Any, value: dict[str, Any]) -> dict[str, Any]:
    entries = value.get("path") or ()
    entities = await asyncio.gather(*(_seen(info, e.get("urn")) for e in entries))
    return {"path": [{"name": e.get("id") or "", "entity": entity} for e, entity in zip(entries, entities)]}


async def _ownership_of(ref: EntityRef, info: Any, _value: dict[str, Any]) -> dict[str, Any] | None:
    return await _ownership(ref, info)


def _settings_value(value: dict[str, Any]) -> dict[str, Any]:
    flags = (
        "isHidden",
        "showInSearchFilters",
        "showInAssetSummary",
        "hideInAssetSummaryWhenEmpty",
        "showAsAssetBadge",
        "showInColumnsTable",
    )
    return {flag: bool(value.get(flag)) for flag in flags}


async def _property_settings(_ref: EntityRef, _info: Any, value: dict[str, Any]) -> dict[str, Any]:
    return _settings_value(value)


ASPECT_FIELDS: dict[str, tuple[str | None, Converter]] = {
    # field: (aspect, converter); aspect None: the object type's EDITABLE_ASPECTS entry
    "editableProperties": (None, _as_is),
    "deprecation": ("deprecation", _deprecation),
    "structuredProperties": ("structuredProperties", _structured_properties),
    "subTypes": ("subTypes", _as_is),
    "ownership": ("ownership", _ownership_of),
    "displayProperties": ("displayProperties", _as_is),
    "browsePathV2": ("browsePathsV2", _browse_path),
    "editableSchemaMetadata": ("editableSchemaMetadata", _editable_schema_metadata),
    "viewProperties": ("viewProperties", _view_properties),
}


def aspect_field(aspect: str, convert: Converter) -> Callable[..., Awaitable[Any]]:
    """The resolver of a field read from one aspect: None when the entity has no such aspect."""

    async def resolve(ref: EntityRef, info: Any) -> Any:
        value = await info.context.aspect(ref.urn, aspect)
        return None if value is None else await convert(ref, info, value)

    return resolve


async def _health(_ref: EntityRef, _info: Any) -> list[dict[str, Any]]:
    return []  # metaledger computes no health (module docstring)


# --- walks and keyed fields ------------------------------------------------------------------------------------------


async def _ancestors(info: Any, urn: str, aspect_of: dict[str, str], field: str) -> list[EntityRef]:
    """The chain of parents `field` names from `urn` up (nearest first), as far as the caller may see them."""
    chain: list[EntityRef] = []
    seen = {urn}
    current, aspect = urn, aspect_of[urn.split(":")[2]]
    while len(chain) < MAX_ANCESTORS:
        parent = (await info.context.aspect(current, aspect) or {}).get(field)
        if not parent or parent in seen:
            break
        ref = await _seen(info, parent)
        if ref is None or ref.entity_name not in aspect_of:
            break
        chain.append(ref)
        seen.add(parent)
        current, aspect = parent, aspect_of[ref.entity_name]
    return chain


GLOSSARY_PARENTS = {"glossaryTerm": "glossaryTermInfo", "glossaryNode": "glossaryNodeInfo"}


async def _parent_nodes(ref: EntityRef, info: Any) -> dict[str, Any]:
    nodes = await _ancestors(info, ref.urn, GLOSSARY_PARENTS, "parentNode")
    nodes = [n for n in nodes if n.entity_name == "glossaryNode"]
    return {"count": len(nodes), "nodes": nodes}


async def _parent_domains(ref: EntityRef, info: Any) -> dict[str, Any]:
    domains = await _ancestors(info, ref.urn, {"domain": "domainProperties"}, "parentDomain")
    return {"count": len(domains), "domains": domains}


async def _field_path(ref: EntityRef, info: Any) -> str:
    return str(_key(ref, info).get("fieldPath") or "")


async def _field_parent(ref: EntityRef, info: Any) -> EntityRef:
    parent = str(_key(ref, info).get("parent") or "")
    name = related_entity(info.context, parent) or "dataset"
    return EntityRef(parent, name)


def _data_type(urn: str) -> EntityRef:
    return EntityRef(urn, "dataType")


def _entity_type(urn: str) -> EntityRef:
    return EntityRef(urn, "entityType")


async def _definition(ref: EntityRef, info: Any) -> dict[str, Any]:
    """DataHub's StructuredPropertyDefinition of the propertyDefinition aspect (non-null in DataHub's schema: a
    property without one answers its key's id as qualified name, a string value type, no entity types)."""
    value = await info.context.aspect(ref.urn, "propertyDefinition") or {}
    qualifiers = value.get("typeQualifier") or {}
    allowed_types = qualifiers.get("allowedTypes")
    return {
        "qualifiedName": value.get("qualifiedName") or str(_key(ref, info).get("id") or ""),
        "displayName": value.get("displayName"),
        "description": value.get("description"),
        "cardinality": value.get("cardinality"),
        "allowedValues": [
            {"value": property_value(v.get("value")), "description": v.get("description")}
            for v in value.get("allowedValues") or ()
            if property_value(v.get("value")) is not None
        ]
        if value.get("allowedValues") is not None
        else None,
        "valueType": _data_type(value.get("valueType") or "urn:li:dataType:datahub.string"),
        "typeQualifier": {"allowedTypes": [_entity_type(u) for u in allowed_types]} if allowed_types else None,
        "entityTypes": [_entity_type(u) for u in value.get("entityTypes") or ()],
        "immutable": bool(value.get("immutable")),
        "created": resolved_stamp(value.get("created")),
        "lastModified": resolved_stamp(value.get("lastModified")),
    }


async def _settings(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await info.context.aspect(ref.urn, "structuredPropertySettings")
    return None if value is None else _settings_value(value)


STD_DATA_TYPES = {"string": "STRING", "number": "NUMBER", "urn": "URN", "rich_text": "RICH_TEXT", "date": "DATE"}


def _qualified(ref: EntityRef, info: Any) -> str:
    return str(_key(ref, info).get("id") or ref.urn.rsplit(":", 1)[-1])


async def _data_type_info(ref: EntityRef, info: Any) -> dict[str, Any]:
    value = await info.context.aspect(ref.urn, "dataTypeInfo") or {}
    name = value.get("qualifiedName") or _qualified(ref, info)
    return {
        "type": STD_DATA_TYPES.get(name.removeprefix("datahub."), "OTHER"),
        "qualifiedName": name,
        "displayName": value.get("displayName"),
        "description": value.get("description"),
    }


async def _entity_type_info(ref: EntityRef, info: Any) -> dict[str, Any]:
    value = await info.context.aspect(ref.urn, "entityTypeInfo") or {}
    name = value.get("qualifiedName") or _qualified(ref, info)
    return {
        "type": type_of_entity(name.removeprefix("datahub.")),
        "qualifiedName": name,
        "displayName": value.get("displayName"),
        "description": value.get("description"),
    }


def _from_aspect(aspect: str, field: str) -> Callable[..., Awaitable[Any]]:
    """One value of one aspect (DataHub's deprecated top-level copies of a properties field)."""

    async def resolve(ref: EntityRef, info: Any) -> Any:
        return (await info.context.aspect(ref.urn, aspect) or {}).get(field)

    return resolve


def _refs(urns: Any, entity: str) -> list[EntityRef]:
    return [EntityRef(urn, entity) for urn in urns or () if isinstance(urn, str)]


async def _feature_table_properties(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await info.context.aspect(ref.urn, "mlFeatureTableProperties")
    return None if value is None else {**value, "customProperties": _custom_properties(value)}


def _nested_refs(field: str, entity: str) -> Callable[..., list[EntityRef]]:
    """A field of an aspect's object that lists URNs, as the entities they name."""

    def resolve(parent: dict[str, Any], _info: Any) -> list[EntityRef]:
        return _refs(parent.get(field), entity)

    return resolve


def _change_stamp(parent: dict[str, Any], _info: Any) -> dict[str, Any]:
    """ChartInfo's/DashboardInfo's `lastModified` (ChangeAuditStamps) as DataHub's mappers answer it: its last
    modification (non-null in DataHub's schema: time 0 without one)."""
    stamps = parent.get("lastModified") or {}
    stamp = stamps.get("lastModified") if "lastModified" in stamps or "created" in stamps else stamps
    return stamp or {"time": 0, "actor": None}


async def _corp_group_info(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await info.context.aspect(ref.urn, "corpGroupInfo")
    if value is None:
        return None
    return {
        **value,
        "admins": _refs(value.get("admins"), "corpuser"),
        "members": _refs(value.get("members"), "corpuser"),
    }


async def _status(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await info.context.aspect(ref.urn, "status")
    return None if value is None else {"removed": bool(value.get("removed"))}


async def _input_output(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await info.context.aspect(ref.urn, "dataJobInputOutput")
    if value is None:
        return None
    inputs, outputs, jobs = await asyncio.gather(
        _seen_all(info, value.get("inputDatasets") or ()),
        _seen_all(info, value.get("outputDatasets") or ()),
        _seen_all(info, value.get("inputDatajobs") or ()),
    )
    return {"inputDatasets": inputs, "outputDatasets": outputs, "inputDatajobs": jobs}


async def _documentation(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await info.context.aspect(ref.urn, "documentation")
    if value is None:
        return None
    out = []
    for doc in value.get("documentations") or ():
        attribution = doc.get("attribution")
        out.append(
            {
                "documentation": doc.get("documentation") or "",
                "attribution": {
                    "time": attribution.get("time") or 0,
                    "actor": EntityRef(
                        attribution["actor"], related_entity(info.context, attribution["actor"]) or "corpuser"
                    ),
                    "source": _lazy(info, attribution.get("source")),
                    "sourceDetail": [
                        {"key": k, "value": v} for k, v in sorted((attribution.get("sourceDetail") or {}).items())
                    ],
                }
                if attribution and attribution.get("actor")
                else None,
            }
        )
    return {"documentations": out}


# A schemaMetadata.platformSchema member's text, by member (DataHub's PlatformSchemaMapper answers a TableSchema)
SCHEMA_TEXT = ("tableSchema", "documentSchema", "schema", "rawSchema", "ddl")


def _platform_schema(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict) or not value:
        return None
    member, body = next(iter(value.items()))
    body = body if isinstance(body, dict) else {}
    if member.endswith("KeyValueSchema"):
        return {
            "__typename": "KeyValueSchema",
            "keySchema": body.get("keySchema") or "",
            "valueSchema": body.get("valueSchema") or "",
        }
    text = next((body[k] for k in SCHEMA_TEXT if isinstance(body.get(k), str)), "")
    return {"__typename": "TableSchema", "schema": text}


def schema_metadata_extras(dataset: str, value: dict[str, Any]) -> dict[str, Any]:
    """DataHub's SchemaMetadataMapper's fields beside the fields: creation time, the dataset, the platform schema
    and the foreign keys (their fields and dataset as the entities they name)."""
    return {
        "createdAt": (value.get("created") or {}).get("time"),
        "datasetUrn": dataset,
        "cluster": value.get("cluster"),
        "platformSchema": _platform_schema(value.get("platformSchema")),
        "foreignKeys": [
            {
                "name": key.get("name"),
                "foreignFields": _refs(key.get("foreignFields"), "schemaField"),
                "sourceFields": _refs(key.get("sourceFields"), "schemaField"),
                "foreignDataset": EntityRef(key["foreignDataset"], "dataset") if key.get("foreignDataset") else None,
            }
            for key in value.get("foreignKeys") or ()
        ]
        if value.get("foreignKeys") is not None
        else None,
    }


def _with_filters(groups: list[list[dict[str, Any]]], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"and": [*group, *extra]} for group in groups or [[]]]


DEFAULT_DOMAIN_ENTITIES = 20  # DataHub's DomainEntitiesResolver; DataProduct.entities pages as a search does
declare_paged("entities", "searchResults", DEFAULT_DOMAIN_ENTITIES)


async def _domain_entities(ref: EntityRef, info: Any, input: dict[str, Any] | None = None) -> dict[str, Any]:
    """DataHub's DomainEntitiesResolver: a search of the entities in the domain (its `filters` ANDed)."""
    from app.graphql.resolvers import resolve_search_across_entities

    input = input or {}
    filters = [{k: v for k, v in f.items() if v is not None} for f in input.get("filters") or ()]
    search = {
        "query": input.get("query") or "*",
        "start": input.get("start") or 0,
        "count": input.get("count") if input.get("count") is not None else DEFAULT_DOMAIN_ENTITIES,
        "orFilters": _with_filters([filters], [{"field": "domains", "values": [ref.urn]}]),
    }
    return await resolve_search_across_entities(None, info, search)


async def _data_product_entities(ref: EntityRef, info: Any, input: dict[str, Any] | None = None) -> dict[str, Any]:
    """DataHub's ListDataProductAssetsResolver: a search among the data product's assets."""
    from app.graphql.resolvers import resolve_search_across_entities

    input = dict(input or {})
    assets = [
        a.get("destinationUrn")
        for a in (await info.context.aspect(ref.urn, "dataProductProperties") or {}).get("assets") or ()
    ]
    assets = [a for a in assets if a]
    start = input.get("start") or 0
    if not assets:
        return {"start": start, "count": 0, "total": 0, "searchResults": [], "facets": []}
    groups = [list(g.get("and") or ()) for g in input.get("orFilters") or ()]
    input["orFilters"] = _with_filters(groups, [{"field": "urn", "values": assets}])
    input.setdefault("query", "*")
    return await resolve_search_across_entities(None, info, input)


# --- assertions and incidents (GetEntity's): assertionInfo / incidentInfo as DataHub's mappers answer them ------------


def _entries(value: Any) -> list[dict[str, Any]] | None:
    return None if value is None else [{"key": k, "value": v} for k, v in sorted(value.items())]


def _with_entity_urn(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """An assertion kind's info: its `entity` as `entityUrn` (DataHub's mappers)."""
    return None if value is None else {**value, "entityUrn": value.get("entity") or ""}


async def _assertion_info(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await info.context.aspect(ref.urn, "assertionInfo")
    if value is None:
        return None
    dataset = value.get("datasetAssertion")
    if dataset is not None:
        dataset = {
            **dataset,
            "datasetUrn": dataset.get("dataset") or "",
            "fields": [{"urn": u, "path": u.rsplit(",", 1)[-1].rstrip(")")} for u in dataset.get("fields") or ()],
            "nativeParameters": _entries(dataset.get("nativeParameters")),
        }
    return {
        **value,
        "datasetAssertion": dataset,
        "volumeAssertion": _with_entity_urn(value.get("volumeAssertion")),
        "sqlAssertion": _with_entity_urn(value.get("sqlAssertion")),
        "fieldAssertion": _with_entity_urn(value.get("fieldAssertion")),
    }


async def _assertion_platform(ref: EntityRef, info: Any) -> EntityRef:
    platform = (await info.context.aspect(ref.urn, "dataPlatformInstance") or {}).get("platform") or "unknown"
    return EntityRef(platform if platform.startswith("urn:li:") else f"urn:li:dataPlatform:{platform}", "dataPlatform")


async def _run_events(_ref: EntityRef, _info: Any, **_arguments: Any) -> dict[str, Any]:
    """Run events are timeseries (assertionRunEvent): metaledger does not answer them here (none, documented)."""
    return {"total": 0, "failed": 0, "succeeded": 0, "runEvents": []}


PRIORITIES = {0: "CRITICAL", 1: "HIGH", 2: "MEDIUM", 3: "LOW"}  # incidentInfo.priority, as DataHub's mapper


async def _incident_info(ref: EntityRef, info: Any) -> dict[str, Any]:
    return await info.context.aspect(ref.urn, "incidentInfo") or {}


def _incident_field(convert: Callable[[dict[str, Any], Any], Any]) -> Callable[..., Awaitable[Any]]:
    async def resolve(ref: EntityRef, info: Any) -> Any:
        return convert(await _incident_info(ref, info), info)

    return resolve


def _incident_entity(value: dict[str, Any], info: Any) -> EntityRef:
    urn = next(iter(value.get("entities") or ()), "")
    return EntityRef(urn, related_entity(info.context, urn) or "dataset")


def _incident_source(value: dict[str, Any], info: Any) -> dict[str, Any] | None:
    source = value.get("source")
    if not source:
        return None
    return {"type": source.get("type") or "MANUAL", "source": _lazy(info, source.get("sourceUrn"))}


def _assignees(value: dict[str, Any], info: Any) -> list[EntityRef]:
    out = []
    for assignee in value.get("assignees") or ():
        name = related_entity(info.context, assignee.get("actor") or "")
        if name in ("corpuser", "corpGroup"):
            out.append(EntityRef(assignee["actor"], name))
    return out


INCIDENT_FIELDS: dict[str, Any] = {
    "incidentType": _incident_field(lambda v, _i: v.get("type") or "CUSTOM"),
    "customType": _incident_field(lambda v, _i: v.get("customType")),
    "title": _incident_field(lambda v, _i: v.get("title")),
    "description": _incident_field(lambda v, _i: v.get("description")),
    "priority": _incident_field(lambda v, _i: PRIORITIES.get(v["priority"]) if "priority" in v else None),
    "startedAt": _incident_field(lambda v, _i: v.get("startedAt")),
    "created": _incident_field(lambda v, _i: v.get("created") or {"time": 0, "actor": None}),
    "assignees": _incident_field(_assignees),
    "entity": _incident_field(_incident_entity),
    "source": _incident_field(_incident_source),
    "tags": _tags,
}


async def _business_attributes(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await info.context.aspect(ref.urn, "businessAttributes")
    if value is None:
        return None
    urn = (value.get("businessAttribute") or {}).get("businessAttributeUrn")
    attribute = await _seen(info, urn)
    association = {"businessAttribute": attribute, "associatedUrn": ref.urn} if attribute else None
    return {"businessAttribute": association}


async def _business_attribute_info(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    from app.graphql.entities import FIELD_TYPES

    value = await info.context.aspect(ref.urn, "businessAttributeInfo")
    if value is None:
        return None
    pegasus = next(iter(((value.get("type") or {}).get("type")) or {"NullType": {}}), "NullType")
    never = {"time": 0, "actor": None}
    return {
        **value,
        "name": value.get("name") or str(_key(ref, info).get("id") or ""),
        "type": FIELD_TYPES.get(pegasus.rsplit(".", 1)[-1], "NULL") if value.get("type") else None,
        "tags": _tag_list(ref.urn, value.get("globalTags")),
        "glossaryTerms": _term_list(ref.urn, value.get("glossaryTerms")),
        "customProperties": _custom_properties(value),
        "created": value.get("created") or never,
        "lastModified": value.get("lastModified") or never,
    }


# Fields of one object type each (the rest: ASPECT_FIELDS, on every entity type declaring them)
TYPE_FIELDS: dict[str, dict[str, Any]] = {
    "GlossaryTerm": {"parentNodes": _parent_nodes},
    "GlossaryNode": {"parentNodes": _parent_nodes},
    "SchemaFieldEntity": {
        "fieldPath": _field_path,
        "parent": _field_parent,
        "documentation": _documentation,
        "businessAttributes": _business_attributes,
    },
    "BusinessAttribute": {"properties": _business_attribute_info},
    "StructuredPropertyEntity": {"definition": _definition, "settings": _settings},
    "DataTypeEntity": {"info": _data_type_info},
    "EntityTypeEntity": {"info": _entity_type_info},
    "MLModel": {"description": _from_aspect("mlModelProperties", "description")},
    "MLModelGroup": {"description": _from_aspect("mlModelGroupProperties", "description")},
    "MLFeature": {"description": _from_aspect("mlFeatureProperties", "description")},
    "MLFeatureTable": {
        "description": _from_aspect("mlFeatureTableProperties", "description"),
        "featureTableProperties": _feature_table_properties,
    },
    "DataProduct": {
        "domain": _domain,
        "tags": _tags,
        "glossaryTerms": _glossary_terms,
        "entities": _data_product_entities,
    },
    "Domain": {"parentDomains": _parent_domains, "entities": _domain_entities},
    "CorpGroup": {"info": _corp_group_info},
    "OwnershipTypeEntity": {"status": _status},
    "DataJob": {"inputOutput": _input_output},
    "Assertion": {"info": _assertion_info, "platform": _assertion_platform, "runEvents": _run_events},
    "Incident": INCIDENT_FIELDS,
}
# Fields of objects inside an entity (not entities): their parent is the converted aspect value
NESTED_FIELDS: dict[str, dict[str, Any]] = {
    "MLFeatureTableProperties": {
        "mlFeatures": _nested_refs("mlFeatures", "mlFeature"),
        "mlPrimaryKeys": _nested_refs("mlPrimaryKeys", "mlPrimaryKey"),
    },
    "ChartProperties": {"lastModified": _change_stamp},
    "DashboardProperties": {"lastModified": _change_stamp},
}


def read_model_resolvers(type_name: str, fields: Iterable[str], bound: Iterable[str]) -> dict[str, Any]:
    """The resolvers of `type_name`'s read-model fields (of `fields`, the ones not `bound` already)."""
    taken = set(bound)
    resolvers: dict[str, Any] = {}
    for field in fields:
        if field in taken:
            continue
        if field in TYPE_FIELDS.get(type_name, {}):
            resolvers[field] = TYPE_FIELDS[type_name][field]
        elif field == "health":
            resolvers[field] = _health
        elif field in ASPECT_FIELDS:
            aspect, convert = ASPECT_FIELDS[field]
            aspect = aspect or EDITABLE_ASPECTS.get(type_name)
            if aspect is not None:
                resolvers[field] = aspect_field(aspect, convert)
    return resolvers


def resolve_property_value(value: Any, _info: Any, _type: Any) -> str:
    """The member of the PropertyValue union a converted value is."""
    return str(value.get("__typename") or ("StringValue" if "stringValue" in value else "NumberValue"))
