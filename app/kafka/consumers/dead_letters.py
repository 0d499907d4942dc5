"""Dead letters: the records that failed, produced to the failure topic with why, and logged.

A dead letter (JSON), keyed by the record's URN (else by the record's own key):

    {"metadataChangeProposal": <the MCP as received: an object, or the raw text when it was not JSON>,
     "error": "<JSON array of TraceException: [{message, exceptionClass, stackTrace, cause, status, body}]>",
     "source": {"topic", "partition", "offset", "timestamp"}}

`body` is metaledger's error body (`{"error", "message", "issues": [...]}`), `status` its HTTP status. MCE dead
letters carry `metadataChangeEvent` instead of `metadataChangeProposal`. A dead letter too large for the failure
topic keeps the head of the record (as text) and says `"payloadTruncated": true`; `source` locates the original.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

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

    def __init__(self, settings: Settings, record_format: RecordFormat) -> None:
        self.format = record_format
        self.topic = record_format.dead_letter_topic(settings)
        self.limit = settings.kafka_max_message_bytes

    def record(self, unit: Unit) -> tuple[bytes | None, bytes]:
        """(key, value) of the unit's dead letter."""
        assert unit.error is not None
        value = {
            self.format.payload_field: unit.payload,
            "error": orjson.dumps([trace_exception(unit.error)]).decode(),
            "source": {"topic": unit.topic, "partition": unit.partition, "offset": unit.offset, "timestamp": unit.timestamp},
        }
        encoded = orjson.dumps(value)
        if len(encoded) > self.limit:
            # Too large for the failure topic (the record itself was at the limit): keep its head; `source`
            # locates the original on the input topic.
            head = orjson.dumps(unit.payload).decode(errors="replace")[: min(self.limit // 2, 1024 * 1024)]
            value[self.format.payload_field] = head
            value["payloadTruncated"] = True
            encoded = orjson.dumps(value)
        key = unit.urn.encode() if unit.urn else unit.key
        return key, encoded

    async def send(self, producer: AIOKafkaProducer, dead: list[Unit], wait: Callable[[], Awaitable[bool]]) -> bool:
        """Produce the dead letters and wait for their acknowledgement; while the broker does not acknowledge them,
        `wait()` (it backs off, and answers False when the consumer is stopping) and try the rest again.
        False if stopped before they were all acknowledged (then nothing may be committed)."""
        records = [(*self.record(unit), unit) for unit in dead]
        pending = list(records)
        while pending:
            try:
                futures = [await producer.send(self.topic, value, key=key) for key, value, _ in pending]
                outcomes = await asyncio.gather(*futures, return_exceptions=True)
                failed = [(record, outcome) for record, outcome in zip(pending, outcomes) if isinstance(outcome, BaseException)]
                for _, outcome in failed:
                    if not isinstance(outcome, KafkaError):
                        raise outcome
                pending = [record for record, _ in failed]
                if failed:
                    raise failed[0][1]
            except KafkaError as error:
                log.warning("dead letters not acknowledged; retrying",
                            extra={"topic": self.topic, "pending": len(pending), "error": repr(error)})
                if not await wait():
                    return False
        for _, _, unit in records:
            self._log(unit)
        return True

    def _log(self, unit: Unit) -> None:
        assert unit.error is not None
        log.warning(
            f"{self.format.kind} dead-lettered",
            extra={
                "urn": unit.urn, "aspect": unit.aspect, "run_id": unit.run_id or DEFAULT_RUN_ID,
                "topic": unit.topic, "partition": unit.partition, "offset": unit.offset,
                "dead_letter_topic": self.topic,
                "error_class": class_name(unit.error),
                "reason": unit.error.message if isinstance(unit.error, MetaledgerError) else str(unit.error),
            },
        )
