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
    _key,
    _ownership,
    readable,
    related_entity,
    type_of_entity,
)

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
        {"term": EntityRef(t["urn"], "glossaryTerm"), "associatedUrn": owner, "context": t.get("context")}
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


def _audit_stamp(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if not value:
        return None
    actor = value.get("actor")
    return {"time": value.get("time") or 0, "actor": EntityRef(actor, "corpuser") if actor else None}


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
        "created": _audit_stamp(value.get("created")),
        "lastModified": _audit_stamp(value.get("lastModified")),
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


# Fields of one object type each (the rest: ASPECT_FIELDS, on every entity type declaring them)
TYPE_FIELDS: dict[str, dict[str, Any]] = {
    "GlossaryTerm": {"parentNodes": _parent_nodes},
    "GlossaryNode": {"parentNodes": _parent_nodes},
    "Domain": {"parentDomains": _parent_domains},
    "SchemaFieldEntity": {"fieldPath": _field_path, "parent": _field_parent},
    "StructuredPropertyEntity": {"definition": _definition, "settings": _settings},
    "DataTypeEntity": {"info": _data_type_info},
    "EntityTypeEntity": {"info": _entity_type_info},
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
    return "StringValue" if "stringValue" in value else "NumberValue"
