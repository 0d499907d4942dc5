"""Per-aspect change events in ("Metadata Events (v5)"): the change topics of the routed entity/aspect pairs
(app.kafka.per_aspect) → the write pipeline; a failure → that pair's FailedMetadataChangeEvent topic.

A `MetadataChangeEvent {urn, proposedValue}` of a pair is an UPSERT of the aspect with `proposedValue`; one without
`proposedValue` is a DELETE of the aspect (never of the whole entity: that is the key aspect's pair). It goes through
the same pipeline as every other entry (validation, rules, change processors), as the system actor. The consumer
subscribes to the routed pairs' topics by name, not by pattern: a team's ACLs can then be as narrow as its pairs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import orjson
from aiokafka import AIOKafkaProducer
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.avro import per_aspect
from app.avro.wire import ValueCodec
from app.errors import Issue, ValidationFailed
from app.ingest.gateway import IngestGateway
from app.kafka.consumers.dead_letters import DeadLetterWriter, trace_exception
from app.kafka.consumers.loop import Consumer
from app.kafka.consumers.records import RECORD, Unit, read_batch
from app.kafka.per_aspect import DerivedEvents, PairRoute
from app.registry import EntityRegistry
from app.settings import Settings
from app.write.proposal import Draft

log = logging.getLogger("metaledger.kafka.consumers")

EVENT_FIELDS = frozenset({"auditHeader", "urn", "proposedValue"})


class PairChangeFormat:
    """One routed pair's change topic."""

    kind: ClassVar[str] = "event"
    payload_field: ClassVar[str] = "metadataChangeEvent"

    def __init__(self, route: PairRoute) -> None:
        self.route = route

    def topic(self, settings: Settings) -> str:
        return self.route.change_topic

    def dead_letter_topic(self, settings: Settings) -> str:
        return self.route.failed_topic

    def default_group(self, settings: Settings) -> str:
        return "metaledger-per-aspect-mce"

    def describe(self, payload: Any) -> tuple[str | None, str | None, str | None]:
        urn = payload.get("urn") if isinstance(payload, dict) else None
        return (urn if isinstance(urn, str) else None), self.route.aspect, None

    def drafts(self, payload: Any, first_index: int, registry: EntityRegistry) -> list[Draft]:
        where = f"{self.route.entity}.{self.route.aspect} MetadataChangeEvent"
        if not isinstance(payload, dict):
            raise ValidationFailed(f"a {where} is an object", [Issue("not an object", path="$")])
        unknown = sorted(set(payload) - EVENT_FIELDS)
        if unknown:
            raise ValidationFailed(
                f"unknown field(s) {unknown} in a {where}", [Issue("unknown field", path=f"$.{unknown[0]}")]
            )
        if not isinstance(payload.get("urn"), str):
            raise ValidationFailed(f"a {where} needs its urn (a string)", [Issue("missing urn", path="$.urn")])
        value = payload.get("proposedValue")
        change_type = "UPSERT" if value is not None else "DELETE"
        return [
            Draft(
                first_index,
                self.route.entity,
                self.route.aspect,
                change_type,
                urn=payload["urn"],
                value=value,
                location=RECORD,
            )
        ]


class PairDeadLetters(DeadLetterWriter):
    """FailedMetadataChangeEvent of the unit's pair, on the pair's failed topic: the event as received when it is
    one, else a placeholder `{urn}` with the raw record in the error's trace."""

    def __init__(
        self, settings: Settings, formats: dict[str, PairChangeFormat], derived: DerivedEvents, codec: ValueCodec
    ) -> None:
        super().__init__(settings, next(iter(formats.values())), codec)
        self.formats = formats
        self.derived = derived

    async def send(self, producer: AIOKafkaProducer, dead: list[Unit], wait: Callable[[], Awaitable[bool]]) -> bool:
        while True:  # the failed records are framed with the ids the pairs' schemas are registered under
            try:
                await self.derived.start()
                break
            except Exception as error:  # noqa: BLE001 - the registry is unreachable: wait, like for the broker
                log.warning("dead letters wait for the schema registry", extra={"error": repr(error)})
                if not await wait():
                    return False
        return await super().send(producer, dead, wait)

    def topic_of(self, unit: Unit) -> str:
        return self.formats[unit.topic].route.failed_topic

    def record(self, unit: Unit) -> tuple[bytes | None, bytes]:
        assert unit.error is not None
        route = self.formats[unit.topic].route
        key = unit.urn.encode() if unit.urn else unit.key
        trace = trace_exception(unit.error)
        trace["source"] = {
            "topic": unit.topic,
            "partition": unit.partition,
            "offset": unit.offset,
            "timestamp": unit.timestamp,
        }
        event = unit.payload if isinstance(unit.payload, dict) else None
        if event is not None:
            try:
                return key, route.encode(
                    per_aspect.FAILED,
                    {"metadataChangeEvent": event, "error": orjson.dumps([trace]).decode()},
                    self.codec.avro,
                )
            except ValueError:  # not an event its record can carry: the placeholder below
                pass
        raw = unit.raw if unit.raw is not None else b""
        trace["rawRecord"] = raw[: min(self.limit // 2, 1024 * 1024)].decode("utf-8", errors="backslashreplace")
        placeholder = {"urn": unit.urn or ""}
        return key, route.encode(
            per_aspect.FAILED,
            {"metadataChangeEvent": placeholder, "error": orjson.dumps([trace]).decode()},
            self.codec.avro,
        )


class PerAspectChangeConsumer(Consumer):
    """Every routed pair's change topic → the ingest gateway in batches; failures → the pair's failed topic."""

    def __init__(
        self,
        settings: Settings,
        sessionmaker: async_sessionmaker[AsyncSession],
        gateway: IngestGateway,
        derived: DerivedEvents,
        *,
        group_id: str | None = None,
        session_timeout_ms: int | None = None,
        heartbeat_interval_ms: int | None = None,
        codec: ValueCodec | None = None,
    ) -> None:
        self.formats = {route.change_topic: PairChangeFormat(route) for route in derived.routes.values()}
        super().__init__(
            next(iter(self.formats.values())),
            settings,
            sessionmaker,
            gateway,
            group_id=group_id,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            codec=codec,
        )
        self.topics = list(self.formats)
        self.topic = ",".join(self.topics)  # in its logs
        self.dead_letters = PairDeadLetters(settings, self.formats, derived, self.codec)

    async def read(self, records: list[Any]) -> list[Unit]:
        by_topic: dict[str, list[Any]] = {}
        for record in records:
            by_topic.setdefault(record.topic, []).append(record)
        units: list[Unit] = []
        for topic, group in by_topic.items():  # each topic's records keep their order
            units += await read_batch(
                group, self.formats[topic], self.gateway, self.codec, first_index=sum(len(u.drafts) for u in units)
            )
        return units
