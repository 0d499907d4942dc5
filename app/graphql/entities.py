"""DataHub's GraphQL entity types over metaledger's aspect store: which registry entity each `EntityType` value
names, the object type of each, and the resolvers of the fields read from aspects (only when a query selects
them: a search that selects `urn` and `type` reads nothing but the index).

An entity type registered at run time (app.registry.runtime) is an object type of the schema built for the registry
holding it (app.graphql.service): `urn`, `type` (OTHER, as DataHub's EntityTypeMapper answers an entity name it has
no value for) and `aspects`, which every entity type has and which reads any aspect of the entity, runtime ones
included, as DataHub's RawAspect."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from graphql import GraphQLSchema

from app.errors import Issue, ValidationFailed
from app.graphql.paging import declare_paged
from app.registry import EntityRegistry
from app.registry.errors import RegistryError
from app.urns import InvalidUrnError, entity_type_of

# EntityType value -> (registry entity name, GraphQL object type), as DataHub's EntityTypeMapper pairs them.
ENTITY_TYPES: dict[str, tuple[str, str]] = {
    "DOMAIN": ("domain", "Domain"),
    "DATASET": ("dataset", "Dataset"),
    "CORP_USER": ("corpuser", "CorpUser"),
    "CORP_GROUP": ("corpGroup", "CorpGroup"),
    "DATA_PLATFORM": ("dataPlatform", "DataPlatform"),
    "ER_MODEL_RELATIONSHIP": ("erModelRelationship", "ERModelRelationship"),
    "DASHBOARD": ("dashboard", "Dashboard"),
    "NOTEBOOK": ("notebook", "Notebook"),
    "CHART": ("chart", "Chart"),
    "DATA_FLOW": ("dataFlow", "DataFlow"),
    "DATA_JOB": ("dataJob", "DataJob"),
    "TAG": ("tag", "Tag"),
    "GLOSSARY_TERM": ("glossaryTerm", "GlossaryTerm"),
    "GLOSSARY_NODE": ("glossaryNode", "GlossaryNode"),
    "CONTAINER": ("container", "Container"),
    "MLMODEL": ("mlModel", "MLModel"),
    "MLMODEL_GROUP": ("mlModelGroup", "MLModelGroup"),
    "MLFEATURE_TABLE": ("mlFeatureTable", "MLFeatureTable"),
    "MLFEATURE": ("mlFeature", "MLFeature"),
    "MLPRIMARY_KEY": ("mlPrimaryKey", "MLPrimaryKey"),
    "INGESTION_SOURCE": ("dataHubIngestionSource", "IngestionSource"),
    "EXECUTION_REQUEST": ("dataHubExecutionRequest", "ExecutionRequest"),
    "ASSERTION": ("assertion", "Assertion"),
    "DATA_PROCESS_INSTANCE": ("dataProcessInstance", "DataProcessInstance"),
    "DATA_PLATFORM_INSTANCE": ("dataPlatformInstance", "DataPlatformInstance"),
    "ACCESS_TOKEN": ("dataHubAccessToken", "AccessTokenMetadata"),
    "TEST": ("test", "Test"),
    "DATAHUB_POLICY": ("dataHubPolicy", "DataHubPolicy"),
    "DATAHUB_ROLE": ("dataHubRole", "DataHubRole"),
    "POST": ("post", "Post"),
    "SCHEMA_FIELD": ("schemaField", "SchemaFieldEntity"),
    "DATAHUB_VIEW": ("dataHubView", "DataHubView"),
    "QUERY": ("query", "QueryEntity"),
    "DATA_PRODUCT": ("dataProduct", "DataProduct"),
    "CUSTOM_OWNERSHIP_TYPE": ("ownershipType", "OwnershipTypeEntity"),
    "DATAHUB_CONNECTION": ("dataHubConnection", "DataHubConnection"),
    "INCIDENT": ("incident", "Incident"),
    "ROLE": ("role", "Role"),
    "DATA_CONTRACT": ("dataContract", "DataContract"),
    "STRUCTURED_PROPERTY": ("structuredProperty", "StructuredPropertyEntity"),
    "FORM": ("form", "Form"),
    "DATA_TYPE": ("dataType", "DataTypeEntity"),
    "ENTITY_TYPE": ("entityType", "EntityTypeEntity"),
    "BUSINESS_ATTRIBUTE": ("businessAttribute", "BusinessAttribute"),
    "VERSION_SET": ("versionSet", "VersionSet"),
    "APPLICATION": ("application", "Application"),
    "DOCUMENT": ("document", "Document"),
    "DATAHUB_PAGE_TEMPLATE": ("dataHubPageTemplate", "DataHubPageTemplate"),
    "DATAHUB_PAGE_MODULE": ("dataHubPageModule", "DataHubPageModule"),
    "DATAHUB_FILE": ("dataHubFile", "DataHubFile"),
}
GRAPHQL_TYPE_OF_ENTITY = {entity: enum for enum, (entity, _) in ENTITY_TYPES.items()}
OTHER = "OTHER"  # the EntityType of an entity without a value of its own (an entity type registered at run time)


def type_of_entity(entity: str) -> str:
    """The EntityType value of a registry entity."""
    return GRAPHQL_TYPE_OF_ENTITY.get(entity, OTHER)


# The types searched when a search names none: DataHub's SearchUtils.SEARCHABLE_ENTITY_TYPES.
SEARCHABLE_TYPES = (
    "DATASET",
    "DASHBOARD",
    "CHART",
    "MLMODEL",
    "MLMODEL_GROUP",
    "MLFEATURE_TABLE",
    "MLFEATURE",
    "MLPRIMARY_KEY",
    "DATA_FLOW",
    "DATA_JOB",
    "GLOSSARY_TERM",
    "GLOSSARY_NODE",
    "TAG",
    "ROLE",
    "CORP_USER",
    "CORP_GROUP",
    "CONTAINER",
    "DOMAIN",
    "DATA_PRODUCT",
    "NOTEBOOK",
    "BUSINESS_ATTRIBUTE",
    "SCHEMA_FIELD",
    "APPLICATION",
    "DOCUMENT",
)


@dataclass(frozen=True, slots=True)
class EntityRef:
    """An entity in a result: what the index or the URN tells (urn, type); the rest is read when selected."""

    urn: str
    entity_name: str  # the registry's

    @property
    def type(self) -> str:
        return type_of_entity(self.entity_name)


def _id_of(urn: str) -> str:
    return urn.split(":", 3)[3] if urn.count(":") >= 3 else urn


# DataHub's non-null ResolvedAuditStamp where an aspect has no stamp
NO_STAMP: dict[str, Any] = {"time": 0, "actor": None}


def resolved_stamp(value: Any) -> dict[str, Any] | None:
    """DataHub's ResolvedAuditStamp of an aspect's AuditStamp: its actor as a CorpUser, whether or not that user
    exists (MapperUtils.createResolvedAuditStamp); None without a stamp."""
    if not isinstance(value, dict) or not value:
        return None
    actor = value.get("actor")
    return {"time": value.get("time") or 0, "actor": EntityRef(actor, "corpuser") if actor else None}


def entity_ref(urn: str) -> EntityRef | None:
    """The entity a URN in an aspect names, when DataHub's GraphQL has a type for it."""
    try:
        entity = entity_type_of(urn)
    except InvalidUrnError:
        return None
    return EntityRef(urn, entity) if entity in GRAPHQL_TYPE_OF_ENTITY else None


def _key(ref: EntityRef, info: Any) -> dict[str, Any]:
    """The entity's key, from its URN (no read: every URN holds its key)."""
    try:
        return info.context.registry.urn_to_key(ref.entity_name, ref.urn)
    except RegistryError:  # a URN in an aspect that is no valid key (a lenient registry let it in)
        return {}


def _custom_properties(value: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": v} for k, v in sorted((value.get("customProperties") or {}).items())]


def _platform(urn: str | None) -> EntityRef | None:
    if not urn:
        return None
    return EntityRef(urn if urn.startswith("urn:li:dataPlatform:") else f"urn:li:dataPlatform:{urn}", "dataPlatform")


async def _aspect(info: Any, ref: EntityRef, name: str) -> dict[str, Any] | None:
    return await info.context.aspect(ref.urn, name)


# --- field resolvers (obj: the EntityRef), and the factories of the ones several types share ------------------------


def _key_field(ref: EntityRef, info: Any, field: str) -> Any:
    """One field of the entity's key (the URN's id when the key has no such value)."""
    value = _key(ref, info).get(field)
    return value if value is not None else _id_of(ref.urn)


def _from_key(field: str):
    async def resolve(ref: EntityRef, info: Any) -> Any:
        return _key_field(ref, info, field)

    return resolve


def _key_platform(field: str):
    """The platform a key names: a platform URN (datasets, ML entities) or a tool's name (charts, flows)."""

    async def resolve(ref: EntityRef, info: Any) -> EntityRef | None:
        return _platform(_key(ref, info).get(field)) or _platform("unknown")

    return resolve


def _instance_platform(default: str):
    """The platform of the entity's dataPlatformInstance aspect, `default` without one."""

    async def resolve(ref: EntityRef, info: Any) -> EntityRef | None:
        value = await _aspect(info, ref, "dataPlatformInstance") or {}
        return _platform(value.get("platform") or default)

    return resolve


def _properties(
    aspect: str,
    *,
    renamed: dict[str, str] | None = None,
    name_from_key: str | None = None,
    defaults: dict[str, Any] | None = None,
):
    """An aspect as a *Properties object: `renamed` maps a GraphQL field to the aspect's field, `name_from_key`
    gives the name when the aspect has none, customProperties become entries."""

    async def resolve(ref: EntityRef, info: Any) -> dict[str, Any] | None:
        value = await _aspect(info, ref, aspect)
        if value is None:
            return None
        out = {**(defaults or {}), **value, "customProperties": _custom_properties(value)}
        for field, source in (renamed or {}).items():
            out[field] = value.get(source)
        if name_from_key is not None and not out.get("name"):
            out["name"] = _key_field(ref, info, name_from_key)
        return out

    return resolve


async def _tags(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "globalTags")
    if value is None:
        return None
    return {
        "tags": [
            {"tag": EntityRef(t["tag"], "tag"), "associatedUrn": ref.urn, "context": t.get("context")}
            for t in value.get("tags") or ()
            if t.get("tag")
        ]
    }


async def _glossary_terms(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "glossaryTerms")
    if value is None:
        return None
    return {
        "terms": [
            {
                "term": EntityRef(t["urn"], "glossaryTerm"),
                "associatedUrn": ref.urn,
                "context": t.get("context"),
                "actor": EntityRef(t["actor"], "corpuser") if t.get("actor") else None,
            }
            for t in value.get("terms") or ()
            if t.get("urn")
        ],
        "auditStamp": value.get("auditStamp"),
    }


OWNER_ENTITIES = {"corpuser", "corpGroup"}  # DataHub's OwnerType union


async def _ownership(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "ownership")
    if value is None:
        return None
    owners = []
    for owner in value.get("owners") or ():
        entity = entity_ref(owner.get("owner") or "")
        if entity is None or entity.entity_name not in OWNER_ENTITIES:
            continue
        type_urn = owner.get("typeUrn")
        owners.append(
            {
                "owner": entity,
                "type": owner.get("type"),
                "associatedUrn": ref.urn,
                "ownershipType": EntityRef(type_urn, "ownershipType") if type_urn else None,
            }
        )
    return {"owners": owners, "lastModified": value.get("lastModified") or {"time": 0, "actor": None}}


async def _domain(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "domains") or {}
    domains = value.get("domains") or ()
    return {"domain": EntityRef(domains[0], "domain"), "associatedUrn": ref.urn} if domains else None


async def _container(ref: EntityRef, info: Any) -> EntityRef | None:
    value = await _aspect(info, ref, "container") or {}
    return EntityRef(value["container"], "container") if value.get("container") else None


async def _sub_type(ref: EntityRef, info: Any) -> str | None:
    names = (await _aspect(info, ref, "subTypes") or {}).get("typeNames") or ()
    return names[0] if names else None


async def _data_flow(ref: EntityRef, info: Any) -> EntityRef | None:
    flow = _key(ref, info).get("flow")
    return EntityRef(flow, "dataFlow") if flow else None


ASSOCIATIONS = {"tags": _tags, "glossaryTerms": _glossary_terms, "ownership": _ownership, "domain": _domain}


async def _sub_types(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "subTypes")
    return None if value is None else {"typeNames": value.get("typeNames")}


async def readable(info: Any, urn: str, entity: str | None = None) -> EntityRef | None:
    """The entity `urn` names when it exists and the caller may see it (its key aspect read through the caller's
    reader, which leaves out what it may not see), of a type DataHub's GraphQL (or the request's schema) has."""
    context = info.context
    name = entity or related_entity(context, urn)
    spec = context.registry.entities.get(name) if name else None
    if spec is None or await context.aspect(urn, spec.key_aspect) is None:
        return None
    return EntityRef(urn, spec.name)


def related_entity(context: Any, urn: str) -> str | None:
    """The registry entity of an URN an aspect or an edge names, when the request's schema has a type for it."""
    try:
        name = entity_type_of(urn)
    except InvalidUrnError:
        return None
    spec = context.registry.entities.get(name)
    if spec is None or (spec.name not in GRAPHQL_TYPE_OF_ENTITY and spec.name not in context.runtime_types):
        return None
    return str(spec.name)


# --- corp users: DataHub's CorpUserMapper over corpUserInfo, corpUserEditableInfo and corpUserSettings ------------


async def _corp_user_info(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "corpUserInfo")
    if value is None:
        return None
    manager = value.get("managerUrn")
    return {
        **value,
        "active": bool(value.get("active")),
        "manager": EntityRef(manager, "corpuser") if manager else None,
        "customProperties": _custom_properties(value),
    }


async def _corp_user_editable(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "corpUserEditableInfo")
    if value is None:
        return None
    platforms = [_platform(urn) for urn in value.get("platforms") or () if urn]
    return {**value, "platforms": platforms}


async def _corp_user_settings(ref: EntityRef, info: Any) -> dict[str, Any]:
    """As DataHub's CorpUserMapper: settings always, their appearance always (its flags false when not set), the
    views when the user has saved a default."""
    value = await _aspect(info, ref, "corpUserSettings") or {}
    appearance = value.get("appearance") or {}
    views = value.get("views")
    default_view = (views or {}).get("defaultView")

    async def resolve_default_view(_info: Any) -> EntityRef | None:
        return await readable(info, default_view, "dataHubView") if default_view else None

    return {
        "appearance": {
            "showSimplifiedHomepage": bool(appearance.get("showSimplifiedHomepage")),
            "showThemeV2": appearance.get("showThemeV2"),
        },
        "views": {"defaultView": resolve_default_view} if views is not None else None,
    }


# --- relationships: the graph's edges (the search backend's), as DataHub's EntityRelationshipsResultResolver ------

DEFAULT_RELATIONSHIPS = 100  # a page's relationships when `count` is not given (DataHub's graph client's default)
declare_paged("relationships", "relationships", DEFAULT_RELATIONSHIPS)
STATUS_ASPECT = "status"


def _urn_of(source: Any) -> str | None:
    return source.urn if isinstance(source, EntityRef) else (source or {}).get("urn")


def _non_negative(value: int | None, default: int, name: str) -> int:
    if value is None:
        return default
    if value < 0:
        raise ValidationFailed(
            f"{name} must not be negative", [Issue("negative", path=f"$input.{name}", found=str(value))]
        )
    return value


async def _relationships(source: Any, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    """One page of the entity's edges of `input.types` (every type when none) in `input.direction`: OUTGOING, the
    entity is the edge's source and the related entity its destination; INCOMING the other way round. As DataHub
    answers them: a related entity the caller may not see is left out of the page (and of `total`), and so, with
    `includeSoftDelete: false`, is one that is soft-deleted or does not exist; `count` is what the page holds."""
    context = info.context
    urn = _urn_of(source)
    start = _non_negative(input.get("start"), 0, "start")
    count = min(_non_negative(input.get("count"), DEFAULT_RELATIONSHIPS, "count"), context.max_count)
    if not urn or count == 0:
        return {"start": start, "count": 0, "total": 0, "relationships": []}
    direction = input["direction"]
    backend = await context.backend()
    edges, total = await backend.relationships(
        urn, direction=direction, types=list(input.get("types") or ()) or None, start=start, count=count
    )
    outgoing = direction == "OUTGOING"
    related = [edge.destination if outgoing else edge.source for edge in edges]
    hidden = await context.unreadable(related)
    if input.get("includeSoftDelete") is False:
        present = await asyncio.gather(*(_present(info, other) for other in related))
        hidden |= {other for other, shown in zip(related, present) if not shown}
    relationships = [
        {
            "type": edge.relationship,
            "direction": direction,
            "entity": _related_ref(context, other),
            "created": {"time": edge.created_on, "actor": edge.created_actor} if edge.created_on is not None else None,
        }
        for edge, other in zip(edges, related)
        if other not in hidden
    ]
    left_out = len(edges) - len(relationships)
    return {"start": start, "count": len(relationships), "total": total - left_out, "relationships": relationships}


def _related_ref(context: Any, urn: str) -> EntityRef | None:
    name = related_entity(context, urn)
    return EntityRef(urn, name) if name else None


async def _present(info: Any, urn: str) -> bool:
    """Whether `urn` exists, is not soft-deleted, and the caller may see it."""
    try:
        spec = info.context.registry.entities.get(entity_type_of(urn))
    except InvalidUrnError:
        return False
    if spec is None:
        return False
    key, status = await asyncio.gather(
        info.context.aspect(urn, spec.key_aspect), info.context.aspect(urn, STATUS_ASPECT)
    )
    return key is not None and not (status or {}).get("removed")


async def _data_product_properties(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "dataProductProperties")
    if value is None:
        return None
    return {
        **value,
        "name": value.get("name") or _key_field(ref, info, "id"),
        "numAssets": len(value.get("assets") or ()),
        "customProperties": _custom_properties(value),
    }


async def _dataset_properties(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "datasetProperties")
    if value is None:
        return None
    return {
        **value,
        "name": value.get("name") or _key_field(ref, info, "name"),
        "customProperties": _custom_properties(value),
    }


# SchemaFieldDataType by the Pegasus type of schemaMetadata's field.type (`{"type": {"com.linkedin.schema.<T>": {}}}`)
FIELD_TYPES = {
    "BooleanType": "BOOLEAN",
    "FixedType": "FIXED",
    "StringType": "STRING",
    "BytesType": "BYTES",
    "NumberType": "NUMBER",
    "DateType": "DATE",
    "TimeType": "TIME",
    "EnumType": "ENUM",
    "NullType": "NULL",
    "MapType": "MAP",
    "ArrayType": "ARRAY",
    "UnionType": "UNION",
    "RecordType": "STRUCT",
}


def _schema_field(field: dict[str, Any]) -> dict[str, Any]:
    pegasus = next(iter((field.get("type") or {}).get("type") or {"NullType": {}}), "NullType")
    return {
        **field,
        "type": FIELD_TYPES.get(pegasus.rsplit(".", 1)[-1], "NULL"),
        "nullable": bool(field.get("nullable")),
        "recursive": bool(field.get("recursive")),
    }


async def _schema_metadata(ref: EntityRef, info: Any, version: int | None = None) -> dict[str, Any] | None:
    from app.graphql.read_model import schema_field_extras, schema_metadata_extras

    value = await info.context.aspect_version(ref, "schemaMetadata", version or 0)
    if value is None:
        return None
    return {
        **value,
        "name": value.get("schemaName", ""),
        "platformUrn": value.get("platform"),
        "hash": value.get("hash", ""),
        "fields": [{**_schema_field(f), **schema_field_extras(ref.urn, f)} for f in value.get("fields") or ()],
        **schema_metadata_extras(ref.urn, value),
    }


async def _exists(ref: EntityRef, info: Any) -> bool:
    return await info.context.exists(ref.urn)


async def _platform_instance(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "dataPlatformInstance")
    if value is None:
        return None
    instance = value.get("instance")
    return {
        "urn": instance or value.get("platform"),
        "type": "DATA_PLATFORM_INSTANCE",
        "platform": _platform(value.get("platform")),
        "instanceId": _id_of(instance) if instance else "",
    }


async def _platform_properties(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "dataPlatformInfo")
    return None if value is None else {**value, "datasetNameDelimiter": value.get("datasetNameDelimiter", ".")}


async def _tag_name(ref: EntityRef, info: Any) -> str:
    props = await _aspect(info, ref, "tagProperties") or {}
    return props.get("name") or _key_field(ref, info, "name")


async def _tag_description(ref: EntityRef, info: Any) -> str | None:
    return (await _aspect(info, ref, "tagProperties") or {}).get("description")


async def _tag_properties(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "tagProperties")
    return None if value is None else {**value, "name": value.get("name") or await _tag_name(ref, info)}


def _render_spec(annotation: dict[str, Any]) -> dict[str, Any] | None:
    spec = annotation.get("renderSpec")
    return {name: spec.get(name) for name in ("displayType", "displayName", "key")} if isinstance(spec, dict) else None


async def _raw_aspects(ref: EntityRef, info: Any, input: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """DataHub's WeaklyTypedAspectsResolver: the entity's aspects that have a value, in the entity's order, filtered
    by `aspectNames` (a name the entity does not have is left out, not an error) and `autoRenderOnly`; a timeseries
    aspect has no latest value to answer. A payload is the aspect's JSON text as stored (never parsed here): aliases
    of the same aspects share it, and the answer's budget counts each time it is answered."""
    registry = info.context.registry
    entity = registry.entities.get(ref.entity_name)
    if entity is None:
        return []
    names = set((input or {}).get("aspectNames") or ())
    auto_render_only = bool((input or {}).get("autoRenderOnly"))
    wanted = [
        name
        for name in entity.aspects_in_order or sorted(entity.aspect_names)
        if (not names or name in names)
        and not registry.aspects[name].is_timeseries
        and (not auto_render_only or registry.aspects[name].annotation.get("autoRender"))
    ]
    values = await asyncio.gather(*(info.context.aspect_json(ref.urn, name) for name in wanted))
    return [
        {"aspectName": name, "payload": value, "renderSpec": _render_spec(registry.aspects[name].annotation)}
        for name, value in zip(wanted, values)
        if value is not None
    ]


FIELD_RESOLVERS: dict[str, dict[str, Any]] = {
    "Dataset": {
        "subTypes": _sub_types,
        "name": _from_key("name"),
        "platform": _key_platform("platform"),
        "origin": _from_key("origin"),
        "properties": _dataset_properties,
        "dataPlatformInstance": _platform_instance,
        "exists": _exists,
        "schemaMetadata": _schema_metadata,
        "container": _container,
        **ASSOCIATIONS,
    },
    "DataPlatform": {"name": _from_key("platformName"), "properties": _platform_properties},
    "DataJob": {
        "subTypes": _sub_types,
        "jobId": _from_key("jobId"),
        "dataFlow": _data_flow,
        "properties": _properties("dataJobInfo"),
        "dataPlatformInstance": _platform_instance,
        "exists": _exists,
        **ASSOCIATIONS,
    },
    "DataFlow": {
        "subTypes": _sub_types,
        "orchestrator": _from_key("orchestrator"),
        "flowId": _from_key("flowId"),
        "cluster": _from_key("cluster"),
        "platform": _key_platform("orchestrator"),
        "properties": _properties("dataFlowInfo"),
        "exists": _exists,
        **ASSOCIATIONS,
    },
    "Tag": {"name": _tag_name, "description": _tag_description, "properties": _tag_properties},
    "CorpUser": {
        "username": _from_key("username"),
        "properties": _properties("corpUserInfo", defaults={"active": False}),
        "info": _corp_user_info,
        "editableProperties": _corp_user_editable,
        "editableInfo": _corp_user_editable,
        "exists": _exists,
        "settings": _corp_user_settings,
    },
    "GlossaryNode": {
        "properties": _properties("glossaryNodeInfo", renamed={"description": "definition"}, name_from_key="name"),
    },
    "DataProduct": {"properties": _data_product_properties},
    "CorpGroup": {"name": _from_key("name"), "properties": _properties("corpGroupInfo")},
    "Domain": {"id": _from_key("id"), "properties": _properties("domainProperties", name_from_key="id")},
    "Container": {
        "subTypes": _sub_types,
        "platform": _instance_platform("unknown"),
        "container": _container,
        "properties": _properties("containerProperties", name_from_key="guid"),
        **ASSOCIATIONS,
    },
    "Chart": {
        "subTypes": _sub_types,
        "tool": _from_key("dashboardTool"),
        "chartId": _from_key("chartId"),
        "platform": _key_platform("dashboardTool"),
        "container": _container,
        "properties": _properties("chartInfo", renamed={"name": "title"}),
        **ASSOCIATIONS,
    },
    "Dashboard": {
        "subTypes": _sub_types,
        "tool": _from_key("dashboardTool"),
        "dashboardId": _from_key("dashboardId"),
        "platform": _key_platform("dashboardTool"),
        "container": _container,
        "properties": _properties("dashboardInfo", renamed={"name": "title"}),
        **ASSOCIATIONS,
    },
    "GlossaryTerm": {
        "name": _from_key("name"),
        "hierarchicalName": _from_key("name"),
        "properties": _properties(
            "glossaryTermInfo",
            renamed={"description": "definition"},
            name_from_key="name",
            defaults={"termSource": "INTERNAL"},
        ),
    },
    "MLModel": {
        "name": _from_key("name"),
        "platform": _key_platform("platform"),
        "origin": _from_key("origin"),
        "properties": _properties("mlModelProperties"),
        **ASSOCIATIONS,
    },
    "MLModelGroup": {
        "name": _from_key("name"),
        "platform": _key_platform("platform"),
        "origin": _from_key("origin"),
        "properties": _properties("mlModelGroupProperties"),
        **ASSOCIATIONS,
    },
    "MLFeatureTable": {
        "name": _from_key("name"),
        "platform": _key_platform("platform"),
        "properties": _properties("mlFeatureTableProperties"),
        **ASSOCIATIONS,
    },
    "MLFeature": {
        "name": _from_key("name"),
        "featureNamespace": _from_key("featureNamespace"),
        "properties": _properties("mlFeatureProperties"),
        **ASSOCIATIONS,
    },
    "MLPrimaryKey": {
        "name": _from_key("name"),
        "featureNamespace": _from_key("featureNamespace"),
        "properties": _properties("mlPrimaryKeyProperties"),
        **ASSOCIATIONS,
    },
    "Notebook": {"subTypes": _sub_types},
    "DataProcessInstance": {"subTypes": _sub_types},
    "Document": {
        "subType": _sub_type,
        "platform": _instance_platform("datahub"),
        "info": _properties("documentInfo"),
        **ASSOCIATIONS,
    },
}


def runtime_entity_types(registry: EntityRegistry, schema_types: Iterable[str]) -> dict[str, str]:
    """The object type name of each entity type registered at run time: its name in PascalCase, `Entity` appended
    when a type of the base schema (`schema_types`) has that name (as DataHub's QueryEntity), then a number."""
    taken = set(schema_types)
    types: dict[str, str] = {}
    for name, spec in sorted(registry.entities.items()):
        if name in GRAPHQL_TYPE_OF_ENTITY or not registry.is_runtime(spec.key_aspect):
            continue
        base = re.sub(r"\W", "_", name[:1].upper() + name[1:]).lstrip("_")
        base = base if base[:1].isalpha() else f"Entity{base}"  # a GraphQL name starts with a letter or _
        candidate, n = base, 1
        while candidate in taken:
            candidate = f"{base}Entity{n if n > 1 else ''}"
            n += 1
        taken.add(candidate)
        types[name] = candidate
    return types


def runtime_entity_sdl(registry: EntityRegistry, types: Mapping[str, str]) -> str:
    """The object types of `types` (runtime_entity_types), in the schema's SDL."""
    return "\n".join(
        f"{orjson.dumps(registry.entities[name].doc or f'{name}: an entity type registered at run time').decode()}\n"
        f"type {type_name} implements Entity {{\n  urn: String!\n  type: EntityType!\n"
        f"  aspects(input: AspectParams): [RawAspect!]\n"
        f"  relationships(input: RelationshipsInput!): EntityRelationshipsResult\n}}\n"
        for name, type_name in types.items()
    )


def bind_entities(schema: GraphQLSchema, runtime_types: Mapping[str, str]) -> None:
    """Attach the interface's type resolver and the aspect-reading field resolvers to the schema built from SDL;
    `runtime_types`: the object type of each entity type registered at run time the schema has."""

    def resolve_entity_type(value: Any, _info: Any, _type: Any) -> str:
        if isinstance(value, EntityRef):
            return runtime_types[value.entity_name] if value.type == OTHER else ENTITY_TYPES[value.type][1]
        return ENTITY_TYPES[value["type"]][1]  # a plain object the resolvers built (a platform instance)

    # type_map holds GraphQLNamedType; these two are interface/union types, which have resolve_type
    for abstract in ("Entity", "OwnerType"):
        schema.type_map[abstract].resolve_type = resolve_entity_type  # type: ignore[attr-defined]
    for type_name, fields in FIELD_RESOLVERS.items():
        object_type = schema.type_map[type_name]
        for field_name, resolver in fields.items():
            object_type.fields[field_name].resolve = resolver  # type: ignore[attr-defined]
    from app.graphql.read_model import NESTED_FIELDS, read_model_resolvers, resolve_property_value

    for type_name, fields in NESTED_FIELDS.items():
        for field_name, resolver in fields.items():
            schema.type_map[type_name].fields[field_name].resolve = resolver  # type: ignore[attr-defined]

    if "PropertyValue" in schema.type_map:  # the curation topic's union (curation.graphql), read here too
        schema.type_map["PropertyValue"].resolve_type = resolve_property_value  # type: ignore[attr-defined]
    for implementation in schema.get_implementations(schema.type_map["Entity"]).objects:  # type: ignore[arg-type]
        own = FIELD_RESOLVERS.get(implementation.name, {})
        # DataHub's read model (app.graphql.read_model): the aspect-read fields the type declares, bound generically
        for field_name, resolver in read_model_resolvers(implementation.name, implementation.fields, own).items():
            implementation.fields[field_name].resolve = resolver
        if "aspects" in implementation.fields:
            implementation.fields["aspects"].resolve = _raw_aspects
        implementation.fields["relationships"].resolve = _relationships
