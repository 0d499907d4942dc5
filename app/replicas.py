"""Read replicas (METALEDGER_READ_DATABASE_URLS): the pool of replica engines, their health, the replica each read
gets, and read-your-writes.

* **Health.** One monitor task per process asks every replica each CHECK_INTERVAL_S whether it is still in recovery
  (a promoted replica is no replica: it leaves rotation), how far it has replayed the primary's WAL, and so how far
  behind it is. Lag is measured against the primary's own positions, not `now() - pg_last_xact_replay_timestamp()`
  (which grows on a replica that is fully caught up with an idle primary): zero bytes behind is zero lag, else the
  age of the oldest position the primary had reached (as the monitor saw it) that the replica has not replayed. A
  replica past REPLICA_MAX_LAG_S, one that does not answer, or a promoted one is out of rotation until a check finds
  it healthy again.
* **Choice.** A request's reads (app.api.deps `ReadSession`, the Postgres search backend through `read_engine`) go to
  one healthy replica, round robin, chosen once per request (`RequestRoute`); to the primary when there is none.
* **Read-your-writes.** A request that committed a write (the ingest gateway calls `note_commit`) is answered with the
  primary's WAL position read after its commit, `X-Metaledger-Written-At` (only when replicas are configured: without
  them no write pays the round trip). A read that sends it back, or whose caller (its token, or its address without
  one) wrote within READ_YOUR_WRITES_S in this process, reads from a replica that has replayed that position: one the
  monitor saw there already, or the next in rotation once it gets there (waited for up to READ_YOUR_WRITES_WAIT_S,
  within the request's read budget), else from the primary. The automatic form is per process (under `serve --workers
  N` another process may have taken the write: the header is exact); it keeps at most RECENT_CALLERS callers.
* **Faults.** A read whose replica fails under it (the database unavailable, app.db_faults) is answered again from the
  primary, once, by `ReplicaRoutingMiddleware`: a replica fault is never a 5xx of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict, deque
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import read_deadline
from app.db import create_engine, driver_connection
from app.errors import Issue, ValidationFailed
from app.settings import Settings

log = logging.getLogger("metaledger.replicas")

WRITTEN_AT_HEADER = "X-Metaledger-Written-At"
CHECK_INTERVAL_S = 1.0  # between two health checks of every replica
CHECK_TIMEOUT_S = 2.0  # a replica that has not answered a check by then is unreachable
RECENT_CALLERS = 10_000  # callers whose last write's position a process keeps (the oldest go first)
_POSITIONS_KEPT = 3_600  # the primary's positions the monitor remembers (one a check): the lag's reference
_WAIT_POLL_S = (0.002, 0.05)  # a read-your-writes wait asks again after this long, doubling up to the second
_WRITTEN_AT = WRITTEN_AT_HEADER.lower().encode()

IN_ROTATION, LAGGING, UNREACHABLE, PROMOTED, UNCHECKED = (
    "in rotation",
    "lagging",
    "unreachable",
    "promoted",
    "unchecked",
)
_STATUS = "SELECT pg_is_in_recovery() AS recovering, pg_last_wal_replay_lsn()::text AS replayed"


def parse_lsn(text: str) -> int:
    """A `pg_lsn` (`16/B374D848`) as a number; ValueError when it is none."""
    high, low = text.split("/")
    position = (int(high, 16) << 32) + int(low, 16)
    if not (0 <= int(high, 16) < 1 << 32 and 0 <= int(low, 16) < 1 << 32):
        raise ValueError(text)
    return position


def format_lsn(position: int) -> str:
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


def replica_name(url: str) -> str:
    """host:port/database: how /ready and /metrics name a replica (never its password)."""
    parsed = make_url(url)
    return f"{parsed.host or 'localhost'}:{parsed.port or 5432}/{parsed.database or ''}"


@dataclass(eq=False)
class Replica:
    """One replica's engine and what the monitor last found."""

    name: str
    engine: AsyncEngine
    state: str = UNCHECKED
    replayed: int = 0  # the WAL position it had replayed at least (a replica only moves forward)
    lag_bytes: int | None = None
    lag_s: float | None = None
    error: str | None = None

    @property
    def in_rotation(self) -> bool:
        return self.state == IN_ROTATION

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"state": self.state, "inRotation": self.in_rotation}
        if self.lag_s is not None:
            described.update(
                lagSeconds=round(self.lag_s, 3), lagBytes=self.lag_bytes, replayed=format_lsn(self.replayed)
            )
        if self.error is not None:
            described["error"] = self.error
        return described


class RecentWrites:
    """Caller → the primary's position after its last write, for READ_YOUR_WRITES_S; at most `capacity` callers (a
    flood of new callers evicts the oldest entries, never grows the map)."""

    def __init__(self, keep_s: float, capacity: int = RECENT_CALLERS) -> None:
        self.keep_s = keep_s
        self.capacity = capacity
        self._written: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def note(self, caller: str | None, position: int) -> None:
        if caller is None or self.keep_s <= 0:
            return
        kept = self._written.pop(caller, None)
        self._written[caller] = (max(position, kept[0]) if kept else position, time.monotonic())
        while len(self._written) > self.capacity:
            self._written.popitem(last=False)

    def position(self, caller: str | None) -> int | None:
        kept = self._written.get(caller) if caller is not None else None
        if kept is None:
            return None
        if time.monotonic() - kept[1] > self.keep_s:
            del self._written[caller]  # type: ignore[arg-type]  # found under it: not None
            return None
        return kept[0]


class ReplicaPool:
    """The replicas of METALEDGER_READ_DATABASE_URLS, their monitor, and the choice of one per read."""

    def __init__(self, settings: Settings, primary: AsyncEngine) -> None:
        self.settings = settings
        self.primary = primary
        self.replicas = []
        for url in settings.read_database_urls:
            # a replica that does not answer (a host gone, packets dropped) costs a read CHECK_TIMEOUT_S, then the
            # primary answers it
            engine = create_engine(url, settings.db_pool_size, settings.db_pool_timeout_s, CHECK_TIMEOUT_S)
            self.replicas.append(Replica(replica_name(url), engine))
        self.recent = RecentWrites(settings.read_your_writes_s)
        self.retried_on_primary = 0  # reads whose replica failed under them, answered again from the primary
        self._turn = itertools.count()
        self._positions: deque[tuple[float, int]] = deque(maxlen=_POSITIONS_KEPT)
        self._stop = asyncio.Event()
        self._monitor: asyncio.Task[None] | None = None

    @classmethod
    def from_settings(cls, settings: Settings, primary: AsyncEngine) -> ReplicaPool | None:
        return cls(settings, primary) if settings.read_database_urls else None

    async def start(self) -> None:
        """Check every replica once (the first requests find the healthy ones in rotation), then every second."""
        await self.check()
        self._monitor = asyncio.create_task(self._watch(), name="replica-monitor")

    async def close(self) -> None:
        self._stop.set()
        if self._monitor is not None:
            await asyncio.gather(self._monitor, return_exceptions=True)
        for replica in self.replicas:
            await replica.engine.dispose()

    async def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), CHECK_INTERVAL_S)
                return
            except TimeoutError:
                pass
            try:
                await self.check()
            except Exception:  # noqa: BLE001 - a check that fails is tried again a second later
                log.warning("checking the read replicas failed", exc_info=True)

    async def primary_position(self) -> int:
        """The primary's current WAL position: past every commit made before it was asked."""
        async with self.primary.connect() as connection:
            raw = driver_connection(await connection.get_raw_connection())
            return parse_lsn(await raw.fetchval("SELECT pg_current_wal_lsn()::text"))

    async def check(self) -> None:
        """Every replica's state, now."""
        now = time.monotonic()
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                self._positions.append((now, await self.primary_position()))
        except Exception as error:  # noqa: BLE001 - without the primary, lag is measured against what it last said
            log.warning("the primary's WAL position could not be read: %s", error)
        await asyncio.gather(*(self._check(replica, now) for replica in self.replicas))

    async def _check(self, replica: Replica, now: float) -> None:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                async with replica.engine.connect() as connection:
                    raw = driver_connection(await connection.get_raw_connection())
                    row = await raw.fetchrow(_STATUS)
        except Exception as error:  # noqa: BLE001 - whatever the failure, the replica is out of rotation
            self._set(replica, UNREACHABLE, error=_describe(error))
            return
        if not row["recovering"]:
            self._set(replica, PROMOTED, error="no longer in recovery (promoted): it no longer follows the primary")
            return
        if row["replayed"] is not None:
            replica.replayed = max(replica.replayed, parse_lsn(row["replayed"]))
        replica.lag_bytes, replica.lag_s = self._lag(replica.replayed, now)
        if replica.lag_s > self.settings.replica_max_lag_s:
            self._set(replica, LAGGING, error=f"{replica.lag_s:.1f} s behind the primary (REPLICA_MAX_LAG_S)")
        else:
            self._set(replica, IN_ROTATION)

    def _lag(self, replayed: int, now: float) -> tuple[int, float]:
        """Bytes and seconds behind the primary's last known position: the age of the oldest position the monitor
        saw the primary at that the replica has not replayed (zero when it replayed the last one)."""
        if not self._positions:
            return 0, 0.0
        latest = self._positions[-1][1]
        if replayed >= latest:
            return 0, 0.0
        since = next(seen for seen, position in self._positions if position > replayed)
        return latest - replayed, now - since

    def _set(self, replica: Replica, state: str, error: str | None = None) -> None:
        if state != replica.state:
            log_at = logging.INFO if state == IN_ROTATION else logging.WARNING
            log.log(log_at, "read replica %s: %s", replica.name, state, extra={"error": error})
        replica.state, replica.error = state, error
        if state in (UNREACHABLE, PROMOTED):
            replica.lag_bytes = replica.lag_s = None

    async def choose(self, position: int | None, wait_s: float) -> Replica | None:
        """A replica in rotation, in turn, that has replayed `position`, waiting up to `wait_s` for one to get there;
        None (read from the primary) when none is in rotation or none got there in time."""
        healthy = [replica for replica in self.replicas if replica.in_rotation]
        if not healthy:
            return None
        start = next(self._turn) % len(healthy)
        ordered = healthy[start:] + healthy[:start]
        if position is None:
            return ordered[0]
        for replica in ordered:
            if replica.replayed >= position:
                return replica
        if wait_s <= 0:
            return None
        try:
            async with asyncio.timeout(wait_s):
                return await self._replayed(ordered[0], position)
        except TimeoutError:
            return None
        except Exception as error:  # noqa: BLE001 - a replica that fails here is the monitor's to take out
            log.warning("waiting for read replica %s failed: %s", ordered[0].name, _describe(error))
            return None

    async def _replayed(self, replica: Replica, position: int) -> Replica:
        pause = _WAIT_POLL_S[0]
        async with replica.engine.connect() as connection:
            raw = driver_connection(await connection.get_raw_connection())
            while True:
                replayed = await raw.fetchval("SELECT pg_last_wal_replay_lsn()::text")
                if replayed is not None:
                    replica.replayed = max(replica.replayed, parse_lsn(replayed))
                if replica.replayed >= position:
                    return replica
                await asyncio.sleep(pause)
                pause = min(pause * 2, _WAIT_POLL_S[1])

    def describe(self) -> dict[str, Any]:
        """/ready's `replicas` check: informational (the primary serves the reads of a replica out of rotation)."""
        return {
            "ok": True,
            "inRotation": sum(replica.in_rotation for replica in self.replicas),
            "replicas": {replica.name: replica.describe() for replica in self.replicas},
        }


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return f"no answer within {CHECK_TIMEOUT_S} s"
    return f"{type(error).__name__}: {error}"[:300]


_UNCHOSEN: Any = object()


@dataclass(eq=False)
class RequestRoute:
    """One HTTP request's routing: the position it must read at least, its caller, whether it committed a write, and
    the replica its reads go to (chosen at the first read, once)."""

    pool: ReplicaPool
    written_at: int | None  # the request's X-Metaledger-Written-At
    caller: str | None = None
    wrote: bool = False
    primary_only: bool = False  # the answer again, after its replica failed
    replica_failed: bool = False
    _chosen: Replica | None = _UNCHOSEN
    _choosing: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def replica(self) -> Replica | None:
        if self.primary_only:
            return None
        if self._chosen is _UNCHOSEN:
            async with self._choosing:  # reads of one request in parallel (GraphQL's resolvers) share the choice
                if self._chosen is _UNCHOSEN:
                    self._chosen = await self.pool.choose(self._position(), self._wait_s())
        return self._chosen

    def _position(self) -> int | None:
        recent = self.pool.recent.position(self.caller)
        known = [p for p in (self.written_at, recent) if p is not None]
        return max(known) if known else None

    def _wait_s(self) -> float:
        wait_s = self.pool.settings.read_your_writes_wait_s
        budget = read_deadline.current()
        return min(wait_s, budget.remaining_s()) if budget is not None else wait_s

    @property
    def on_replica(self) -> bool:
        return self._chosen is not _UNCHOSEN and self._chosen is not None

    def again_on_primary(self) -> None:
        self.primary_only, self.replica_failed, self._chosen = True, False, None


_ROUTE: ContextVar[RequestRoute | None] = ContextVar("replica_route", default=None)


def current_route() -> RequestRoute | None:
    """The request's routing; None outside a request or without replicas."""
    return _ROUTE.get()


async def read_engine(primary: AsyncEngine) -> AsyncEngine:
    """The engine a read of the request being served goes to: its replica's, else `primary`."""
    route = _ROUTE.get()
    replica = await route.replica() if route is not None else None
    return replica.engine if replica is not None else primary


def note_caller(caller: str | None) -> None:
    """Who the request's caller is (its token id, or its address): whose recent write its reads must see."""
    route = _ROUTE.get()
    if route is not None:
        route.caller = caller


async def read_after_primary() -> None:
    """The request's reads must see everything the primary has committed so far (after waiting for the embedded
    indexer, app.api.deps `WaitForIndex`, whose writes the replica must then have replayed)."""
    route = _ROUTE.get()
    if route is not None:
        position = await route.pool.primary_position()
        route.written_at = max(position, route.written_at or 0)


def note_commit() -> None:
    """The request committed a write: its answer carries the primary's position after it (X-Metaledger-Written-At)."""
    route = _ROUTE.get()
    if route is not None:
        route.wrote = True


def note_fault() -> None:
    """The database was unavailable under the request (app.main's handler): when its reads were on a replica, the
    answer is made again from the primary."""
    route = _ROUTE.get()
    if route is not None and route.on_replica:
        route.replica_failed = True


def _written_at(scope: Scope) -> int | None:
    raw = next((v for k, v in scope.get("headers", ()) if k == _WRITTEN_AT), None)
    if raw is None:
        return None
    text = raw.decode("latin-1").strip()
    try:
        return parse_lsn(text)
    except ValueError:
        raise ValidationFailed(
            f"{WRITTEN_AT_HEADER} must be a WAL position as a write's answer gives it (e.g. 16/B374D848)",
            [Issue("not a WAL position", path=f"$.headers.{WRITTEN_AT_HEADER}", found=text[:40])],
        ) from None


class ReplicaRoutingMiddleware:
    """With replicas: each HTTP request's `RequestRoute`; a write's answer gets `X-Metaledger-Written-At`; an answer
    whose replica failed under it is dropped before it is sent and made again from the primary (its body, read
    once, replayed)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pool: ReplicaPool | None = getattr(scope["app"].state, "replicas", None) if scope["type"] == "http" else None
        if pool is None:
            await self.app(scope, receive, send)
            return
        try:
            route = RequestRoute(pool, _written_at(scope))
        except ValidationFailed as error:
            refused = Response(orjson.dumps(error.to_json()), error.status_code, media_type="application/json")
            await refused(scope, receive, send)
            return
        received: list[Message] = []
        dropped = False

        async def recorded() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                received.append(message)
            return message

        async def routed(message: Message) -> None:
            nonlocal dropped
            if message["type"] == "http.response.start":
                if route.replica_failed and not route.primary_only:
                    dropped = True
                    return
                if route.wrote:
                    message = await _with_position(pool, route, message)
            elif dropped:
                return
            await send(message)

        token = _ROUTE.set(route)
        try:
            await self.app(scope, recorded, routed)
            if dropped:
                pool.retried_on_primary += 1
                log.warning(
                    "a read's replica failed under it: answered from the primary", extra={"path": scope["path"]}
                )
                route.again_on_primary()
                dropped = False
                replayed = iter(received)

                async def replay() -> Message:
                    return next(replayed, None) or await receive()

                await self.app(scope, replay, routed)
        finally:
            _ROUTE.reset(token)


async def _with_position(pool: ReplicaPool, route: RequestRoute, message: Message) -> Message:
    try:
        position = await pool.primary_position()
    except Exception as error:  # noqa: BLE001 - the write is committed: answered, without a position to wait for
        log.warning("the primary's WAL position after a write could not be read: %s", _describe(error))
        return message
    pool.recent.note(route.caller, position)
    return {**message, "headers": [*message.get("headers", []), (_WRITTEN_AT, format_lsn(position).encode())]}
