"""Backpressure on writes: refuse early with 429 and `Retry-After` (which DataHub's clients honour) instead of letting
requests queue until they time out.

Two limits, checked by the ingest gateway (`IngestGateway.submit`, which every HTTP write goes through; the Kafka
consumers have their own flow control and are not refused):

- **admission by cost, fair between callers.** A write costs its proposals plus one per `write_cost_bytes` of its
  request body (`WriteAdmission.cost`), not one slot. The writes in flight in a process may cost `write_budget` in
  all and number `max_in_flight_writes`; one caller (`caller_key`: the token's actor, or the client's address
  without auth) may hold at most `write_caller_share` of each, so the rest stays free for everyone else. A write
  costlier than a caller's share is charged the share: it runs, alone for its caller. Waiting writes are granted
  the caller with the least cost in flight first (among equals the one served longest ago, then the oldest write;
  first come, first served within a caller), so a caller with many writes queued takes turns with the others.
  A write waits up to `write_queue_timeout_ms`; one whose caller's own queue would not drain within that time is
  refused at once. A 429's `Retry-After` is when the caller's queue as it is now would have drained (its writes in
  flight, at the pace its writes went so far, and those waiting, which start or give up within that time), at least
  `backpressure_retry_after_s`, at most `MAX_RETRY_AFTER_S`.
- **a duty cycle under contention.** Shares bound what a caller holds, not how busy it keeps the machine: a flood's
  one write per process at a time, back to back, kept both cores busy and a single write beside it took 400 ms at
  p99. So while other callers have written within `ACTIVE_WINDOW_S` (in any process of a `serve --workers N`:
  app.ops.activity), a write that took d seconds *rests* after it ends: its cost stays charged to its caller (not
  to the process's budget) for d × (1 / `write_caller_duty` − 1) more, and the caller's next writes wait for it, or
  are refused with a `Retry-After` that counts it. A caller alone never rests. A single write rests too, but a few ms of one unit of cost never fills a share.
  An HTTP write is admitted before its body is read (`admit_before_body`, app.api.deps), on the cost its
  Content-Length suggests (`estimate`), so a refused write costs its headers only, not the reading, parsing and
  validation of its body; once the body is parsed the gateway corrects the cost to what the write carries (`resize`).
- **the outbox backlog** (`max_outbox_backlog` rows; 0, the default: off): while the change logs not yet published
  (with Kafka) or not yet indexed (without) exceed it, writes get 429. The backlog is the sampler's last figure
  (app.ops.sampler, every `ops_sample_interval_s`), never queried per request.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from app.errors import TooManyRequests
from app.ops.activity import SharedActivity
from app.ops.metrics import WRITE_REJECTIONS
from app.registry.validator import forget_checked_urns
from app.urns import URN_CACHE_ENTRIES, forget_cached_urns

ACTIVE_WINDOW_S = 1.0  # a caller who wrote within this long is active: the others' writes rest (the duty cycle)
MAX_RETRY_AFTER_S = 60  # a client told to come back later than this has likely given up on the write anyway
_EWMA_WEIGHT = 0.2  # of the newest write in a caller's seconds-per-unit estimate
PACED_CALLERS = 1024  # callers whose pace is remembered while they have nothing in flight (the least recent go)
# Bytes per proposal assumed before a body is parsed (a v1 MCP takes from about 150 to many thousands): estimates err
# high more often than low. Either way the gateway corrects the cost once the body is parsed.
ESTIMATED_PROPOSAL_BYTES = 200


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0), or None elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return lambda: trim(0)


# Large writes leave the C heap fragmented with free pages glibc does not give back on its own (RSS stayed ~100 MB
# up after a flood of 1,000-MCP batches); trimming returns them, at a few ms, once the writes are over.
MALLOC_TRIM = _malloc_trim()


def give_memory_back(*, caches: bool = False) -> None:
    """Collect the cyclic garbage a flood leaves (refused writes' exceptions and their frames: app.main raises the
    collector's thresholds, so the oldest generation may wait a long time for its next collection), then trim.
    `caches`: forget the parsed and validated URNs too (after a load that filled the caches with its own)."""
    if caches:
        forget_cached_urns()
        forget_checked_urns()
    gc.collect()
    if MALLOC_TRIM is not None:
        MALLOC_TRIM()


# The client's address, for `caller_key` when authentication is off (every request is then the same principal).
CLIENT_ADDRESS: ContextVar[str | None] = ContextVar("metaledger_client_address", default=None)


@dataclass(slots=True, eq=False)
class Grant:
    """A write admitted: what it holds until `WriteAdmission.release`."""

    caller: str
    cost: int
    started: float


# The admission an HTTP request took before its body was read (`admit_before_body`): the gateway resizes it.
REQUEST_GRANT: ContextVar[Grant | None] = ContextVar("metaledger_request_grant", default=None)


@dataclass(slots=True, eq=False)
class _Waiting:
    cost: int
    arrived: float
    granted: asyncio.Future[Grant]


@dataclass(slots=True, eq=False)
class _Caller:
    in_flight: int = 0  # writes
    cost_in_flight: int = 0
    resting: int = 0  # writes over, still charged to the caller (the duty cycle)
    cost_resting: int = 0
    waiting: deque[_Waiting] = field(default_factory=deque)
    last_granted: float = -math.inf  # loop time: among callers with as much in flight, the one served longest ago goes

    @property
    def cost_waiting(self) -> int:
        return sum(w.cost for w in self.waiting)


class WriteAdmission:
    def __init__(
        self,
        limit: int,
        wait_s: float,
        *,
        budget: int | None = None,
        caller_share: float = 1.0,
        cost_bytes: int = 65_536,
        backlog_limit: int = 0,
        backlog: Callable[[], int | None] | None = None,
        retry_after_s: int = 1,
        duty: float = 1.0,
        shared: SharedActivity | None = None,
    ) -> None:
        self.limit = max(1, limit)  # writes in flight
        self.budget = max(1, budget if budget is not None else self.limit)  # their cost
        self.caller_limit = max(1, math.floor(self.limit * caller_share))
        self.caller_budget = max(1, math.floor(self.budget * caller_share))
        self.cost_bytes = max(1, cost_bytes)
        self.wait_s = max(0.0, wait_s)
        self.backlog_limit = backlog_limit
        self.backlog = backlog
        self.retry_after_s = retry_after_s
        self.rest_factor = 1 / duty - 1  # a write's rest, per second it took, while other callers are active
        self.in_flight = 0
        self.cost_in_flight = 0
        self._callers: dict[str, _Caller] = {}  # callers with writes in flight or waiting
        # caller → how long its writes held their admission, per unit of cost (EWMA), kept while it is idle (a
        # flood's writes often leave it with nothing in flight). Not another caller's: a single write's fixed cost
        # per unit is a batch's many times over.
        self._pace: dict[str, float] = {}
        self._active_at: dict[str, float] = {}  # caller → loop time of its latest grant or release, the latest last
        self._shared = shared  # the same, for the other processes of a `serve --workers N` (app.ops.activity)
        # figures, for /metrics and tests
        self.rejected = 0
        self._since_settled = False  # writes ended or were refused since `settle_memory` last gave memory back
        self._cost_since_settled = 0  # the cost of the writes that ended since then

    def contended(self) -> bool:
        """Whether writes of more than one caller are in flight in this process: a large write's turns of the event
        loop then give the others time (app.turns)."""
        busy = 0
        for state in self._callers.values():
            busy += state.in_flight > 0
            if busy > 1:
                return True
        return False

    @property
    def waiting(self) -> int:
        return sum(len(c.waiting) for c in self._callers.values())

    def cost(self, items: int, body_bytes: int = 0) -> int:
        """What a write of `items` proposals in a request body of `body_bytes` costs."""
        return max(1, items) + body_bytes // self.cost_bytes

    def estimate(self, body_bytes: int) -> int:
        """What a write of a `body_bytes` request body is taken to cost before it is parsed."""
        return self.cost(body_bytes // ESTIMATED_PROPOSAL_BYTES, body_bytes)

    def check_backlog(self) -> None:
        """429 while the sampled outbox backlog is over its limit (a no-op when the limit is 0)."""
        if not self.backlog_limit or self.backlog is None:
            return
        backlog = self.backlog()
        if backlog is not None and backlog > self.backlog_limit:
            self.rejected += 1
            WRITE_REJECTIONS.labels("backlog").inc()
            raise TooManyRequests(
                f"the change-log backlog is {backlog} rows, over its limit of {self.backlog_limit}; retry later",
                retry_after_s=self.retry_after_s,
            )

    @asynccontextmanager
    async def admit(self, caller: str, cost: int) -> AsyncIterator[Grant]:
        """Hold admission for one write (released however the write ends: done, failed or cancelled)."""
        grant = await self.acquire(caller, cost)
        try:
            yield grant
        finally:
            self.release(grant)

    @asynccontextmanager
    async def admit_before_body(self, caller: str, body_bytes: int) -> AsyncIterator[Grant]:
        """Hold admission for an HTTP write whose body (of `body_bytes`, as its Content-Length says) is not read
        yet, at its `estimate`; the gateway's `submit` then `resize`s this grant (REQUEST_GRANT) to the write's cost
        instead of taking another."""
        async with self.admit(caller, self.estimate(body_bytes)) as grant:
            REQUEST_GRANT.set(grant)
            try:
                yield grant
            finally:
                REQUEST_GRANT.set(None)

    async def acquire(self, caller: str, cost: int) -> Grant:
        """Admission for a write of `cost` by `caller`, or TooManyRequests: at once when the caller's own queue
        would not drain within `wait_s`, else after waiting `wait_s` without being granted."""
        loop = asyncio.get_running_loop()
        state = self._callers.setdefault(caller, _Caller())
        cost = min(max(1, cost), self.caller_budget)
        # No waiting write fits (`_dispatch` grants every one that does), so taking what fits jumps no one.
        if not state.waiting and self._fits(state, cost):
            return self._grant(caller, state, cost, loop.time())
        ahead = state.cost_in_flight + state.cost_resting + state.cost_waiting
        # Refused at once only under contention: alone, a caller waits its turn up to `wait_s`, first come first served.
        if self._others_active(state) and self._drain_s(caller, ahead) > self.wait_s:
            self._forget_if_idle(caller, state)
            raise self._refusal(caller, state, cost)
        waiting = _Waiting(cost, loop.time(), loop.create_future())
        state.waiting.append(waiting)
        self._dispatch()
        try:
            async with asyncio.timeout(self.wait_s):
                return await waiting.granted
        except (TimeoutError, asyncio.CancelledError) as error:
            if waiting.granted.done() and not waiting.granted.cancelled():
                self.release(waiting.granted.result())  # granted as the wait ended: hand it on
            else:
                waiting.granted.cancel()
                if waiting in state.waiting:  # else `_dispatch` dropped it already (its wait was over)
                    state.waiting.remove(waiting)
                self._forget_if_idle(caller, state)
                self._dispatch()  # a big write that gave up may have held back smaller ones behind it
            if isinstance(error, asyncio.CancelledError):
                raise
            raise self._refusal(caller, state, cost) from None

    def resize(self, grant: Grant, cost: int) -> None:
        """Charge `grant` `cost` instead of what it was admitted at: at once, waiting for nothing (its write is
        admitted already); a smaller cost frees the rest for the waiting writes."""
        cost = min(max(1, cost), self.caller_budget)
        state = self._callers[grant.caller]
        state.cost_in_flight += cost - grant.cost
        self.cost_in_flight += cost - grant.cost
        shrunk, grant.cost = cost < grant.cost, cost
        if shrunk:
            self._dispatch()

    def release(self, grant: Grant) -> None:
        """Give back what `grant` held, or let it rest first (the duty cycle), learn how long it took, and grant the
        waiting writes that now fit."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        state = self._callers[grant.caller]
        state.in_flight -= 1
        state.cost_in_flight -= grant.cost
        self.in_flight -= 1
        self.cost_in_flight -= grant.cost
        took = now - grant.started
        rest = took * self.rest_factor if self.rest_factor and self._others_recent(grant.caller, now) else 0.0
        if rest > 0:
            state.resting += 1
            state.cost_resting += grant.cost
            loop.call_later(rest, self._end_rest, grant.caller, state, grant.cost)
        # the caller's pace includes its rests: a Retry-After then tells when its writes can go on
        _put_latest(self._pace, grant.caller, _ewma(self._pace.get(grant.caller), (took + rest) / grant.cost))
        self._mark_active(grant.caller, now)
        self._forget_if_idle(grant.caller, state)
        self._dispatch()
        self._since_settled = True
        self._cost_since_settled += grant.cost

    def _end_rest(self, caller: str, state: _Caller, cost: int) -> None:
        state.resting -= 1
        state.cost_resting -= cost
        self._forget_if_idle(caller, state)
        self._dispatch()

    def settle_memory(self) -> bool:
        """Give the heap back (`give_memory_back`) if writes ended or were refused since the last time and none is in
        flight or waiting now: what a flood allocated goes back once it is over. Called every few seconds
        (app.ops); whether it did."""
        if not self._since_settled or self.in_flight or self._callers:
            return False
        # Writes of that many items may have turned the URN caches over with URNs met once (a flood of new
        # entities: up to 16 MB per process held after it); a trickle of writes keeps the caches warm.
        give_memory_back(caches=self._cost_since_settled >= URN_CACHE_ENTRIES)
        self._since_settled = False
        self._cost_since_settled = 0
        return True

    # --- policy ---------------------------------------------------------------------------------------------------

    def _fits(self, state: _Caller, cost: int) -> bool:
        if not (self.in_flight < self.limit and self.cost_in_flight + cost <= self.budget):
            return False
        if state.cost_in_flight + state.cost_resting + cost > self.caller_budget:
            return False  # always: the rest of the budget stays free for a caller who comes next
        # The count share is for contention only: a caller alone (an ingestion job with many threads of small
        # writes) may hold every slot.
        return state.in_flight + state.resting < self.caller_limit or not self._others_active(state)

    def _others_active(self, state: _Caller) -> bool:
        return any((other.in_flight or other.waiting) for other in self._callers.values() if other is not state)

    def _others_recent(self, caller: str, now: float) -> bool:
        """Whether a caller other than `caller` has writes in flight or waiting, or wrote within `ACTIVE_WINDOW_S`."""
        state = self._callers.get(caller)
        if state is not None and self._others_active(state):
            return True
        for other, at in reversed(self._active_at.items()):  # the most recent first: stops at the window's edge
            if at < now - ACTIVE_WINDOW_S:
                break
            if other != caller:
                return True
        return self._shared is not None and self._shared.others_since(caller, time.monotonic() - ACTIVE_WINDOW_S)

    def _mark_active(self, caller: str, now: float) -> None:
        _put_latest(self._active_at, caller, now)
        if self._shared is not None:
            self._shared.mark(caller, time.monotonic())

    def _dispatch(self) -> None:
        """Grant waiting writes while one fits: the caller with the least cost in flight first, then the one served
        longest ago (callers take turns), then the oldest write."""
        now = asyncio.get_running_loop().time()
        for state in self._callers.values():
            # A wait that is over but not yet handled (its task cancelled on the same turn: a timeout, a client
            # gone) is granted nothing: its task cleans up after itself when it runs.
            while state.waiting and state.waiting[0].granted.done():
                state.waiting.popleft()
        while True:
            ready = [
                (state.cost_in_flight, state.last_granted, state.waiting[0].arrived, caller, state)
                for caller, state in self._callers.items()
                if state.waiting and self._fits(state, state.waiting[0].cost)
            ]
            if not ready:
                return
            *_, caller, state = min(ready, key=lambda r: r[:3])
            waiting = state.waiting.popleft()
            waiting.granted.set_result(self._grant(caller, state, waiting.cost, now))

    def _grant(self, caller: str, state: _Caller, cost: int, now: float) -> Grant:
        state.last_granted = now
        self._mark_active(caller, now)
        state.in_flight += 1
        state.cost_in_flight += cost
        self.in_flight += 1
        self.cost_in_flight += cost
        return Grant(caller, cost, now)

    def _forget_if_idle(self, caller: str, state: _Caller) -> None:
        if not (state.in_flight or state.resting or state.waiting) and self._callers.get(caller) is state:
            del self._callers[caller]

    def _drain_s(self, caller: str, cost: int) -> float:
        """How long `cost` of the caller's writes takes, at the pace its writes went so far (none yet: no time)."""
        return cost * self._pace.get(caller, 0.0)

    def _refusal(self, caller: str, state: _Caller, cost: int) -> TooManyRequests:
        """A 429 for a write of `cost`, with the time its caller's queue as it is now would take to drain: its writes
        in flight, and those waiting, which start or give up within `wait_s`. Not the writes refused before: a
        client told to come back competes with the others again then, and counting a turn for every refused write
        would tell a flood's clients ever longer waits than its queue has."""
        self.rejected += 1
        self._since_settled = True
        WRITE_REJECTIONS.labels("in_flight").inc()
        drain_s = self._drain_s(caller, state.cost_in_flight + state.cost_resting) + min(
            self._drain_s(caller, state.cost_waiting), self.wait_s
        )
        retry_after = max(self.retry_after_s, min(MAX_RETRY_AFTER_S, math.ceil(drain_s)))
        return TooManyRequests(
            f"{caller} has writes of cost {state.cost_in_flight} in flight, {state.cost_resting} resting and "
            f"{state.cost_waiting} waiting in this process (its share: {self.caller_budget} of {self.budget}, {self.caller_limit} of {self.limit} "
            f"writes); this one, of cost {cost}, would not start within {self.wait_s * 1000:.0f} ms; retry",
            retry_after_s=retry_after,
        )


def _put_latest(remembered: dict[str, float], caller: str, value: float) -> None:
    """`caller`'s value, put last (the most recent); the least recent caller goes past `PACED_CALLERS`."""
    remembered.pop(caller, None)
    remembered[caller] = value
    if len(remembered) > PACED_CALLERS:
        del remembered[next(iter(remembered))]


def _ewma(previous: float | None, value: float) -> float:
    return value if previous is None else previous + _EWMA_WEIGHT * (value - previous)
