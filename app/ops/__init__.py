"""The operator's view of a running service: `/metrics` (app.ops.metrics), `/ready` (app.ops.readiness), request
ids and access logs (app.ops.middleware), write backpressure (app.ops.backpressure) and the outbox sampler they read
(app.ops.sampler).

`Operations` is one app's share of it, built by app.main's lifespan: the sampler task, the write admission the ingest
gateway asks for a slot, the readiness checks, and a collector of the figures read from the app's own objects at
scrape time (the DB pool, writes in flight, the outbox backlog, indexing lag).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from app.ops.activity import SharedActivity
from app.ops.backpressure import WriteAdmission
from app.ops.metrics import EVENT_LOOP_LAG, exposition
from app.ops.readiness import Readiness
from app.ops.sampler import OutboxSampler
from app.registry import EntityRegistry
from app.replicas import ReplicaPool
from app.settings import Settings

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the text format generate_latest writes (names escaped to underscores)
LOOP_PROBE_S = 0.02  # how often the event loop's lag is sampled
MEMORY_SETTLE_S = 5.0  # how often memory is given back once writes are over


def in_flight_limit(settings: Settings) -> int:
    """`max_in_flight_writes`, or when it is 0 four times the database pool's size: writes share transactions
    (app.write.combiner), so in-flight writes are not connections."""
    return settings.max_in_flight_writes or 4 * settings.db_pool_size


class Operations:
    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        registry: EntityRegistry | None = None,
        schema_registry: Any = None,
        replicas: ReplicaPool | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.replicas = replicas
        self.sampler = OutboxSampler(settings, engine)
        self.admission = WriteAdmission(
            in_flight_limit(settings),
            settings.write_queue_timeout_ms / 1000,
            budget=settings.write_budget or settings.write_group_transactions * settings.write_group_max_proposals,
            caller_share=settings.write_caller_share,
            cost_bytes=settings.write_cost_bytes,
            backlog_limit=settings.max_outbox_backlog,
            backlog=self.sampler.backlog,
            retry_after_s=settings.backpressure_retry_after_s,
            duty=settings.write_caller_duty,
            shared=SharedActivity.from_environment(),
        )
        self.readiness = Readiness(settings, self.sampler, registry, schema_registry, replicas)
        self.background: Any = None
        self.collectors = CollectorRegistry(auto_describe=False)  # this app's figures (the module's are shared)
        self.collectors.register(_AppCollector(self))
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    async def start(self, background: Any = None) -> None:
        """Read the migrations' head, start sampling; `background` (app.background.Background) gives the indexing
        worker's figures."""
        self.background = self.readiness.background = background
        await self.readiness.start()
        self._tasks = [
            asyncio.create_task(self.sampler.run(self._stop), name="ops-sampler"),
            asyncio.create_task(self._probe_loop(), name="ops-loop-probe"),
        ]

    async def close(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.sampler.close()

    async def _probe_loop(self) -> None:
        """Observe how late each LOOP_PROBE_S timer fires (EVENT_LOOP_LAG), and every MEMORY_SETTLE_S give memory
        back after writes (`WriteAdmission.settle_memory`), until closed."""
        loop = asyncio.get_running_loop()
        settle_at = loop.time() + MEMORY_SETTLE_S
        while not self._stop.is_set():
            due = loop.time() + LOOP_PROBE_S
            await asyncio.sleep(LOOP_PROBE_S)
            EVENT_LOOP_LAG.observe(max(0.0, loop.time() - due))
            if loop.time() >= settle_at:
                settle_at = loop.time() + MEMORY_SETTLE_S
                self.admission.settle_memory()

    async def metrics(self) -> bytes:
        """The exposition: the process's series, then this app's (with a fresh outbox sample)."""
        await self.sampler.refresh()
        return exposition() + generate_latest(self.collectors)

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        return await self.readiness.check()


class _AppCollector(Collector):
    def __init__(self, ops: Operations) -> None:
        self.ops = ops

    def collect(self) -> Iterator[Any]:
        ops = self.ops
        pool = ops.engine.pool
        assert isinstance(pool, QueuePool)  # app.db.create_engine's (no overflow: its size is its most)
        yield GaugeMetricFamily(
            "metaledger_db_pool_connections_in_use",
            "Pooled database connections checked out now",
            value=pool.checkedout(),
        )
        yield GaugeMetricFamily(
            "metaledger_db_pool_connections_max",
            "The most connections the pool opens",
            value=pool.size(),
        )
        if ops.replicas is not None:
            yield from _replica_figures(ops.replicas)
        admission = ops.admission
        yield GaugeMetricFamily(
            "metaledger_writes_in_flight", "Write transactions holding a slot now", value=admission.in_flight
        )
        yield GaugeMetricFamily("metaledger_writes_waiting", "Writes waiting for a slot now", value=admission.waiting)
        yield GaugeMetricFamily(
            "metaledger_writes_in_flight_limit", "Write slots of this process", value=admission.limit
        )
        sample = ops.sampler.latest
        yield CounterMetricFamily(
            "metaledger_outbox_sample_errors",
            "Outbox samples that failed (the database could not answer)",
            value=ops.sampler.errors,
        )
        if sample is not None:
            yield GaugeMetricFamily(
                "metaledger_outbox_sample_age_seconds", "Age of the outbox figures below", value=sample.age_s
            )
            yield GaugeMetricFamily(
                "metaledger_outbox_backlog_rows",
                "Change logs not yet consumed: unsequenced + unpublished (Kafka) or unindexed (embedded)",
                value=sample.backlog,
            )
            yield GaugeMetricFamily(
                "metaledger_outbox_oldest_age_seconds",
                "Age of the oldest change log of the backlog",
                value=sample.oldest_age_s,
            )
            yield GaugeMetricFamily(
                "metaledger_outbox_unsequenced_rows",
                "Committed change logs without a feed offset yet",
                value=sample.unsequenced,
            )
            yield GaugeMetricFamily(
                "metaledger_change_feed_offset", "The last feed offset given (commit order)", value=sample.feed_end
            )
            if sample.relay_lag is not None:
                yield GaugeMetricFamily(
                    "metaledger_relay_lag_rows",
                    "Sequenced change logs not yet published to Kafka",
                    value=sample.relay_lag,
                )
                yield GaugeMetricFamily(
                    "metaledger_relay_lag_seconds",
                    "Age of the oldest change log not yet published",
                    value=sample.relay_lag_s or 0.0,
                )
            if sample.indexer_lag is not None:
                yield GaugeMetricFamily(
                    "metaledger_indexer_lag_rows",
                    "Change logs past the embedded indexer's cursor",
                    value=sample.indexer_lag,
                )
                yield GaugeMetricFamily(
                    "metaledger_indexer_lag_seconds",
                    "Age of the oldest change log not yet indexed",
                    value=sample.indexer_lag_s or 0.0,
                )
            yield GaugeMetricFamily(
                "metaledger_indexer_failing_rows",
                "Change logs the search backend refused, recorded in search_index_failure (retried later)",
                value=sample.failing_rows,
            )
            yield GaugeMetricFamily(
                "metaledger_indexer_failing_oldest_seconds",
                "Since the oldest change log in search_index_failure first failed (0: none)",
                value=sample.failing_age_s or 0.0,
            )


def _replica_figures(pool: ReplicaPool) -> Iterator[Any]:
    """Each read replica's state as the monitor last found it, labelled host:port/database (app.replicas)."""
    rotation = GaugeMetricFamily(
        "metaledger_replica_in_rotation", "1 when the read replica serves reads, 0 when it is out", labels=["replica"]
    )
    lag_s = GaugeMetricFamily(
        "metaledger_replica_lag_seconds",
        "How long the read replica has been behind the primary's WAL position (0: caught up)",
        labels=["replica"],
    )
    lag_bytes = GaugeMetricFamily(
        "metaledger_replica_lag_bytes", "WAL bytes the read replica has not replayed yet", labels=["replica"]
    )
    for replica in pool.replicas:
        rotation.add_metric([replica.name], float(replica.in_rotation))
        if replica.lag_s is not None:
            lag_s.add_metric([replica.name], replica.lag_s)
            lag_bytes.add_metric([replica.name], float(replica.lag_bytes or 0))
    yield from (rotation, lag_s, lag_bytes)
    yield CounterMetricFamily(
        "metaledger_replica_reads_retried_on_primary",
        "Reads whose read replica failed under them, answered again from the primary",
        value=pool.retried_on_primary,
    )
