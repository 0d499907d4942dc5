"""The service's background work, started and stopped with the app: Kafka topics, the outbox relay, the
proposal producer (async writes), the ingestion consumers, and (without Kafka) the search indexing worker."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from fastapi import FastAPI

from app.kafka.consumers import MceConsumer, McpConsumer
from app.kafka.proposals import ProposalProducer
from app.kafka.relay import OutboxRelay
from app.kafka.topics import ensure_topics
from app.search.worker import IndexWorker
from app.workers import pause

log = logging.getLogger("metaledger.background")


@dataclass
class Background:
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task] = field(default_factory=list)
    producer: ProposalProducer | None = None

    async def start(self, app: FastAPI) -> None:
        settings = app.state.settings
        kafka = bool(settings.kafka_bootstrap_servers)
        if kafka and settings.create_topics_on_start:
            await ensure_topics(settings)
        if kafka:
            self.producer = ProposalProducer(settings)
            await self.producer.start()
        app.state.proposal_producer = self.producer
        workers = []
        if settings.relay_enabled:
            workers.append(OutboxRelay(settings, app.state.engine))
        if kafka and settings.mcp_consumer_enabled:
            workers.append(McpConsumer(settings, app.state.sessionmaker, app.state.write_service))
        if kafka and settings.mce_consumer_enabled:
            workers.append(MceConsumer(settings, app.state.sessionmaker, app.state.write_service))
        if not kafka and getattr(app.state, "search", None) is not None:
            # The embedded default: this process indexes the outbox. With Kafka, indexing is the Spark job's.
            workers.append(IndexWorker(settings, app.state.engine, app.state.search))
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
        if self.producer is not None:
            await self.producer.stop()
