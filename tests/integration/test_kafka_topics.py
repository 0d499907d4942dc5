"""Topic creation (app.kafka.topics) against the Kafka-protocol broker: an existing topic whose partition count is not
the setting is left as it is, with a warning naming it (a reader that auto-created the MCL topic with the broker's
default count once hid where change logs landed)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from app.kafka.topics import create_missing_topics
from app.settings import Settings
from tests.helpers import unique_topics


@pytest.fixture
def warnings() -> Iterator[list[logging.LogRecord]]:
    """The module's warnings, caught on its logger (the service's JSON logging does not propagate to the root)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("metaledger.kafka.topics")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


async def test_an_existing_topic_with_another_partition_count_is_kept_and_warned_about(kafka_broker, warnings):
    topics = unique_topics()
    settings = Settings(kafka_bootstrap_servers=kafka_broker.bootstrap_servers, **topics)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topics["topic_mcl_versioned"], 4, 1)])
        created = await create_missing_topics(settings)
        described = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(list(topics.values()))}
    finally:
        await admin.close()
    versioned = topics["topic_mcl_versioned"]
    others = sorted(set(topics.values()) - {versioned})
    assert sorted(created) == others and described[versioned] == 4  # left as it is
    assert [(r.topic, r.partitions, r.kafka_topic_partitions) for r in warnings] == [
        (versioned, 4, settings.kafka_topic_partitions)
    ]
    warnings.clear()
    assert await create_missing_topics(settings.model_copy(update={"kafka_topic_partitions": 4})) == []
    assert sorted(r.topic for r in warnings) == others
