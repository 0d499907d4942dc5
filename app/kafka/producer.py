"""Kafka producers: the one every producer is made by (`make_producer`), and the proposal queue of asynchronous
ingestion (`async=true` on the write endpoints).

The ingest gateway validates first (registry, schema, URN, proposal rules), then hands the MCPs (DataHub's JSON
form, app.ingest.mcp.proposal_to_mcp) to `ProposalProducer.send`, which produces them to `MetadataChangeProposal_v1`
keyed by the entity URN (values encoded by the process's `ValueCodec`: Avro `MetadataChangeProposal` framed with
its schema id by default, JSON with `kafka_value_format=json`) and returns once the broker acknowledged every
record (`acks=all`). The MCP consumer (app.kafka.consumers) applies them through the same pipeline.

Delivery is at least once: if the produce fails half-way the client gets a 503 and retries, and the records that
did reach the topic are applied twice (a no-op the second time for UPSERT).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner, murmur2

from app.avro.wire import ValueCodec
from app.errors import Issue, PayloadTooLarge, ServiceUnavailable, ValidationFailed
from app.settings import Settings

log = logging.getLogger("metaledger.kafka.producer")

# How long a request waits for the broker's acknowledgements before answering 503 (the Python client's own
# timeout is 30 s).
SEND_TIMEOUT_S = 15.0
# Room for the record's framing on top of the value and key, when sizing requests.
RECORD_OVERHEAD = 64 * 1024


class KeyPartitioner:
    """aiokafka's default partitioner (the Java client's murmur2 of the key: every Kafka client puts a key on the same
    partition), without its cost where it buys nothing. aiokafka's murmur2 is pure Python, about 20 µs a record, the
    largest single cost of the relay's publishing: a topic of one partition (DataHub's default) needs no hash, and
    otherwise a key's hash is computed once for the change log and every record sharing its key (its derived events)."""

    MAX_CACHED = 10_000

    def __init__(self) -> None:
        self._hashes: dict[bytes, int] = {}

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if len(all_partitions) == 1:
            return all_partitions[0]
        if key is None:
            return DefaultPartitioner()(key, all_partitions, available)
        hashed = self._hashes.get(key)
        if hashed is None:
            if len(self._hashes) >= self.MAX_CACHED:
                self._hashes.clear()
            hashed = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[hashed % len(all_partitions)]


def make_producer(settings: Settings, client_suffix: str) -> AIOKafkaProducer:
    """A producer for JSON records: acks=all, not idempotent (aiokafka's idempotent producer needs InitProducerId
    versions some brokers lack; keys and at-least-once consumers make duplicates harmless)."""
    return AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        client_id=f"{settings.kafka_client_id}-{client_suffix}",
        acks="all",
        enable_idempotence=False,
        max_request_size=settings.kafka_max_message_bytes + RECORD_OVERHEAD,
        linger_ms=2,
        partitioner=KeyPartitioner(),
    )


class ProposalProducer:
    """Produces MCPs to `topic_mcp`. Started with the app when Kafka is configured; if the broker is unreachable at
    start-up the service still starts, and the first `send` connects (answering 503 while the broker is away)."""

    def __init__(self, settings: Settings, codec: ValueCodec | None = None) -> None:
        self.settings = settings
        self.codec = codec or ValueCodec(settings)
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        try:
            await self._ensure_started()
        except ServiceUnavailable as error:
            log.warning("proposal producer not connected; will retry on first use", extra={"error": error.message})

    async def _ensure_started(self) -> AIOKafkaProducer:
        if self._producer is not None:
            return self._producer
        async with self._lock:
            if self._producer is None:
                try:
                    await self.codec.start()  # an external registry: the schemas registered first
                except Exception as error:  # noqa: BLE001 - the registry is unreachable: the client retries
                    raise ServiceUnavailable(
                        f"the schema registry is unreachable ({type(error).__name__}: {error}); retry"
                    ) from error
                producer = make_producer(self.settings, "proposals")
                try:
                    await producer.start()
                except (KafkaError, OSError) as error:
                    await producer.stop()
                    raise ServiceUnavailable(
                        f"the Kafka broker is unreachable ({type(error).__name__}: {error}); retry"
                    ) from error
                self._producer = producer
        return self._producer

    async def stop(self) -> None:
        async with self._lock:
            if self._producer is not None:
                await self._producer.stop()
                self._producer = None

    async def send(self, proposals: list[dict[str, Any]]) -> None:
        """Produce MCPs (DataHub JSON form) to the MCP topic, keyed by entity URN; returns when acknowledged.
        Raises PayloadTooLarge (nothing produced) when a record exceeds `kafka_max_message_bytes`, and
        ServiceUnavailable when the broker does not acknowledge in time."""
        records = []
        limit = self.settings.kafka_max_message_bytes
        for index, mcp in enumerate(proposals):
            try:
                value = self.codec.encode("mcp", mcp)
            except ValueError as error:  # validated already: a proposal the MCP record cannot carry
                raise ValidationFailed(
                    f"proposal {index} cannot be written as a MetadataChangeProposal: {error}",
                    [
                        Issue(
                            f"not encodable as a MetadataChangeProposal: {error}",
                            index,
                            mcp.get("entityUrn"),
                            mcp.get("aspectName"),
                        )
                    ],
                ) from None
            if len(value) > limit:
                raise PayloadTooLarge(
                    f"proposal {index} is {len(value)} bytes on the proposal topic; the limit is {limit}",
                    [
                        Issue(
                            "proposal too large for the proposal topic",
                            index,
                            mcp.get("entityUrn"),
                            mcp.get("aspectName"),
                        )
                    ],
                )
            key = mcp.get("entityUrn")
            records.append((key.encode() if isinstance(key, str) else None, value))
        if not records:
            return
        producer = await self._ensure_started()
        topic = self.settings.topic_mcp
        try:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                futures = [await producer.send(topic, value, key=key) for key, value in records]
                await asyncio.gather(*futures)
        except (KafkaError, TimeoutError) as error:
            log.warning(
                "proposals not acknowledged by the broker",
                extra={"topic": topic, "records": len(records), "error": repr(error)},
            )
            raise ServiceUnavailable(
                f"the proposal topic did not acknowledge the write ({type(error).__name__}); retry, it is idempotent"
            ) from error
