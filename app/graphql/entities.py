"""DataHub's GraphQL entity types over metaledger's aspect store: which registry entity each `EntityType` value
names, the object type of each, and the resolvers of the fields read from aspects (only when a query selects
them: a search that selects `urn` and `type` reads nothing but the index)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphql import GraphQLSchema

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

# The types searched when a search names none: DataHub's SearchUtils.SEARCHABLE_ENTITY_TYPES.
SEARCHABLE_TYPES = (
    "DATASET", "DASHBOARD", "CHART", "MLMODEL", "MLMODEL_GROUP", "MLFEATURE_TABLE", "MLFEATURE", "MLPRIMARY_KEY",
    "DATA_FLOW", "DATA_JOB", "GLOSSARY_TERM", "GLOSSARY_NODE", "TAG", "ROLE", "CORP_USER", "CORP_GROUP", "CONTAINER",
    "DOMAIN", "DATA_PRODUCT", "NOTEBOOK", "BUSINESS_ATTRIBUTE", "SCHEMA_FIELD", "APPLICATION",
)


@dataclass(frozen=True, slots=True)
class EntityRef:
    """An entity in a result: what the index or the URN tells (urn, type); the rest is read when selected."""

    urn: str
    entity_name: str  # the registry's

    @property
    def type(self) -> str:
        return GRAPHQL_TYPE_OF_ENTITY[self.entity_name]


def _id_of(urn: str) -> str:
    return urn.split(":", 3)[3] if urn.count(":") >= 3 else urn


def _custom_properties(value: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": v} for k, v in sorted((value.get("customProperties") or {}).items())]


async def _aspect(info: Any, ref: EntityRef, name: str) -> dict[str, Any] | None:
    return (await info.context.aspects(ref.urn)).get(name)


def _platform(urn: str | None) -> EntityRef | None:
    return EntityRef(urn, "dataPlatform") if urn else None


# --- field resolvers (obj: the EntityRef) -------------------------------------------------------------------------


async def _dataset_name(ref: EntityRef, info: Any) -> str:
    key = await _aspect(info, ref, "datasetKey") or {}
    return key.get("name") or _id_of(ref.urn)


async def _dataset_platform(ref: EntityRef, info: Any) -> EntityRef | None:
    key = await _aspect(info, ref, "datasetKey") or {}
    return _platform(key.get("platform"))


async def _dataset_origin(ref: EntityRef, info: Any) -> str | None:
    return (await _aspect(info, ref, "datasetKey") or {}).get("origin")


async def _dataset_properties(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "datasetProperties")
    if value is None:
        return None
    return {**value, "name": value.get("name") or await _dataset_name(ref, info),
            "customProperties": _custom_properties(value)}


# SchemaFieldDataType by the Pegasus type of schemaMetadata's field.type (`{"type": {"com.linkedin.schema.<T>": {}}}`)
FIELD_TYPES = {"BooleanType": "BOOLEAN", "FixedType": "FIXED", "StringType": "STRING", "BytesType": "BYTES",
               "NumberType": "NUMBER", "DateType": "DATE", "TimeType": "TIME", "EnumType": "ENUM", "NullType": "NULL",
               "MapType": "MAP", "ArrayType": "ARRAY", "UnionType": "UNION", "RecordType": "STRUCT"}


def _schema_field(field: dict[str, Any]) -> dict[str, Any]:
    pegasus = next(iter(((field.get("type") or {}).get("type") or {"NullType": {}})), "NullType")
    return {**field, "type": FIELD_TYPES.get(pegasus.rsplit(".", 1)[-1], "NULL"), "nullable": bool(field.get("nullable")),
            "recursive": bool(field.get("recursive"))}


async def _schema_metadata(ref: EntityRef, info: Any, version: int | None = None) -> dict[str, Any] | None:
    value = await info.context.aspect_version(ref, "schemaMetadata", version or 0)
    if value is None:
        return None
    return {**value, "name": value.get("schemaName", ""), "platformUrn": value.get("platform"), "hash": value.get("hash", ""),
            "fields": [_schema_field(f) for f in value.get("fields") or ()]}


async def _exists(ref: EntityRef, info: Any) -> bool:
    return bool(await info.context.aspects(ref.urn))


async def _platform_instance(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "dataPlatformInstance")
    if value is None:
        return None
    instance = value.get("instance")
    return {"urn": instance or value.get("platform"), "type": "DATA_PLATFORM_INSTANCE",
            "platform": _platform(value.get("platform")), "instanceId": _id_of(instance) if instance else ""}


async def _platform_name(ref: EntityRef, info: Any) -> str:
    key = await _aspect(info, ref, "dataPlatformKey") or {}
    return key.get("platformName") or _id_of(ref.urn)


async def _platform_properties(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "dataPlatformInfo")
    return None if value is None else {**value, "datasetNameDelimiter": value.get("datasetNameDelimiter", ".")}


def _info_properties(aspect: str, key_name: str):
    async def resolve(ref: EntityRef, info: Any) -> dict[str, Any] | None:
        value = await _aspect(info, ref, aspect)
        if value is None:
            return None
        return {**value, "name": value.get("name") or key_name, "customProperties": _custom_properties(value)}
    return resolve


async def _job_id(ref: EntityRef, info: Any) -> str:
    return (await _aspect(info, ref, "dataJobKey") or {}).get("jobId") or _id_of(ref.urn)


async def _flow_key(ref: EntityRef, info: Any) -> dict[str, Any]:
    return await _aspect(info, ref, "dataFlowKey") or {}


async def _tag_name(ref: EntityRef, info: Any) -> str:
    props = await _aspect(info, ref, "tagProperties") or {}
    key = await _aspect(info, ref, "tagKey") or {}
    return props.get("name") or key.get("name") or _id_of(ref.urn)


async def _tag_description(ref: EntityRef, info: Any) -> str | None:
    return (await _aspect(info, ref, "tagProperties") or {}).get("description")


async def _tag_properties(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value = await _aspect(info, ref, "tagProperties")
    return None if value is None else {**value, "name": value.get("name") or await _tag_name(ref, info)}


async def _corp_user_name(ref: EntityRef, info: Any) -> str:
    return (await _aspect(info, ref, "corpUserKey") or {}).get("username") or _id_of(ref.urn)


async def _corp_group_name(ref: EntityRef, info: Any) -> str:
    return (await _aspect(info, ref, "corpGroupKey") or {}).get("name") or _id_of(ref.urn)


def _from_flow_key(field: str):
    async def resolve(ref: EntityRef, info: Any) -> str:
        return (await _flow_key(ref, info)).get(field) or ""
    return resolve


FIELD_RESOLVERS: dict[str, dict[str, Any]] = {
    "Dataset": {"name": _dataset_name, "platform": _dataset_platform, "origin": _dataset_origin,
                "properties": _dataset_properties, "dataPlatformInstance": _platform_instance, "exists": _exists,
                "schemaMetadata": _schema_metadata},
    "DataPlatform": {"name": _platform_name, "properties": _platform_properties},
    "DataJob": {"jobId": _job_id, "properties": _info_properties("dataJobInfo", ""),
                "dataPlatformInstance": _platform_instance, "exists": _exists},
    "DataFlow": {"orchestrator": _from_flow_key("orchestrator"), "flowId": _from_flow_key("flowId"),
                 "cluster": _from_flow_key("cluster"), "properties": _info_properties("dataFlowInfo", ""),
                 "exists": _exists},
    "Tag": {"name": _tag_name, "description": _tag_description, "properties": _tag_properties},
    "CorpUser": {"username": _corp_user_name},
    "CorpGroup": {"name": _corp_group_name},
}


def _resolve_entity_type(value: Any, _info: Any, _type: Any) -> str:
    if isinstance(value, EntityRef):
        return ENTITY_TYPES[value.type][1]
    return ENTITY_TYPES[value["type"]][1]  # a plain object the resolvers built (a platform instance)


def bind_entities(schema: GraphQLSchema) -> None:
    """Attach the interface's type resolver and the aspect-reading field resolvers to the schema built from SDL."""
    schema.type_map["Entity"].resolve_type = _resolve_entity_type  # type: ignore[attr-defined]
    for type_name, fields in FIELD_RESOLVERS.items():
        object_type = schema.type_map[type_name]
        for field_name, resolver in fields.items():
            object_type.fields[field_name].resolve = resolver  # type: ignore[attr-defined]
