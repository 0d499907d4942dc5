"""What the ingestion topics carry, and a batch of Kafka records read into units of work.

A record format is a strategy the consumer loop is given, not a subclass of it: the MCP and the MCE consumers run the
same loop and differ only in their topics, their default group, the field of a dead letter that holds the record,
and how a record becomes drafts. Reading a batch (`read_batch`) is the same for both: decode the value through the
process's `ValueCodec` (Confluent-framed Avro, writer schema by id, or JSON: both are accepted whatever
`kafka_value_format` says), turn each record into drafts (draft indices running on across the batch, each draft
located in its record), prepare them through the ingest gateway; a record that fails any of it keeps its error,
shaped as a record's (`for_record`). A value that is neither JSON nor decodable Avro (a truncated frame, a wrong
magic byte, an unknown schema id, bytes that do not decode) is a 400 with that reason; a schema registry that cannot
be reached is not the record's fault: `read_batch` raises ServiceUnavailable and the batch is read again later.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

from app.avro.wire import SchemaFetchFailed, ValueCodec, WireFormatError
from app.errors import Issue, Location, MetaledgerError, ServiceUnavailable, ValidationFailed
from app.ingest.gateway import IngestGateway
from app.ingest.mce import unbundle_mce
from app.ingest.mcp import parse_mcp
from app.limits import clip, too_deep
from app.registry import EntityRegistry
from app.settings import Settings
from app.write.proposal import Draft, Proposal

log = logging.getLogger("metaledger.kafka.consumers")

# A record is its own document: issues name paths in it, without a batch index.
RECORD = Location(None, "$")


@dataclass(slots=True, eq=False)
class Unit:
    """One record of a batch and what became of it."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    payload: Any  # the record as received, in its JSON form (decoded from Avro or JSON), or the raw text if neither
    drafts: list[Draft] = field(default_factory=list)
    proposals: list[Proposal] = field(default_factory=list)
    error: BaseException | None = None
    applied: bool = False
    urn: str | None = None
    aspect: str | None = None
    run_id: str | None = None
    raw: bytes | None = None  # the value's bytes as consumed
    schema_id: int | None = None  # the writer schema's id of an Avro value (None: JSON)


class RecordFormat(Protocol):
    """What one kind of record is: where it comes from, where its dead letters go, how it becomes drafts."""

    kind: ClassVar[str]  # "proposal" | "event": in client ids and log messages
    payload_field: ClassVar[str]  # the field of a dead letter that holds the record as received

    def topic(self, settings: Settings) -> str: ...

    def dead_letter_topic(self, settings: Settings) -> str: ...

    def default_group(self, settings: Settings) -> str: ...

    def describe(self, payload: Any) -> tuple[str | None, str | None, str | None]:
        """(urn, aspect, run id) as far as the record tells them; never raises (dead letters are keyed and logged
        with them even when the record is invalid)."""
        ...

    def drafts(self, payload: Any, first_index: int, registry: EntityRegistry) -> list[Draft]:
        """The record's drafts, indexed from `first_index` and located in the record; MetaledgerError if invalid."""
        ...


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _run_id(system_metadata: Any) -> str | None:
    return system_metadata.get("runId") if isinstance(system_metadata, dict) else None


@dataclass(frozen=True, slots=True)
class McpFormat:
    """MetadataChangeProposal_v1 records; failures → FailedMetadataChangeProposal_v1."""

    kind: ClassVar[str] = "proposal"
    payload_field: ClassVar[str] = "metadataChangeProposal"

    def topic(self, settings: Settings) -> str:
        return settings.topic_mcp

    def dead_letter_topic(self, settings: Settings) -> str:
        return settings.topic_fmcp

    def default_group(self, settings: Settings) -> str:
        return settings.mcp_consumer_group

    def describe(self, payload: Any) -> tuple[str | None, str | None, str | None]:
        if not isinstance(payload, dict):
            return None, None, None
        return (
            _string(payload.get("entityUrn")),
            _string(payload.get("aspectName")),
            _run_id(payload.get("systemMetadata")),
        )

    def drafts(self, payload: Any, first_index: int, registry: EntityRegistry) -> list[Draft]:
        return [parse_mcp(payload, RECORD, first_index)]


@dataclass(frozen=True, slots=True)
class MceFormat:
    """MetadataChangeEvent_v4 records, unbundled into one draft per aspect; failures → FailedMetadataChangeEvent_v4.
    An event is all or nothing: one bad aspect dead-letters the whole event."""

    kind: ClassVar[str] = "event"
    payload_field: ClassVar[str] = "metadataChangeEvent"

    def topic(self, settings: Settings) -> str:
        return settings.topic_mce

    def dead_letter_topic(self, settings: Settings) -> str:
        return settings.topic_fmce

    def default_group(self, settings: Settings) -> str:
        return "mce-consumer-job-client"  # DataHub's MetadataChangeEventsProcessor group

    def describe(self, payload: Any) -> tuple[str | None, str | None, str | None]:
        if not isinstance(payload, dict):
            return None, None, None
        urn = None
        snapshot = payload.get("proposedSnapshot")
        if isinstance(snapshot, dict) and len(snapshot) == 1:
            inner = next(iter(snapshot.values()))
            if isinstance(inner, dict):
                urn = _string(inner.get("urn"))
        return urn, None, _run_id(payload.get("systemMetadata"))  # the aspects are the drafts'

    def drafts(self, payload: Any, first_index: int, registry: EntityRegistry) -> list[Draft]:
        return unbundle_mce(payload, registry, first_index=first_index).drafts


MCP = McpFormat()
MCE = MceFormat()


def for_record(error: MetaledgerError) -> MetaledgerError:
    """An error as a record's: no request indices, `$` is the record (not `$[0]`), and a message made of the
    record's issues (not a batch summary such as "1 of 1 proposals are invalid")."""
    issues = [replace(i, index=None, path=i.path.replace("$[0]", "$", 1) if i.path else i.path) for i in error.issues]
    if not issues:
        return error.with_issues(issues)
    said = dict.fromkeys(i.message + (f" (at {i.path})" if i.path and i.path != "$" else "") for i in issues)
    message = "; ".join(said)
    return error.with_issues(issues, message if len(message) <= 2000 else message[:1997] + "...")


async def decode_values(records: list[Any], codec: ValueCodec) -> list[tuple[Any, int | None] | WireFormatError]:
    """Each record's value in its JSON form with its schema id, or why it is neither JSON nor decodable Avro.
    ServiceUnavailable when a writer schema has to be fetched and the registry cannot answer."""
    out: list[tuple[Any, int | None] | WireFormatError] = []
    for record in records:
        if record.value is None:
            out.append(WireFormatError("the record has no value"))
            continue
        try:
            out.append(await codec.decode(record.value))
        except WireFormatError as error:
            out.append(error)
        except SchemaFetchFailed as error:  # the registry is unreachable: not the record's fault, the batch waits
            raise ServiceUnavailable(str(error)) from error
        except Exception as error:  # noqa: BLE001 - a value that breaks the decoder is that value's problem
            log.exception("unexpected error decoding a record", extra={"topic": record.topic, "offset": record.offset})
            out.append(WireFormatError(f"undecodable value ({type(error).__name__}: {error})"))
    return out


async def read_batch(
    records: Iterable[Any], record_format: RecordFormat, gateway: IngestGateway, codec: ValueCodec, first_index: int = 0
) -> list[Unit]:
    """Each record (as aiokafka gives it) → a unit: decoded, turned into drafts, prepared; or with its error. Draft
    indices run on from `first_index` (unique across the batch applied together)."""
    records = list(records)
    decoded = await decode_values(records, codec)
    units: list[Unit] = []
    next_index = first_index
    for record, value in zip(records, decoded, strict=True):
        unit = Unit(record.topic, record.partition, record.offset, record.timestamp, record.key, None, raw=record.value)
        units.append(unit)
        try:
            if isinstance(value, WireFormatError):
                raw = record.value or b""
                unit.payload = raw.decode("utf-8", errors="backslashreplace")
                message = f"the record is neither JSON nor decodable Avro: {value}"
                raise ValidationFailed(message, [Issue(message, path="$")])
            unit.payload, unit.schema_id = value
            deep = too_deep(unit.payload, gateway.settings.max_json_depth)
            if deep is not None:  # kept as text: nothing walks it, and its dead letter can still be written
                unit.payload = (record.value or b"").decode("utf-8", errors="backslashreplace")
                message = f"the record is nested more than {gateway.settings.max_json_depth} levels deep (METALEDGER_MAX_JSON_DEPTH)"
                raise ValidationFailed(message, [Issue(message, path=clip(deep))])
            unit.urn, unit.aspect, unit.run_id = record_format.describe(unit.payload)
            unit.drafts = record_format.drafts(unit.payload, next_index, gateway.registry)
            next_index += len(unit.drafts)
            unit.aspect = unit.aspect or ",".join(d.aspect_name for d in unit.drafts)
            unit.proposals = gateway.prepare(unit.drafts)
            if unit.proposals:
                first = unit.proposals[0]
                unit.urn, unit.aspect, unit.run_id = first.urn, unit.aspect or first.aspect_name, first.run_id
        except MetaledgerError as error:
            unit.error = for_record(error)
        except Exception as error:  # a bug: still never dropped silently
            log.exception("unexpected error preparing a record", extra={"topic": unit.topic, "offset": unit.offset})
            unit.error = error
    return units
