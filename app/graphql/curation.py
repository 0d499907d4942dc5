"""DataHub's curation mutations (curation.graphql): tags, glossary terms, owners and domains on many resources at once,
descriptions of entities and of dataset fields, structured properties, and the ownership types an owner can be given.

Each mutation refuses a caller without the WRITE permission, checks that what it names exists (the resources, the
fields, the tags, terms, owners, domains and properties: DataHub's LabelUtils/OwnerUtils/DomainUtils validations), then
reads each aspect it changes, changes it, and writes every changed aspect of every resource in one submission through
the ingest gateway with the caller's principal, as every other write: its policies, processors, validation, change
log (naming the actor) and trace apply. As in DataHub, adding what is there already and removing what is not change
nothing (and write nothing).

The read-modify-write is conditional (better than DataHub's resolvers, which overwrite): each changed aspect is written
with `If-Version-Match` on the version that was read, and when another write came between the read and the
submission the mutation reads again and applies its change to what is there now (up to ATTEMPTS times, then the
precondition's error), so a concurrent change is never lost."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from app.errors import Issue, PreconditionFailed, ValidationFailed
from app.graphql.entities import FIELD_RESOLVERS, EntityRef, entity_ref
from app.graphql.paging import declare_paged
from app.limits import clip
from app.search.across import TypeSearch, search_across
from app.urns import InvalidUrnError, entity_type_of
from app.write.proposal import IF_VERSION_MATCH, AuditStamp, ChangeType, Draft
from app.write.rules import ABSENT_VERSION

if TYPE_CHECKING:
    from app.graphql.resolvers import Context
    from app.write.repository import StoredAspect

log = logging.getLogger("metaledger.graphql")

DATASET_FIELD = "DATASET_FIELD"
EDITABLE_SCHEMA = "editableSchemaMetadata"
SYSTEM_OWNERSHIP_PREFIX = "urn:li:ownershipType:__system__"
# DataHub's built-in ownership types (its bootstrap's ownership_types.json): id -> name
SYSTEM_OWNERSHIP_TYPES = {
    "technical_owner": "Technical Owner",
    "business_owner": "Business Owner",
    "data_steward": "Data Steward",
    "none": "None",
}
OWNERSHIP_TYPE_ENTITY = "ownershipType"
DEFAULT_OWNERSHIP_TYPES = 20  # a page's ownership types when `count` is not given (DataHub's resolver)
declare_paged("listOwnershipTypes", "ownershipTypes", DEFAULT_OWNERSHIP_TYPES)
ATTEMPTS = 10  # optimistic: each round one of the racing writers wins, so n racers need at most n rounds
OWNER_ENTITY = {"CORP_USER": "corpuser", "CORP_GROUP": "corpGroup"}
# DataHub's DescriptionUtils: the aspect (and its field) an entity-level description goes to, by entity type
DESCRIPTION_ASPECTS: dict[str, tuple[str, str]] = {
    "dataset": ("editableDatasetProperties", "description"),
    "container": ("editableContainerProperties", "description"),
    "chart": ("editableChartProperties", "description"),
    "dashboard": ("editableDashboardProperties", "description"),
    "dataFlow": ("editableDataFlowProperties", "description"),
    "dataJob": ("editableDataJobProperties", "description"),
    "notebook": ("editableNotebookProperties", "description"),
    "mlModel": ("editableMlModelProperties", "description"),
    "mlModelGroup": ("editableMlModelGroupProperties", "description"),
    "mlFeatureTable": ("editableMlFeatureTableProperties", "description"),
    "mlFeature": ("editableMlFeatureProperties", "description"),
    "mlPrimaryKey": ("editableMlPrimaryKeyProperties", "description"),
    "corpGroup": ("corpGroupEditableInfo", "description"),
    "tag": ("tagProperties", "description"),
    "domain": ("domainProperties", "description"),
    "glossaryTerm": ("glossaryTermInfo", "definition"),
    "glossaryNode": ("glossaryNodeInfo", "definition"),
    "dataProduct": ("dataProductProperties", "description"),
}


def _refuse(message: str, path: str, found: str | None = None) -> ValidationFailed:
    return ValidationFailed(message, [Issue(message, path=path, found=None if found is None else clip(found, 200))])


def _entity_name(urn: str, path: str) -> str:
    try:
        return entity_type_of(urn)
    except InvalidUrnError:
        raise _refuse(f"{clip(urn, 100)} is not a valid urn", path, urn) from None


class Changes:
    """The aspects one mutation changes, read once each (with their version) and written together, each write
    conditional on the version that was read."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self.stamp = AuditStamp.now(context.caller.actor).to_json()
        self._values: dict[tuple[str, str], dict[str, Any]] = {}
        self._read: dict[tuple[str, str], tuple[dict[str, Any] | None, str]] = {}

    async def get(self, urn: str, aspect: str) -> dict[str, Any]:
        """The aspect as this mutation has it so far (a copy of the stored one; empty when absent)."""
        pair = (urn, aspect)
        if pair not in self._values:
            row = cast("StoredAspect | None", await self.context.loader.aspect(urn, aspect))
            stored = None if row is None else row.value
            self._read[pair] = (stored, ABSENT_VERSION if row is None else str(row.version))
            self._values[pair] = _copy(stored or {})
        return self._values[pair]

    def drafts(self, *, unchanged: bool = False) -> list[Draft]:
        """The writes of what changed (`unchanged`: of every aspect taken, changed or not)."""
        return [
            Draft(
                0,
                entity_type_of(urn),
                aspect,
                ChangeType.UPSERT.value,
                urn=urn,
                value=value,
                headers={IF_VERSION_MATCH: self._read[(urn, aspect)][1]},
            )
            for (urn, aspect), value in self._values.items()
            if unchanged or value != (self._read[(urn, aspect)][0] or {})
        ]


async def _apply(context: Context, what: str, edit: Callable[[Changes], Awaitable[None]]) -> bool:
    """Run `edit` on freshly read aspects and write what it changed; again on what is there now when another write
    changed one of them in between."""
    for attempt in range(1, ATTEMPTS + 1):
        changes = Changes(context)
        await edit(changes)
        drafts = changes.drafts()
        if not drafts:  # nothing to write, yet the answer is the one the write would get (DataHub decides first)
            await context.gateway.authorize(context.caller, changes.drafts(unchanged=True))
        if drafts:
            try:
                await context.gateway.submit(
                    context.session, drafts, context.caller, request_headers=context.request_headers
                )
            except PreconditionFailed:
                context.forget_aspects()
                if attempt == ATTEMPTS:
                    raise
                continue
            finally:
                context.forget_aspects()
        log.info("curation", extra={"mutation": what, "aspects": len(drafts), "actor": context.caller.actor})
        return True
    raise AssertionError("unreachable: the last attempt returns or raises")


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


async def _require_exists(context: Context, urn: str, path: str, kinds: Iterable[str], what: str) -> None:
    kinds = tuple(kinds)
    if _entity_name(urn, path) not in kinds:
        raise _refuse(f"{clip(urn, 100)} is not a {what} urn", path, urn)
    if not await context.exists(urn):
        raise _refuse(f"Failed to update: {what} {clip(urn, 100)} does not exist", path, urn)


def _resources(input: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return [(i, r) for i, r in enumerate(input.get("resources") or ()) if r is not None]


async def _entity_resources(context: Context, input: dict[str, Any]) -> list[str]:
    """The resources' URNs, each checked (entity-level: a sub-resource is refused)."""
    urns = []
    for i, resource in _resources(input):
        await _check_resource(context, resource, f"$input.resources[{i}]", fields=False)
        urns.append(resource["resourceUrn"])
    return urns


async def _check_resource(context: Context, resource: dict[str, Any], path: str, fields: bool) -> str | None:
    """The resource exists (and its field, for a DATASET_FIELD sub-resource): its fieldPath, or None."""
    urn = resource["resourceUrn"]
    entity = _entity_name(urn, f"{path}.resourceUrn")
    if not await context.exists(urn):
        raise _refuse(
            f"Failed to update resource with urn {clip(urn, 100)}. Entity does not exist.", f"{path}.resourceUrn", urn
        )
    sub_type, sub = resource.get("subResourceType"), resource.get("subResource")
    if not sub_type and not sub:
        return None
    if not fields:
        raise _refuse("this mutation takes no sub-resource", f"{path}.subResource", sub)
    if sub_type != DATASET_FIELD or not sub or entity != "dataset":
        raise _refuse(
            "a sub-resource is a dataset's field: subResourceType DATASET_FIELD and subResource its fieldPath",
            f"{path}.subResource",
            sub,
        )
    schema = await context.aspect(urn, "schemaMetadata") or {}
    if not any(f.get("fieldPath") == sub for f in schema.get("fields") or ()):
        raise _refuse(
            f"Failed to update {clip(urn, 100)} & field {clip(sub, 100)}. "
            f"Field {clip(sub, 100)} does not exist in the datasets schema.",
            f"{path}.subResource",
            sub,
        )
    return str(sub)


async def _field_info(changes: Changes, urn: str, field_path: str, create: bool = True) -> dict[str, Any] | None:
    """The editableSchemaMetadata entry of one field (added when there is none and `create`)."""
    value = await changes.get(urn, EDITABLE_SCHEMA)
    infos = value.get("editableSchemaFieldInfo") or []
    for info in infos:
        if info.get("fieldPath") == field_path:
            return info
    if not create:
        return None
    info = {"fieldPath": field_path}
    value["editableSchemaFieldInfo"] = [*infos, info]
    await _touch_schema(changes, urn)
    return info


async def _touch_schema(changes: Changes, urn: str) -> None:
    value = await changes.get(urn, EDITABLE_SCHEMA)
    value.setdefault("editableSchemaFieldInfo", [])
    value.setdefault("created", changes.stamp)
    value["lastModified"] = changes.stamp


# --- tags and terms -----------------------------------------------------------------------------------------------

# kind -> (input list, entity of its urns, aspect, list in the aspect, key of the urn in an entry, what)
LABELS = {
    "tags": ("tagUrns", ("tag",), "globalTags", "tags", "tag", "tag"),
    "terms": ("termUrns", ("glossaryTerm",), "glossaryTerms", "terms", "urn", "glossary term"),
}


def _labels(kind: str, add: bool, field_key: str) -> Callable[..., Any]:
    input_key, kinds, aspect, list_key, urn_key, what = LABELS[kind]

    async def resolve(_root: Any, info: Any, input: dict[str, Any]) -> bool:
        context: Context = info.context
        await context.require_write_access()
        labels = list(dict.fromkeys(input[input_key]))
        for i, label in enumerate(input[input_key]):
            if add:
                await _require_exists(context, label, f"$input.{input_key}[{i}]", kinds, what)
            else:
                _entity_name(label, f"$input.{input_key}[{i}]")
        targets = [
            (resource["resourceUrn"], await _check_resource(context, resource, f"$input.resources[{i}]", fields=True))
            for i, resource in _resources(input)
        ]

        async def edit(changes: Changes) -> None:
            for urn, field_path in targets:
                if field_path is None:
                    holder = await changes.get(urn, aspect)
                elif add:
                    entry = await _field_info(changes, urn, field_path)
                    assert entry is not None
                    holder = entry.setdefault(field_key, {})
                else:
                    entry = await _field_info(changes, urn, field_path, create=False)
                    holder = {} if entry is None else entry.get(field_key) or {}
                current = holder.get(list_key) or []
                if add:
                    present = {e.get(urn_key) for e in current}
                    wanted = current + [{urn_key: label} for label in labels if label not in present]
                else:
                    wanted = [e for e in current if e.get(urn_key) not in labels]
                if wanted != current:
                    holder[list_key] = wanted
                    if kind == "terms":
                        holder["auditStamp"] = changes.stamp
                    if field_path is not None:
                        await _touch_schema(changes, urn)

        return await _apply(context, f"{'add' if add else 'remove'} {kind}", edit)

    return resolve


# --- owners -------------------------------------------------------------------------------------------------------


def _ownership_type_urn(owner: dict[str, Any], batch_type: str | None) -> str:
    """DataHub's OwnerUtils: the owner's ownership type, else the batch's, else its deprecated `type`, else NONE."""
    if owner.get("ownershipTypeUrn"):
        return str(owner["ownershipTypeUrn"])
    if batch_type:
        return batch_type
    return SYSTEM_OWNERSHIP_PREFIX + str(owner.get("type") or "NONE").lower()


def _legacy_type(type_urn: str) -> str:
    """The deprecated `type` DataHub still sets: the system type's name, CUSTOM for any other."""
    if type_urn.startswith(SYSTEM_OWNERSHIP_PREFIX):
        return type_urn.removeprefix(SYSTEM_OWNERSHIP_PREFIX).upper()
    return "CUSTOM"


async def _check_ownership_type(context: Context, urn: str, path: str) -> None:
    if urn.startswith(SYSTEM_OWNERSHIP_PREFIX):
        if urn.removeprefix(SYSTEM_OWNERSHIP_PREFIX).upper() in OWNERSHIP_TYPE_NAMES:
            return
        raise _refuse(f"{clip(urn, 100)} is not one of DataHub's system ownership types", path, urn)
    await _require_exists(context, urn, path, ("ownershipType",), "ownership type")


# The system ownership types: DataHub's OwnershipType enum but CUSTOM (`__system__<name in lower case>`)
OWNERSHIP_TYPE_NAMES = (
    "TECHNICAL_OWNER",
    "BUSINESS_OWNER",
    "DATA_STEWARD",
    "NONE",
    "DATAOWNER",
    "PRODUCER",
    "DEVELOPER",
    "CONSUMER",
    "STAKEHOLDER",
    "DELEGATE",
)


async def resolve_batch_add_owners(_root: Any, info: Any, input: dict[str, Any]) -> bool:
    context: Context = info.context
    await context.require_write_access()
    batch_type = input.get("ownershipTypeUrn")
    if batch_type:
        await _check_ownership_type(context, batch_type, "$input.ownershipTypeUrn")
    owners: list[tuple[str, str]] = []
    for i, owner in enumerate(input["owners"]):
        path = f"$input.owners[{i}]"
        urn = owner["ownerUrn"]
        expected = OWNER_ENTITY[owner["ownerEntityType"]]
        await _require_exists(
            context, urn, f"{path}.ownerUrn", (expected,), "user" if expected == "corpuser" else "group"
        )
        type_urn = _ownership_type_urn(owner, batch_type)
        if type_urn != batch_type:
            await _check_ownership_type(context, type_urn, f"{path}.ownershipTypeUrn")
        owners.append((urn, type_urn))
    resources = await _entity_resources(context, input)

    async def edit(changes: Changes) -> None:
        for resource in resources:
            value = await changes.get(resource, "ownership")
            entries = value.setdefault("owners", [])
            before = _copy(entries)
            for urn, type_urn in owners:
                if not any(e.get("owner") == urn and type_urn_of(e) == type_urn for e in entries):
                    entries.append(
                        {
                            "owner": urn,
                            "type": _legacy_type(type_urn),
                            "typeUrn": type_urn,
                            "source": {"type": "MANUAL"},
                        }
                    )
            if entries != before:
                value["lastModified"] = changes.stamp

    return await _apply(context, "add owners", edit)


def type_urn_of(owner: dict[str, Any]) -> str:
    """An owner entry's ownership type as a URN: its `typeUrn`, else its legacy `type` as DataHub's system type."""
    return str(owner.get("typeUrn") or SYSTEM_OWNERSHIP_PREFIX + str(owner.get("type") or "NONE").lower())


async def resolve_batch_remove_owners(_root: Any, info: Any, input: dict[str, Any]) -> bool:
    context: Context = info.context
    await context.require_write_access()
    owner_urns = set(input["ownerUrns"])
    type_urn = input.get("ownershipTypeUrn")
    resources = await _entity_resources(context, input)

    async def edit(changes: Changes) -> None:
        for resource in resources:
            value = await changes.get(resource, "ownership")
            entries = value.get("owners") or []
            kept = [
                e
                for e in entries
                if not (e.get("owner") in owner_urns and (not type_urn or type_urn_of(e) == type_urn))
            ]
            if len(kept) != len(entries):
                value["owners"] = kept
                value["lastModified"] = changes.stamp

    return await _apply(context, "remove owners", edit)


# --- domains ------------------------------------------------------------------------------------------------------


async def resolve_batch_set_domain(_root: Any, info: Any, input: dict[str, Any]) -> bool:
    context: Context = info.context
    await context.require_write_access()
    domain = input.get("domainUrn")
    if domain:
        await _require_exists(context, domain, "$input.domainUrn", ("domain",), "domain")
    resources = await _entity_resources(context, input)
    wanted = [domain] if domain else []

    async def edit(changes: Changes) -> None:
        for resource in resources:
            value = await changes.get(resource, "domains")
            if (value.get("domains") or []) != wanted:
                value["domains"] = wanted

    return await _apply(context, "set domain", edit)


# --- descriptions -------------------------------------------------------------------------------------------------


async def resolve_update_description(_root: Any, info: Any, input: dict[str, Any]) -> bool:
    """DataHub's UpdateDescriptionResolver: a dataset field's description in editableSchemaMetadata, an entity's in
    its editable properties (DESCRIPTION_ASPECTS)."""
    context: Context = info.context
    await context.require_write_access()
    description = input["description"]
    urn = input["resourceUrn"]
    field_path = await _check_resource(context, input, "$input", fields=True)
    if field_path is not None:

        async def edit_field(changes: Changes) -> None:
            entry = await _field_info(changes, urn, field_path)
            assert entry is not None
            if entry.get("description") != description:
                entry["description"] = description
                await _touch_schema(changes, urn)

        return await _apply(context, "update field description", edit_field)
    entity = entity_type_of(urn)
    target = DESCRIPTION_ASPECTS.get(entity)
    if target is None or target[0] not in context.registry.entity(entity).aspect_names:
        raise _refuse(f"descriptions of {entity} entities are not supported", "$input.resourceUrn", urn)
    aspect, key = target
    field_names = context.registry.aspect(entity, aspect).field_names

    async def edit(changes: Changes) -> None:
        value = await changes.get(urn, aspect)
        if value.get(key) != description:
            value[key] = description
            _required(value, aspect, field_names, urn, changes.stamp)

    return await _apply(context, "update description", edit)


NAMED_ASPECTS = ("tagProperties", "domainProperties")  # their `name` is required (DataHub's PDL)


def _required(value: dict[str, Any], aspect: str, fields: Iterable[str], urn: str, stamp: dict[str, Any]) -> None:
    """What an aspect written for the first time must hold besides its description (DataHub's PDL): its audit
    stamps where it has them, a required name (the URN's id) and a term's source."""
    fields = set(fields)
    if "lastModified" in fields:
        value["lastModified"] = stamp
    if "created" in fields:
        value.setdefault("created", stamp)
    if aspect in NAMED_ASPECTS:
        value.setdefault("name", urn.split(":", 3)[3])
    if "termSource" in fields:
        value.setdefault("termSource", "INTERNAL")


# --- structured properties ----------------------------------------------------------------------------------------


def _property_value(value: dict[str, Any], path: str) -> dict[str, Any]:
    if value.get("stringValue") is not None and value.get("numberValue") is None:
        return {"string": value["stringValue"]}
    if value.get("numberValue") is not None and value.get("stringValue") is None:
        return {"double": float(value["numberValue"])}
    raise _refuse("a value is a stringValue or a numberValue: exactly one of them", path)


def _answer(urn: str, value: dict[str, Any]) -> dict[str, Any]:
    """DataHub's StructuredProperties of the aspect's value."""
    entries = []
    for assignment in value.get("properties") or ():
        values: list[dict[str, Any]] = []
        entities = []
        for v in assignment.get("values") or ():
            if "double" in v:
                values.append({"__typename": "NumberValue", "numberValue": v["double"]})
            else:
                values.append({"__typename": "StringValue", "stringValue": v.get("string")})
                ref = entity_ref(str(v.get("string") or ""))
                if ref is not None:
                    entities.append(ref)
        entries.append(
            {
                "structuredProperty": EntityRef(assignment["propertyUrn"], "structuredProperty"),
                "values": values,
                "valueEntities": entities,
                "associatedUrn": urn,
            }
        )
    return {"properties": entries}


async def resolve_upsert_structured_properties(_root: Any, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    context: Context = info.context
    await context.require_write_access()
    urn = input["assetUrn"]
    await _check_resource(context, {"resourceUrn": urn}, "$input.assetUrn", fields=False)
    wanted: dict[str, list[dict[str, Any]]] = {}
    for i, params in enumerate(input["structuredPropertyInputParams"]):
        path = f"$input.structuredPropertyInputParams[{i}]"
        prop = params["structuredPropertyUrn"]
        await _require_exists(
            context, prop, f"{path}.structuredPropertyUrn", ("structuredProperty",), "structured property"
        )
        wanted[prop] = [_property_value(v, f"{path}.values[{j}]") for j, v in enumerate(params["values"])]

    async def edit(changes: Changes) -> None:
        value = await changes.get(urn, "structuredProperties")
        assignments = value.setdefault("properties", [])
        for prop, values in wanted.items():
            current = next((a for a in assignments if a.get("propertyUrn") == prop), None)
            if current is None:
                assignments.append(
                    {"propertyUrn": prop, "values": values, "created": changes.stamp, "lastModified": changes.stamp}
                )
            elif current.get("values") != values:
                current["values"] = values
                current["lastModified"] = changes.stamp

    await _apply(context, "upsert structured properties", edit)
    return _answer(urn, await context.aspect(urn, "structuredProperties") or {})


async def resolve_remove_structured_properties(_root: Any, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    context: Context = info.context
    await context.require_write_access()
    urn = input["assetUrn"]
    await _check_resource(context, {"resourceUrn": urn}, "$input.assetUrn", fields=False)
    removed = set(input["structuredPropertyUrns"])

    async def edit(changes: Changes) -> None:
        value = await changes.get(urn, "structuredProperties")
        assignments = value.get("properties") or []
        kept = [a for a in assignments if a.get("propertyUrn") not in removed]
        if len(kept) != len(assignments):
            value["properties"] = kept

    await _apply(context, "remove structured properties", edit)
    return _answer(urn, await context.aspect(urn, "structuredProperties") or {})


# --- ownership types ----------------------------------------------------------------------------------------------


async def resolve_list_ownership_types(_root: Any, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    """The ownership types whose name holds `query` (DataHub's ListOwnershipTypesResolver): DataHub's four system
    types that were never written first (DataHub bootstraps them; metaledger answers them from SYSTEM_OWNERSHIP_TYPES),
    then the ownershipType entities found by a search the caller may see (a custom type, or a system type written)."""
    from app.graphql.resolvers import _count, _query  # the search helpers of app.graphql.resolvers, which imports this

    context: Context = info.context
    start = max(int(input.get("start") or 0), 0)
    count = _count(input.get("count"), DEFAULT_OWNERSHIP_TYPES, context.max_count)
    query = (input.get("query") or "").strip()
    words = "" if query == "*" else query.lower()
    unwritten = [
        urn
        for urn, name in ((SYSTEM_OWNERSHIP_PREFIX + type_id, name) for type_id, name in SYSTEM_OWNERSHIP_TYPES.items())
        if words in name.lower() or words in urn
    ]
    unwritten = [urn for urn in unwritten if not await context.exists(urn)]
    from_search = max(start - len(unwritten), 0)
    page = await search_across(
        await context.backend(),
        [TypeSearch(OWNERSHIP_TYPE_ENTITY, None)],
        _query(query or None),
        start=from_search,
        count=min(max(count - len(unwritten[start:]), 0), max(context.max_count - from_search, 0)),
    )
    urns = [*unwritten[start : start + count], *(hit.urn for hit in page.hits)]
    return {
        "start": start,
        "count": len(urns),
        "total": len(unwritten) + page.total,
        "ownershipTypes": [EntityRef(urn, OWNERSHIP_TYPE_ENTITY) for urn in urns],
    }


async def _ownership_type_info(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    """ownershipTypeInfo; a system ownership type's built-in name when it was never written."""
    value = await info.context.aspect(ref.urn, "ownershipTypeInfo")
    if value is not None:
        return value
    type_id = ref.urn.removeprefix(SYSTEM_OWNERSHIP_PREFIX)
    if ref.urn.startswith(SYSTEM_OWNERSHIP_PREFIX) and type_id in SYSTEM_OWNERSHIP_TYPES:
        return {"name": SYSTEM_OWNERSHIP_TYPES[type_id]}
    return None


# This topic's field of OwnershipTypeEntity, bound with the others (app.graphql.entities.bind_entities).
FIELD_RESOLVERS.setdefault("OwnershipTypeEntity", {})["info"] = _ownership_type_info

CURATION_MUTATIONS = {
    "batchAddTags": _labels("tags", True, "globalTags"),
    "batchRemoveTags": _labels("tags", False, "globalTags"),
    "batchAddTerms": _labels("terms", True, "glossaryTerms"),
    "batchRemoveTerms": _labels("terms", False, "glossaryTerms"),
    "batchAddOwners": resolve_batch_add_owners,
    "batchRemoveOwners": resolve_batch_remove_owners,
    "batchSetDomain": resolve_batch_set_domain,
    "updateDescription": resolve_update_description,
    "upsertStructuredProperties": resolve_upsert_structured_properties,
    "removeStructuredProperties": resolve_remove_structured_properties,
}
CURATION_QUERIES = {"listOwnershipTypes": resolve_list_ownership_types}
