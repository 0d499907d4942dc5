"""DataHub's OpenAPI v3 entity endpoints. The handlers are generic over `{entityName}`; the typed per-entity
paths of the published spec are generated from the registry (app.openapi_spec)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy.ext.asyncio import AsyncSession

from app.deps import get_registry, get_session, get_write_service, request_audit_stamp
from app.entities.service import (
    EntityReader,
    aspect_envelope,
    delete_drafts,
    drafts_from_entity_batch,
    entities_from_results,
    stored_envelope,
)
from app.errors import Issue, ValidationFailed
from app.http import json_response, parse_bool, read_json
from app.proposals.endpoints import queue_proposals
from app.registry import EntityRegistry
from app.search.service import sync_index_if_requested
from app.write.proposal import CONDITIONAL_HEADERS, AuditStamp, ChangeType, Proposal
from app.write.service import Draft, WriteService

router = APIRouter(prefix="/openapi/v3/entity", include_in_schema=False)

Session = Annotated[AsyncSession, Depends(get_session)]
Writer = Annotated[WriteService, Depends(get_write_service)]
Registry = Annotated[EntityRegistry, Depends(get_registry)]
Audit = Annotated[AuditStamp, Depends(request_audit_stamp)]


@router.post("/{entity_name}")
async def upsert_entities(
    entity_name: str, request: Request, session: Session, writer: Writer, audit: Audit,
    system_metadata: Annotated[str | None, Query(alias="systemMetadata")] = None,
    async_: Annotated[str | None, Query(alias="async")] = None,
) -> Response:
    return await _write_entities(entity_name, ChangeType.UPSERT, request, session, writer, audit, system_metadata, async_)


@router.patch("/{entity_name}")
async def patch_entities(
    entity_name: str, request: Request, session: Session, writer: Writer, audit: Audit,
    system_metadata: Annotated[str | None, Query(alias="systemMetadata")] = None,
    async_: Annotated[str | None, Query(alias="async")] = None,
) -> Response:
    """Each aspect's `value` is DataHub's `{"patch": [...], "arrayPrimaryKeys"?, "forceGenericPatch"?}`, applied
    inside the transaction to the locked latest value."""
    return await _write_entities(entity_name, ChangeType.PATCH, request, session, writer, audit, system_metadata, async_)


async def _write_entities(
    entity_name: str, change_type: ChangeType, request: Request, session: AsyncSession, writer: WriteService,
    audit: AuditStamp, system_metadata: str | None, async_: str | None,
) -> Response:
    # `async` defaults to true, as DataHub: validated now, queued on the proposal topic, 202 with the echoed
    # entities. Without Kafka configured the write is applied synchronously (200 means committed).
    body = await read_json(request, writer.settings.max_request_bytes)
    entity = writer.registry.entity(entity_name).name
    drafts = drafts_from_entity_batch(entity, body, change_type)
    proposals = writer.prepare(drafts)
    with_sm = parse_bool(system_metadata, True)
    if parse_bool(async_, True):
        queued = await queue_proposals(request, drafts, proposals)
        if queued is not None:
            return json_response(_queued_entities(queued, with_sm), 202)
    result = await writer.apply(session, proposals, audit)
    index = await sync_index_if_requested(request, proposals, result)
    return json_response(entities_from_results(result.items, with_sm), headers=index and index.headers())


def _queued_entities(queued: list[tuple[Draft, Proposal]], with_system_metadata: bool) -> list[dict[str, Any]]:
    """The echo of an accepted asynchronous write: the entities as sent, one per URN, each aspect QUEUED."""
    entities: dict[str, dict[str, Any]] = {}
    for draft, proposal in queued:
        entity = entities.setdefault(proposal.urn, {"urn": proposal.urn})
        envelope = aspect_envelope(draft.value, draft.system_metadata, with_system_metadata)
        envelope["status"] = "QUEUED"
        entity[proposal.aspect_name] = envelope
    return list(entities.values())


@router.post("/{entity_name}/batchGet")
async def batch_get(entity_name: str, request: Request, session: Session, registry: Registry,
                    system_metadata: Annotated[str | None, Query(alias="systemMetadata")] = None) -> Response:
    body = await read_json(request, 16_000_000)
    if not isinstance(body, list):
        raise ValidationFailed("the body must be a JSON array of {urn, <aspect>: {}}", [Issue("expected an array", path="$")])
    reader = EntityReader(session, registry)
    with_sm = parse_bool(system_metadata, False)
    out = []
    for position, item in enumerate(body):
        if not isinstance(item, dict) or not isinstance(item.get("urn"), str):
            raise ValidationFailed("each item needs a `urn`", [Issue("Missing `urn` field", position, path=f"$[{position}].urn")])
        aspects = [a for a in item if a != "urn"] or None
        rows = await reader.repo.entity_latest(item["urn"], aspects)
        if not rows:
            continue
        entity = {"urn": item["urn"]}
        for row in rows:
            entity[row.aspect] = stored_envelope(row, with_sm)
        out.append(entity)
    registry.entity(entity_name)
    return json_response(out)


@router.get("/{entity_name}/{urn}")
async def get_entity(
    entity_name: str, urn: str, session: Session, registry: Registry,
    aspects: Annotated[list[str] | None, Query()] = None,
    system_metadata: Annotated[str | None, Query(alias="systemMetadata")] = None,
) -> Response:
    rows = await EntityReader(session, registry).entity(entity_name, urn, aspects)
    with_sm = parse_bool(system_metadata, False)
    entity = {"urn": urn}
    for row in rows:
        entity[row.aspect] = stored_envelope(row, with_sm)
    return json_response(entity)


@router.head("/{entity_name}/{urn}")
async def entity_exists(entity_name: str, urn: str, session: Session, registry: Registry) -> Response:
    registry.entity(entity_name)
    exists = await EntityReader(session, registry).repo.entity_exists(urn)
    return Response(status_code=204 if exists else 404)


@router.delete("/{entity_name}/{urn}")
async def delete_entity(
    entity_name: str, urn: str, request: Request, session: Session, writer: Writer, audit: Audit,
    aspects: Annotated[list[str] | None, Query()] = None,
    clear: Annotated[str | None, Query()] = None,
) -> Response:
    spec = writer.registry.entity(entity_name)
    if parse_bool(clear, False):
        rows = await EntityReader(session, writer.registry).entity(spec.name, urn, None)
        targets = [row.aspect for row in rows if row.aspect != spec.key_aspect]
    elif aspects and spec.key_aspect not in aspects:
        targets = aspects
    else:
        targets = [spec.key_aspect]  # no aspects, or the key aspect: a hard delete of the entity
    proposals = writer.prepare(delete_drafts(spec.name, urn, targets))
    result = await writer.apply(session, proposals, audit)
    index = await sync_index_if_requested(request, proposals, result)
    return json_response({"urn": urn, "deleted": [r.aspect for r in result.items if r.status.value == "DELETED"]},
                         headers=index and index.headers())


def _http_conditional_headers(request: Request) -> dict[str, str]:
    """Documented extension: the conditional-write headers may also come as HTTP headers on single-aspect writes."""
    return {name: request.headers[name] for name in CONDITIONAL_HEADERS if name in request.headers}


@router.post("/{entity_name}/{urn}/{aspect_name}")
async def upsert_aspect(
    entity_name: str, urn: str, aspect_name: str, request: Request, session: Session, writer: Writer, audit: Audit,
    create_if_not_exists: Annotated[str | None, Query(alias="createIfNotExists")] = None,
    create_if_entity_not_exists: Annotated[str | None, Query(alias="createIfEntityNotExists")] = None,
    system_metadata: Annotated[str | None, Query(alias="systemMetadata")] = None,
    async_: Annotated[str | None, Query(alias="async")] = None,
) -> Response:
    body = await read_json(request, writer.settings.max_request_bytes)
    if not isinstance(body, dict) or "value" not in body:
        raise ValidationFailed('the body must be {"value": {...}, "systemMetadata"?, "headers"?}', [Issue("missing value", path="$.value")])
    headers = {**_http_conditional_headers(request), **(body.get("headers") or {})}
    # DataHub defaults createIfNotExists to true, which silently turns every write into CREATE and defeats
    # If-Version-Match (DataHub #19127). metaledger keeps the default but an explicit precondition header wins.
    has_precondition = any(h.lower() in ("if-version-match", "if-modified-since", "if-unmodified-since") for h in headers)
    if parse_bool(create_if_entity_not_exists, False):
        change_type = ChangeType.CREATE_ENTITY
    elif parse_bool(create_if_not_exists, not has_precondition):
        change_type = ChangeType.CREATE
    else:
        change_type = ChangeType.UPSERT
    entity = writer.registry.entity(entity_name).name
    draft = Draft(0, entity, aspect_name, change_type.value, urn=urn, value=body["value"],
                  system_metadata=body.get("systemMetadata"), headers=headers)
    proposals = writer.prepare([draft])
    with_sm = parse_bool(system_metadata, True)
    # `async=true` (default false here, as DataHub): queued with its change type (CREATE by default), 202.
    if parse_bool(async_, False):
        queued = await queue_proposals(request, [draft], proposals)
        if queued is not None:
            return json_response(_queued_entities(queued, with_sm)[0], 202)
    result = await writer.apply(session, proposals, audit)
    index = await sync_index_if_requested(request, proposals, result)
    return json_response(entities_from_results(result.items, with_sm)[0], headers=index and index.headers())


@router.patch("/{entity_name}/{urn}/{aspect_name}")
async def patch_aspect(
    entity_name: str, urn: str, aspect_name: str, request: Request, session: Session, writer: Writer, audit: Audit,
    system_metadata: Annotated[str | None, Query(alias="systemMetadata")] = None,
) -> Response:
    """Body: an RFC 6902 array or DataHub's GenericJsonPatch `{"patch": [...], "arrayPrimaryKeys"?}`."""
    body = await read_json(request, writer.settings.max_request_bytes)
    entity = writer.registry.entity(entity_name).name
    draft = Draft(0, entity, aspect_name, ChangeType.PATCH.value, urn=urn, value=body,
                  headers=_http_conditional_headers(request))
    proposals = writer.prepare([draft])
    result = await writer.apply(session, proposals, audit)
    index = await sync_index_if_requested(request, proposals, result)
    return json_response(entities_from_results(result.items, parse_bool(system_metadata, True))[0],
                         headers=index and index.headers())


@router.get("/{entity_name}/{urn}/{aspect_name}")
async def get_aspect(
    entity_name: str, urn: str, aspect_name: str, session: Session, registry: Registry,
    version: Annotated[int, Query(ge=0)] = 0,
    system_metadata: Annotated[str | None, Query(alias="systemMetadata")] = None,
) -> Response:
    row = await EntityReader(session, registry).aspect(entity_name, urn, aspect_name, version)
    envelope = stored_envelope(row, parse_bool(system_metadata, False))
    envelope["version"] = row.system_metadata.get("version", str(row.version))
    return json_response(envelope)


@router.head("/{entity_name}/{urn}/{aspect_name}")
async def aspect_exists(entity_name: str, urn: str, aspect_name: str, session: Session, registry: Registry) -> Response:
    reader = EntityReader(session, registry)
    registry.aspect(registry.entity(entity_name).name, aspect_name)
    rows = await reader.repo.latest([(urn, aspect_name)])
    return Response(status_code=204 if rows else 404)


@router.delete("/{entity_name}/{urn}/{aspect_name}")
async def delete_aspect(entity_name: str, urn: str, aspect_name: str, request: Request, session: Session,
                        writer: Writer, audit: Audit) -> Response:
    entity = writer.registry.entity(entity_name).name
    draft = Draft(0, entity, aspect_name, ChangeType.DELETE.value, urn=urn, headers=_http_conditional_headers(request))
    proposals = writer.prepare([draft])
    result = await writer.apply(session, proposals, audit)
    index = await sync_index_if_requested(request, proposals, result)
    item = result.items[0]
    return json_response({"urn": urn, "aspect": aspect_name, "status": item.status.value}, headers=index and index.headers())
