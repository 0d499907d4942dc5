"""`/runs`: the runs, what each wrote, and rollback.

A run is the `runId` its writes carry in their system metadata (migration 0011 indexes it and keeps `ingestion_run`).

Rollback of run R works aspect by aspect, in (urn, aspect) order, `PAGE` aspects per transaction, each page written
through the ingest gateway as ordinary proposals attributed to the caller, with the system metadata runId
`rollback_run_id(R)` (so the rollback is itself a run, listed and describable):

* an aspect whose latest value R wrote goes back to the value it had before R's first change (its newest history
  row older than that), or is deleted when R created it;
* an entity R created (its key aspect) is removed: soft (`status.removed = true`, its other aspects R created
  deleted) or, with `safe=false`, hard (its key aspect deleted: every aspect, every version);
* an aspect someone else changed since R wrote it (a later run, a user), or in between two of R's writes, is left
  as it is and reported (`unsafeEntities`, `aspectsAffected`), as is an entity R created that holds aspects from
  elsewhere; `safe=false` reverts such aspects too and hard-deletes such entities;
* an aspect R only re-observed (the same value again) is not R's to revert;
* metaledger's own entity (metaledgerSystem: the runtime model set, the change-processor pipeline) is never touched:
  only its own services write it (app.write.rules.SystemEntityThroughItsServices).

Each proposal carries `If-Version-Match` with the version it was decided on: a concurrent write to it fails the
page's transaction, which is decided again from what is stored then. Nothing is kept between pages but counters and
the first rows of the report, so memory does not grow with the run; a rollback interrupted (or refused part way) is
resumed by asking again: what was rolled back is no longer R's, and is skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from app.audit import repository as audit_log
from app.audit.model import RUN_ROLLBACK, Entry
from app.auth.model import Principal
from app.db import SessionOrConnection, session_connection
from app.errors import Backpressure, Issue, PreconditionFailed, ValidationFailed
from app.ingest.gateway import IngestGateway
from app.registry import EntityRegistry
from app.runs.repository import RunRepository
from app.urns import entity_type_of
from app.write.processors import PIPELINE_ENTITY
from app.write.proposal import DEFAULT_RUN_ID, IF_VERSION_MATCH, ChangeType, Draft
from app.write.rules import ABSENT_VERSION

log = logging.getLogger("metaledger.runs")

PAGE = 500  # aspects decided and written per transaction
SUMMARY_ROWS = 100  # aspectRowSummaries in a rollback's answer (DataHub's)
UNSAFE_LISTED = 10_000  # unsafeEntities listed; unsafeEntitiesCount counts them all
PAGE_ATTEMPTS = 5  # a page decided again after a concurrent write (412) or backpressure, at most
STATUS = "status"


def rollback_run_id(run_id: str) -> str:
    return f"__rollback:{run_id}"


def _millis(value: datetime) -> int:
    return int(value.replace(tzinfo=UTC).timestamp() * 1000) if value.tzinfo is None else int(value.timestamp() * 1000)


def _sm(raw: str | None) -> dict[str, Any]:
    return orjson.loads(raw) if raw else {}


def _version(sm: dict[str, Any]) -> str:
    return str(sm.get("version", 1))


def check_run_id(run_id: Any) -> str:
    if not isinstance(run_id, str) or not run_id:
        raise ValidationFailed("`runId` is required", [Issue("missing required string field 'runId'", path="$.runId")])
    if run_id == DEFAULT_RUN_ID:
        raise ValidationFailed(
            f"{DEFAULT_RUN_ID} is the run id of writes made without one; it names no run",
            [Issue("a reserved run id", path="$.runId", found=run_id)],
        )
    return run_id


def row_summary(
    registry: EntityRegistry,
    run_id: str,
    urn: str,
    aspect: str,
    metadata: str,
    sm: dict[str, Any],
    created: datetime,
    *,
    with_aspect: bool = False,
) -> dict[str, Any]:
    """DataHub's AspectRowSummary."""
    summary: dict[str, Any] = {
        "runId": run_id,
        "aspectName": aspect,
        "urn": urn,
        "timestamp": _millis(created),
        "metadata": metadata,
        "version": int(_version(sm)) if _version(sm).isdigit() else 0,
        "keyAspect": _is_key(registry, urn, aspect),
    }
    if "telemetryTraceId" in sm:
        summary["telemetryTraceId"] = sm["telemetryTraceId"]
    if with_aspect and aspect in registry.aspects:
        summary["aspect"] = {registry.aspects[aspect].record_name: orjson.loads(metadata)}
    return summary


def _is_key(registry: EntityRegistry, urn: str, aspect: str) -> bool:
    spec = registry.aspects.get(aspect)
    return spec is not None and spec.is_key


async def list_runs(session: SessionOrConnection, offset: int, limit: int, include_soft: bool) -> list[dict[str, Any]]:
    runs = await RunRepository(session).list_runs(offset, limit, include_soft)
    return [{"runId": r.run_id, "timestamp": _millis(r.first_seen), "rows": r.rows} for r in runs]


async def describe_run(
    session: SessionOrConnection,
    registry: EntityRegistry,
    run_id: str,
    offset: int,
    limit: int,
    *,
    include_soft: bool,
    include_aspect: bool,
) -> list[dict[str, Any]]:
    rows = await RunRepository(session).describe(run_id, offset, limit, include_soft)
    return [
        row_summary(
            registry,
            run_id,
            r["urn"],
            r["aspect"],
            r["metadata"],
            _sm(r["systemmetadata"]),
            r["createdon"],
            with_aspect=include_aspect,
        )
        for r in rows
    ]


@dataclass(slots=True)
class RollbackReport:
    """Counters and the first rows of the answer; urns arrive in order, so distinct ones are counted by change."""

    summaries: list[dict[str, Any]] = field(default_factory=list)
    aspects_reverted: int = 0
    aspects_affected: int = 0
    entities_deleted: int = 0
    entities_affected: int = 0
    unsafe_count: int = 0
    unsafe: list[dict[str, str]] = field(default_factory=list)
    _last_affected: str | None = None
    _last_unsafe: str | None = None

    def affected(self, urn: str) -> None:
        if urn != self._last_affected:
            self._last_affected = urn
            self.entities_affected += 1

    def unsafe_aspect(self, urn: str) -> None:
        self.aspects_affected += 1
        if urn != self._last_unsafe:
            self._last_unsafe = urn
            self.unsafe_count += 1
            if len(self.unsafe) < UNSAFE_LISTED:
                self.unsafe.append({"urn": urn})

    def to_json(self) -> dict[str, Any]:
        return {
            "aspectRowSummaries": self.summaries,
            "entitiesAffected": self.entities_affected,
            "aspectsAffected": self.aspects_affected,
            "entitiesDeleted": self.entities_deleted,
            "aspectsReverted": self.aspects_reverted,
            "unsafeEntitiesCount": self.unsafe_count,
            "unsafeEntities": self.unsafe,
        }


@dataclass(slots=True)
class _Entity:
    """An entity of the page whose key aspect the run created: removed unless something else wrote to it."""

    foreign_aspects: int
    status: dict[str, Any] | None  # its status value, None when it has none
    status_version: str


class Rollback:
    def __init__(
        self,
        session: AsyncSession,
        gateway: IngestGateway,
        caller: Principal,
        run_id: str,
        *,
        dry_run: bool,
        safe: bool,
    ) -> None:
        self.session, self.gateway, self.caller = session, gateway, caller
        self.registry = gateway.registry
        self.repo = RunRepository(session)
        self.run_id, self.dry_run, self.safe = run_id, dry_run, safe
        self.marker = rollback_run_id(run_id)
        self.report = RollbackReport()

    async def run(self) -> dict[str, Any]:
        info = await self.repo.run(self.run_id)
        if info is None or info.first_change is None:  # unknown, or it changed nothing
            return self.report.to_json()
        self.first_change = info.first_change
        after = ("", "")
        while keys := await self.repo.written_after(self.run_id, after, PAGE):
            await self._page(keys)
            after = keys[-1]
        if not self.dry_run:
            await self.repo.mark_rolled_back(self.run_id)
            await audit_log.record(
                await session_connection(self.session),
                Entry(
                    RUN_ROLLBACK,
                    self.caller.actor,
                    run_id=self.run_id,
                    detail={k: v for k, v in self.report.to_json().items() if isinstance(v, int)},
                ),
            )
        log.info(
            "run rolled back" if not self.dry_run else "run rollback planned",
            extra={
                "run_id": self.run_id,
                "by": self.caller.actor,
                **{k: v for k, v in self.report.to_json().items() if isinstance(v, int)},
            },
        )
        return self.report.to_json()

    async def _page(self, keys: list[tuple[str, str]]) -> None:
        """Decide and write one page; decided again from the stored state when a concurrent write to one of its
        aspects failed the transaction (412), or after waiting out backpressure."""
        for attempt in range(1, PAGE_ATTEMPTS + 1):
            report = _copy(self.report)
            drafts = await self._decide(keys, report)
            if self.dry_run or not drafts:
                self.report = report
                return
            try:
                await self.gateway.submit(self.session, drafts, self.caller)
            except PreconditionFailed:
                if attempt == PAGE_ATTEMPTS:
                    raise
                continue
            except Backpressure as error:
                if attempt == PAGE_ATTEMPTS:
                    raise
                await asyncio.sleep(error.retry_after_s)
                continue
            self.report = report
            return

    async def _decide(self, keys: list[tuple[str, str]], report: RollbackReport) -> list[Draft]:
        states = await self.repo.aspect_states(self.run_id, self.marker, self.first_change, keys)
        entities = await self._created_entities(sorted({k[0] for k in keys}))
        drafts = [d for state in states for d in self._decide_aspect(state, entities, report)]
        for index, draft in enumerate(drafts):
            draft.index = index
        return drafts

    async def _created_entities(self, urns: list[str]) -> dict[str, _Entity]:
        """The page's entities whose key aspect the run created, with what else they hold."""
        created: dict[str, _Entity] = {}
        by_urn: dict[str, list[asyncpg.Record]] = {}
        for row in await self.repo.latest_of_entities(urns):
            by_urn.setdefault(row["urn"], []).append(row)
        for urn, rows in by_urn.items():
            key_aspect = self._key_aspect(urn)
            key = next((r for r in rows if r["aspect"] == key_aspect), None)
            if key is None or key["createdon"] < self.first_change or key["run"] != self.run_id:
                continue
            status = next((r for r in rows if r["aspect"] == STATUS), None)
            foreign = sum(
                1
                for r in rows
                if r["aspect"] not in (key_aspect, STATUS)
                and r["run"] != self.marker
                and not (r["run"] == self.run_id and r["createdon"] >= self.first_change)
            )
            created[urn] = _Entity(
                foreign,
                orjson.loads(status["status_metadata"]) if status else None,
                _version(_sm(status["status_sm"])) if status else ABSENT_VERSION,
            )
        return created

    def _key_aspect(self, urn: str) -> str | None:
        try:
            return self.registry.entity(entity_type_of(urn)).key_aspect
        except Exception:  # a row of an entity type the registry no longer has: only its aspects are reverted
            return None

    def _decide_aspect(
        self, s: asyncpg.Record, entities: dict[str, _Entity], report: RollbackReport
    ) -> Iterator[Draft]:
        urn, aspect = s["urn"], s["aspect"]
        if s["cur_sm"] is None:
            return  # gone since (deleted, or rolled back by an earlier pass)
        current_is_runs = s["cur_run"] == self.run_id and s["cur_createdon"] >= self.first_change
        if not current_is_runs and not s["run_wrote"]:
            return  # the run only re-observed this value
        if s["cur_run"] == self.marker:
            return  # rolled back already
        entity_type = entity_type_of(urn)
        if entity_type == PIPELINE_ENTITY:
            return  # metaledger's own configuration: written by its own services only, never a run's to revert
        key_aspect = self._key_aspect(urn)
        entity = entities.get(urn)
        cur_sm = _sm(s["cur_sm"])
        version = _version(cur_sm)
        if entity is not None and (self.safe is False or entity.foreign_aspects == 0):
            # An entity the run created, to be removed: through its key aspect (the other aspects go with it when
            # hard; when soft, its status says removed and the rest the run created is deleted below).
            if aspect == key_aspect:
                if not self.safe:
                    report.affected(urn)
                    report.entities_deleted += 1
                    report.aspects_affected += entity.foreign_aspects
                    self._summarize(report, s, cur_sm)
                    yield self._draft(entity_type, urn, aspect, ChangeType.DELETE, None, version)
                elif not (entity.status or {}).get("removed"):
                    report.affected(urn)
                    report.entities_deleted += 1
                    yield self._draft(
                        entity_type, urn, STATUS, ChangeType.UPSERT, {"removed": True}, entity.status_version
                    )
                return
            if not self.safe or aspect == STATUS:
                return
        elif entity is not None and aspect in (key_aspect, STATUS):
            report.unsafe_aspect(urn)  # created by the run, but holds what others wrote: kept, reported
            return
        interleaved = s["foreign"] or not current_is_runs
        if interleaved and self.safe:
            report.unsafe_aspect(urn)
            return
        if s["prev_metadata"] is not None:
            change = ChangeType.UPSERT
            value = orjson.loads(s["prev_metadata"])
        elif s["oldest"] >= self.first_change and _created_since(cur_sm, self.first_change):
            change, value = ChangeType.DELETE, None
        else:
            report.unsafe_aspect(urn)  # the value before the run is no longer kept (history retention)
            return
        report.affected(urn)
        report.aspects_reverted += 1
        if interleaved:
            report.aspects_affected += 1
        self._summarize(report, s, cur_sm)
        yield self._draft(entity_type, urn, aspect, change, value, version)

    def _summarize(self, report: RollbackReport, s: asyncpg.Record, sm: dict[str, Any]) -> None:
        if len(report.summaries) < SUMMARY_ROWS:
            report.summaries.append(
                row_summary(
                    self.registry, self.run_id, s["urn"], s["aspect"], s["cur_metadata"], sm, s["cur_createdon"]
                )
            )

    def _draft(
        self,
        entity_type: str,
        urn: str,
        aspect: str,
        change: ChangeType,
        value: dict[str, Any] | None,
        version: str,
    ) -> Draft:
        return Draft(
            0,
            entity_type,
            aspect,
            change.value,
            urn=urn,
            value=value,
            system_metadata={"runId": self.marker},
            headers={IF_VERSION_MATCH: version},
        )


def _created_since(sm: dict[str, Any], first_change: datetime) -> bool:
    """Whether the aspect's first version dates from the run (DataHub's `aspectCreated` audit stamp; rows written
    without one count by their oldest row, which the caller checked)."""
    created = sm.get("aspectCreated")
    if not isinstance(created, dict) or not isinstance(created.get("time"), int):
        return True
    return created["time"] >= _millis(first_change)


def _copy(report: RollbackReport) -> RollbackReport:
    """The report as it was before a page, for deciding the page again."""
    return RollbackReport(
        list(report.summaries),
        report.aspects_reverted,
        report.aspects_affected,
        report.entities_deleted,
        report.entities_affected,
        report.unsafe_count,
        list(report.unsafe),
        report._last_affected,
        report._last_unsafe,
    )
