"""One micro-batch of change logs, inside a Spark task: parse, keep the newest version per (urn, aspect), build the
index changes with the service's own document module, and write them to the search backend in bulk.

Pure planning (`plan`) is separate from writing (`IndexTask`) so the rules can be tested without Spark or servers.

Why the result is exactly-once although delivery is at least once: the backend's `apply` is idempotent and
order-safe (every change carries the aspect version; an older or equal version never overwrites a newer one), so a
micro-batch that is replayed after a crash, or a record the relay published twice, changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.avro.wire import ValueCodec, WireFormatError
from app.registry import EntityRegistry
from app.registry.errors import RegistryConfigError
from app.search.documents import IndexLimits, changes_from_mcl
from app.search.model import IndexChange, SearchBackend
from app.urns import InvalidUrnError, entity_type_of

log = logging.getLogger("metaledger.spark_indexer")

TRANSIENT_ATTEMPTS = 6  # a backend that stays unreachable this long fails the task (Spark retries, or the query stops)


# A broken installation or configuration on the executor (a module missing from the shipped environment, a registry
# that does not load) is no record's fault: it fails the task, hence the batch (the stream stops, its offsets are not
# committed), and never becomes a dead letter. Dead letters are for records only.
class BackendSetupError(RuntimeError):
    """The search backend could not be built or started on this executor for a reason that is not an outage (a
    client library missing, e.g. elastic_transport's "You must have 'httpx' installed", or a bad setting)."""


INSTALLATION_ERRORS: tuple[type[BaseException], ...] = (ImportError, RegistryConfigError, BackendSetupError)


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record of a change-log topic (the columns both Kafka sources give)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: Record
    reason: str
    urn: str | None = None
    aspect: str | None = None
    unknown_to_registry: bool = False  # an entity type or aspect the registry does not know (a newer model set may)


@dataclass(slots=True)
class Planned:
    """A parsed change log and where it came from."""

    record: Record
    mcl: dict[str, Any]
    version: int
    timeseries: bool


@dataclass(frozen=True, slots=True)
class Point:
    """A record of the timeseries topic as the analytics archive keeps it (`spark_indexer.stream` writes it): taken
    from the decoded change log whether or not the registry knows its aspect, as the archive is of the topic."""

    record: Record
    urn: str
    entity_type: str | None
    aspect: str
    timestamp_ms: int
    event: str  # the aspect's JSON text
    run_id: str | None


@dataclass(slots=True)
class Plan:
    to_apply: list[Planned] = field(default_factory=list)  # in (partition, offset) order
    dead: list[DeadLetter] = field(default_factory=list)
    superseded: int = 0  # older versions of an aspect dropped because a newer one is in the same batch
    points: list[Point] = field(default_factory=list)  # the timeseries topic's records, for the archive


def _version(mcl: dict[str, Any]) -> int:
    """The aspect version an MCL is about: the deleted version for a DELETE, else the written one."""
    change_type = str(mcl.get("changeType") or "UPSERT").upper()
    containers = ("previousSystemMetadata", "systemMetadata") if change_type == "DELETE" else ("systemMetadata",)
    for name in containers:
        sm = mcl.get(name)
        if isinstance(sm, dict) and sm.get("version") is not None:
            try:
                return int(sm["version"])
            except (TypeError, ValueError):
                return 0
    return 0


def _entity_type_from_urn(urn: str) -> str | None:
    try:
        return entity_type_of(urn)
    except InvalidUrnError:
        return None  # not an URN: the registry lookup below names it


_local_codec: ValueCodec | None = None


def local_decode(raw: bytes | None) -> dict[str, Any]:
    """JSON, or Avro framed with one of DataHub's schema ids (no registry)."""
    global _local_codec
    if _local_codec is None:
        from app.settings import Settings

        _local_codec = ValueCodec(Settings())
    return _local_codec.decode_known(raw)[0]


def decoded(record: Record, decode: Any = None) -> dict[str, Any] | DeadLetter:
    """A record's change log in its JSON form, or the reason it has none. `decode`: raw value → the MCL's JSON form,
    WireFormatError when it is neither JSON nor decodable Avro (default: DataHub's ids, no registry)."""
    if record.value is None:
        return DeadLetter(record, "empty record (no value)")
    try:
        return (decode or local_decode)(record.value)
    except WireFormatError as error:
        return DeadLetter(record, f"unparseable change log: {error}")


def checked(
    record: Record, mcl: dict[str, Any], registry: EntityRegistry, timeseries_topic: str
) -> Planned | DeadLetter:
    """A decoded change log as one the registry knows, or the reason it is not one."""
    urn, aspect = mcl.get("entityUrn"), mcl.get("aspectName")
    if not isinstance(urn, str) or not urn:
        return DeadLetter(record, "change log without entityUrn", aspect=aspect if isinstance(aspect, str) else None)
    if not isinstance(aspect, str) or not aspect:
        return DeadLetter(record, "change log without aspectName", urn=urn)
    entity_type = mcl.get("entityType") or _entity_type_from_urn(urn)
    try:
        entity = registry.entity(entity_type) if entity_type else None
    except Exception:  # noqa: BLE001 - the registry's own lookup error; the reason below says it plainly
        entity = None
    if entity is None:
        return DeadLetter(record, f"entity type {entity_type!r} is not in the entity registry", urn, aspect, True)
    if aspect not in entity.aspect_names:
        return DeadLetter(
            record, f"aspect {aspect!r} is not an aspect of entity {entity.name!r} in the registry", urn, aspect, True
        )
    if mcl.get("entityType") != entity.name:
        mcl["entityType"] = entity.name
    return Planned(record, mcl, _version(mcl), record.topic == timeseries_topic)


def _json_text(value: Any) -> str | None:
    """A JSON value as Spark's `get_json_object` gives it: a string as it is, anything else as its JSON text."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _millis(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def timeseries_point(record: Record, mcl: dict[str, Any]) -> Point | None:
    """The archive's row for a decoded change log of the timeseries topic; None without an URN, an aspect name or
    the aspect's `timestampMillis` (a point the archive cannot place)."""
    aspect_body = mcl.get("aspect")
    value = aspect_body.get("value") if isinstance(aspect_body, dict) else None
    event = _json_text(value)
    fields = value  # DataHub's MCL carries the value as JSON text; a decoded one is read as it is
    if isinstance(value, str):
        try:
            fields = orjson.loads(value)
        except orjson.JSONDecodeError:
            fields = None
    timestamp_ms = _millis(fields.get("timestampMillis")) if isinstance(fields, dict) else None
    urn, aspect = _json_text(mcl.get("entityUrn")), _json_text(mcl.get("aspectName"))
    if urn is None or aspect is None or timestamp_ms is None or event is None:  # a timestamp comes with a value
        return None
    system = mcl.get("systemMetadata")
    return Point(
        record,
        urn,
        _json_text(mcl.get("entityType")),
        aspect,
        timestamp_ms,
        event,
        _json_text(system.get("runId")) if isinstance(system, dict) else None,
    )


def plan(records: Iterable[Record], registry: EntityRegistry, timeseries_topic: str, decode: Any = None) -> Plan:
    """Parse a task's records; of the versioned change logs keep, per (urn, aspect), only the newest: the highest
    version, and of equal versions the last on the topic (an upsert then the delete of that same version). A
    duplicate of an older version published later (the relay is at-least-once) therefore never wins. Timeseries
    points are all kept: each has its own document id, and each is a `Point` of the archive too."""
    result = Plan()
    newest: dict[tuple[str, str], Planned] = {}
    kept: list[Planned] = []
    for record in records:
        mcl = decoded(record, decode)
        if isinstance(mcl, DeadLetter):
            result.dead.append(mcl)
            continue
        if record.topic == timeseries_topic and (point := timeseries_point(record, mcl)) is not None:
            result.points.append(point)  # before `checked`, which may rename the entity type
        parsed = checked(record, mcl, registry, timeseries_topic)
        if isinstance(parsed, DeadLetter):
            result.dead.append(parsed)
            continue
        if parsed.timeseries:
            kept.append(parsed)
            continue
        key = (parsed.mcl["entityUrn"], parsed.mcl["aspectName"])
        current = newest.get(key)
        if current is None:
            newest[key] = parsed
        elif (parsed.version, parsed.record.offset) > (current.version, current.record.offset):
            newest[key] = parsed
            result.superseded += 1
        else:
            result.superseded += 1
    kept.extend(newest.values())
    kept.sort(key=lambda p: (p.record.topic, p.record.partition, p.record.offset))
    result.to_apply = kept
    return result


def is_transient(error: BaseException) -> bool:
    """A failure of the search server or the network (retry), as opposed to a change it refuses (dead letter): the
    service's own rule (app.search.failures.is_transient), so the stream and the embedded worker agree."""
    from app.search.failures import is_transient as search_is_transient

    return search_is_transient(error)


@dataclass(slots=True)
class TaskResult:
    rows: int = 0
    applied: int = 0  # change logs written to the backend (after the in-batch newest-version filter)
    changes: int = 0
    superseded: int = 0
    dead: list[DeadLetter] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    max_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def timeseries_rows(self) -> int:
        return len(self.points)


class IndexTask:
    """Writes one task's plan through a started backend (a `spark_indexer.sink.WorkerRuntime`). `recheck`: asked once
    when records are of an entity type or aspect the registry does not know, before they are dead-lettered; True when
    it took up a newer model set (the records are then parsed again under it)."""

    def __init__(self, runtime: Any, chunk: int, recheck: Callable[[], bool] | None = None) -> None:
        self.runtime = runtime
        self.chunk = max(1, chunk)
        self.recheck = recheck
        self.limits = IndexLimits.from_settings(getattr(runtime, "settings", None))

    def changes_of(self, items: list[Planned], dead: list[DeadLetter]) -> list[tuple[Planned, list[IndexChange]]]:
        """Each change log's index changes, within the settings' `IndexLimits` (NUL stripped, text capped: the same
        documents as the service's); one that cannot be built is dead-lettered with the reason."""
        out: list[tuple[Planned, list[IndexChange]]] = []
        for item in items:
            try:
                out.append((item, changes_from_mcl(item.mcl, self.runtime.registry, self.limits)))
            except INSTALLATION_ERRORS:
                raise
            except Exception as error:  # noqa: BLE001 - one bad change log must not stop the stream
                dead.append(
                    DeadLetter(
                        item.record,
                        f"index document could not be built: {type(error).__name__}: {error}",
                        item.mcl.get("entityUrn"),
                        item.mcl.get("aspectName"),
                    )
                )
        return out

    def _started_backend(self) -> SearchBackend:
        try:
            return self.runtime.started_backend()
        except Exception as error:  # noqa: BLE001
            if is_transient(error) or isinstance(error, INSTALLATION_ERRORS):
                raise
            raise BackendSetupError(
                f"the search backend could not be set up on this executor: {type(error).__name__}: {error}"
            ) from error

    def _apply(self, changes: list[IndexChange]) -> None:
        """Apply with retries on transient failures; a refusal is raised to the caller."""
        for attempt in range(TRANSIENT_ATTEMPTS):
            try:
                backend = self._started_backend()
                self.runtime.run(backend.apply(changes))
                return
            except INSTALLATION_ERRORS:
                raise
            except Exception as error:  # noqa: BLE001
                if not is_transient(error) or attempt == TRANSIENT_ATTEMPTS - 1:
                    raise
                log.warning(
                    "search backend unavailable; retrying",
                    extra={"attempt": attempt + 1, "error": f"{type(error).__name__}: {error}"},
                )
                self.runtime.reset_backend()
                time.sleep(min(5.0, 0.2 * 2**attempt))

    def write(self, built: list[tuple[Planned, list[IndexChange]]], dead: list[DeadLetter]) -> int:
        """Apply in bulk chunks (in order); a chunk the backend refuses (for its data: a Postgres data error,
        Elasticsearch item errors as `IndexRefused`) is retried change log by change log, so only the refused ones
        go to the dead letter, with the backend's reason, and the stream goes on. Transient errors (the backend
        unreachable or overloaded, items rejected with 429/5xx as `IndexUnavailable`) are retried, then fail the
        task: nothing is skipped, and so does a broken installation (`INSTALLATION_ERRORS`). Returns the number of
        changes applied."""
        applied = 0
        for start in range(0, len(built), self.chunk):
            part = built[start : start + self.chunk]
            changes = [c for _, cs in part for c in cs]
            if not changes:
                continue
            try:
                self._apply(changes)
                applied += len(changes)
                continue
            except Exception as error:  # noqa: BLE001
                if is_transient(error) or isinstance(error, INSTALLATION_ERRORS):
                    raise
            for item, item_changes in part:
                if not item_changes:
                    continue
                try:
                    self._apply(item_changes)
                    applied += len(item_changes)
                except Exception as error:  # noqa: BLE001
                    if is_transient(error) or isinstance(error, INSTALLATION_ERRORS):
                        raise
                    dead.append(
                        DeadLetter(
                            item.record,
                            f"search backend refused the change: {type(error).__name__}: {error}",
                            item.mcl.get("entityUrn"),
                            item.mcl.get("aspectName"),
                        )
                    )
        return applied

    def run(self, records: Iterable[Record], timeseries_topic: str) -> TaskResult:
        t0 = time.perf_counter()
        records = list(records)
        result = TaskResult(rows=len(records))
        for r in records:
            key = (r.topic, r.partition)
            if r.offset > result.max_offsets.get(key, -1):
                result.max_offsets[key] = r.offset
        decode = getattr(self.runtime, "decode", None)
        planned = plan(records, self.runtime.registry, timeseries_topic, decode)
        if self.recheck is not None and any(d.unknown_to_registry for d in planned.dead) and self.recheck():
            planned = plan(records, self.runtime.registry, timeseries_topic, decode)
        result.dead = planned.dead
        result.points = planned.points
        result.superseded = planned.superseded
        built = self.changes_of(planned.to_apply, result.dead)
        result.changes = self.write(built, result.dead)
        result.applied = len(built)
        result.seconds = time.perf_counter() - t0
        return result


# --- Arrow in, Arrow out (the `mapInArrow` function of a micro-batch) ---------------------------------------------

# The rows a task gives back: its figures (`count`), per topic partition the highest offset it saw, its dead letters
# (the record and the reason) and the timeseries points for the archive (`point`: the `Point` fields), which stay on
# the executors (the driver collects every row but those).
RESULT_COLUMNS = (
    ("kind", "string"),
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "long"),
    ("key", "binary"),
    ("value", "binary"),
    ("reason", "string"),
    ("urn", "string"),
    ("aspect", "string"),
    ("count", "long"),
    ("entity_type", "string"),
    ("timestamp_ms", "long"),
    ("event", "string"),
    ("run_id", "string"),
)
RESULT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in RESULT_COLUMNS)
POINT = "point"
COUNTS = ("rows", "applied", "changes", "superseded", "timeseries_rows")  # `TaskResult` figures, summed by the driver


def records_of(batches: Iterable[Any]) -> Iterator[Record]:
    for batch in batches:
        columns = batch.to_pydict()
        for topic, partition, offset, key, value in zip(
            columns["topic"], columns["partition"], columns["offset"], columns["key"], columns["value"], strict=True
        ):
            yield Record(topic, int(partition), int(offset), key, value)


def result_batch(result: TaskResult) -> Any:
    import pyarrow as pa

    arrow_types = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "binary": pa.binary()}
    rows: dict[str, list[Any]] = {name: [] for name, _ in RESULT_COLUMNS}

    def add(kind: str, **values: Any) -> None:
        for name, column in rows.items():
            column.append(kind if name == "kind" else values.get(name))

    for name in COUNTS:
        add(name, count=getattr(result, name))
    add("millis", count=int(result.seconds * 1000))
    for (topic, partition), offset in result.max_offsets.items():
        add("max_offset", topic=topic, partition=partition, offset=offset)
    for d in result.dead:
        add(
            "dead",
            topic=d.record.topic,
            partition=d.record.partition,
            offset=d.record.offset,
            key=d.record.key,
            value=d.record.value,
            reason=d.reason,
            urn=d.urn,
            aspect=d.aspect,
        )
    for p in result.points:
        add(
            POINT,
            topic=p.record.topic,
            partition=p.record.partition,
            offset=p.record.offset,
            urn=p.urn,
            aspect=p.aspect,
            entity_type=p.entity_type,
            timestamp_ms=p.timestamp_ms,
            event=p.event,
            run_id=p.run_id,
        )
    schema = pa.schema([(name, arrow_types[kind]) for name, kind in RESULT_COLUMNS])
    return pa.RecordBatch.from_pydict(rows, schema=schema)


def index_partition_fn(payload: dict[str, Any], timeseries_topic: str, chunk: int, models_version: int | None = None):
    """The function a micro-batch maps over its partitions (closure shipped to the executors). `models_version`: the
    stored runtime model set's version the driver read for this batch (None: unknown)."""

    def index_partition(batches: Iterator[Any]) -> Iterator[Any]:
        from spark_indexer.sink import worker_runtime

        runtime = worker_runtime(payload)
        runtime.follow_models(models_version)
        result = IndexTask(runtime, chunk, recheck=runtime.recheck_models).run(records_of(batches), timeseries_topic)
        yield result_batch(result)

    return index_partition
