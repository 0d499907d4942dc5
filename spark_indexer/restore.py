"""restore-indices: rebuild the search, graph and edge-set indices from the latest rows of `metadata_aspect_v2`.

Every latest row becomes a synthetic change log (UPSERT of the stored value with its stored system metadata) and goes
through `app.search.documents.changes_from_mcl`, exactly as live indexing does (under the base models and the runtime
model set stored in the database when the driver, and each task, starts: `sink.current_registry`), then through the
backend's `apply` (idempotent and order-safe) from Spark tasks: the rows are read in parallel (`postgres_source`, N =
`spark_restore_partitions` hash buckets of the urn, so all aspects of an entity are in one task), sorted by urn (so an
entity's aspects go in one bulk) and applied in `spark_apply_chunk`-sized bulks, two in flight per task. When Spark has
no more cores than N, each bucket is sorted by Postgres and applied by the task that reads it (one stage, no shuffle);
otherwise the rows are repartitioned by urn into ~`ROWS_PER_APPLY_TASK`-row tasks and sorted by Spark.

Modes:

* **rebuild** (Elasticsearch/OpenSearch, no narrowing filter, or `clean=True`): `ElasticBackend.create_rebuild_target`
  creates fresh concrete indices `{alias}_{digest}_r{timestamp}` (`{alias}_{digest}` is the name
  `ElasticBackend.ensure_index` creates, same mapping) for every selected entity type and for the graph and edge-set
  indices; the Spark tasks fill them (`writing_into(target)`) while the aliases keep serving the old ones; then
  `swap_in` swaps every alias in ONE `_aliases` call and deletes the old indices; then rows written during the
  rebuild (`createdon >= start - margin`) are applied in place (order-safe: replays are no-ops). A failed build is
  dropped (`drop_rebuild_target`). With `clean=True` and `entities`, only those entity types' indices are rebuilt, and
  the graph indices keep the edges of the other entity types (copied before the build).
  Limit: an aspect or entity deleted while the rebuild runs may survive in the new indices (a delete leaves no row to
  catch up from); `reconcile(repair=True)` removes such orphans.
* **in-place** (narrowing filters without `clean`, and always for the embedded Postgres backend): the selected rows are
  applied to the live indices (`create_missing_indices` first). Postgres backend with `clean=True`: the selected entity
  types' rows of the search tables are deleted first (`PostgresBackend.clear`), so search on those types is incomplete
  until the restore ends (there is no shadow build on Postgres). Timeseries indices/points are
  never touched (timeseries aspects are not stored in `metadata_aspect_v2`).

`clean=True` rebuilds whole entity types: it combines with `entities` only (other filters raise `ValueError`).
The index lifecycle is the backends' (public methods); this module only decides the mode and drives Spark.
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from app.registry import EntityRegistry
from app.search.model import RebuildTarget
from app.urns import InvalidUrnError, entity_type_of
from spark_indexer.config import IndexerSettings, database_url_of, with_database
from spark_indexer.postgres_source import RowFilter, count_latest, read_latest_aspects
from spark_indexer.sink import build_backend, current_registry, opened_backend, settings_from_payload, settings_payload

CATCH_UP_MARGIN = timedelta(seconds=5)  # clock skew between writers and this job: replays are harmless
ROWS_PER_APPLY_TASK = 10_000  # apply-stage partitions: at least spark_restore_partitions, ~this many rows each
MAX_APPLY_TASKS = 4096
IN_FLIGHT_BULKS = 2  # bulk calls in flight per task (conversion overlaps the previous bulk's I/O)
MAX_ERROR_EXAMPLES = 20
STATS_SCHEMA = "rows long, indexed long, skipped long, failed long, changes long, entities long, errors string"


# --- results and progress -----------------------------------------------------------------------------------------


@dataclass
class RestoreResult:
    backend: str  # "elasticsearch" | "opensearch" | "postgres"
    mode: str  # "rebuild" | "in-place"
    rows_total: int = 0  # latest rows selected (COUNT before the run)
    rows_read: int = 0
    rows_indexed: int = 0  # rows that produced index changes
    rows_skipped: int = 0  # rows with nothing to index (aspects without Searchable/Relationship, timeseries, unknown)
    rows_failed: int = 0  # rows whose value could not be turned into changes (bad JSON, ...)
    changes: int = 0
    entities: int = 0
    catch_up_rows: int = 0  # rows written during a rebuild, applied after the swap
    duration_s: float = 0.0
    swapped: dict[str, str] = field(default_factory=dict)  # alias -> new concrete index
    deleted_indices: list[str] = field(default_factory=list)
    cleared: dict[str, int] = field(default_factory=dict)  # postgres clean: table -> rows deleted
    errors: list[str] = field(default_factory=list)

    @property
    def aspects_per_s(self) -> float:
        return self.rows_read / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def ok(self) -> bool:
        return self.rows_failed == 0

    def summary(self) -> str:
        lines = [
            f"restore-indices ({self.backend}, {self.mode}): {self.rows_read:,} of {self.rows_total:,} latest rows in "
            f"{self.duration_s:.1f}s ({self.aspects_per_s:,.0f} aspects/s); {self.rows_indexed:,} indexed, "
            f"{self.rows_skipped:,} with nothing to index, {self.rows_failed:,} failed; {self.changes:,} changes for "
            f"{self.entities:,} entities",
        ]
        if self.catch_up_rows:
            lines.append(f"  caught up {self.catch_up_rows:,} rows written during the rebuild")
        if self.swapped:
            lines.append(f"  swapped {len(self.swapped)} aliases; deleted {len(self.deleted_indices)} old indices")
        if self.cleared:
            lines.append("  cleared " + ", ".join(f"{t}: {n}" for t, n in sorted(self.cleared.items())))
        for error in self.errors[:MAX_ERROR_EXAMPLES]:
            lines.append(f"  error: {error}")
        return "\n".join(lines)


class Progress:
    """`rows done / total, rate, ETA` on stderr, at most every `interval` seconds (and once at the end)."""

    def __init__(
        self, label: str, total: int, *, enabled: bool = True, interval: float = 2.0, stream: Any = None
    ) -> None:
        self.label, self.total, self.enabled, self.interval = label, total, enabled, interval
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self._last = 0.0
        self._last_done = -1

    def line(self, done: int) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = done / elapsed
        pct = 100.0 * done / self.total if self.total else 100.0
        remaining = (self.total - done) / rate if rate > 0 and self.total >= done else None
        eta = "?" if remaining is None else str(timedelta(seconds=int(remaining)))
        return f"{self.label}: {done:,}/{self.total:,} rows ({pct:.1f}%), {rate:,.0f} rows/s, ETA {eta}"

    def update(self, done: int, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and (now - self._last < self.interval or done == self._last_done):
            return
        self._last, self._last_done = now, done
        print(self.line(min(done, self.total) if self.total else done), file=self.stream, flush=True)


# --- rows -> changes (executor side) ----------------------------------------------------------------------------


def entity_type_of_urn(urn: str) -> str | None:
    try:
        return entity_type_of(urn)
    except InvalidUrnError:
        return None


def row_mcl(
    urn: str, aspect: str, version: int, metadata: str, systemmetadata: str | None, entity_type: str | None = None
) -> dict[str, Any]:
    """The change log live indexing would have seen for this latest row (UPSERT of the stored value)."""
    sm = orjson.loads(systemmetadata) if systemmetadata else {}
    if not isinstance(sm, dict):
        sm = {}
    if sm.get("version") is None:
        sm["version"] = str(version)  # the logical version the repository reports (1 for unversioned rows)
    return {
        "entityType": entity_type or entity_type_of_urn(urn),
        "entityUrn": urn,
        "aspectName": aspect,
        "changeType": "UPSERT",
        "aspect": {"value": metadata, "contentType": "application/json"},
        "systemMetadata": sm,
    }


def row_changes(
    registry: EntityRegistry,
    urn: str,
    aspect: str,
    version: int,
    metadata: str,
    systemmetadata: str | None,
    limits: Any = None,
) -> list[Any]:
    """The index changes of one latest row (timeseries points dropped: restore never touches timeseries indices),
    within `limits` (`IndexLimits`; None: the defaults), as live indexing builds them."""
    from app.search.documents import DEFAULT_LIMITS, changes_from_mcl
    from app.search.model import TimeseriesPoint

    spec = registry.aspects.get(aspect)
    if spec is None or spec.is_timeseries:
        return []
    changes = changes_from_mcl(
        row_mcl(urn, aspect, version, metadata, systemmetadata), registry, limits or DEFAULT_LIMITS
    )
    return [c for c in changes if not isinstance(c, TimeseriesPoint)]


def backend_for_task(
    settings: IndexerSettings, registry: EntityRegistry, target: RebuildTarget | None = None
) -> tuple[Any, Any]:
    """(backend, engine or None), not started: the driver made sure the indices/tables exist. With `target`, the
    backend writes into the rebuild target's fresh indices."""
    return build_backend(settings, registry, pool_size=IN_FLIGHT_BULKS + 1, target=target)


class _LoopThread:
    """An event loop in a thread: bulk calls run there while the task thread converts the next rows."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coroutine: Any) -> Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def _apply_partition(payload: dict[str, Any], target: RebuildTarget | None, chunk_size: int, accumulator: Any):
    """The mapInArrow function: rows (sorted by urn) → changes → bulks; yields one stats row."""

    def apply_rows(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from app.search.documents import IndexLimits

        settings = settings_from_payload(payload)
        registry = current_registry(settings)
        limits = IndexLimits.from_settings(settings)
        stats = {"rows": 0, "indexed": 0, "skipped": 0, "failed": 0, "changes": 0, "entities": 0}
        errors: list[str] = []
        runner = _LoopThread()
        backend, engine = backend_for_task(settings, registry, target)
        in_flight: list[tuple[Future, int]] = []
        pending: list[Any] = []
        pending_rows = 0
        last_urn: str | None = None

        def drain(limit: int) -> None:
            while len(in_flight) > limit:
                future, rows = in_flight.pop(0)
                future.result()  # a failed bulk fails the task (Spark retries it; apply is idempotent)
                if accumulator is not None:
                    accumulator.add(rows)

        def flush() -> None:
            nonlocal pending, pending_rows
            if pending:
                in_flight.append((runner.submit(backend.apply(pending)), pending_rows))
                drain(IN_FLIGHT_BULKS)
            elif pending_rows and accumulator is not None:
                accumulator.add(pending_rows)
            pending, pending_rows = [], 0

        try:
            for batch in batches:
                columns = batch.to_pydict()
                for urn, aspect, version, metadata, sm in zip(
                    columns["urn"],
                    columns["aspect"],
                    columns["version"],
                    columns["metadata"],
                    columns["systemmetadata"],
                ):
                    if urn != last_urn:
                        if len(pending) >= chunk_size:
                            flush()  # bulks end at entity boundaries: one entity's aspects in one bulk
                        stats["entities"] += 1
                        last_urn = urn
                    stats["rows"] += 1
                    pending_rows += 1
                    try:
                        changes = row_changes(registry, urn, aspect, version, metadata, sm, limits)
                    except Exception as exc:  # noqa: BLE001 - one bad row must not stop the restore
                        stats["failed"] += 1
                        if len(errors) < MAX_ERROR_EXAMPLES:
                            errors.append(f"{urn} {aspect}: {type(exc).__name__}: {exc}"[:500])
                        continue
                    if changes:
                        stats["indexed"] += 1
                        stats["changes"] += len(changes)
                        pending.extend(changes)
                    else:
                        stats["skipped"] += 1
            flush()
            drain(0)
        finally:
            for future, _ in in_flight:
                future.cancel()
            try:
                runner.submit(backend.close()).result()
                if engine is not None:
                    runner.submit(engine.dispose()).result()
            finally:
                runner.stop()
        yield pa.RecordBatch.from_pydict(
            {**{k: [v] for k, v in stats.items()}, "errors": [orjson.dumps(errors).decode()]},
            schema=pa.schema([(k, pa.int64()) for k in stats] + [("errors", pa.string())]),
        )

    return apply_rows


def apply_latest_rows(
    spark: Any,
    settings: IndexerSettings,
    row_filter: RowFilter,
    *,
    target: RebuildTarget | None = None,
    total: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Read the selected latest rows and apply their changes from Spark tasks; returns the summed stats."""
    if total is None:
        total = asyncio.run(count_latest(database_url_of(settings), row_filter))
    if total == 0:
        return {"rows": 0, "indexed": 0, "skipped": 0, "failed": 0, "changes": 0, "entities": 0, "errors": []}
    partitions = settings.spark_restore_partitions
    apply_tasks = min(MAX_APPLY_TASKS, max(partitions, math.ceil(total / ROWS_PER_APPLY_TASK)))
    accumulator = spark.sparkContext.accumulator(0)
    fn = _apply_partition(settings_payload(settings), target, max(1, settings.spark_apply_chunk), accumulator)
    if spark.sparkContext.defaultParallelism <= partitions:
        # The read buckets already keep every core busy and hold each entity whole: Postgres sorts each bucket
        # (urn, aspect; byte order, as Spark would) and the rows go from the reader to the apply function in one
        # stage, without a shuffle and a sort in the JVM.
        df = read_latest_aspects(spark, settings, row_filter, partitions=partitions, ordered=True)
        applied = df.mapInArrow(fn, STATS_SCHEMA)
    else:  # more cores than readers: spread the apply over more, smaller tasks
        df = read_latest_aspects(spark, settings, row_filter, partitions=partitions)
        applied = df.repartition(apply_tasks, "urn").sortWithinPartitions("urn", "aspect").mapInArrow(fn, STATS_SCHEMA)

    result: dict[str, Any] = {}
    error: list[BaseException] = []

    def job() -> None:
        try:
            result["rows"] = applied.collect()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            error.append(exc)

    worker = threading.Thread(target=job, name="restore-indices-job", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.25)
        if progress is not None:
            progress.update(accumulator.value)
    if error:
        raise error[0]
    out: dict[str, Any] = {
        "rows": 0,
        "indexed": 0,
        "skipped": 0,
        "failed": 0,
        "changes": 0,
        "entities": 0,
        "errors": [],
    }
    for row in result["rows"]:
        for key in ("rows", "indexed", "skipped", "failed", "changes", "entities"):
            out[key] += int(row[key] or 0)
        out["errors"].extend(orjson.loads(row["errors"] or "[]"))
    if progress is not None:
        progress.update(out["rows"], force=True)
    return out


# --- driver side -------------------------------------------------------------------------------------------------


def _canonical_entities(registry: EntityRegistry, entities: Sequence[str] | None) -> list[str]:
    if not entities:
        return []
    names = []
    for name in entities:
        try:
            names.append(registry.entity(name).name)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"unknown entity type {name!r}") from exc
    return sorted(set(names))


def backend_label(settings: IndexerSettings) -> str:
    return (settings.search_flavor or "elasticsearch").lower() if settings.search_url else "postgres"


def _with_backend(settings: IndexerSettings, registry: EntityRegistry, action: Any) -> Any:
    """Run `action(backend)` (a coroutine function) with the configured backend, not started (the index lifecycle
    calls create what they need), closed after."""

    async def run() -> Any:
        async with opened_backend(settings, registry, start=False) as backend:
            return await action(backend)

    return asyncio.run(run())


# --- the command ------------------------------------------------------------------------------------------------


def restore_indices(
    spark: Any,
    settings: IndexerSettings,
    *,
    clean: bool = False,
    entities: Sequence[str] | None = None,
    aspects: Sequence[str] | None = None,
    urn_like: str | None = None,
    since: datetime | str | None = None,
    until: datetime | str | None = None,
    progress: bool = True,
) -> RestoreResult:
    """Rebuild the indices from the latest rows (see the module docstring for the modes)."""
    settings = with_database(settings)
    if clean and (aspects or urn_like or since or until):
        raise ValueError("--clean rebuilds whole entity types: combine it with --entity only")
    started = time.monotonic()
    rebuild_start = datetime.now(UTC)
    registry = current_registry(settings)
    entity_types = _canonical_entities(registry, entities)
    row_filter = RowFilter.of(entities=entity_types, aspects=aspects, urn_like=urn_like, since=since, until=until)
    fresh_indices = bool(settings.search_url)  # Elasticsearch/OpenSearch can build fresh indices; Postgres cannot
    rebuild = fresh_indices and (clean or not row_filter.narrowing)
    result = RestoreResult(backend=backend_label(settings), mode="rebuild" if rebuild else "in-place")
    result.rows_total = asyncio.run(count_latest(database_url_of(settings), row_filter))
    meter = Progress("restore-indices", result.rows_total, enabled=progress)

    def absorb(stats: dict[str, Any]) -> None:
        result.rows_read += stats["rows"]
        result.rows_indexed += stats["indexed"]
        result.rows_skipped += stats["skipped"]
        result.rows_failed += stats["failed"]
        result.changes += stats["changes"]
        result.entities += stats["entities"]
        result.errors.extend(stats["errors"])

    if not rebuild:
        if clean:  # the Postgres backend: the selected entity types' rows go first
            result.cleared = _with_backend(settings, registry, lambda b: b.clear(entity_types))
        else:
            _with_backend(
                settings, registry, lambda b: b.create_missing_indices(entity_types or sorted(registry.entities))
            )
        absorb(apply_latest_rows(spark, settings, row_filter, total=result.rows_total, progress=meter))
    else:
        stamp = rebuild_start.strftime("%Y%m%d%H%M%S%f")
        target = _with_backend(settings, registry, lambda b: b.create_rebuild_target(entity_types, stamp=stamp))
        try:
            absorb(
                apply_latest_rows(spark, settings, row_filter, target=target, total=result.rows_total, progress=meter)
            )
        except BaseException:
            _with_backend(settings, registry, lambda b: b.drop_rebuild_target(target))
            raise
        result.deleted_indices = _with_backend(settings, registry, lambda b: b.swap_in(target))
        result.swapped = dict(target.indices)
        # rows written while the new indices were built: the old indices got them, the new ones may not have
        catch_up = RowFilter.of(entities=entity_types, since=rebuild_start - CATCH_UP_MARGIN)
        stats = apply_latest_rows(spark, settings, catch_up, progress=None)
        result.catch_up_rows = stats["rows"]
        result.rows_failed += stats["failed"]
        result.errors.extend(stats["errors"])
    result.duration_s = time.monotonic() - started
    return result
