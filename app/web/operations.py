"""The operator's dashboard (admins): `/operations`, the figures `/ready` and `/metrics` hold, drawn and tabled, the
change-processor pipeline, the runtime model set's versions with a diff between two, and the change feed's tail, live
at `/operations/feed` (server-sent events).

Every figure is read in-process from its owner, as `/ready` and `/metrics` read it, never through the service's own
HTTP: the readiness checks and the exposition of app.ops.Operations (which also takes a fresh outbox sample), this
process's write admission (app.ops.backpressure), the pipeline from the write service, the model sets from
app.modelset.store, the feed from app.changelog.feed.

A live feed is a long response, so it is bounded: at most MAX_STREAMS at once per process (past that a 429 with
Retry-After), a heartbeat comment every HEARTBEAT_S (proxies keep an idle stream open), LIFETIME_S at most (the browser
reconnects after `retry:`, its session checked again, and resumes after the `Last-Event-ID` it saw, which is the
feed's offset). It ends within STOP_CHECK_S when the process stops (`FeedStreams.stopping`): uvicorn's graceful stop
waits for every response in flight, so a stream that went on would hold a worker's SIGTERM drain (app.ops.drain) or
Ctrl-C until `shutdown_timeout_s`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

import asyncpg
import orjson
from fastapi import APIRouter, FastAPI, Query, Request
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.api.deps import Engine, Gateway, Ops, Session, SettingsDep
from app.auth.model import Principal
from app.auth.reads import readable_events
from app.changelog import feed
from app.changelog.feed import FeedEvent
from app.db import session_connection
from app.ingest.gateway import IngestGateway
from app.limits import clip
from app.modelset.service import model_diff
from app.modelset.store import StoredModels, model_history, stored_models
from app.ops import Operations
from app.ops.drain import Drain
from app.registry.runtime import RuntimeModelSet
from app.web.paths import entity_url
from app.web.policy import PageAdmin, WebError
from app.web.render import message, page
from app.write.processors import PIPELINE_ASPECT, PIPELINE_URN
from app.write.repository import AspectRepository

log = logging.getLogger("metaledger.web")

TAIL_EVENTS = 25  # the change logs the page itself shows, newest first
FAILING_ROWS_SHOWN = 20  # of search_index_failure, the latest failures first
DIFF_LINES_SHOWN = 200  # of one aspect's or entity's structural diff
# The live feed's bounds (module attributes: the tests shorten them)
MAX_STREAMS = 8  # open at once in a process; an operator's tab holds one
STREAM_REFUSED_RETRY_S = 10
HEARTBEAT_S = 15.0
LIFETIME_S = 120.0
POLL_S = 1.0  # how often a stream reads the feed
STOP_CHECK_S = 0.25  # how soon a stream sees the process stopping
CLOSE_WAIT_S = 2.0  # how long the app's shutdown waits for its streams to end
RETRY_MS = 3000  # the browser's wait before it reconnects
FEED_BATCH = 100
_DATABASE_ERRORS = (SQLAlchemyError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError)


# --- the live feed's streams ----------------------------------------------------------------------------------------


class FeedStreams:
    """The live feeds of one app: how many are open, and whether they must end now."""

    def __init__(self, drain: Drain) -> None:
        self.open = 0
        self.closing = asyncio.Event()  # the app's lifespan is ending
        self._drain = drain
        self._none_open = asyncio.Event()
        self._none_open.set()

    def stopping(self) -> bool:
        """The process is going away: SIGTERM's drain began, uvicorn's graceful stop began (Ctrl-C, or the drain's
        end), or the app's lifespan is ending."""
        return self.closing.is_set() or self._drain.draining or _uvicorn_exiting()

    def take(self) -> bool:
        if self.open >= MAX_STREAMS:
            return False
        self.open += 1
        self._none_open.clear()
        return True

    def give_back(self) -> None:
        self.open -= 1
        if not self.open:
            self._none_open.set()

    async def pause(self, seconds: float) -> None:
        """Up to `seconds`, less once the streams must end."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self.stopping() and (left := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, STOP_CHECK_S)):
                    await self.closing.wait()

    async def close(self) -> None:
        """End every stream, and give them CLOSE_WAIT_S to finish their response (the rest of the shutdown closes
        the database they read)."""
        self.closing.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_S):
                await self._none_open.wait()


def _uvicorn_exiting() -> bool:
    """uvicorn's graceful stop has begun: its server is found as app.ops.drain finds it, as a signal's handler
    (SIGINT stays uvicorn's; SIGTERM may be the drain's, which sets `Drain.draining` first)."""
    import uvicorn

    server = getattr(signal.getsignal(signal.SIGINT), "__self__", None)
    return isinstance(server, uvicorn.Server) and server.should_exit


@contextlib.asynccontextmanager
async def _feed_streams(app: FastAPI) -> AsyncIterator[None]:
    """Within the app's lifespan (FastAPI nests an included router's inside it, ending first)."""
    app.state.feed_streams = streams = FeedStreams(app.state.drain)
    try:
        yield
    finally:
        await streams.close()


router = APIRouter(include_in_schema=False, lifespan=_feed_streams)


class _StreamResponse(StreamingResponse):
    """A live feed's response, which gives its stream's place back however it ends (done, client gone, cancelled)."""

    def __init__(self, streams: FeedStreams, content: AsyncIterator[bytes]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            # not kept by any cache, not buffered by a proxy (nginx holds a response back otherwise)
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        self.streams = streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.streams.give_back()


# --- figures --------------------------------------------------------------------------------------------------------

# The series of the exposition the page shows (the exposition's other lines are not parsed)
_SERIES = (
    "metaledger_write_rejections_total",
    "metaledger_http_requests_total",
    "metaledger_change_processor_calls_total",
    "metaledger_relay_published_total",
    "metaledger_indexer_applied_rows_total",
    "metaledger_indexer_failures_total",
    "metaledger_indexer_retried_rows_total",
    "metaledger_indexer_errors_total",
    "metaledger_db_pool_connections_in_use",
    "metaledger_db_pool_connections_max",
)
Samples = dict[str, list[tuple[dict[str, str], float]]]


def _details(value: Any, prefix: str = "") -> Iterable[tuple[str, str]]:
    """A readiness check's details as (name, text) pairs, nested objects by dotted name."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if key != "ok":
                yield from _details(inner, f"{prefix}{key}.")
    else:
        text = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
        yield prefix.rstrip("."), text


def _samples(exposition: bytes) -> Samples:
    """The series of _SERIES in the exposition `/metrics` serves (with several processes, every process's summed)."""
    lines = [line for line in exposition.decode().splitlines() if line.startswith(_SERIES)]
    found: Samples = defaultdict(list)
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            found[sample.name].append((sample.labels, sample.value))
    return found


def _total(samples: Samples, name: str, **labels: str) -> int:
    return int(
        sum(value for found, value in samples.get(name, ()) if all(found.get(k) == v for k, v in labels.items()))
    )


@dataclass(frozen=True, slots=True)
class Gauge:
    """A figure against its limit, drawn as a bar."""

    label: str
    value: float
    limit: float
    unit: str = ""
    warns: bool = True  # a full bar is a warning (slots, a backlog), not progress (the indexer's position)

    @property
    def percent(self) -> float:
        return round(min(100.0, 100.0 * self.value / self.limit), 1) if self.limit > 0 else 0.0

    @property
    def level(self) -> str:
        if not self.warns:
            return "plain"
        return "high" if self.percent >= 90 else "mid" if self.percent >= 70 else "low"


def _admission(ops: Operations, samples: Samples, max_backlog: int) -> dict[str, Any]:
    admission = ops.admission
    in_use = _total(samples, "metaledger_db_pool_connections_in_use")
    pool_max = _total(samples, "metaledger_db_pool_connections_max")
    rejections = {
        reason: _total(samples, "metaledger_write_rejections_total", reason=reason)
        for reason in ("in_flight", "backlog")
    }
    refused_routes = sorted(
        (
            (labels.get("route", ""), labels.get("method", ""), int(value))
            for labels, value in samples.get("metaledger_http_requests_total", ())
            if labels.get("status") == "429" and value
        ),
        key=lambda row: -row[2],
    )
    return {
        "gauges": [
            Gauge("Writes in flight", admission.in_flight, admission.limit),
            Gauge("Cost in flight", admission.cost_in_flight, admission.budget),
            Gauge("Database connections in use", in_use, pool_max),
        ],
        "waiting": admission.waiting,
        "caller_limit": admission.caller_limit,
        "caller_budget": admission.caller_budget,
        "wait_ms": round(admission.wait_s * 1000),
        "max_backlog": max_backlog,
        "rejected_here": admission.rejected,
        "rejections": rejections,
        "rejections_most": max(rejections.values()) or 1,
        "refused_routes": refused_routes,
    }


async def _failing_rows(session: AsyncSession) -> list[dict[str, Any]]:
    """The latest indexing failures (app.search.failures' table: refused change logs, retried later)."""
    conn = await session_connection(session)
    rows = await conn.fetch(
        """SELECT urn, aspect, version, attempts, reason, first_failed_at, next_retry_at
           FROM search_index_failure ORDER BY last_failed_at DESC LIMIT $1""",
        FAILING_ROWS_SHOWN,
    )
    return [
        {
            **row,
            "url": entity_url(row["urn"]),
            "first_failed": _when(int(row["first_failed_at"].timestamp() * 1000)),
            "next_retry": _when(int(row["next_retry_at"].timestamp() * 1000)),
        }
        for row in rows
    ]


async def _pipeline(gateway: IngestGateway, session: AsyncSession, samples: Samples) -> dict[str, Any]:
    """The pipeline in force, every step in order: the enabled ones as loaded (the write service's), the disabled
    ones from the stored pipeline (a pipeline loads only its enabled steps), with the calls each decided on."""
    pipeline = await gateway.writer.current_processors(session)
    loaded = pipeline.describe()
    row = (await AspectRepository(session).latest([(PIPELINE_URN, PIPELINE_ASPECT)])).get(
        (PIPELINE_URN, PIPELINE_ASPECT)
    )
    steps: list[dict[str, Any]] = []
    if row is not None and row.version == pipeline.version:
        enabled = iter(loaded)
        for stored in row.value.get("steps") or []:
            if stored.get("enabled", True):
                steps.append({**next(enabled), "enabled": True})
            else:
                steps.append({"name": stored["name"], "enabled": False, "required": stored.get("required", False)})
    else:
        steps = [{**step, "enabled": True} for step in loaded]
    outcomes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for labels, value in samples.get("metaledger_change_processor_calls_total", ()):
        outcomes[labels.get("processor", "")][labels.get("outcome", "")] += int(value)
    for step in steps:
        step["outcomes"] = dict(sorted(outcomes.get(step["name"], {}).items()))
    return {
        "version": pipeline.version,
        "source": f"stored pipeline, version {pipeline.version}"
        if pipeline.version
        else "entity_registry.yml's changeProcessors (no pipeline stored yet)",
        "steps": steps,
    }


# --- the model set's diff -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DiffLine:
    where: str  # a path into the value: `schema.fields[stars].type`
    change: str  # added, removed, changed, reordered
    before: str | None = None  # JSON, cut
    after: str | None = None


def _shown(value: Any) -> str:
    return clip(orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode(), 300)


def _named(items: list[Any]) -> dict[str, Any] | None:
    """A list of records keyed by their `name` (an .avsc's fields, an enum's symbols are not), or None."""
    named = {item["name"]: item for item in items if isinstance(item, dict) and isinstance(item.get("name"), str)}
    return named if len(named) == len(items) else None


def structural_diff(before: Any, after: Any, where: str = "") -> list[DiffLine]:
    """What changed from `before` to `after`, path by path: objects by key, lists of named records (a schema's
    fields) by name, lists of plain values as values added and removed; anything else as a whole."""
    lines: list[DiffLine] = []
    _diff(before, after, where, lines)
    return lines


def _diff(before: Any, after: Any, where: str, lines: list[DiffLine]) -> None:
    if before == after:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(before.keys() | after.keys()):
            path = f"{where}.{key}" if where else key
            if key not in after:
                lines.append(DiffLine(path, "removed", before=_shown(before[key])))
            elif key not in before:
                lines.append(DiffLine(path, "added", after=_shown(after[key])))
            else:
                _diff(before[key], after[key], path, lines)
        return
    if isinstance(before, list) and isinstance(after, list):
        old, new = _named(before), _named(after)
        if old is not None and new is not None:
            for name in [*new, *(n for n in old if n not in new)]:
                path = f"{where}[{name}]"
                if name not in new:
                    lines.append(DiffLine(path, "removed", before=_shown(old[name])))
                elif name not in old:
                    lines.append(DiffLine(path, "added", after=_shown(new[name])))
                else:
                    _diff(old[name], new[name], path, lines)
            if [n for n in old if n in new] != [n for n in new if n in old]:
                lines.append(DiffLine(where, "reordered", _shown(list(old)), _shown(list(new))))
            return
        if not any(isinstance(v, dict | list) for v in (*before, *after)):
            removed = [v for v in before if v not in after]
            added = [v for v in after if v not in before]
            lines.extend(DiffLine(where, "removed", before=_shown(v)) for v in removed)
            lines.extend(DiffLine(where, "added", after=_shown(v)) for v in added)
            if not removed and not added:
                lines.append(DiffLine(where, "reordered", _shown(before), _shown(after)))
            return
    lines.append(DiffLine(where or "(the whole value)", "changed", _shown(before), _shown(after)))


@dataclass(frozen=True, slots=True)
class ModelChange:
    name: str
    change: str  # added, removed, changed
    summary: str = ""  # of an added or removed one
    lines: list[DiffLine] = field(default_factory=list)
    more: int = 0  # lines past DIFF_LINES_SHOWN


def _model_changes(before: RuntimeModelSet, after: RuntimeModelSet) -> dict[str, list[ModelChange]]:
    """app.modelset.service's `model_diff` (what an apply changes, by name), with each changed aspect's and entity's
    structural diff."""
    names = model_diff(before, after)

    def aspect(models: RuntimeModelSet, name: str) -> dict[str, Any]:
        spec = models.aspects[name]
        return {"compatibility": spec.compatibility.value, "schema": spec.schema}

    def fields(models: RuntimeModelSet, name: str) -> str:
        found = _named(models.aspects[name].schema.get("fields") or [])
        return "fields: " + (", ".join(found) if found else "none")

    def entity(models: RuntimeModelSet, name: str) -> dict[str, Any]:
        return next(e for e in models.entities if e.name == name).to_stored()

    def members(models: RuntimeModelSet, name: str) -> str:
        value = entity(models, name)
        key = f"key aspect {value['keyAspect']}; " if value["keyAspect"] else ""
        return key + "aspects: " + (", ".join(value["aspects"]) or "none")

    def listed(kind: str, read: Any, summary: Any) -> list[ModelChange]:
        changes = [ModelChange(n, "added", summary(after, n)) for n in names[kind]["added"]]
        changes += [ModelChange(n, "removed", summary(before, n)) for n in names[kind]["removed"]]
        for n in names[kind]["changed"]:
            lines = structural_diff(read(before, n), read(after, n))
            changes.append(
                ModelChange(n, "changed", lines=lines[:DIFF_LINES_SHOWN], more=max(0, len(lines) - DIFF_LINES_SHOWN))
            )
        return sorted(changes, key=lambda c: c.name)

    return {"aspects": listed("aspects", aspect, fields), "entities": listed("entities", entity, members)}


def _version_asked(raw: str | None, name: str) -> int | None:
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        raise WebError(400, f"`{clip(name, 20)}` is a model-set version: a number (0: none stored).")
    return int(raw)


async def _model_sets(
    session: AsyncSession, in_force: int, from_raw: str | None, to_raw: str | None
) -> tuple[dict[str, Any], int]:
    """The versions stored, the one in force, and the diff between two (by default the latest and the one before
    it); the page's status: 404 when a version asked for is not stored."""
    history = [{**h, "when": _when(h["createdOn"])} for h in await model_history(session)]
    stored = [h["version"] for h in history]
    latest = stored[0] if stored else 0
    to_version = _version_asked(to_raw, "to")
    from_version = _version_asked(from_raw, "from")
    to_version = latest if to_version is None else to_version
    if from_version is None:
        from_version = max((v for v in stored if v < to_version), default=0)
    answer: dict[str, Any] = {
        "history": history,
        "in_force": in_force,
        "latest": latest,
        "from": from_version,
        "to": to_version,
        "missing": [v for v in (from_version, to_version) if v and v not in stored],
        "diff": None,
    }
    if answer["missing"]:
        return answer, 404
    if stored:
        before: StoredModels = await stored_models(session, from_version)
        after: StoredModels = await stored_models(session, to_version)
        answer["diff"] = _model_changes(before.models, after.models)
    return answer, 200


# --- the change feed ------------------------------------------------------------------------------------------------


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _change(event: FeedEvent) -> dict[str, Any]:
    """What the tail shows of a change log: its MCL's `created` names who wrote it."""
    mcl = orjson.loads(event.payload)
    created = mcl.get("created") if isinstance(mcl, dict) else None
    actor = created.get("actor") if isinstance(created, dict) else None
    return {
        "offset": event.offset,
        "time": event.created_at_ms,
        "when": _when(event.created_at_ms),
        "iso": datetime.fromtimestamp(event.created_at_ms / 1000, UTC).isoformat(timespec="seconds"),
        "urn": event.urn,
        "url": entity_url(event.urn),
        "aspect": event.aspect,
        "changeType": event.change_type,
        "actor": actor if isinstance(actor, str) else None,
        "version": event.version,
    }


async def _readable(sessionmaker: Any, principal: Principal, events: Sequence[FeedEvent]) -> list[FeedEvent]:
    """The read rule, as the change feed's HTTP API applies it (app.auth.reads)."""
    async with sessionmaker() as session:
        return await readable_events(principal, events, AspectRepository(session))


async def _changes(
    streams: FeedStreams,
    engine: AsyncEngine,
    sessionmaker: Any,
    principal: Principal,
    topics: Sequence[str],
    after: int,
) -> AsyncIterator[bytes]:
    """The change logs after offset `after`, as server-sent events whose id is their offset, until LIFETIME_S is
    over or the process stops; a heartbeat comment when nothing was sent for HEARTBEAT_S."""
    yield f"retry: {RETRY_MS}\n\n".encode()
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + LIFETIME_S
    beat_at = loop.time() + HEARTBEAT_S
    while not streams.stopping() and loop.time() < ends_at:
        try:
            events, after = await feed.read_page(engine, after, FEED_BATCH, topics)
            shown = await _readable(sessionmaker, principal, events)
        except _DATABASE_ERRORS as error:
            log.warning("operations feed: the feed cannot be read", extra={"error": clip(str(error), 300)})
            yield b": the change feed cannot be read now; reconnect later\n\n"
            return
        for event in shown:
            yield b"id: %d\nevent: change\ndata: %s\n\n" % (event.offset, orjson.dumps(_change(event)))
        if shown:
            beat_at = loop.time() + HEARTBEAT_S
        if len(events) == FEED_BATCH:
            continue  # more are there now
        if loop.time() >= beat_at:
            yield b": heartbeat\n\n"
            beat_at = loop.time() + HEARTBEAT_S
        await streams.pause(min(POLL_S, max(0.0, beat_at - loop.time())))
    yield b": this stream ends here; reconnect with Last-Event-ID\n\n"


def _offset(raw: str | None, name: str) -> int | None:
    """A feed offset the client sends back (`after`, `Last-Event-ID`)."""
    if raw is None or raw.strip() == "":
        return None
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise WebError(400, f"{name} is an offset of the change feed (the id of an event it sent).")
    return int(raw)


async def _tail(
    engine: AsyncEngine, session: AsyncSession, principal: Principal, topics: Sequence[str]
) -> tuple[int, list[dict[str, Any]]]:
    """The feed's last offset and the change logs of its last TAIL_EVENTS offsets, newest first."""
    end = await feed.last_offset(engine)
    events, _ = await feed.read_page(engine, max(0, end - TAIL_EVENTS), TAIL_EVENTS, topics)
    shown = await readable_events(principal, events, AspectRepository(session))
    return end, [_change(e) for e in reversed(shown)]


# --- the routes -----------------------------------------------------------------------------------------------------


@router.get("/operations")
async def operations(
    request: Request,
    session: PageAdmin,
    db: Session,
    gateway: Gateway,
    ops: Ops,
    engine: Engine,
    settings: SettingsDep,
    from_version: Annotated[str | None, Query(alias="from")] = None,
    to_version: Annotated[str | None, Query(alias="to")] = None,
) -> Response:
    samples = _samples(await ops.metrics())  # the exposition of /metrics, with a fresh outbox sample
    ready, readiness = await ops.ready()
    models, status = await _model_sets(db, gateway.registry.runtime_version, from_version, to_version)
    feed_end, tail = await _tail(engine, db, session.principal, feed.feed_topics(settings)[0])
    sample = ops.sampler.latest
    gauges = []
    if sample is not None and settings.max_outbox_backlog:
        gauges.append(Gauge("Backlog against its limit", sample.backlog, settings.max_outbox_backlog, " rows"))
    if sample is not None and sample.indexer_position is not None and sample.feed_end:
        gauges.append(Gauge("Indexed of the feed", sample.indexer_position, sample.feed_end, warns=False))
    return page(
        "operations.html",
        session,
        status=status,
        taken_at=_when(int(time.time() * 1000)),
        this_page=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        ready=ready,
        checks=[(name, check["ok"], list(_details(check))) for name, check in readiness["checks"].items()],
        indexing=readiness["checks"]["indexing"],
        admission=_admission(ops, samples, settings.max_outbox_backlog),
        sample=sample,
        outbox_gauges=[g for g in gauges if g.warns],
        indexing_gauges=[g for g in gauges if not g.warns],
        sampler_errors=ops.sampler.errors,
        sampler_error=ops.sampler.last_error,
        kafka=bool(settings.kafka_bootstrap_servers),
        relay_published=_total(samples, "metaledger_relay_published_total"),
        indexer={
            "applied": _total(samples, "metaledger_indexer_applied_rows_total"),
            "failed": _total(samples, "metaledger_indexer_failures_total"),
            "retried": _total(samples, "metaledger_indexer_retried_rows_total"),
            "errors": _total(samples, "metaledger_indexer_errors_total"),
        },
        failing=await _failing_rows(db),
        pipeline=await _pipeline(gateway, db, samples),
        models=models,
        feed_end=feed_end,
        tail=tail,
        feed_config={"url": "/operations/feed", "after": feed_end, "keep": 200},
    )


@router.get("/operations/feed")
async def operations_feed(
    request: Request, session: PageAdmin, engine: Engine, settings: SettingsDep, after: str | None = None
) -> Response:
    """The change feed's change logs after `Last-Event-ID` (a reconnecting browser's), else after `after`, else from
    now on, as server-sent events."""
    streams: FeedStreams = request.app.state.feed_streams
    start = _offset(request.headers.get("last-event-id"), "Last-Event-ID")
    if start is None:
        start = _offset(after, "after")
    if streams.stopping():
        return _refused(session, 503, "Stopping", "This process is stopping: the live feed reconnects elsewhere.")
    if start is None:
        start = await feed.last_offset(engine)
    if not streams.take():
        return _refused(
            session, 429, "Too many live feeds", f"At most {MAX_STREAMS} live change feeds are open in this process."
        )
    return _StreamResponse(
        streams,
        _changes(
            streams,
            engine,
            request.app.state.sessionmaker,
            session.principal,
            feed.feed_topics(settings)[0],
            start,
        ),
    )


def _refused(session: Any, status: int, title: str, text: str) -> Response:
    response = message(session, status, title, f"{text} Retry in {STREAM_REFUSED_RETRY_S} s.")
    response.headers["Retry-After"] = str(STREAM_REFUSED_RETRY_S)
    return response
