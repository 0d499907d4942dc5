"""DataHub's OpenAPI v3 entity endpoints: v3 bodies ↔ drafts, outcomes ↔ v3 responses. The handlers are generic
over `{entityName}`; the typed per-entity paths of the published spec are generated from the registry
(app.openapi_spec). Issues name paths in the body the client sent (`$[0].datasetProperties.value.name`)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request, Response

from app.api.deps import ALLOW_READ, ALLOW_WRITE, Caller, Gateway, Registry, Session, SettingsDep
from app.api.http import (
    aspect_envelope, check_batch_size, checked_urn, invalid_at, json_response, parse_bool, read_json, stored_envelope,
)
from app.errors import Issue, Location, ValidationFailed
from app.ingest.gateway import Outcome
from app.limits import check_long
from app.urns import InvalidUrnError, entity_type_of
from app.write.proposal import CONDITIONAL_HEADERS, ChangeType, Draft
from app.write.reader import EntityReader
from app.write.service import ItemResult

router = APIRouter(prefix="/openapi/v3/entity", include_in_schema=False)

ENVELOPE_KEYS = frozenset({"value", "systemMetadata", "headers"})
SystemMetadataParam = Annotated[str | None, Query(alias="systemMetadata")]
AsyncParam = Annotated[str | None, Query(alias="async")]


@router.post("/{entity_name}", dependencies=[ALLOW_WRITE])
async def upsert_entities(
    entity_name: str, request: Request, session: Session, gateway: Gateway, caller: Caller,
    system_metadata: SystemMetadataParam = None, async_: AsyncParam = None,
) -> Response:
    return await _write_entities(entity_name, ChangeType.UPSERT, request, session, gateway, caller, system_metadata, async_)


@router.patch("/{entity_name}", dependencies=[ALLOW_WRITE])
async def patch_entities(
    entity_name: str, request: Request, session: Session, gateway: Gateway, caller: Caller,
    system_metadata: SystemMetadataParam = None, async_: AsyncParam = None,
) -> Response:
    """Each aspect's `value` is DataHub's `{"patch": [...], "arrayPrimaryKeys"?, "forceGenericPatch"?}`, applied
    inside the transaction to the locked latest value."""
    return await _write_entities(entity_name, ChangeType.PATCH, request, session, gateway, caller, system_metadata, async_)


async def _write_entities(
    entity_name: str, change_type: ChangeType, request: Request, session: Session, gateway: Gateway, caller: Caller,
    system_metadata: str | None, async_: str | None,
) -> Response:
    # `async` defaults to true, as DataHub: validated now, queued on the proposal topic, 202 with the echoed
    # entities. Without Kafka configured the write is applied synchronously (200 means committed).
    body = await read_json(request, gateway.settings)
    check_batch_size(body, gateway.settings)
    if isinstance(body, list):  # and its aspects, before a draft is made of each
        aspects = sum(len(item) - ("urn" in item) for item in body if isinstance(item, dict))
        check_batch_size(body, gateway.settings, count=aspects, what="aspects")
    entity = gateway.registry.entity(entity_name).name
    drafts = drafts_from_entity_batch(entity, body, change_type)
    outcome = await gateway.submit(session, drafts, caller, queue=parse_bool(async_, True, "async"), request_headers=request.headers)
    return _entities_response(outcome, parse_bool(system_metadata, True, "systemMetadata"), echo_limit=gateway.settings.max_echo_value_bytes)


@router.post("/{entity_name}/batchGet", dependencies=[ALLOW_READ])
async def batch_get(entity_name: str, request: Request, session: Session, registry: Registry, settings: SettingsDep,
                    system_metadata: SystemMetadataParam = None) -> Response:
    body = await read_json(request, settings)
    if not isinstance(body, list):
        raise ValidationFailed("the body must be a JSON array of {urn, <aspect>: {}}", [Issue("expected an array", path="$")])
    check_batch_size(body, settings)
    entity_name = registry.entity(entity_name).name
    wanted: list[tuple[str, list[str] | None]] = []
    issues: list[Issue] = []
    for position, item in enumerate(body):
        if not isinstance(item, dict) or not isinstance(item.get("urn"), str):
            raise ValidationFailed("each item needs a `urn`", [Issue("Missing `urn` field", position, path=f"$[{position}].urn")])
        urn = item["urn"]
        try:
            entity_type_of(urn)  # too long, a NUL, not a URN: never sent to the database
        except InvalidUrnError as error:
            issues.append(Issue(str(error), position, urn, path=f"$[{position}].urn"))
            continue
        aspects = [a for a in item if a != "urn"] or None
        for aspect in aspects or ():
            try:
                with invalid_at(f"$[{position}]", urn=urn, aspect=aspect):
                    registry.aspect(entity_name, aspect)
            except ValidationFailed as error:
                issues.extend(Issue(i.message, position, urn, aspect, i.path) for i in error.issues)
        wanted.append((urn, aspects))
    if issues:
        raise ValidationFailed(f"{len({i.index for i in issues})} of {len(body)} items are invalid", issues)
    found = await EntityReader(session, registry).repo.entities_latest(wanted)  # one query for the whole batch
    with_sm = parse_bool(system_metadata, False, "systemMetadata")
    out = []
    for urn, aspects in wanted:
        rows = [r for r in found.get(urn, ()) if aspects is None or r.aspect in aspects]
        if not rows:
            continue
        entity = {"urn": urn}
        for row in rows:
            entity[row.aspect] = stored_envelope(row, with_sm)
        out.append(entity)
    return json_response(out)


@router.get("/{entity_name}/{urn}", dependencies=[ALLOW_READ])
async def get_entity(
    entity_name: str, urn: str, session: Session, registry: Registry,
    aspects: Annotated[list[str] | None, Query()] = None, system_metadata: SystemMetadataParam = None,
) -> Response:
    checked_urn(urn)
    rows = await EntityReader(session, registry).entity(entity_name, urn, aspects)
    with_sm = parse_bool(system_metadata, False, "systemMetadata")
    entity = {"urn": urn}
    for row in rows:
        entity[row.aspect] = stored_envelope(row, with_sm)
    return json_response(entity)


@router.head("/{entity_name}/{urn}", dependencies=[ALLOW_READ])
async def entity_exists(entity_name: str, urn: str, session: Session, registry: Registry) -> Response:
    registry.entity(entity_name)
    exists = await EntityReader(session, registry).repo.entity_exists(checked_urn(urn))
    return Response(status_code=204 if exists else 404)


# Deleting the whole entity (its key aspect) needs ADMIN: the gateway checks each draft.
@router.delete("/{entity_name}/{urn}", dependencies=[ALLOW_WRITE])
async def delete_entity(
    entity_name: str, urn: str, request: Request, session: Session, gateway: Gateway, caller: Caller,
    aspects: Annotated[list[str] | None, Query()] = None,
    clear: Annotated[str | None, Query()] = None,
) -> Response:
    spec = gateway.registry.entity(entity_name)
    if parse_bool(clear, False, "clear"):
        rows = await EntityReader(session, gateway.registry).entity(spec.name, checked_urn(urn), None)
        targets = [row.aspect for row in rows if row.aspect != spec.key_aspect]
    elif aspects and spec.key_aspect not in aspects:
        targets = aspects
    else:
        targets = [spec.key_aspect]  # no aspects, or the key aspect: a hard delete of the entity
    drafts = [Draft(i, spec.name, aspect, ChangeType.DELETE.value, urn=urn) for i, aspect in enumerate(targets)]
    if not drafts:  # `clear` of an entity that has only its key aspect
        return json_response({"urn": urn, "deleted": []})
    outcome = await gateway.submit(session, drafts, caller, request_headers=request.headers)
    assert outcome.result is not None
    deleted = [r.aspect for r in outcome.result.items if r.status.value == "DELETED"]
    return json_response({"urn": urn, "deleted": deleted}, headers=outcome.response_headers)


def _http_conditional_headers(request: Request) -> dict[str, str]:
    """Documented extension: the conditional-write headers may also come as HTTP headers on single-aspect writes."""
    return {name: request.headers[name] for name in CONDITIONAL_HEADERS if name in request.headers}


@router.post("/{entity_name}/{urn}/{aspect_name}", dependencies=[ALLOW_WRITE])
async def upsert_aspect(
    entity_name: str, urn: str, aspect_name: str, request: Request, session: Session, gateway: Gateway, caller: Caller,
    create_if_not_exists: Annotated[str | None, Query(alias="createIfNotExists")] = None,
    create_if_entity_not_exists: Annotated[str | None, Query(alias="createIfEntityNotExists")] = None,
    system_metadata: SystemMetadataParam = None, async_: AsyncParam = None,
) -> Response:
    body = await read_json(request, gateway.settings)
    if not isinstance(body, dict) or "value" not in body:
        raise ValidationFailed('the body must be {"value": {...}, "systemMetadata"?, "headers"?}', [Issue("missing value", path="$.value")])
    envelope_issues = _envelope_issues(body, "$")
    if envelope_issues:
        raise ValidationFailed(envelope_issues[0].message, envelope_issues)
    headers = {**_http_conditional_headers(request), **(body.get("headers") or {})}
    # DataHub defaults createIfNotExists to true, which silently turns every write into CREATE and defeats
    # If-Version-Match (DataHub #19127). metaledger keeps the default but an explicit precondition header wins.
    has_precondition = any(h.lower() in ("if-version-match", "if-modified-since", "if-unmodified-since") for h in headers)
    if parse_bool(create_if_entity_not_exists, False, "createIfEntityNotExists"):
        change_type = ChangeType.CREATE_ENTITY
    elif parse_bool(create_if_not_exists, not has_precondition, "createIfNotExists"):
        change_type = ChangeType.CREATE
    else:
        change_type = ChangeType.UPSERT
    entity = gateway.registry.entity(entity_name).name
    draft = Draft(0, entity, aspect_name, change_type.value, urn=urn, value=body["value"],
                  system_metadata=body.get("systemMetadata"), headers=headers, location=SINGLE_ASPECT)
    # `async=true` (default false here, as DataHub): queued with its change type (CREATE by default), 202.
    outcome = await gateway.submit(session, [draft], caller, queue=parse_bool(async_, False, "async"), request_headers=request.headers)
    return _entities_response(outcome, parse_bool(system_metadata, True, "systemMetadata"), single=True, echo_limit=gateway.settings.max_echo_value_bytes)


@router.patch("/{entity_name}/{urn}/{aspect_name}", dependencies=[ALLOW_WRITE])
async def patch_aspect(
    entity_name: str, urn: str, aspect_name: str, request: Request, session: Session, gateway: Gateway, caller: Caller,
    system_metadata: SystemMetadataParam = None,
) -> Response:
    """Body: an RFC 6902 array or DataHub's GenericJsonPatch `{"patch": [...], "arrayPrimaryKeys"?}`."""
    body = await read_json(request, gateway.settings)
    entity = gateway.registry.entity(entity_name).name
    draft = Draft(0, entity, aspect_name, ChangeType.PATCH.value, urn=urn, value=body,
                  headers=_http_conditional_headers(request), location=SINGLE_PATCH)
    outcome = await gateway.submit(session, [draft], caller, request_headers=request.headers)
    return _entities_response(outcome, parse_bool(system_metadata, True, "systemMetadata"), single=True, echo_limit=gateway.settings.max_echo_value_bytes)


@router.get("/{entity_name}/{urn}/{aspect_name}", dependencies=[ALLOW_READ])
async def get_aspect(
    entity_name: str, urn: str, aspect_name: str, session: Session, registry: Registry,
    version: Annotated[int, Query(ge=0)] = 0, system_metadata: SystemMetadataParam = None,
) -> Response:
    check_long(version, "version", minimum=0)
    row = await EntityReader(session, registry).aspect(entity_name, checked_urn(urn), aspect_name, version)
    envelope = stored_envelope(row, parse_bool(system_metadata, False, "systemMetadata"))
    envelope["version"] = row.system_metadata.get("version", str(row.version))
    return json_response(envelope)


@router.head("/{entity_name}/{urn}/{aspect_name}", dependencies=[ALLOW_READ])
async def aspect_exists(entity_name: str, urn: str, aspect_name: str, session: Session, registry: Registry) -> Response:
    reader = EntityReader(session, registry)
    registry.aspect(registry.entity(entity_name).name, aspect_name)
    rows = await reader.repo.latest([(checked_urn(urn), aspect_name)])
    return Response(status_code=204 if rows else 404)


@router.delete("/{entity_name}/{urn}/{aspect_name}", dependencies=[ALLOW_WRITE])
async def delete_aspect(entity_name: str, urn: str, aspect_name: str, request: Request, session: Session,
                        gateway: Gateway, caller: Caller) -> Response:
    entity = gateway.registry.entity(entity_name).name
    draft = Draft(0, entity, aspect_name, ChangeType.DELETE.value, urn=urn, headers=_http_conditional_headers(request))
    outcome = await gateway.submit(session, [draft], caller, request_headers=request.headers)
    assert outcome.result is not None
    item = outcome.result.items[0]
    return json_response({"urn": urn, "aspect": aspect_name, "status": item.status.value}, headers=outcome.response_headers)


# --- v3 bodies ↔ drafts, outcomes ↔ v3 responses ----------------------------------------------------------------

# Where a single-aspect write's issues point: its body is `{"value", "systemMetadata"?, "headers"?}` (a patch body
# is the patch itself); the URN is a path parameter.
SINGLE_ASPECT = Location(0, "$", value="$.value", urn="$urn", fields="$")
SINGLE_PATCH = Location(0, "$", value="$", urn="$urn", fields="$")


def drafts_from_entity_batch(entity_type: str, body: Any, change_type: ChangeType) -> list[Draft]:
    """`[{"urn": ..., "<aspect>": {"value": {...}, "systemMetadata"?, "headers"?}}, ...]` → one draft per aspect,
    located at its aspect in the body."""
    if not isinstance(body, list):
        raise ValidationFailed("the body must be a JSON array of entities", [Issue("expected an array", path="$")])
    if not body:
        raise ValidationFailed("the body is an empty array: send at least one entity", [Issue("empty batch", path="$")])
    drafts: list[Draft] = []
    issues: list[Issue] = []
    for position, item in enumerate(body):
        path = f"$[{position}]"
        if not isinstance(item, dict):
            issues.append(Issue("each entity must be an object with a `urn` field", position, path=path))
            continue
        urn = item.get("urn")
        if not isinstance(urn, str):
            issues.append(Issue("Missing `urn` field", position, path=f"{path}.urn"))
            continue
        for aspect_name, envelope in item.items():
            if aspect_name == "urn":
                continue
            aspect_path = f"{path}.{aspect_name}"
            if not isinstance(envelope, dict) or "value" not in envelope:
                issues.append(Issue('an aspect must be {"value": {...}, "systemMetadata"?, "headers"?}', position, urn, aspect_name, aspect_path))
                continue
            unknown = set(envelope) - ENVELOPE_KEYS
            if unknown:
                issues.append(Issue(f"unknown aspect envelope field(s) {sorted(unknown)}", position, urn, aspect_name, aspect_path))
                continue
            envelope_issues = _envelope_issues(envelope, aspect_path, position, urn, aspect_name)
            if envelope_issues:
                issues.extend(envelope_issues)
                continue
            drafts.append(
                Draft(
                    index=len(drafts),
                    entity_type=entity_type,
                    aspect_name=aspect_name,
                    change_type=change_type.value,
                    urn=urn,
                    value=envelope["value"],
                    system_metadata=envelope.get("systemMetadata"),
                    headers=envelope.get("headers"),
                    location=Location(position, aspect_path, value=f"{aspect_path}.value", urn=f"{path}.urn", fields=aspect_path),
                )
            )
    if issues:
        raise ValidationFailed(f"{len(issues)} entities of the batch are malformed; nothing was written", issues)
    return drafts


def _envelope_issues(
    envelope: dict[str, Any], path: str, index: int | None = None, urn: str | None = None, aspect: str | None = None,
) -> list[Issue]:
    """An aspect envelope's `systemMetadata` must be an object, its `headers` an object of strings."""
    issues = []
    system_metadata = envelope.get("systemMetadata")
    if system_metadata is not None and not isinstance(system_metadata, dict):
        issues.append(Issue("`systemMetadata` must be an object", index, urn, aspect, f"{path}.systemMetadata"))
    headers = envelope.get("headers")
    if headers is not None and not (
        isinstance(headers, dict) and all(isinstance(v, str) for v in headers.values())
    ):
        issues.append(Issue("`headers` must be an object of strings", index, urn, aspect, f"{path}.headers", expected="{name: value}"))
    return issues


def _echoed(value: Any, envelope: dict[str, Any], limit: int) -> None:
    """Put `value` in a write's answer, as DataHub echoes written aspects, unless it is larger than `limit` bytes
    (METALEDGER_MAX_ECHO_VALUE_BYTES): then the envelope says so instead. Serialized once, here."""
    raw = orjson.dumps(value)
    if len(raw) <= limit:
        envelope["value"] = orjson.Fragment(raw)
    else:
        del envelope["value"]
        envelope["message"] = (f"value not echoed: {len(raw)} bytes, over the {limit} bytes a response echoes "
                               "(METALEDGER_MAX_ECHO_VALUE_BYTES); read it back with GET")


def entities_from_results(
    results: list[ItemResult], with_system_metadata: bool = True, echo_limit: int | None = None,
) -> list[dict[str, Any]]:
    """Group written aspects back into the v3 entity shape, in request order (values larger than `echo_limit`
    bytes left out)."""
    entities: dict[str, dict[str, Any]] = {}
    for result in results:
        entity = entities.setdefault(result.urn, {"urn": result.urn})
        envelope = aspect_envelope(result.value, result.system_metadata, with_system_metadata)
        if echo_limit is not None and result.value is not None:
            _echoed(result.value, envelope, echo_limit)
        envelope["status"] = result.status.value
        if result.message:
            envelope["message"] = result.message
        envelope.update(result.processing())
        entity[result.aspect] = envelope
    return list(entities.values())


def _queued_entities(outcome: Outcome, with_system_metadata: bool, echo_limit: int | None) -> list[dict[str, Any]]:
    """The echo of an accepted asynchronous write: the entities as sent, one per URN, each aspect QUEUED."""
    entities: dict[str, dict[str, Any]] = {}
    for draft, proposal in outcome.queued:
        entity = entities.setdefault(proposal.urn, {"urn": proposal.urn})
        envelope = aspect_envelope(draft.value, draft.system_metadata, with_system_metadata)
        if echo_limit is not None and draft.value is not None:
            _echoed(draft.value, envelope, echo_limit)
        envelope["status"] = "QUEUED"
        entity[proposal.aspect_name] = envelope
    return list(entities.values())


def _entities_response(
    outcome: Outcome, with_system_metadata: bool, *, single: bool = False, echo_limit: int | None = None,
) -> Response:
    """202 with the queued echo, or the written entities (and the sync index status header)."""
    if outcome.result is None:
        entities = _queued_entities(outcome, with_system_metadata, echo_limit)
        return json_response(entities[0] if single else entities, 202)
    entities = entities_from_results(outcome.result.items, with_system_metadata, echo_limit)
    return json_response(entities[0] if single else entities, headers=outcome.response_headers)
