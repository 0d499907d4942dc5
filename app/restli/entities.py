"""Rest.li `/entities` actions and `/entitiesV2` reads, as GMS serves them (`EntityResource.java`,
`EntityV2Resource.java`) and DataHub's Python client calls them. All `/entities?action=` actions share one route.

* `action=ingest`: the legacy MetadataChangeEvent
  `{"entity": {"value": {"com.linkedin.metadata.snapshot.<X>Snapshot": {"urn", "aspects": [{FQN: {...}}]}}},
  "systemMetadata"?}`, unbundled into one UPSERT per aspect (app.proposals.mce), one transaction; answers `{}`.
* `action=delete` `{"urn", "aspectName"?, "startTimeMillis"?, "endTimeMillis"?}`: without `aspectName` a hard delete
  of the entity (every aspect, every version) and of its timeseries points; with a timeseries `aspectName` the points
  of that aspect in the time range (bounds inclusive, optional); with a versioned `aspectName` (metaledger extension:
  DataHub refuses it) every version of that aspect. → `{"value": {"urn", "rows", "timeseriesRows"}}`. One
  transaction. Timeseries points live in the interim store (the outbox's timeseries change logs; see
  app.restli.timeseries) until the timeseries index exists.
* `action=deleteReferences` `{"urn", "dryRun"}` → `{"value": {"total", "relatedAspects": [{"relationshipType",
  "entity", "aspect"}]}}`; see app.restli.references.
* `GET /entitiesV2/{urn}?aspects=List(a,b)` → EntityResponse `{"urn", "entityName", "aspects": {name: {"name",
  "type": "VERSIONED", "version": 0, "value", "created": {"time", "actor"}, "systemMetadata"}}}`. The key aspect is
  always included (`alwaysIncludeKeyAspect=false` turns that off); for an unknown URN the answer is the key aspect
  alone, derived from the URN, as GMS does.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy.ext.asyncio import AsyncSession

from app.deps import get_registry, get_session, get_write_service, request_audit_stamp
from app.errors import ERROR_RESPONSES, Issue, MetaledgerError, ValidationFailed
from app.http import json_response, parse_bool, read_json
from app.proposals.mce import relocate_issues, unbundle_restli_entity
from app.registry import EntityRegistry
from app.registry.errors import RegistryError
from app.restli.common import ACTION_BODY, entity_of, optional_int, parse_restli_list, require_object, require_urn
from app.restli.references import find_references, relationship_paths
from app.restli.repository import RestliRepository
from app.search.service import sync_index_if_requested
from app.write.proposal import IF_VERSION_MATCH, AuditStamp, ChangeType
from app.write.repository import AspectRepository
from app.search.worker import wait_until_indexed
from app.write.service import Draft, WriteService

import orjson

router = APIRouter(tags=["rest.li"])

Session = Annotated[AsyncSession, Depends(get_session)]
Writer = Annotated[WriteService, Depends(get_write_service)]
Registry = Annotated[EntityRegistry, Depends(get_registry)]
Audit = Annotated[AuditStamp, Depends(request_audit_stamp)]

ACTIONS = ("ingest", "delete", "deleteReferences")


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
    openapi_extra=ACTION_BODY,
)
async def entities_action(
    request: Request, session: Session, writer: Writer, audit: Audit,
    action: Annotated[str, Query(description=", ".join(ACTIONS))],
) -> Response:
    if action not in ACTIONS:
        raise ValidationFailed(
            f"unknown action {action!r} on /entities", [Issue(f"supported actions: {', '.join(ACTIONS)}", path="$action")]
        )
    body = await read_json(request, writer.settings.max_request_bytes)
    if action == "ingest":
        return await _ingest(body, session, writer, audit, request)
    body = require_object(body)
    if action == "delete":
        return json_response({"value": await _delete(body, session, writer, audit, request)})
    return json_response({"value": await _delete_references(body, session, writer, audit)})


async def _ingest(body: Any, session: AsyncSession, writer: WriteService, audit: AuditStamp, request: Request | None = None) -> Response:
    """Every aspect of the snapshot is committed together, or none is."""
    event = unbundle_restli_entity(body, writer.registry)
    try:
        proposals = writer.prepare(event.drafts)
    except ValidationFailed as error:
        raise relocate_issues(error, event) from None
    result = await writer.apply(session, proposals, audit)
    index = await sync_index_if_requested(request, proposals, result) if request is not None else None
    return json_response({}, headers=index and index.headers())


async def _delete(
    body: dict[str, Any], session: AsyncSession, writer: WriteService, audit: AuditStamp, request: Request
) -> dict[str, Any]:
    registry = writer.registry
    urn = require_urn(body)
    entity = registry.entity(entity_of(registry, urn))
    aspect_name = body.get("aspectName")
    start, end = optional_int(body, "startTimeMillis"), optional_int(body, "endTimeMillis")
    timeseries_topic = writer.settings.topic_mcl_timeseries
    if aspect_name is not None:
        if not isinstance(aspect_name, str):
            raise ValidationFailed("`aspectName` must be a string", [Issue("expected a string", path="$.aspectName")])
        try:
            spec = registry.aspect(entity.name, aspect_name)
        except RegistryError as error:
            raise ValidationFailed(str(error), [Issue(str(error), urn=urn, aspect=aspect_name, path="$.aspectName")]) from None
    else:
        spec = None
    if spec is None or not spec.is_timeseries:
        if start is not None or end is not None:
            raise ValidationFailed(
                "startTimeMillis/endTimeMillis apply to timeseries aspects only",
                [Issue("a time range needs a timeseries aspectName", urn=urn, path="$.aspectName")],
            )
    repo = RestliRepository(session)
    rows = timeseries_rows = 0
    # One transaction: the counts, the timeseries points and the rows (the write path's transaction nests as a
    # savepoint on the same connection).
    async with AspectRepository(session).transaction():
        if spec is not None and spec.is_timeseries:
            timeseries_rows = await repo.delete_timeseries(timeseries_topic, urn, [spec.name], start, end)
        else:
            target = spec.name if spec is not None else entity.key_aspect
            rows = await repo.count_rows(urn, None if target == entity.key_aspect else target)
            if rows:
                proposals = writer.prepare([Draft(0, entity.name, target, ChangeType.DELETE.value, urn=urn)])
                await writer.apply(session, proposals, audit)
            if spec is None:  # the whole entity: its timeseries points too
                series = sorted(a for a in entity.aspect_names if registry.aspects[a].is_timeseries)
                timeseries_rows = await repo.delete_timeseries(timeseries_topic, urn, series, None, None)
    if spec is None or spec.is_timeseries:
        timeseries_rows = max(timeseries_rows, await _delete_indexed_points(request, urn, spec, entity, start, end))
    return {"urn": urn, "rows": rows, "timeseriesRows": timeseries_rows}


async def _delete_indexed_points(request: Request, urn: str, spec: Any, entity: Any, start: int | None, end: int | None) -> int:
    """Points live in the timeseries store; their change logs may still sit in the outbox. Let the embedded worker
    apply what was committed before this delete (so it cannot index a deleted point afterwards), then delete from
    the store too. Counted once: a point is in the outbox, the store, or both."""
    runtime = getattr(request.app.state, "search", None)
    if runtime is None:
        return 0
    await wait_until_indexed(request.app)
    registry = request.app.state.registry
    aspects = [spec.name] if spec is not None else sorted(a for a in entity.aspect_names if registry.aspects[a].is_timeseries)
    backend = await runtime.ready_backend()
    return await backend.delete_timeseries(urn, aspects, start_ms=start, end_ms=end)


async def _delete_references(
    body: dict[str, Any], session: AsyncSession, writer: WriteService, audit: AuditStamp
) -> dict[str, Any]:
    registry = writer.registry
    urn = require_urn(body)
    entity_of(registry, urn)
    dry_run = parse_bool(str(body.get("dryRun", "false")), False)
    needle = orjson.dumps(urn).decode()[1:-1]  # the URN as it appears inside stored JSON text
    candidates = await RestliRepository(session).rows_mentioning(needle, urn, sorted(relationship_paths(registry)))
    references = find_references(registry, candidates, urn)
    related = [
        {"relationshipType": t, "entity": r.urn, "aspect": r.aspect} for r in references for t in r.relationship_types
    ]
    if not dry_run and references:
        drafts = []
        for i, ref in enumerate(references):
            headers = {IF_VERSION_MATCH: ref.version} if ref.version is not None else None
            if ref.new_value is None:
                drafts.append(Draft(i, ref.entity_type, ref.aspect, ChangeType.DELETE.value, urn=ref.urn, headers=headers))
            else:
                drafts.append(Draft(i, ref.entity_type, ref.aspect, ChangeType.UPSERT.value, urn=ref.urn,
                                    value=ref.new_value, headers=headers))
        try:
            await writer.apply(session, writer.prepare(drafts), audit)
        except MetaledgerError as error:
            error.message = f"removing the references to {urn} failed (retry): {error.message}"
            raise
    return {"total": len(references), "relatedAspects": related}


def _envelope(name: str, value: dict[str, Any], created_ms: int, actor: str, system_metadata: dict[str, Any] | None) -> dict[str, Any]:
    envelope: dict[str, Any] = {
        "name": name, "type": "VERSIONED", "version": 0, "value": value, "created": {"time": created_ms, "actor": actor},
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
    urn: str, request: Request, session: Session, registry: Registry,
    always_include_key_aspect: Annotated[str | None, Query(alias="alwaysIncludeKeyAspect")] = None,
) -> Response:
    entity = registry.entity(entity_of(registry, urn, "$urn"))
    requested = parse_restli_list(request.query_params.get("aspects"))
    with_key = parse_bool(always_include_key_aspect, True)
    if requested is not None:
        for name in requested:
            try:
                registry.aspect(entity.name, name)
            except RegistryError as error:
                raise ValidationFailed(str(error), [Issue(str(error), urn=urn, aspect=name, path="$aspects")]) from None
        wanted = [a for a in requested if not registry.aspects[a].is_timeseries]
        if with_key and entity.key_aspect not in wanted:
            wanted.append(entity.key_aspect)
        rows = await AspectRepository(session).entity_latest(urn, wanted) if wanted else []
    else:
        rows = await AspectRepository(session).entity_latest(urn)
        if not with_key:
            rows = [r for r in rows if r.aspect != entity.key_aspect]
    aspects: dict[str, Any] = {}
    for row in rows:
        created_ms = int(row.created_on.timestamp() * 1000) if row.created_on.tzinfo else int(
            row.created_on.replace(tzinfo=__import__("datetime").timezone.utc).timestamp() * 1000
        )
        aspects[row.aspect] = _envelope(row.aspect, row.value, created_ms, row.created_by, row.system_metadata)
    if with_key and entity.key_aspect not in aspects:
        # GMS answers for any URN: at least the key aspect, derived from the URN.
        aspects[entity.key_aspect] = _envelope(
            entity.key_aspect, registry.urn_to_key(entity.name, urn), 0, "urn:li:corpuser:unknown", None
        )
    return json_response({"urn": urn, "entityName": entity.name, "aspects": aspects})
