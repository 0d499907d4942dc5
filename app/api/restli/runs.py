"""Rest.li `/runs`, as GMS serves it (`BatchIngestionRunResource.java`) and `datahub ingest list-runs | show |
rollback` call it; admins only. What each action reads and writes: app.runs.service.

* `action=list` `{"pageOffset"?, "pageSize"?, "includeSoft"?}` → `{"value": [{"runId", "timestamp", "rows"}]}`,
  newest first; `rows` counts the aspects whose latest row the run wrote; `includeSoft` lists rolled-back runs too.
* `action=describe` `{"runId", "start"?, "count"?, "includeSoft"?, "includeAspect"?}` → `{"value":
  [AspectRowSummary]}` in (urn, aspect) order; `includeSoft` adds the aspects the run wrote that were changed or
  rolled back since; `includeAspect` adds each `aspect` as `{"<Pegasus record name>": value}`.
* `action=rollback` `{"runId", "dryRun"?, "safe"?}` → `{"value": {"aspectRowSummaries", "entitiesAffected",
  "aspectsAffected", "entitiesDeleted", "aspectsReverted", "unsafeEntitiesCount", "unsafeEntities": [{"urn"}]}}`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from app.api.deps import ALLOW_MANAGE_INGESTION, Caller, Gateway, Session, get_read_session
from app.api.http import json_response
from app.api.restli.common import ObjectActionBody, optional_int
from app.errors import ERROR_RESPONSES, Issue, ValidationFailed
from app.flags import parse_bool
from app.idempotency import idempotent
from app.runs.service import Rollback, check_run_id, describe_run, list_runs

router = APIRouter(tags=["rest.li"], dependencies=[ALLOW_MANAGE_INGESTION])

ACTIONS = ("list", "describe", "rollback")
DEFAULT_PAGE_SIZE = 100  # GMS's
MAX_PAGE_SIZE = 10_000
_BODY = ObjectActionBody("/runs", ACTIONS)


@router.post(
    "/runs",
    responses=ERROR_RESPONSES,
    summary="Rest.li ingestion run actions: list, describe, rollback (admin)",
    description=(
        '`action=list` `{"pageOffset"?, "pageSize"?, "includeSoft"?}` → `{"value": [{"runId", "timestamp", "rows"}]}`. '
        '`action=describe` `{"runId", "start"?, "count"?, "includeSoft"?, "includeAspect"?}` → `{"value": '
        '[{"runId", "aspectName", "urn", "timestamp", "metadata", "version", "keyAspect", "aspect"?}]}`. '
        '`action=rollback` `{"runId", "dryRun"?, "safe"?}` → `{"value": {"aspectRowSummaries", "entitiesAffected", '
        '"aspectsAffected", "entitiesDeleted", "aspectsReverted", "unsafeEntitiesCount", "unsafeEntities"}}`: an '
        "aspect the run changed goes back to its value before the run, what it created is removed, what others "
        "changed since is reported and kept unless `safe` is false."
    ),
)
@idempotent
async def runs_action(
    body: Annotated[dict[str, Any], Depends(_BODY)],
    request: Request,
    session: Session,
    gateway: Gateway,
    caller: Caller,
    action: Annotated[str, Query(description=", ".join(ACTIONS))],
) -> Response:
    if action == "list":  # list and describe are pure reads (a replica's); a rollback reads and writes the primary
        offset, size = _page(body, "pageOffset", "pageSize")
        listed = await list_runs(await get_read_session(request), offset, size, _flag(body, "includeSoft", False))
        return json_response({"value": listed})
    run_id = check_run_id(body.get("runId"))
    if action == "describe":
        offset, size = _page(body, "start", "count")
        return json_response(
            {
                "value": await describe_run(
                    await get_read_session(request),
                    gateway.registry,
                    run_id,
                    offset,
                    size,
                    include_soft=_flag(body, "includeSoft", False),
                    include_aspect=_flag(body, "includeAspect", False),
                )
            }
        )
    rollback = Rollback(
        session,
        gateway,
        caller,
        run_id,
        dry_run=_flag(body, "dryRun", False),
        safe=_flag(body, "safe", True),
    )
    return json_response({"value": await rollback.run()})


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    raw = body.get(key)
    return parse_bool(raw, default, f".{key}")


def _page(body: dict[str, Any], offset_key: str, size_key: str) -> tuple[int, int]:
    offset = optional_int(body, offset_key) or 0
    size = optional_int(body, size_key)
    size = DEFAULT_PAGE_SIZE if size is None else size
    for key, value, low, high in ((offset_key, offset, 0, None), (size_key, size, 0, MAX_PAGE_SIZE)):
        if value < low or (high is not None and value > high):
            raise ValidationFailed(
                f"`{key}` must be between {low} and {high if high is not None else 'any'}",
                [Issue("out of range", path=f"$.{key}", found=str(value))],
            )
    return offset, size
