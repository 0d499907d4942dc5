"""The runs pages: the recent ingestion runs (what `datahub ingest list-runs` shows), the aspects a run wrote, and
its rollback, previewed (a dry run) before it is done. Paths under `/runs` are metaledger's own: DataHub's frontend
has no page for runs.

Each page calls what Rest.li `/runs` calls (app.runs.service: `list_runs`, `describe_run`, `Rollback`), as the
signed-in person: a rollback's writes go through the ingest gateway attributed to the web view, so its policies,
change logs and tracing apply and its change logs name that person. Rolling back needs what the Rest.li action needs,
the admin role; anyone signed in sees the runs and the preview, with the read rule applied to what they show (an
entity the person may not see is left out, as every read path leaves it out)."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote

from fastapi import APIRouter, Request
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import RedirectResponse, Response

from app.api.deps import Registry, Session
from app.api.urn_paths import restore_slashes
from app.auth.model import Permission, Principal
from app.errors import MetaledgerError
from app.ingest.gateway import AttributedGateway, IngestGateway
from app.registry import EntityRegistry
from app.runs.repository import RunRepository
from app.runs.service import (
    SUMMARY_ROWS,
    Rollback,
    RollbackReport,
    check_run_id,
    describe_run,
    list_runs,
    rollback_run_id,
)
from app.web.catalog import ORIGIN, short_name
from app.web.charts import Timed
from app.web.paths import entity_url
from app.web.policy import FormOfSession, PageAdmin, PageReader, WebError
from app.web.render import message
from app.web.render import page as render
from app.web.sessions import WebSession
from app.write.proposal import ChangeType, Draft
from app.write.reader import EntityReader

router = APIRouter(include_in_schema=False)

PAGE_SIZE = 50
MAX_PAGE = 10_000
MAX_RUN_ID = 500  # ingestion_run.run_id is a varchar(500) (migration 0011): a longer one names no run
SHOWN_JSON = 20_000  # characters of an aspect's value shown; the Aspects tab and the APIs have all of it
UNSAFE_SHOWN = 100
_OUTCOME = ("reverted", "deleted", "unsafe")  # the counts a rollback's redirect carries to the run's page


def run_url(run_id: str, suffix: str = "") -> str:
    """A run's page: its id as one path segment (a `/` in it travels as %2F: app.api.urn_paths)."""
    return "/runs/" + quote(run_id, safe="") + suffix


def _run_id(raw: str) -> str:
    """The run id of a path, or a 400 page saying why it names no run."""
    run_id = restore_slashes(raw)
    if len(run_id) > MAX_RUN_ID:
        raise WebError(400, f"A run id has at most {MAX_RUN_ID} characters; this one has {len(run_id)}.")
    if any(ord(c) < 32 or ord(c) == 127 for c in run_id):
        raise WebError(400, "A run id holds no control characters.")
    try:
        return check_run_id(run_id)
    except MetaledgerError as error:
        raise WebError(400, error.message) from None


def _page_number(raw: str) -> int:
    return min(max(int(raw), 1), MAX_PAGE) if raw.isdigit() and len(raw) < 6 else 1


async def _known(db: AsyncSession, run_id: str) -> None:
    if await RunRepository(db).run(run_id) is None:
        raise WebError(404, f"There is no run {run_id!r}: no write carried this run id.")


async def _hidden(db: AsyncSession, registry: EntityRegistry, principal: Principal, urns: set[str]) -> set[str]:
    """The entities among `urns` the person may not see (app.auth.reads; none for an admin)."""
    return await EntityReader(db, registry, principal).unreadable(sorted(urns)) if urns else set()


def _value_json(raw: Any) -> str:
    text = json.dumps(json.loads(raw) if isinstance(raw, str) else raw, indent=2, sort_keys=True)
    return text if len(text) <= SHOWN_JSON else text[:SHOWN_JSON] + "\n…"


def _gateway(request: Request) -> IngestGateway:
    return cast(IngestGateway, AttributedGateway(request.app.state.gateway, ORIGIN))


# --- the list


@dataclass(frozen=True, slots=True)
class RunRow(Timed):
    run_id: str
    url: str
    at: int  # when its first write landed, in ms
    rows: int


@router.get("/runs")
async def runs_page(session: PageReader, db: Session, page: str = "1", rolled_back: str = "") -> Response:
    number = _page_number(page)
    include_rolled_back = rolled_back == "on"
    found = await list_runs(db, (number - 1) * PAGE_SIZE, PAGE_SIZE + 1, include_rolled_back)
    rows = [RunRow(r["runId"], run_url(r["runId"]), r["timestamp"], r["rows"]) for r in found[:PAGE_SIZE]]
    return render(
        "runs.html",
        session,
        runs=rows,
        page_number=number,
        more=len(found) > PAGE_SIZE,
        rolled_back=include_rolled_back,
    )


# --- one run


@dataclass(frozen=True, slots=True)
class AspectRow(Timed):
    urn: str
    name: str
    url: str | None
    aspect: str
    version: int
    at: int
    key_aspect: bool
    json: str


def _outcome_signature(session: WebSession, run_id: str, counts: str) -> str:
    """The outcome a rollback's redirect carries, signed with the session's own secret: a link made elsewhere cannot
    show a rollback that did not happen."""
    mac = hmac.new(session.csrf_token.encode(), f"{run_id}\n{counts}".encode(), hashlib.sha256)
    return mac.hexdigest()[:32]


def _outcome(session: WebSession, run_id: str, done: str) -> dict[str, int] | None:
    counts, _, signature = done.rpartition(".")
    parts = counts.split(".")
    if len(parts) != len(_OUTCOME) or not all(p.isdigit() and len(p) < 12 for p in parts):
        return None
    if not hmac.compare_digest(signature, _outcome_signature(session, run_id, counts)):
        return None
    return dict(zip(_OUTCOME, map(int, parts), strict=True))


@router.get("/runs/{run_id}")
async def run_page(
    run_id: str,
    session: PageReader,
    db: Session,
    registry: Registry,
    page: str = "1",
    superseded: str = "",
    done: str = "",
) -> Response:
    run_id = _run_id(run_id)
    await _known(db, run_id)
    number = _page_number(page)
    include_superseded = superseded == "on"
    found = await describe_run(
        db,
        registry,
        run_id,
        (number - 1) * PAGE_SIZE,
        PAGE_SIZE + 1,
        include_soft=include_superseded,
        include_aspect=False,
    )
    shown = found[:PAGE_SIZE]
    hidden = await _hidden(db, registry, session.principal, {r["urn"] for r in shown})
    rows = [
        AspectRow(
            urn=r["urn"],
            name=short_name(r["urn"]),
            url=entity_url(r["urn"]),
            aspect=r["aspectName"],
            version=r["version"],
            at=r["timestamp"],
            key_aspect=r["keyAspect"],
            json=_value_json(r["metadata"]),
        )
        for r in shown
        if r["urn"] not in hidden
    ]
    rollback = rollback_run_id(run_id)
    rolled_back = await RunRepository(db).run(rollback) is not None
    return render(
        "run.html",
        session,
        run_id=run_id,
        rows=rows,
        page_number=number,
        more=len(found) > PAGE_SIZE,
        superseded=include_superseded,
        run_url=run_url,
        rollback=rollback if rolled_back else None,
        outcome=_outcome(session, run_id, done[:200]) if done else None,
    )


# --- the rollback


@dataclass(frozen=True, slots=True)
class PlannedChange:
    urn: str
    name: str
    url: str | None
    aspect: str
    action: str
    json: str | None  # the value the aspect would go back to


class Preview(Rollback):
    """The service's dry run, keeping how each aspect would change (its report says which aspects, not how): the
    first SUMMARY_ROWS of the proposals a rollback would write, decided exactly as the rollback decides them."""

    def __init__(self, db: AsyncSession, gateway: IngestGateway, caller: Principal, run_id: str, safe: bool) -> None:
        super().__init__(db, gateway, caller, run_id, dry_run=True, safe=safe)
        self.changes: list[Draft] = []
        self.planned = 0

    async def _decide(self, keys: list[tuple[str, str]], report: RollbackReport) -> list[Draft]:
        drafts = await super()._decide(keys, report)
        self.planned += len(drafts)
        self.changes.extend(drafts[: max(SUMMARY_ROWS - len(self.changes), 0)])
        return drafts


def _action(registry: EntityRegistry, draft: Draft) -> str:
    spec = registry.aspects.get(draft.aspect_name)
    if draft.change_type == ChangeType.DELETE.value:
        if spec is not None and spec.is_key:
            return "Delete the entity the run created: every aspect, every version"
        return "Delete: the run created this aspect"
    if draft.aspect_name == "status" and draft.value == {"removed": True}:
        return "Mark the entity removed (soft delete)"
    return "Restore the value it had before the run"


def _safe(raw: str | None) -> bool:
    return raw != "false"  # as Rest.li's `safe`: true unless asked otherwise


@router.get("/runs/{run_id}/rollback")
async def rollback_preview(
    request: Request, run_id: str, session: PageReader, db: Session, registry: Registry, safe: str = "true"
) -> Response:
    run_id = _run_id(run_id)
    await _known(db, run_id)
    preview = Preview(db, _gateway(request), session.principal, run_id, _safe(safe))
    try:
        report = await preview.run()
    except MetaledgerError as error:
        return message(session, error.status_code, "The preview failed", error.message)
    unsafe = [u["urn"] for u in report["unsafeEntities"]]
    hidden = await _hidden(db, registry, session.principal, {d.urn or "" for d in preview.changes} | set(unsafe))
    changes = [
        PlannedChange(
            urn=d.urn or "",
            name=short_name(d.urn or ""),
            url=entity_url(d.urn or ""),
            aspect=d.aspect_name,
            action=_action(registry, d),
            json=_value_json(d.value) if d.value is not None else None,
        )
        for d in preview.changes
        if d.urn not in hidden
    ]
    return render(
        "rollback.html",
        session,
        run_id=run_id,
        run_url=run_url,
        safe=_safe(safe),
        report=report,
        planned=preview.planned,
        changes=changes,
        unsafe=[(short_name(u), entity_url(u), u) for u in unsafe if u not in hidden][:UNSAFE_SHOWN],
        may_roll_back=session.principal.allows(Permission.ADMIN),
    )


@router.post("/runs/{run_id}/rollback")
async def roll_back(request: Request, run_id: str, session: PageAdmin, form: FormOfSession, db: Session) -> Response:
    run_id = _run_id(run_id)
    await _known(db, run_id)
    rollback = Rollback(db, _gateway(request), session.principal, run_id, dry_run=False, safe=_safe(form.get("safe")))
    try:
        report = await rollback.run()
    except MetaledgerError as error:
        return message(session, error.status_code, "Not rolled back", error.message)
    counts = f"{report['aspectsReverted']}.{report['entitiesDeleted']}.{report['unsafeEntitiesCount']}"
    done = f"{counts}.{_outcome_signature(session, run_id, counts)}"
    return RedirectResponse(run_url(run_id, "?done=" + done), status_code=303)


@router.get("/runs/{rest:path}")
async def no_such_runs_page(session: PageReader, rest: str) -> Response:
    """Any other path under /runs (a run id with an unencoded `/`): a page saying so, never the API's JSON 404."""
    return message(
        session, 404, "Not found", "There is no page at this address. A run's page is /runs/<run id, URL-encoded>."
    )
