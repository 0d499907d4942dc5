"""DataHub's OpenLineage endpoint: OpenLineage events (one, or a JSON array of them) → DataHub aspects through the
ingest gateway, as one transaction (app.openlineage: the spec check and the mapping).

A request is bounded by what it would write, METALEDGER_MAX_BATCH_ITEMS for each of (413 naming the limit, the
count and the place): its events; before the spec check, the lists it walks (the datasets of each event's `inputs`
and `outputs` and of the whole request, each facets map); and as the events are mapped, the aspect writes
(proposals) they become, the writes of several events to one aspect counted once: the mapping stops at the first
one past the limit."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from app.api.deps import ALLOW_WRITE, Caller, DeclaredBody, Gateway, Session, get_settings
from app.api.http import check_batch_size, json_response
from app.errors import ERROR_RESPONSES, Issue, Location, PayloadTooLarge
from app.idempotency import idempotent
from app.openlineage.mapping import Change, TooManyWrites, WriteBudget, map_event
from app.openlineage.validation import validate_events
from app.settings import Settings
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


Events = tuple[list[dict[str, Any]], bool]  # a request's events, and whether they came as an array


class LineageEvents(DeclaredBody[Events]):
    """An event of the OpenLineage spec or a JSON array of them, bounded (MAX_BATCH_ITEMS events, `_check_list_sizes`)
    and checked against the spec."""

    def request_body_schema(self) -> dict[str, Any]:
        return {
            "description": f"An event of the OpenLineage spec ({_SPEC}), or an array of them",
            "oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}],
        }

    async def parse(self, document: Any, request: Request) -> Events:
        settings = await get_settings(request)
        check_batch_size(document, settings)
        _check_list_sizes(document, settings)
        return validate_events(document)


@idempotent
async def _ingest(
    request: Request,
    session: Session,
    gateway: Gateway,
    caller: Caller,
    body: Annotated[Events, Depends(LineageEvents())],
):
    events, batch = body
    drafts = _drafts(events, batch, WriteBudget(gateway.settings.max_batch_items))
    outcome = await gateway.submit(session, drafts, caller, request_headers=request.headers)
    assert outcome.result is not None
    return json_response(
        {
            "events": len(events),
            "results": [
                {
                    "urn": r.urn,
                    "aspectName": r.aspect,
                    "status": r.status.value,
                    **({"version": r.version} if r.version else {}),
                }
                for r in outcome.result.items
            ],
            "changeLogs": outcome.result.change_logs,
        }
    )


def _check_list_sizes(body: Any, settings: Settings) -> None:
    """413 for more than MAX_BATCH_ITEMS datasets in one event's `inputs` or `outputs`, or in the request's (each
    dataset listed is checked against the spec, and is an aspect write at least), or facets in one facets map, before
    the spec check walks them. Whatever is no list or map is left for the spec check to name."""
    batch = isinstance(body, list)
    listed = 0
    for index, event in enumerate(body if batch else [body]):
        if not isinstance(event, dict):
            continue
        base = f"$[{index}]" if batch else "$"
        holders: list[tuple[str, Any]] = [
            (f"{base}.{member}", event.get(member)) for member in ("run", "job", "dataset")
        ]
        for side in ("inputs", "outputs"):
            datasets = event.get(side)
            if isinstance(datasets, list):
                check_batch_size(datasets, settings, f"{base}.{side}", what="datasets")
                listed += len(datasets)
                check_batch_size(None, settings, count=listed, what="datasets (inputs and outputs)")
                holders.extend((f"{base}.{side}[{i}]", dataset) for i, dataset in enumerate(datasets))
        for path, holder in holders:
            if not isinstance(holder, dict):
                continue
            for member in ("facets", "inputFacets", "outputFacets"):
                facets = holder.get(member)
                if isinstance(facets, dict):
                    check_batch_size(None, settings, f"{path}.{member}", count=len(facets), what="facets")


def _drafts(events: list[dict[str, Any]], batch: bool, budget: WriteBudget) -> list[Draft]:
    """The events' aspect writes, one draft per aspect and change type: the writes of several events to one aspect
    become one (the last value, the first create-if-absent, or the patches one after the other), a timeseries point is
    written once. Every merge of an event with what is stored happens in the write transaction (patches).
    The writes are counted in `budget` as each event is mapped: past its limit, a 413 (`_too_many`)."""
    merged: dict[tuple[str, ...], tuple[int, Change, list[Any] | None]] = {}
    for index, event in enumerate(events):
        budget.start(event)
        for change in map_event(event):  # made one by one: none past the first write over the limit
            try:
                budget.spend(change)
            except TooManyWrites as error:
                raise _too_many(error, index if batch else None) from None
            key = change.key()
            first = merged.get(key)
            if first is None or change.change_type == "UPSERT":
                ops = list(change.value) if change.change_type == "PATCH" else None
                merged[key] = (first[0] if first is not None else index, change, ops)
            elif change.change_type == "PATCH":  # the patches one after the other, in a list of their own (no copies)
                ops = first[2] if first[2] is not None else list(first[1].value)
                ops.extend(change.value)
                merged[key] = (first[0], change, ops)
    return [
        Draft(
            index=n,
            entity_type=change.entity_type,
            aspect_name=change.aspect,
            change_type=change.change_type,
            urn=change.urn,
            value=(replace(change, value=ops) if ops is not None else change).document(),
            headers=change.headers,
            location=EventLocation(index if batch else None, f"$[{index}]" if batch else "$"),
        )
        for n, (index, change, ops) in enumerate(merged.values())
    ]


def _too_many(error: TooManyWrites, index: int | None) -> PayloadTooLarge:
    """The 413 of events that map to more aspect writes than MAX_BATCH_ITEMS: the limit, how many were mapped when the
    mapping stopped, and where: the member of the event whose datasets made the most of them (`$.inputs`,
    `$[3].outputs`), else the event (`$[3]`)."""
    path = ("$" if index is None else f"$[{index}]") + "".join(f".{p}" for p in error.place)
    listed = f" ({error.items} datasets)" if error.items is not None else ""
    what = "the event maps" if index is None else "the events map"
    message = (
        f"{what} to more than {error.limit} aspect writes: {error.count} when the mapping stopped, "
        f"{error.by_place} of them by {path}{listed}; the limit is {error.limit} (METALEDGER_MAX_BATCH_ITEMS): "
        "send fewer datasets per event, or fewer events per request"
    )
    return PayloadTooLarge(
        message,
        [
            Issue(
                "too many aspect writes",
                index=index,
                path=path,
                expected=f"at most {error.limit} aspect writes",
                found=f"{error.count} aspect writes when the mapping stopped, {error.by_place} by {path}{listed}",
            )
        ],
    )


_DESCRIPTION = (
    "An OpenLineage RunEvent, JobEvent or DatasetEvent, or a JSON array of them (written in one transaction), "
    "checked against the OpenLineage spec shipped with metaledger; a refused event is a 400 naming the field "
    "(`$[3].run.runId`). See docs/openlineage.md for the mapping to DataHub's entities."
)

router.add_api_route(
    "/openapi/openlineage/api/v1/lineage",
    _ingest,
    methods=["POST"],
    summary="Write OpenLineage events (DataHub's path)",
    description=_DESCRIPTION,
    operation_id="postOpenLineageEvents",
    responses=ERROR_RESPONSES,
)
router.add_api_route(
    "/api/v1/lineage",
    _ingest,
    methods=["POST"],
    summary="Write OpenLineage events (OpenLineage's own path)",
    description=_DESCRIPTION,
    operation_id="postOpenLineageEventsOpenLineagePath",
    responses=ERROR_RESPONSES,
)
