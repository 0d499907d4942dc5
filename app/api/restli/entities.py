"""Rest.li `/entities` actions and `/entitiesV2` reads, as GMS serves them (`EntityResource.java`,
`EntityV2Resource.java`) and DataHub's Python client calls them. All `/entities?action=` actions share one route.

* `action=ingest`: the legacy MetadataChangeEvent
  `{"entity": {"value": {"com.linkedin.metadata.snapshot.<X>Snapshot": {"urn", "aspects": [{FQN: {...}}]}}},
  "systemMetadata"?}`, unbundled into one UPSERT per aspect (app.ingest.mce), one transaction; answers `{}`.
* `action=delete` `{"urn", "aspectName"?, "startTimeMillis"?, "endTimeMillis"?}`: without `aspectName` a hard delete
  of the entity (every aspect, every version) and of its timeseries points; with a timeseries `aspectName` the points
  of that aspect in the time range (bounds inclusive, optional); with a versioned `aspectName` (metaledger extension:
  DataHub refuses it) every version of that aspect. → `{"value": {"urn", "rows", "timeseriesRows"}}`. One
  transaction for the rows and the timeseries change logs not yet indexed; then the points in the timeseries index.
* `action=deleteReferences` `{"urn", "dryRun"}` → `{"value": {"total", "relatedAspects": [{"relationshipType",
  "entity", "aspect"}]}}`; see app.ingest.references.
* `GET /entitiesV2/{urn}?aspects=List(a,b)` → EntityResponse `{"urn", "entityName", "aspects": {name: {"name",
  "type": "VERSIONED", "version": 0, "value", "created": {"time", "actor"}, "systemMetadata"}}}`. The key aspect is
  always included (`alwaysIncludeKeyAspect=false` turns that off); for an unknown URN the answer is the key aspect
  alone, derived from the URN, as GMS does.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from app.api.deps import (
    Caller,
    Gateway,
    Reader,
    Registry,
    Search,
    Session,
    StoredEntities,
    WaitForIndex,
    get_registry,
    get_settings,
)
from app.api.http import Flag, UrnPath, check_batch_size, entity_of_urn, invalid_at, json_response
from app.api.restli.common import ActionBody, optional_int, parse_restli_list, require_object, require_urn
from app.auth.model import Permission
from app.errors import ERROR_RESPONSES, Issue, ValidationFailed
from app.flags import parse_bool
from app.ingest.deletion import delete_entity, delete_references
from app.ingest.mce import UnbundledEvent, unbundle_restli_entity
from app.search.service import SearchRuntime
from app.write.proposal import ChangeType, Draft

# The actions route needs READ; `ingest` is checked per draft by the gateway, the deletes before they look at data.
router = APIRouter(tags=["rest.li"])

ACTIONS = ("ingest", "delete", "deleteReferences")


class EntityActionBody(ActionBody[dict[str, Any] | UnbundledEvent]):
    """`ingest`'s body is a legacy MCE, unbundled into the drafts of its aspects (app.ingest.mce, which names the shape
    it expects), at most MAX_BATCH_ITEMS of them; the other actions' a JSON object."""

    async def parse(self, document: Any, request: Request) -> dict[str, Any] | UnbundledEvent:
        if request.query_params.get("action") != "ingest":
            return require_object(document)
        event = unbundle_restli_entity(document, await get_registry(request))
        check_batch_size(None, await get_settings(request), "$.entity.value", count=len(event.drafts), what="aspects")
        return event


_BODY = EntityActionBody("/entities", ACTIONS, writes={"ingest"})


@router.post(
    "/entities",
    responses=ERROR_RESPONSES,
    summary="Rest.li entity actions: ingest (legacy MCE), delete, deleteReferences",
    description=(
        '`action=ingest` `{"entity": {"value": {"com.linkedin.metadata.snapshot.<Entity>Snapshot": {"urn", "aspects": '
        '[{"<Pegasus class>": {...}}]}}}, "systemMetadata"?}` → `{}` (one transaction). '
        '`action=delete` `{"urn", "aspectName"?, "startTimeMillis"?, "endTimeMillis"?}` → `{"value": {"urn", "rows", '
        '"timeseriesRows"}}`. `action=deleteReferences` `{"urn", "dryRun"}` → `{"value": {"total", "relatedAspects": '
        '[{"relationshipType", "entity", "aspect"}]}}`.'
    ),
)
async def entities_action(
    caller: Reader,
    body: Annotated[dict[str, Any] | UnbundledEvent, Depends(_BODY)],
    request: Request,
    session: Session,
    gateway: Gateway,
    search: Search,
    caught_up: WaitForIndex,
    action: Annotated[str, Query(description=", ".join(ACTIONS))],
) -> Response:
    if isinstance(body, UnbundledEvent):  # `ingest`: every aspect of the snapshot is committed together, or none is
        outcome = await gateway.submit(session, body.drafts, caller, request_headers=request.headers)
        return json_response({}, headers=outcome.response_headers)
    if action == "delete":
        return json_response({"value": await _delete(body, session, gateway, caller, search, caught_up)})
    caller.require(Permission.ADMIN)
    return json_response({"value": await _delete_references(body, session, gateway, caller)})


async def _delete(
    body: dict[str, Any],
    session: Session,
    gateway: Gateway,
    caller: Caller,
    search: SearchRuntime | None,
    caught_up: WaitForIndex,
) -> dict[str, Any]:
    registry = gateway.registry
    urn = require_urn(body)
    entity = registry.entity(entity_of_urn(registry, urn, "$.urn"))
    aspect_name = body.get("aspectName")
    start, end = optional_int(body, "startTimeMillis"), optional_int(body, "endTimeMillis")
    if aspect_name is not None:
        if not isinstance(aspect_name, str):
            raise ValidationFailed("`aspectName` must be a string", [Issue("expected a string", path="$.aspectName")])
        with invalid_at("$.aspectName", urn=urn, aspect=aspect_name):
            spec = registry.aspect(entity.name, aspect_name)
    else:
        spec = None
    # Before anything is read: a caller who may not delete learns nothing about what exists.
    await gateway.authorize(
        caller, [Draft(0, entity.name, spec.name if spec else entity.key_aspect, ChangeType.DELETE.value, urn=urn)]
    )
    if spec is None or not spec.is_timeseries:
        if start is not None or end is not None:
            raise ValidationFailed(
                "startTimeMillis/endTimeMillis apply to timeseries aspects only",
                [Issue("a time range needs a timeseries aspectName", urn=urn, path="$.aspectName")],
            )
    deleted = await delete_entity(
        session, gateway, caller, entity, spec, urn, start, end, search=search, caught_up=caught_up
    )
    return {"urn": urn, "rows": deleted.rows, "timeseriesRows": deleted.timeseries_rows}


async def _delete_references(
    body: dict[str, Any], session: Session, gateway: Gateway, caller: Caller
) -> dict[str, Any]:
    urn = require_urn(body)
    entity_of_urn(gateway.registry, urn, "$.urn")
    dry_run = parse_bool(body.get("dryRun"), False, ".dryRun")
    references = await delete_references(session, gateway, caller, urn, dry_run=dry_run)
    related = [
        {"relationshipType": t, "entity": r.urn, "aspect": r.aspect} for r in references for t in r.relationship_types
    ]
    return {"total": len(references), "relatedAspects": related}


def _envelope(
    name: str, value: dict[str, Any], created_ms: int, actor: str, system_metadata: dict[str, Any] | None
) -> dict[str, Any]:
    envelope: dict[str, Any] = {
        "name": name,
        "type": "VERSIONED",
        "version": 0,
        "value": value,
        "created": {"time": created_ms, "actor": actor},
    }
    if system_metadata is not None:
        envelope["systemMetadata"] = system_metadata
    return envelope


@router.get(
    "/entitiesV2/{urn:path}",
    responses=ERROR_RESPONSES,
    summary="An entity's latest aspects, Rest.li EntityResponse",
    description='`?aspects=List(a,b)` (Rest.li list syntax) selects aspects. Answers `{"urn", "entityName", "aspects": '
    '{name: {"name", "type": "VERSIONED", "version": 0, "value", "created": {"time", "actor"}, "systemMetadata"}}}`; '
    "the key aspect is always included unless `alwaysIncludeKeyAspect=false`; an unknown URN gives the key aspect only.",
)
async def get_entity_v2(
    urn: UrnPath,
    request: Request,
    registry: Registry,
    reader: StoredEntities,
    always_include_key_aspect: Annotated[Flag, Query(alias="alwaysIncludeKeyAspect")] = True,
) -> Response:
    entity = registry.entity(entity_of_urn(registry, urn))
    requested = parse_restli_list(request.query_params.get("aspects"))
    if requested is not None:
        for name in requested:
            with invalid_at("$aspects", urn=urn, aspect=name):
                registry.aspect(entity.name, name)
        wanted = [a for a in requested if not registry.aspects[a].is_timeseries]
        if always_include_key_aspect and entity.key_aspect not in wanted:
            wanted.append(entity.key_aspect)
    else:
        wanted = None
    rows = (await reader.latest_of_many([(urn, wanted)])).get(urn, []) if wanted != [] else []
    if requested is None and not always_include_key_aspect:
        rows = [r for r in rows if r.aspect != entity.key_aspect]
    aspects: dict[str, Any] = {}
    for row in rows:
        aspects[row.aspect] = _envelope(row.aspect, row.value, row.created_ms, row.created_by, row.system_metadata)
    if always_include_key_aspect and entity.key_aspect not in aspects:
        # GMS answers for any URN: at least the key aspect, derived from the URN.
        aspects[entity.key_aspect] = _envelope(
            entity.key_aspect, registry.urn_to_key(entity.name, urn), 0, "urn:li:corpuser:unknown", None
        )
    return json_response({"urn": urn, "entityName": entity.name, "aspects": aspects})
