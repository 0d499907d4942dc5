"""Topic creation at start-up (and again by the relay whenever it reconnects to Kafka).

Every metaledger topic is created if missing, with DataHub's configs: one partition and replication factor 1 by
default (DataHub's PARTITIONS / REPLICATION_FACTOR defaults), `max.message.bytes` = `kafka_max_message_bytes` on all,
`retention.ms` 7 days on the versioned MCL topic and 90 days on the timeseries MCL topic. Existing topics are left as
they are (their configs are not altered); one whose partition count is not `kafka_topic_partitions` is logged as a
warning (a topic a client auto-created with the broker's default count, say). Creating is idempotent: a topic created
concurrently by another process ("already exists") is not an error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from app.settings import Settings

log = logging.getLogger("metaledger.kafka.topics")

VERSIONED_RETENTION_MS = 7 * 24 * 3600 * 1000  # 604800000
TIMESERIES_RETENTION_MS = 90 * 24 * 3600 * 1000  # 7776000000, DataHub's MetadataChangeLog_Timeseries_v1
TOPIC_ALREADY_EXISTS = 36  # Kafka protocol error code
ADMIN_TIMEOUT_MS = 10_000


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    configs: dict[str, str]


def topic_specs(settings: Settings, extra: Sequence[str] = ()) -> list[TopicSpec]:
    """Every topic metaledger produces to or consumes from, with the configs it is created with; `extra`: the
    topics of the configured per-aspect events and MAE v4 (app.kafka.per_aspect.DerivedEvents.topics)."""
    max_bytes = str(settings.kafka_max_message_bytes)

    def spec(name: str, retention_ms: int | None = None) -> TopicSpec:
        configs = {"max.message.bytes": max_bytes}
        if retention_ms is not None:
            configs["retention.ms"] = str(retention_ms)
        return TopicSpec(name, configs)

    specs = [
        spec(settings.topic_mcl_versioned, VERSIONED_RETENTION_MS),
        spec(settings.topic_mcl_timeseries, TIMESERIES_RETENTION_MS),
        spec(settings.topic_platform_event),
        spec(settings.topic_mcp),
        spec(settings.topic_fmcp),
        spec(settings.topic_mce),
        spec(settings.topic_fmce),
        *(spec(name) for name in extra),
    ]
    unique: dict[str, TopicSpec] = {}
    for s in specs:
        unique.setdefault(s.name, s)  # one spec per name, the first
    return list(unique.values())


async def create_missing_topics(settings: Settings, extra: Sequence[str] = ()) -> list[str]:
    """Create the missing topics; returns the names created. Raises KafkaError when Kafka is unreachable or refuses."""
    partitions = settings.kafka_topic_partitions
    replication = settings.kafka_topic_replication_factor
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        client_id=f"{settings.kafka_client_id}-admin",
        request_timeout_ms=ADMIN_TIMEOUT_MS,
    )
    await admin.start()
    try:
        existing = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics()}
        specs = topic_specs(settings, extra)
        for spec in specs:
            if spec.name in existing and existing[spec.name] != partitions:
                log.warning(
                    "kafka topic exists with another partition count than the setting; left as it is",
                    extra={"topic": spec.name, "partitions": existing[spec.name], "kafka_topic_partitions": partitions},
                )
        missing = [s for s in specs if s.name not in existing]
        if not missing:
            return []
        response = await admin.create_topics(
            [NewTopic(s.name, partitions, replication, topic_configs=s.configs) for s in missing],
            timeout_ms=ADMIN_TIMEOUT_MS,
        )
        created, failures = [], []
        for error in response.topic_errors:
            name, code = error[0], error[1]
            message = error[2] if len(error) > 2 else None
            if code == 0:
                created.append(name)
            elif code != TOPIC_ALREADY_EXISTS:
                failures.append(f"{name}: error {code} {message or ''}".strip())
        if failures:
            raise KafkaError("could not create topics: " + "; ".join(failures))
        if created:
            log.info("kafka topics created", extra={"topics": created})
        return created
    finally:
        await admin.close()


async def ensure_topics(settings: Settings, extra: Sequence[str] = ()) -> None:
    """Create every metaledger topic that is missing, with its configs (retention, max message size).

    Kafka being unreachable at start-up does not stop the service (writes only need Postgres): it is logged, and the
    relay creates the missing topics itself when it connects. A broker that refuses a topic (bad config) raises."""
    try:
        await create_missing_topics(settings, extra)
    except (KafkaConnectionError, KafkaTimeoutError, OSError) as error:
        log.warning(
            "kafka unreachable: topics not checked; the relay creates them when it connects",
            extra={"bootstrap_servers": settings.kafka_bootstrap_servers, "error": f"{type(error).__name__}: {error}"},
        )
