"""DataHub's OpenLineage endpoint: OpenLineage events (one, or a JSON array of them) → DataHub aspects through the
ingest gateway, as one transaction (app.openlineage: the spec check and the mapping)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson
from fastapi import APIRouter, Request

from app.api.deps import ALLOW_WRITE, Caller, Gateway, Session
from app.api.http import check_batch_size, json_response, read_json
from app.errors import ERROR_RESPONSES, Issue, Location
from app.openlineage.mapping import Change, map_event
from app.openlineage.validation import validate_events
from app.write.proposal import Draft

router = APIRouter(tags=["openlineage"], dependencies=[ALLOW_WRITE])

_SPEC = "https://openlineage.io/spec/2-0-2/OpenLineage.json"


@dataclass(frozen=True, slots=True)
class EventLocation(Location):
    """Where the aspects an event became sit: the event itself. The aspect, URN and message say what was refused;
    a path into DataHub's aspect would be no path into what the caller sent."""

    def path(self, mcp_path: str | None) -> str | None:
        return self.base

    def place(self, issue: Issue) -> Issue:
        return replace(issue, index=self.index, path=self.base)


async def _ingest(request: Request, session: Session, gateway: Gateway, caller: Caller):
    body = await read_json(request, gateway.settings)
    check_batch_size(body, gateway.settings)
    events, batch = validate_events(body)
    drafts = _drafts(events, batch)
    outcome = await gateway.submit(session, drafts, caller, request_headers=request.headers)
    assert outcome.result is not None
    return json_response({
        "events": len(events),
        "results": [{"urn": r.urn, "aspectName": r.aspect, "status": r.status.value, **({"version": r.version} if r.version else {})}
                    for r in outcome.result.items],
        "changeLogs": outcome.result.change_logs,
    })


def _drafts(events: list[dict[str, Any]], batch: bool) -> list[Draft]:
    """The events' aspect writes, one draft per aspect and change type: the writes of several events to one aspect
    become one (the last value, the first create-if-absent, or the patches one after the other), a timeseries point is
    written once. Every merge of an event with what is stored happens in the write transaction (patches)."""
    merged: dict[tuple[str, ...], tuple[int, Change]] = {}
    for index, event in enumerate(events):
        for change in map_event(event):
            if change.aspect == "dataProcessInstanceRunEvent":
                key: tuple[str, ...] = (change.urn, change.aspect, orjson.dumps(change.value).decode())
            else:
                key = (change.urn, change.aspect, change.change_type)
            first = merged.get(key)
            if first is None or change.change_type == "UPSERT":
                merged[key] = (first[0] if first is not None else index, change)
            elif change.change_type == "PATCH":
                merged[key] = (first[0], replace(change, value=[*first[1].value, *change.value]))
    return [
        Draft(
            index=n, entity_type=change.entity_type, aspect_name=change.aspect, change_type=change.change_type,
            urn=change.urn, value=change.document(), headers=change.headers,
            location=EventLocation(index if batch else None, f"$[{index}]" if batch else "$"),
        )
        for n, (index, change) in enumerate(merged.values())
    ]


_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {
            "description": f"An event of the OpenLineage spec ({_SPEC}), or an array of them",
            "oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}],
        }}},
    },
}
_DESCRIPTION = (
    "An OpenLineage RunEvent, JobEvent or DatasetEvent, or a JSON array of them (written in one transaction), "
    "checked against the OpenLineage spec shipped with metaledger; a refused event is a 400 naming the field "
    "(`$[3].run.runId`). See the README's OpenLineage section for the mapping to DataHub's entities."
)

router.add_api_route(
    "/openapi/openlineage/api/v1/lineage", _ingest, methods=["POST"], summary="Write OpenLineage events (DataHub's path)",
    description=_DESCRIPTION, operation_id="postOpenLineageEvents", responses=ERROR_RESPONSES, openapi_extra=_OPENAPI,
)
router.add_api_route(
    "/api/v1/lineage", _ingest, methods=["POST"], summary="Write OpenLineage events (OpenLineage's own path)",
    description=_DESCRIPTION, operation_id="postOpenLineageEventsOpenLineagePath", responses=ERROR_RESPONSES,
    openapi_extra=_OPENAPI,
)
