"""Backpressure on writes: refuse early with 429 and `Retry-After` (which DataHub's clients honour) instead of letting
requests queue until they time out.

Two limits, checked by the ingest gateway (`IngestGateway.submit`, which every HTTP write goes through; the Kafka
consumers have their own flow control and are not refused):

- **writes in flight** per process (`max_in_flight_writes`; 0: the database pool's size, `db_pool_size`): a write
  transaction needs a pooled connection, so at most that many run at once. A write waits up to
  `write_queue_timeout_ms` for a slot (first come, first served), then gets 429.
- **the outbox backlog** (`max_outbox_backlog` rows; 0, the default: off): while the change logs not yet published
  (with Kafka) or not yet indexed (without) exceed it, writes get 429. The backlog is the sampler's last figure
  (app.ops.sampler, every `ops_sample_interval_s`), never queried per request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from app.errors import TooManyRequests
from app.ops.metrics import WRITE_REJECTIONS


class WriteAdmission:
    def __init__(
        self, limit: int, wait_s: float, *, backlog_limit: int = 0, backlog: Callable[[], int | None] | None = None,
        retry_after_s: int = 1,
    ) -> None:
        self.limit = max(1, limit)
        self.wait_s = max(0.0, wait_s)
        self.backlog_limit = backlog_limit
        self.backlog = backlog
        self.retry_after_s = retry_after_s
        self._free = self.limit
        self._waiters: deque[asyncio.Future[None]] = deque()
        # figures, for /metrics and tests
        self.rejected = 0

    @property
    def in_flight(self) -> int:
        return self.limit - self._free

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

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

    async def acquire(self) -> None:
        """A write slot, or TooManyRequests after waiting `wait_s` for one."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.wait_s):
                await waiter
        except (TimeoutError, asyncio.CancelledError) as error:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over as the wait ended: hand it on
            else:
                waiter.cancel()
            try:
                self._waiters.remove(waiter)
            except ValueError:
                pass
            if isinstance(error, asyncio.CancelledError):
                raise
            self.rejected += 1
            WRITE_REJECTIONS.labels("in_flight").inc()
            raise TooManyRequests(
                f"{self.limit} writes are in flight in this process and none finished within "
                f"{self.wait_s * 1000:.0f} ms; retry",
                retry_after_s=self.retry_after_s,
            ) from None

    def release(self) -> None:
        """Give the slot to the oldest waiter, or back to the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    async def __aenter__(self) -> WriteAdmission:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()
