"""Dead letters: the records that failed, produced to the failure topic with why, and logged.

A dead letter is keyed by the record's URN (else by the record's own key). With `kafka_value_format=avro` (the
default) it is DataHub's `FailedMetadataChangeProposal` (`FailedMetadataChangeEvent` for MCEs), Confluent-framed:

    {"auditHeader": null,
     "metadataChangeProposal": <the MCP as received, as an Avro MetadataChangeProposal>,
     "error": "<JSON array of TraceException: [{message, exceptionClass, stackTrace, cause, status, body, source}]>"}

`source` (`{"topic", "partition", "offset", "timestamp"}`) locates the original record. A record that cannot be
written as an MCP at all (not JSON, not Avro, not an MCP) is carried as a placeholder MCP: entityType, entityUrn,
changeType and aspectName as far as they could be read (`"unknown"` otherwise, UPSERT), and the record's bytes as
received as the aspect value with contentType `application/octet-stream`; its TraceException says
`"rawRecord": true`. An MCE that cannot be written as one is carried as an empty snapshot of its entity with the
record's bytes in `systemMetadata.properties["metaledger.rawRecord"]` (UTF-8 text, or base64 with
`"metaledger.rawRecordEncoding": "base64"`).

With `kafka_value_format=json`, today's JSON:

    {"metadataChangeProposal": <the MCP as received: an object, or the raw text when it was not JSON>,
     "error": "<JSON array of TraceException: [{message, exceptionClass, stackTrace, cause, status, body}]>",
     "source": {"topic", "partition", "offset", "timestamp"}}

`body` is metaledger's error body (`{"error", "message", "issues": [...]}`), `status` its HTTP status. MCE dead
letters carry `metadataChangeEvent` instead of `metadataChangeProposal`. A dead letter too large for the failure
topic keeps the head of the record (the text in JSON, the first bytes in a placeholder in Avro) and says
`"payloadTruncated": true` (in the TraceException in Avro); `source` locates the original.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import traceback
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from app.avro import schemas
from app.avro.wire import ValueCodec
from app.errors import MetaledgerError
from app.kafka.consumers.records import RecordFormat, Unit
from app.settings import Settings
from app.write.proposal import DEFAULT_RUN_ID

log = logging.getLogger("metaledger.kafka.consumers")


def class_name(error: BaseException) -> str:
    cls = type(error)
    return f"{cls.__module__}.{cls.__qualname__}"


def trace_exception(error: BaseException, depth: int = 0) -> dict[str, Any]:
    """DataHub's TraceException `{message, exceptionClass, stackTrace, cause}`, plus metaledger's status and error
    body. Client errors carry no stack trace (they are not bugs); unexpected ones do."""
    if isinstance(error, MetaledgerError):
        return {
            "message": error.message,
            "exceptionClass": class_name(error),
            "stackTrace": [],
            "cause": None,
            "status": error.status_code,
            "body": error.to_json(),
        }
    cause = error.__cause__ or error.__context__
    return {
        "message": str(error) or type(error).__name__,
        "exceptionClass": class_name(error),
        "stackTrace": [line.rstrip("\n") for line in traceback.format_tb(error.__traceback__)][-20:],
        "cause": trace_exception(cause, depth + 1) if cause is not None and depth < 3 else None,
        "status": 500,
        "body": {"error": "Internal Server Error", "message": str(error) or type(error).__name__, "issues": []},
    }


class DeadLetterWriter:
    """Produces a batch's dead letters to the format's failure topic and waits for their acknowledgement."""

    def __init__(self, settings: Settings, record_format: RecordFormat, codec: ValueCodec | None = None) -> None:
        self.format = record_format
        self.topic = record_format.dead_letter_topic(settings)
        self.limit = settings.kafka_max_message_bytes
        self.codec = codec or ValueCodec(settings)
        self.mce = record_format.payload_field == "metadataChangeEvent"
        self.role = "fmce" if self.mce else "fmcp"

    def record(self, unit: Unit) -> tuple[bytes | None, bytes]:
        """(key, value) of the unit's dead letter."""
        assert unit.error is not None
        key = unit.urn.encode() if unit.urn else unit.key
        if self.codec.avro:
            return key, self._avro(unit)
        value = {
            self.format.payload_field: unit.payload,
            "error": orjson.dumps([trace_exception(unit.error)]).decode(),
            "source": {
                "topic": unit.topic,
                "partition": unit.partition,
                "offset": unit.offset,
                "timestamp": unit.timestamp,
            },
        }
        encoded = orjson.dumps(value)
        if len(encoded) > self.limit:
            # Too large for the failure topic (the record itself was at the limit): keep its head; `source`
            # locates the original on the input topic.
            head = orjson.dumps(unit.payload).decode(errors="replace")[: min(self.limit // 2, 1024 * 1024)]
            value[self.format.payload_field] = head
            value["payloadTruncated"] = True
            encoded = orjson.dumps(value)
        return key, encoded

    def _avro(self, unit: Unit) -> bytes:
        """The FMCP / FMCE record: the record as received when it is one, else a placeholder carrying its bytes."""
        assert unit.error is not None
        trace = trace_exception(unit.error)
        trace["source"] = {
            "topic": unit.topic,
            "partition": unit.partition,
            "offset": unit.offset,
            "timestamp": unit.timestamp,
        }
        field = self.format.payload_field
        if isinstance(unit.payload, dict):
            try:
                encoded = self.codec.encode(self.role, {field: unit.payload, "error": orjson.dumps([trace]).decode()})
                if len(encoded) <= self.limit:
                    return encoded
            except ValueError:  # not an MCP/MCE the Avro record can carry: the placeholder below
                pass
        raw = unit.raw if unit.raw is not None else b""
        trace["rawRecord"] = True
        head = min(self.limit // 2, 1024 * 1024)
        if len(raw) > head:
            raw = raw[:head]
            trace["payloadTruncated"] = True
        placeholder = self._placeholder_mce(unit, raw) if self.mce else self._placeholder_mcp(unit, raw)
        return self.codec.encode(self.role, {field: placeholder, "error": orjson.dumps([trace]).decode()})

    @staticmethod
    def _placeholder_mcp(unit: Unit, raw: bytes) -> dict[str, Any]:
        payload = unit.payload if isinstance(unit.payload, dict) else {}
        entity_type = payload.get("entityType")
        change_type = payload.get("changeType")
        mcp: dict[str, Any] = {
            "entityType": entity_type if isinstance(entity_type, str) else "unknown",
            "changeType": change_type if change_type in _change_types() else "UPSERT",
            "aspectName": unit.aspect or "unknown",
            "aspect": {"value": raw, "contentType": "application/octet-stream"},
        }
        if unit.urn:
            mcp["entityUrn"] = unit.urn
        return mcp

    @staticmethod
    def _placeholder_mce(unit: Unit, raw: bytes) -> dict[str, Any]:
        try:
            text, encoding = raw.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(raw).decode(), "base64"
        snapshot = _snapshot_for(unit.payload, unit.urn)
        return {
            "proposedSnapshot": {snapshot: {"urn": unit.urn or "", "aspects": []}},
            "systemMetadata": {"properties": {"metaledger.rawRecord": text, "metaledger.rawRecordEncoding": encoding}},
        }

    async def send(self, producer: AIOKafkaProducer, dead: list[Unit], wait: Callable[[], Awaitable[bool]]) -> bool:
        """Produce the dead letters and wait for their acknowledgement; while the broker does not acknowledge them,
        `wait()` (it backs off, and answers False when the consumer is stopping) and try the rest again.
        False if stopped before they were all acknowledged (then nothing may be committed)."""
        while True:
            try:
                await self.codec.start()  # an external registry: the failure topics' schemas registered
                break
            except Exception as error:  # noqa: BLE001 - the registry is unreachable: wait, like for the broker
                log.warning(
                    "dead letters wait for the schema registry", extra={"topic": self.topic, "error": repr(error)}
                )
                if not await wait():
                    return False
        records = [(*self.record(unit), unit) for unit in dead]
        pending = list(records)
        while pending:
            try:
                futures = [await producer.send(self.topic_of(unit), value, key=key) for key, value, unit in pending]
                outcomes = await asyncio.gather(*futures, return_exceptions=True)
                failed = [
                    (record, outcome)
                    for record, outcome in zip(pending, outcomes)
                    if isinstance(outcome, BaseException)
                ]
                for _, outcome in failed:
                    if not isinstance(outcome, KafkaError):
                        raise outcome
                pending = [record for record, _ in failed]
                if failed:
                    raise failed[0][1]
            except KafkaError as error:
                log.warning(
                    "dead letters not acknowledged; retrying",
                    extra={"topic": self.topic, "pending": len(pending), "error": repr(error)},
                )
                if not await wait():
                    return False
        for _, _, unit in records:
            self._log(unit)
        return True

    def topic_of(self, unit: Unit) -> str:
        """Where the unit's dead letter goes (one topic per format; the per-aspect events have one per pair)."""
        return self.topic

    def _log(self, unit: Unit) -> None:
        assert unit.error is not None
        log.warning(
            f"{self.format.kind} dead-lettered",
            extra={
                "urn": unit.urn,
                "aspect": unit.aspect,
                "run_id": unit.run_id or DEFAULT_RUN_ID,
                "topic": unit.topic,
                "partition": unit.partition,
                "offset": unit.offset,
                "dead_letter_topic": self.topic_of(unit),
                "error_class": class_name(unit.error),
                "reason": unit.error.message if isinstance(unit.error, MetaledgerError) else str(unit.error),
            },
        )


@cache
def _change_types() -> frozenset[str]:
    mcp = schemas.schema(schemas.MCP)
    change_type = next(f["type"] for f in mcp["fields"] if f["name"] == "changeType")
    return frozenset(change_type["symbols"])


@cache
def _snapshots() -> tuple[str, ...]:
    """The Avro full names of the MCE's snapshot records, in union order."""
    mce = schemas.schema(schemas.MCE)
    members = next(f["type"] for f in mce["fields"] if f["name"] == "proposedSnapshot")
    return tuple(schemas.full_name(m["name"], m.get("namespace")) if isinstance(m, dict) else m for m in members)


def _snapshot_for(payload: Any, urn: str | None) -> str:
    """The snapshot record of a placeholder MCE: the one the record named, else its URN's entity's, else the first."""
    names = _snapshots()
    if (
        isinstance(payload, dict)
        and isinstance(payload.get("proposedSnapshot"), dict)
        and len(payload["proposedSnapshot"]) == 1
    ):
        (named,) = payload["proposedSnapshot"]
        short = str(named).rpartition(".")[2]
        for name in names:
            if name.rpartition(".")[2] == short:
                return name
    if urn and urn.startswith("urn:li:"):
        entity = urn.split(":", 3)[2].lower()
        for name in names:
            if name.rpartition(".")[2].lower() == f"{entity}snapshot":
                return name
    return names[0]
