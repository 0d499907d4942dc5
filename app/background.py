"""The service's background work, started and stopped with the app: Kafka topics, the outbox relay, the ingestion
consumers, the change processors' after phase, the removal of deleted structured properties' values, and (without
Kafka) the search indexing worker."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.audit.service import AuditSealer
from app.avro.wire import ValueCodec
from app.ingest.gateway import IngestGateway
from app.kafka.consumers import MceConsumer, McpConsumer
from app.kafka.consumers.per_aspect import PerAspectChangeConsumer
from app.kafka.per_aspect import DerivedEvents
from app.kafka.relay import OutboxRelay
from app.kafka.topics import ensure_topics
from app.modelset.watcher import ModelWatcher
from app.search.service import SearchRuntime
from app.search.worker import IndexWorker
from app.settings import Settings
from app.workers import pause
from app.write.after_processors import AfterProcessorWorker
from app.write.structured_property_deletes import PropertyValueRemoval

log = logging.getLogger("metaledger.background")


@dataclass
class Background:
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task] = field(default_factory=list)
    workers: list = field(default_factory=list)  # the running workers, for their figures (app.ops)

    async def start(
        self,
        settings: Settings,
        engine: AsyncEngine,
        sessionmaker: async_sessionmaker[AsyncSession],
        gateway: IngestGateway,
        search: SearchRuntime,
        codec: ValueCodec | None = None,
    ) -> None:
        kafka = bool(settings.kafka_bootstrap_servers)
        codec = codec or ValueCodec(settings)  # one per process, shared by the relay and the consumers
        derived = DerivedEvents(settings, gateway.registry, codec) if kafka else None
        if derived is not None and settings.create_topics_on_start:  # with Kafka
            await ensure_topics(settings, derived.topics())
        # first: the registry follows the models registered at run time (what the other workers validate and publish)
        models = ModelWatcher(settings, sessionmaker, gateway.registry)
        workers: list = [models]
        if settings.relay_enabled:
            workers.append(OutboxRelay(settings, engine, codec, derived, models))
        if kafka and settings.mcp_consumer_enabled:
            workers.append(McpConsumer(settings, sessionmaker, gateway, codec=codec))
        if derived is not None and settings.events_v5_consumer_enabled and derived.routes:
            workers.append(PerAspectChangeConsumer(settings, sessionmaker, gateway, derived, codec=codec))
        if kafka and settings.mce_consumer_enabled:
            workers.append(MceConsumer(settings, sessionmaker, gateway, codec=codec))
        workers.append(AfterProcessorWorker(settings, engine, sessionmaker, gateway.writer))
        workers.append(PropertyValueRemoval(settings, engine, sessionmaker, gateway.writer))
        # the audit log's entries are chained after they commit, and purged past their retention
        workers.append(AuditSealer(settings, engine))
        if not kafka:
            # The embedded default: this process indexes the outbox. With Kafka, indexing is the Spark job's.
            workers.append(IndexWorker(settings, engine, search, models))
        self.workers = workers
        for worker in workers:
            self.tasks.append(asyncio.create_task(self._supervise(worker), name=type(worker).__name__))

    async def _supervise(self, worker) -> None:
        """Keep a worker running: a crash is logged and the worker restarted after a pause, until shutdown."""
        while not self.stop.is_set():
            try:
                await worker.run(self.stop)
            except Exception:
                log.exception("background worker failed; restarting", extra={"worker": type(worker).__name__})
                await pause(self.stop, 1.0)

    async def close(self) -> None:
        self.stop.set()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
