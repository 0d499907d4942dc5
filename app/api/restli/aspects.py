"""Rest.li `/aspects` as GMS serves it (`AspectResource.java`) and DataHub's Python client calls it.

* `POST /aspects?action=ingestProposal` `{"proposal": MCP, "async": "true"|"false"}` and
  `POST /aspects?action=ingestProposalBatch` `{"proposals": [MCP, ...], "async": ...}` (also `/aspects/?action=`,
  which `datahub put` uses): aspect values as JSON strings (`application/json`) or patches
  (`application/json-patch+json`). A batch is one transaction. Answers `{"value": "success"}`. DataHub skips bad
  proposals silently and still answers "success"; metaledger answers 400 naming every bad proposal
  (`$.proposals[i]...` paths) and writes nothing; an empty `proposals` is a 400 too. `async: "true"` with Kafka configured validates now, queues the
  proposals on the MCP topic and answers 200 `{"value": "success"}` (DataHub's answer; the client accepts any 2xx);
  without Kafka it is applied synchronously.
* `POST /aspects?action=getTimeseriesAspectValues` (reads the search backend's timeseries store, app.api.restli.timeseries).
* `GET /aspects/{urn}?aspect=&version=` → `{"aspect": {"<Pegasus record name>": {...}}, "version": n}`; 404 (the
  project's error body) when absent, which the client reads as "not found".
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from app.api.deps import (
    Gateway,
    Reader,
    Registry,
    Session,
    StoredEntities,
    get_backend,
    get_index_wait,
)
from app.api.http import UrnPath, check_batch_size, entity_of_urn, invalid_at, json_response
from app.api.restli.common import ObjectActionBody, optional_int, require_urn
from app.api.restli.timeseries import DEFAULT_LIMIT, check_filter, timeseries_from_backend
from app.errors import ERROR_RESPONSES, Issue, Location, NotFound, ValidationFailed
from app.flags import parse_bool
from app.idempotency import idempotent
from app.ingest.mcp import parse_mcp
from app.limits import check_long
from app.registry import EntityRegistry

# The actions route needs READ (getTimeseriesAspectValues); the gateway checks WRITE for the ingest actions.
router = APIRouter(tags=["rest.li"])

SUCCESS = {"value": "success"}
ACTIONS = ("ingestProposal", "ingestProposalBatch", "getTimeseriesAspectValues")
_BODY = ObjectActionBody("/aspects", ACTIONS, writes={"ingestProposal", "ingestProposalBatch"})


@router.post(
    "/aspects",
    responses=ERROR_RESPONSES,
    summary="Rest.li aspect actions: ingestProposal, ingestProposalBatch, getTimeseriesAspectValues",
    description=(
        '`action=ingestProposal` `{"proposal": MCP, "async": "true"|"false"}`; `action=ingestProposalBatch` '
        '`{"proposals": [MCP, ...], "async": ...}` (one transaction) → `{"value": "success"}`. '
        '`action=getTimeseriesAspectValues` `{"urn", "entity", "aspect", "startTimeMillis"?, "endTimeMillis"?, '
        '"limit"?, "latestValue"?, "filter"?}` → `{"value": {"entityName", "aspectName", "limit", "values": '
        '[{"aspect": {"value": "<JSON text>", "contentType"}, "systemMetadata"}]}}`, newest first.'
    ),
)
@router.post("/aspects/", include_in_schema=False)
@idempotent
async def aspects_action(
    caller: Reader,
    body: Annotated[dict[str, Any], Depends(_BODY)],
    request: Request,
    session: Session,
    gateway: Gateway,
    action: Annotated[str, Query(description=", ".join(ACTIONS))],
) -> Response:
    if action == "getTimeseriesAspectValues":
        return json_response({"value": await _timeseries(body, request, gateway.registry)})
    if action == "ingestProposalBatch":
        check_batch_size(body.get("proposals"), gateway.settings, "$.proposals")
        drafts = await gateway.parse_in_turns(body.get("proposals"), "$.proposals")
    else:
        if not isinstance(body.get("proposal"), dict):
            raise ValidationFailed(
                "`proposal` must be a proposal object", [Issue("expected an object", path="$.proposal")]
            )
        drafts = [parse_mcp(body["proposal"], Location(0, "$.proposal"))]
    queue = parse_bool(body.get("async"), False, ".async")
    outcome = await gateway.submit(session, drafts, caller, queue=queue, request_headers=request.headers)
    return json_response(SUCCESS, headers=outcome.response_headers)


async def _timeseries(body: dict[str, Any], request: Request, registry: EntityRegistry) -> dict[str, Any]:
    urn = require_urn(body)
    entity = entity_of_urn(registry, urn, "$.urn")
    if isinstance(body.get("entity"), str) and body["entity"].lower() != entity.lower():
        raise ValidationFailed(
            f"URN {urn} is of entity type {entity!r}, not {body['entity']!r}",
            [Issue("entity mismatch", urn=urn, path="$.entity")],
        )
    aspect_name = body.get("aspect")
    if not isinstance(aspect_name, str):
        raise ValidationFailed(
            "`aspect` is required", [Issue("missing required string field 'aspect'", path="$.aspect")]
        )
    with invalid_at("$.aspect", urn=urn, aspect=aspect_name):
        aspect = registry.aspect(entity, aspect_name)
    if not aspect.is_timeseries:
        raise ValidationFailed(
            f"aspect {aspect_name!r} is not a timeseries aspect",
            [Issue("not a timeseries aspect", urn=urn, aspect=aspect_name, path="$.aspect")],
        )
    limit = optional_int(body, "limit")
    limit = (
        DEFAULT_LIMIT if limit is None else min(limit, DEFAULT_LIMIT)
    )  # DataHub's search window holds 10,000 at most
    if body.get("latestValue") in (True, "true"):
        limit = min(limit, 1)
    groups = check_filter(body.get("filter"))
    backend = await get_backend(request)
    caught_up = await get_index_wait(request)
    await caught_up()  # DataHub's clients read their own timeseries writes
    values = await timeseries_from_backend(
        backend,
        urn,
        aspect.name,
        start=optional_int(body, "startTimeMillis"),
        end=optional_int(body, "endTimeMillis"),
        limit=limit,
        groups=groups,
    )
    return {"entityName": entity, "aspectName": aspect.name, "limit": limit, "values": values}


@router.get(
    "/aspects/{urn:path}",
    responses=ERROR_RESPONSES,
    summary="One aspect of an entity, Rest.li VersionedAspect (404 when absent)",
    description='`{"aspect": {"<Pegasus record name>": {...}}, "version": n}`; `version=0` (default) is the latest. '
    "The URN is percent-encoded in the path.",
)
async def get_versioned_aspect(
    urn: UrnPath,
    registry: Registry,
    reader: StoredEntities,
    aspect: Annotated[str, Query(description="Aspect name, e.g. datasetProperties")],
    version: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    entity = entity_of_urn(registry, urn)
    check_long(version, "version", minimum=0)
    with invalid_at("$aspect", urn=urn, aspect=aspect):
        spec = registry.aspect(entity, aspect)
    if spec.is_timeseries:  # never in the aspect store (DataHub: no SQL row either)
        raise NotFound(f"timeseries aspect {aspect!r} is not versioned", [Issue("not found", urn=urn, aspect=aspect)])
    row = await reader.aspect(entity, urn, aspect, version)
    return json_response({"aspect": {spec.record_name: row.value}, "version": version})
