"""The audit log over HTTP (app.audit): its entries, filtered and paged in chain order (an admin reads anyone's,
any other caller its own), and the verification of its hash chain (admins)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query

from app.api.deps import ALLOW_SYSTEM_OPERATIONS, Auth, Reader, Session
from app.api.http import json_response
from app.audit.model import ACTIONS
from app.audit.repository import EntryQuery
from app.audit.service import AuditLog
from app.auth.privileges import MANAGE_SYSTEM_OPERATIONS
from app.errors import ERROR_RESPONSES, Forbidden, Issue, ValidationFailed

router = APIRouter(prefix="/openapi/v1/audit", tags=["audit"], responses=ERROR_RESPONSES)

MAX_COUNT = 1000


def _cursor(raw: str | None) -> int:
    if raw is None:
        return 0
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise ValidationFailed(
            "the cursor is not one this API gave",
            [Issue("not a cursor of /openapi/v1/audit", path="cursor", found=raw[:40])],
        )
    return int(raw)


def _time(name: str, ms: int | None) -> datetime | None:
    if ms is None:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        raise ValidationFailed(
            f"{name} is not a time", [Issue("not epoch milliseconds in range", path=name, found=str(ms)[:40])]
        ) from None


@router.get("", summary="Audit entries in the order they were committed: filters are exact; a caller not an admin "
            "reads its own")  # fmt: skip
async def entries(
    caller: Reader,
    session: Session,
    auth: Auth,
    actor: Annotated[
        str | None,
        Query(max_length=500, description="the entries of this actor (default: the caller's own unless an admin)"),
    ] = None,
    urn: Annotated[str | None, Query(max_length=2000)] = None,
    action: Annotated[str | None, Query(max_length=100, description=f"one of {', '.join(ACTIONS)}")] = None,
    since: Annotated[int | None, Query(description="written at or after (epoch milliseconds)")] = None,
    until: Annotated[int | None, Query(description="written before (epoch milliseconds)")] = None,
    cursor: Annotated[str | None, Query(max_length=40, description="`next` of the previous page")] = None,
    count: Annotated[int, Query(ge=1, le=MAX_COUNT)] = 100,
) -> Any:
    if actor != caller.actor and not (await auth.decide(caller, MANAGE_SYSTEM_OPERATIONS)).allowed:
        if actor is not None:
            raise Forbidden(
                f"{caller.actor} may read its own audit entries only; another actor's need the ADMIN permission "
                f"(or {MANAGE_SYSTEM_OPERATIONS} granted by a policy)",
                [Issue("another actor's entries", path="actor", found=actor[:200])],
            )
        actor = caller.actor
    query = EntryQuery(_cursor(cursor), count, actor, urn, action, _time("since", since), _time("until", until))
    found = await AuditLog(session).page(query)
    return json_response({"entries": found.entries, "next": found.next})


@router.get("/verify", dependencies=[ALLOW_SYSTEM_OPERATIONS], summary="Recompute the audit log's hash chain: the first entry "
            "that no longer matches, or that it holds and how many entries were checked")  # fmt: skip
async def verify(session: Session) -> Any:
    return json_response(await AuditLog(session).verify())
