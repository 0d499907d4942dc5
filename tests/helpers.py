"""Small helpers shared by the test modules (proposal builders, HTTP calls, Kafka and outbox helpers).

Test modules import from here (or from tests/spark/dataset.py for the Spark data set), never from each other.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import orjson

JSON = "application/json"
DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"


class _TraceId(str):
    """Equal to any W3C trace id (32 hex digits): what every write stores as `telemetryTraceId` (app.ingest.trace)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and len(other) == 32 and all(c in "0123456789abcdef" for c in other)

    __hash__ = str.__hash__


ANY_TRACE_ID = _TraceId("<any trace id>")


# --- proposals ---------------------------------------------------------------------------------------------------


def ds(name: str, platform: str = "hive", env: str = "PROD") -> str:
    """A dataset URN."""
    return f"urn:li:dataset:(urn:li:dataPlatform:{platform},{name},{env})"


def dataset(name: str, db: str = "relay") -> str:
    """A hive dataset URN named `<db>.<name>` (the relay and change-feed tests' datasets)."""
    return ds(f"{db}.{name}")


def mcp(
    aspect: str,
    value: Any,
    urn: str = DATASET,
    change_type: str = "UPSERT",
    entity: str = "dataset",
    *,
    encode: bool = False,
    content_type: str | None = JSON,
    sync: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """A MetadataChangeProposal; `value=None` leaves out `aspect` (a DELETE). Extra keyword arguments are MCP fields
    (`systemMetadata=`, `headers=`, ...).

    `encode=True` sends the aspect value as a JSON string (DataHub's wire form: Rest.li, Kafka) instead of an object;
    `content_type=None` leaves out `aspect.contentType`; `sync=True` adds the sync-index header to the MCP's headers.
    """
    proposal = {"entityType": entity, "entityUrn": urn, "changeType": change_type, "aspectName": aspect, **extra}
    if value is not None:
        proposal["aspect"] = {"value": orjson.dumps(value).decode() if encode else value}
        if content_type is not None:
            proposal["aspect"]["contentType"] = content_type
    if sync:
        # case-insensitive, name and value
        proposal["headers"] = {**proposal.get("headers", {}), "x-datahub-sync-index-update": "TRUE"}
    return proposal


def policy_info(**overrides: Any) -> dict[str, Any]:
    """A DataHub access policy's `dataHubPolicyInfo`: METADATA, ACTIVE, granting EDIT_ENTITY_TAGS on every resource to
    no one; override what a test needs (`actors` is merged into the default actors)."""
    info: dict[str, Any] = {
        "displayName": "test policy",
        "description": "",
        "type": "METADATA",
        "state": "ACTIVE",
        "privileges": ["EDIT_ENTITY_TAGS"],
        "actors": {"resourceOwners": False, "allUsers": False, "allGroups": False},
        "editable": True,
    }
    for key, value in overrides.items():
        info[key] = {**info[key], **value} if key == "actors" else value
    return info


def policy_mcp(name: str, **overrides: Any) -> dict[str, Any]:
    """The MCP writing `urn:li:dataHubPolicy:<name>` with `policy_info(displayName=name, **overrides)`."""
    info = policy_info(**{"displayName": name, **overrides})
    return mcp("dataHubPolicyInfo", info, f"urn:li:dataHubPolicy:{name}", entity="dataHubPolicy")


async def propose(
    client, *proposals: dict[str, Any], expect: int = 200, batch_size: int | None = None, **kw: Any
) -> Any:
    """POST the proposals to /openapi/v1/proposals (in requests of `batch_size` if given); asserts the status of each
    request and returns the (last) response body. Extra keyword arguments go to `client.post` (`headers=`, ...)."""
    if batch_size is None:
        batches = [list(proposals)]
    else:
        batches = [list(proposals[start : start + batch_size]) for start in range(0, len(proposals), batch_size)]
    body = None
    for batch in batches:
        response = await client.post("/openapi/v1/proposals", json=batch, **kw)
        assert response.status_code == expect, response.text
        body = response.json()
    return body


RESTLI_HEADERS = {  # what DataHub's Python client sends on every request (Content-Type included, GETs too)
    "Content-Type": "application/json",
    "X-RestLi-Protocol-Version": "2.0.0",
    "X-DataHub-Client-Mode": "SDK",
    "X-DataHub-Py-Cli-Version": "1.7.0.17",
    "User-Agent": "DataHub-Client/1.0 (sdk; datahub/terminal; 1.7.0.17) python-requests/2.34.2",
}


async def restli_propose(client, *mcps: dict[str, Any], async_: str = "false", path: str = "/aspects"):
    """`POST /aspects?action=ingestProposal` (one MCP) or `ingestProposalBatch` (several), as DataHub's Python client
    sends them; returns the response."""
    if len(mcps) == 1:
        body = {"proposal": mcps[0], "async": async_}
        return await client.post(f"{path}?action=ingestProposal", content=orjson.dumps(body), headers=RESTLI_HEADERS)
    body = {"proposals": list(mcps), "async": async_}
    return await client.post(f"{path}?action=ingestProposalBatch", content=orjson.dumps(body), headers=RESTLI_HEADERS)


# --- waiting and reading ----------------------------------------------------------------------------------------


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float = 20.0, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Poll `check` until it returns something truthy; returns that."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what} not met within {timeout}s"
        await asyncio.sleep(interval)


async def stored(db, urn: str, aspect: str) -> dict[str, Any] | None:
    """The latest stored row (version 0) of an aspect: value, systemMetadata and createdBy; None if absent."""
    row = await db.fetchrow(
        "SELECT metadata, systemmetadata, createdby FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = $2 AND version = 0",
        urn,
        aspect,
    )
    if row is None:
        return None
    return {
        "value": orjson.loads(row["metadata"]),
        "systemMetadata": orjson.loads(row["systemmetadata"]),
        "createdBy": row["createdby"],
    }


async def wait_delivered(db: asyncpg.Connection, timeout: float = 20.0) -> int:
    """Wait until every outbox row is sequenced and delivered; returns the row count."""
    deadline = time.monotonic() + timeout
    while True:
        left = await db.fetchval(
            "SELECT count(*) FROM change_log_outbox WHERE delivered_at IS NULL OR feed_offset IS NULL"
        )
        if left == 0:
            return await db.fetchval("SELECT count(*) FROM change_log_outbox")
        assert time.monotonic() < deadline, f"{left} outbox rows still undelivered"
        await asyncio.sleep(0.05)


async def wait_sequenced(db: asyncpg.Connection, timeout: float = 20.0) -> int:
    """Wait until every outbox row has its feed offset (without Kafka nothing is ever delivered); returns the last
    offset given."""
    deadline = time.monotonic() + timeout
    while True:
        left = await db.fetchval("SELECT count(*) FROM change_log_outbox WHERE feed_offset IS NULL")
        if left == 0:
            return await db.fetchval("SELECT last_offset FROM change_log_feed_state")
        assert time.monotonic() < deadline, f"{left} outbox rows still without a feed offset"
        await asyncio.sleep(0.02)


class SequencerPasses:
    """Counts the passes of the sequencers running in this process (each call of app.changelog.outbox.sequence), so
    that a test showing that a row is *not* sequenced waits for passes that saw it, not for a time."""

    def __init__(self, monkeypatch) -> None:
        from app.changelog import outbox

        real = outbox.sequence
        self.done = 0

        async def counted(*args: Any, **kwargs: Any) -> Any:
            result = await real(*args, **kwargs)
            self.done += 1
            return result

        monkeypatch.setattr(outbox, "sequence", counted)

    async def wait(self, passes: int = 3, timeout: float = 20.0) -> None:
        """Wait until `passes` whole passes began after this call (the first to end may have begun before it)."""
        target = self.done + passes + 1
        await eventually(
            lambda: asyncio.sleep(0, self.done >= target),
            timeout,
            0.01,
            what=f"{passes} sequencer passes (passes so far: {self.done})",
        )


# --- Kafka --------------------------------------------------------------------------------------------------------

_CODEC = None


def codec(value_format: str = "avro"):
    """A ValueCodec without a registry (DataHub's fixed ids decode locally), for reading and building topic values."""
    from app.avro.wire import ValueCodec
    from app.settings import Settings

    global _CODEC
    if value_format != "avro":
        return ValueCodec(Settings(kafka_value_format=value_format))
    if _CODEC is None:
        _CODEC = ValueCodec(Settings())
    return _CODEC


def decode_value(raw: bytes) -> dict[str, Any]:
    """A topic value (Confluent-framed Avro with one of DataHub's ids, or JSON) in its JSON form."""
    return codec().decode_known(raw)[0]


def wire_value(role: str, payload: Any, value_format: str = "avro") -> bytes:
    """The bytes metaledger publishes for a JSON form (object or text) on a topic of `role` ("mcl_versioned"...)."""
    return codec(value_format).encode(role, payload)


def published_value(settings, topic: str, payload: Any) -> bytes:
    """What a relay with these settings publishes for an outbox row (its topic and JSON text)."""
    from app.avro.wire import ValueCodec

    value_codec = ValueCodec(settings)
    role = value_codec.role_of(topic)
    if role is None or not value_codec.avro:
        return payload.encode() if isinstance(payload, str) else payload
    return value_codec.encode(role, payload)


def wire_form(role: str, obj: dict[str, Any]) -> dict[str, Any]:
    """The JSON form as it reads back after a trip through Avro: aspect values as JSON text, defaults filled in,
    fields the schema lacks dropped."""
    return decode_value(wire_value(role, obj))


# The topic settings and the stem of each test topic's name.
TOPIC_STEMS = {
    "topic_mcl_versioned": "mclv",
    "topic_mcl_timeseries": "mclt",
    "topic_platform_event": "pe",
    "topic_mcp": "mcp",
    "topic_fmcp": "fmcp",
    "topic_mce": "mce",
    "topic_fmce": "fmce",
}


def unique_topics(*settings: str) -> dict[str, str]:
    """Topic settings (all of them, or those named) with names of their own (Tansu keeps every message of the run:
    unique names keep tests apart)."""
    tag = uuid.uuid4().hex[:10]
    return {name: f"{TOPIC_STEMS[name]}_{tag}" for name in settings or TOPIC_STEMS}


async def create_topics(bootstrap: str, *names: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1) for name in names])
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, records: list[tuple[str | None, Any]]) -> None:
    """Records as (key, value): a value that is bytes is sent as is, anything else as JSON."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(
                topic, value if isinstance(value, bytes) else orjson.dumps(value), key=key.encode() if key else None
            )
    finally:
        await producer.stop()


async def read_topic(bootstrap: str, topic: str, expect: int, timeout: float = 20.0, settle: float = 0.3) -> list[Any]:
    """Every record of a one-partition topic from the start, once at least `expect` are there (then a short wait
    for any extra). No consumer group: assigned, so no join."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(records) < expect and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=200)
            records.extend(batch.get(tp, []))
        batch = await consumer.getmany(tp, timeout_ms=int(settle * 1000))
        records.extend(batch.get(tp, []))
        return records
    finally:
        await consumer.stop()


class TopicReader:
    """Reads topics from the start (no consumer group: Tansu's group joins are slow and 'latest' is unreliable)."""

    def __init__(self, bootstrap: str, *topics: str) -> None:
        from aiokafka import AIOKafkaConsumer

        self.consumer = AIOKafkaConsumer(
            *topics,
            bootstrap_servers=bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=50,
            max_partition_fetch_bytes=8 * 1024 * 1024,
        )
        self.records: list[dict[str, Any]] = []

    async def __aenter__(self) -> TopicReader:
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.consumer.stop()

    async def _poll(self) -> int:
        batches = await self.consumer.getmany(timeout_ms=100)
        count = 0
        for records in batches.values():
            for r in records:
                count += 1
                value, schema_id = codec().decode_known(r.value)
                self.records.append(
                    {
                        "topic": r.topic,
                        "key": r.key.decode(),
                        "raw": r.value,
                        "value": value,
                        "schema_id": schema_id,
                        "partition": r.partition,
                        "offset": r.offset,
                    }
                )
        return count

    async def read_until(self, done, timeout: float = 20.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while not done(self.records):
            assert time.monotonic() < deadline, f"timed out; {len(self.records)} messages read"
            await self._poll()
        return self.records

    async def read_count(self, count: int, timeout: float = 20.0) -> list[dict[str, Any]]:
        return await self.read_until(lambda records: len(records) >= count, timeout)

    async def settle(self, quiet: float = 0.5) -> list[dict[str, Any]]:
        """Read until nothing new arrives for `quiet` seconds (to show that no further message comes)."""
        last_news = time.monotonic()
        while time.monotonic() - last_news < quiet:
            if await self._poll():
                last_news = time.monotonic()
        return self.records


# --- asynchronous ingestion (the MCP / MCE consumers) -------------------------------------------------------------

# Short group sessions keep joins quick on Tansu (a join waits about half the session; a re-join after a member left
# waits for the old member's session to expire first). Heartbeats every 500 ms keep them safe on a busy machine.
SESSION_MS = 3000
HEARTBEAT_MS = 500


def fast_groups(monkeypatch) -> None:
    from app.kafka.consumers.loop import Consumer

    monkeypatch.setattr(Consumer, "session_timeout_ms", SESSION_MS)
    monkeypatch.setattr(Consumer, "heartbeat_interval_ms", HEARTBEAT_MS)


def kafka_overrides(bootstrap: str, topics: dict[str, str]) -> dict[str, Any]:
    """Settings for an app on the test broker with these topics, no relay, and a consumer group of its own."""
    return {
        "kafka_bootstrap_servers": bootstrap,
        "create_topics_on_start": False,
        "relay_enabled": False,
        "mcp_consumer_group": f"group-{topics['topic_mcp']}",
        **topics,
    }


def dead_letter(record) -> tuple[Any, dict[str, Any]]:
    """(the record as received, the first TraceException with `source` and `key`) of a FMCP/FMCE record, Avro
    (the default) or JSON. A record carried raw in an Avro placeholder (`rawRecord`) comes back as received: its
    JSON object, else its text."""
    value = decode_value(record.value)
    (trace,) = orjson.loads(value["error"])
    payload = value.get("metadataChangeProposal", value.get("metadataChangeEvent"))
    if trace.get("rawRecord"):
        payload = raw_record(payload)
    return payload, {**trace, "source": value.get("source") or trace.get("source"), "key": record.key}


def raw_record(placeholder: dict[str, Any]) -> Any:
    """The record an Avro dead letter's placeholder MCP/MCE carries: its JSON object, else its text."""
    if "proposedSnapshot" in placeholder:
        properties = placeholder["systemMetadata"]["properties"]
        text = properties["metaledger.rawRecord"]
        if properties.get("metaledger.rawRecordEncoding") == "base64":
            import base64

            text = base64.b64decode(text).decode("utf-8", errors="backslashreplace")
    else:
        text = placeholder["aspect"]["value"]
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


# --- authentication ---------------------------------------------------------------------------------------------

TEST_ACTOR = "urn:li:corpuser:datahub"  # the actor of the default test token (DataHub's root user)


async def mint_token(app, role: str = "admin", actor: str = TEST_ACTOR, ttl: str | None = None) -> str:
    """A real token issued by the app's auth service (signed, stored, verified like any other)."""
    from app.auth.model import Role

    issued = await app.state.auth.create_token(actor, Role.parse(role), ttl=ttl, created_by="urn:li:corpuser:test")
    return issued[0]


async def bearer(app, role: str = "admin", actor: str = TEST_ACTOR) -> dict[str, str]:
    return {"Authorization": f"Bearer {await mint_token(app, role, actor)}"}


async def run_relay(settings, database_url: str | None = None, *, derived_from=None, schema_registry=None):
    """An outbox relay running in this process on its own small engine; returns it and an awaitable that stops it.
    `derived_from`: a registry, for the per-aspect events it derives (with `schema_registry`'s ids, by default the
    registry metaledger serves)."""
    from app.db import create_engine
    from app.kafka.relay import OutboxRelay

    engine = create_engine(database_url or settings.database_url, 2)
    if derived_from is None:
        relay = OutboxRelay(settings, engine)
    else:
        from app.avro.wire import ValueCodec
        from app.db import create_sessionmaker
        from app.kafka.per_aspect import DerivedEvents
        from app.modelset.watcher import ModelWatcher
        from app.schema_registry.internal import InternalRegistry

        codec = ValueCodec(settings, schema_registry or InternalRegistry(engine, settings))
        models = ModelWatcher(settings, create_sessionmaker(engine), derived_from)  # as the background process's
        relay = OutboxRelay(settings, engine, codec, DerivedEvents(settings, derived_from, codec), models)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))

    async def finish() -> None:
        stop.set()
        await task
        await engine.dispose()

    return relay, finish
