"""reconcile: compare what the indices hold with the latest rows of `metadata_aspect_v2`, and optionally repair.

Expected side (Postgres, read in parallel by `postgres_source`, versions only): every latest row of an aspect that
produces index content (`documents` aspect model: not timeseries, with Searchable fields, Relationship annotations, or
the key aspect; of the base models and the runtime model set stored when it starts) must be in its entity's document at
its logical version (target "document"); an aspect with Relationship annotations must also have its edge-set marker at
that version (target "edges").

Index side, read in bulk (first, so writes landing meanwhile show up as benign "missing"/"stale" rather than
"orphan"): the backend's `indexed_versions` (Elasticsearch/OpenSearch: `search_after` over each selected entity index
and the edge-set index; Postgres backend: `search_aspect_fields` and `search_edge_version`). Entity tombstones count
as no document. Timeseries aspects are ignored on both sides.

Drift kinds: missing (in PG, not live in the index), stale (index version < PG), orphan (live in the index, no PG row;
for edges: a marker with edges), ahead (index version > PG, or a delete marker at >= the PG version).

`repair=True` (on the driver, through `backend.apply`): missing/stale → the PG rows are re-applied; orphans → aspect
deletes at the indexed version (an `EntityRemoval`, i.e. a tombstone, when the entity has no latest row at all).
"ahead" is reported, not repaired: versions are monotonic (across hard deletes too) and apply never lowers one, so
only a rebuild into fresh indices (`restore_indices(clean=True, entities=[...])`) resets it. Then everything is
checked again: `counts` are the drift left (so `ok` stays False while "ahead" entries exist), `found` what the first
pass saw.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.registry import EntityRegistry
from app.urns import entity_type_of
from spark_indexer.config import IndexerSettings, database_url_of, with_database
from spark_indexer.postgres_source import RowFilter, asyncpg_dsn, fetch_latest, read_latest_aspects
from spark_indexer.restore import _canonical_entities, backend_label, row_changes
from spark_indexer.sink import current_registry, opened_backend

KINDS = ("missing", "stale", "orphan", "ahead")
MAX_EXAMPLES = 20
INDEX_SCHEMA = "urn string, aspect string, target string, index_version long, live boolean"


@dataclass(frozen=True)
class Drift:
    kind: str  # missing | stale | orphan | ahead
    target: str  # "document" (entity document's aspect) | "edges" (edge-set marker of a relationship aspect)
    urn: str
    aspect: str
    pg_version: int | None
    index_version: int | None

    def __str__(self) -> str:
        return (
            f"{self.kind:<7} {self.target:<8} {self.urn} {self.aspect} "
            f"(postgres {self.pg_version if self.pg_version is not None else '-'}, "
            f"index {self.index_version if self.index_version is not None else '-'})"
        )


@dataclass
class ReconcileReport:
    backend: str
    entities: list[str]
    pg_rows: int = 0  # latest rows of indexed aspects
    index_entries: int = 0  # (urn, aspect, target) entries read from the index
    found: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))  # first pass
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))  # left at the end
    examples: list[Drift] = field(default_factory=list)  # first pass, at most MAX_EXAMPLES
    remaining: list[Drift] = field(default_factory=list)  # after repair, at most MAX_EXAMPLES
    repaired: bool = False
    repair_changes: int = 0
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    @property
    def drift(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        found = ", ".join(f"{k} {self.found[k]}" for k in KINDS)
        lines = [
            f"reconcile ({self.backend}): {self.pg_rows:,} indexed aspects in Postgres, {self.index_entries:,} "
            f"index entries; drift: {found} ({self.duration_s:.1f}s)"
        ]
        for drift in self.examples:
            lines.append(f"  {drift}")
        if self.repaired:
            left = ", ".join(f"{k} {self.counts[k]}" for k in KINDS)
            lines.append(f"  repair: {self.repair_changes:,} index changes applied; left after re-check: {left}")
            for drift in self.remaining:
                lines.append(f"  still: {drift}")
        lines.append("OK: no drift" if self.ok else f"DRIFT: {self.drift:,} entries")
        return "\n".join(lines)


# --- what produces index content ------------------------------------------------------------------------------


def indexed_aspects(registry: EntityRegistry, entity_types: Sequence[str]) -> tuple[set[str], set[str]]:
    """(aspects whose rows go into entity documents, aspects that also declare edges) of these entity types."""
    from app.search import documents

    doc_aspects: set[str] = set()
    edge_aspects: set[str] = set()
    for entity_type in entity_types:
        docs, edges = documents.indexed_aspects(registry, entity_type)
        doc_aspects |= docs
        edge_aspects |= edges
    return doc_aspects, edge_aspects


async def index_entries(
    settings: IndexerSettings, registry: EntityRegistry, entity_types: list[str], timeseries: set[str]
) -> list[tuple[str, str, str, int, bool]]:
    """(urn, aspect, target, index version, live) of everything the index holds for these entity types (the
    backend's `indexed_versions`, not started: read only), timeseries aspects left out."""
    async with opened_backend(settings, registry, start=False) as backend:
        entries = await backend.indexed_versions(entity_types)
    return [tuple(e) for e in entries if not (e.target == "document" and e.aspect in timeseries)]


# --- comparison ---------------------------------------------------------------------------------------------------


def _compare(
    spark: Any, settings: IndexerSettings, registry: EntityRegistry, entity_types: list[str]
) -> tuple[Any, Any, int]:
    """The drift DataFrame (urn, aspect, target, pg_version, index_version, kind), the PG side's DataFrame (cached:
    the caller unpersists it), the number of index entries."""
    from pyspark.sql import functions as F

    doc_aspects, edge_aspects = indexed_aspects(registry, entity_types)
    timeseries = {name for name, a in registry.aspects.items() if a.is_timeseries}
    # the index first: writes landing meanwhile look "missing", not "orphan"
    entries = asyncio.run(index_entries(settings, registry, entity_types, timeseries))
    pg = read_latest_aspects(
        spark, settings, RowFilter.of(entities=entity_types, aspects=sorted(doc_aspects)), keys_only=True
    ).select("urn", "aspect", F.col("version").alias("pg_version"))
    pg = (
        pg.withColumn("target", F.lit("document"))
        .unionByName(pg.where(F.col("aspect").isin(sorted(edge_aspects) or [""])).withColumn("target", F.lit("edges")))
        .cache()
    )
    index = spark.createDataFrame(entries or [], INDEX_SCHEMA)
    joined = pg.join(index, ["urn", "aspect", "target"], "full_outer")
    pgv, iv, live = F.col("pg_version"), F.col("index_version"), F.col("live")
    kind = (
        F.when(pgv.isNotNull() & iv.isNull(), "missing")
        .when(pgv.isNotNull() & ~live & (iv < pgv), "missing")
        .when(pgv.isNotNull() & ~live & (iv >= pgv) & (F.col("target") == "document"), "ahead")
        .when(pgv.isNotNull() & (iv < pgv), "stale")
        .when(pgv.isNotNull() & (iv > pgv), "ahead")
        .when(pgv.isNull() & live, "orphan")
    )
    drift = (
        joined.withColumn("kind", kind)
        .where(F.col("kind").isNotNull())
        .select("urn", "aspect", "target", "pg_version", "index_version", "kind")
    )
    return drift, pg, len(entries)


def _check(
    spark: Any, settings: IndexerSettings, registry: EntityRegistry, entity_types: list[str], collect_all: bool
) -> tuple[dict[str, int], list[Drift], list[Drift], int, int]:
    drift_df, pg, index_entries = _compare(spark, settings, registry, entity_types)
    try:
        rows = drift_df.collect() if collect_all else None
        if rows is None:
            counts = Counter({r["kind"]: r["count"] for r in drift_df.groupBy("kind").count().collect()})
            sample = drift_df.orderBy("urn", "aspect", "target").limit(MAX_EXAMPLES).collect()
        else:
            counts = Counter(r["kind"] for r in rows)
            sample = sorted(rows, key=lambda r: (r["urn"], r["aspect"], r["target"]))[:MAX_EXAMPLES]
        pg_rows = pg.where("target = 'document'").count()
    finally:
        pg.unpersist()

    def drift(r: Any) -> Drift:
        return Drift(r["kind"], r["target"], r["urn"], r["aspect"], r["pg_version"], r["index_version"])

    return (
        {k: int(counts.get(k, 0)) for k in KINDS},
        [drift(r) for r in sample],
        [drift(r) for r in rows or []],
        pg_rows,
        index_entries,
    )


# --- repair -------------------------------------------------------------------------------------------------------


async def _repair(settings: IndexerSettings, registry: EntityRegistry, drifts: list[Drift]) -> int:
    import asyncpg

    from app.search.model import AspectEdges, AspectFields, EntityRemoval

    urns = sorted({d.urn for d in drifts})
    conn = await asyncpg.connect(asyncpg_dsn(database_url_of(settings)))
    try:
        alive = {
            r["urn"]
            for r in await conn.fetch(
                "SELECT DISTINCT urn FROM metadata_aspect_v2 WHERE version = 0 AND urn = ANY($1::text[])", urns
            )
        }
    finally:
        await conn.close()
    reapply = {(d.urn, d.aspect) for d in drifts if d.kind in ("missing", "stale")}
    orphans = [d for d in drifts if d.kind == "orphan"]
    rows = await fetch_latest(database_url_of(settings), RowFilter(keys=tuple(sorted(reapply)))) if reapply else []
    from app.search.documents import IndexLimits

    limits = IndexLimits.from_settings(settings)
    changes: list[Any] = []
    for row in sorted(rows, key=lambda r: (r["urn"], r["aspect"])):
        changes.extend(
            row_changes(
                registry, row["urn"], row["aspect"], row["version"], row["metadata"], row["systemmetadata"], limits
            )
        )
    gone: dict[str, int] = {}  # urn without any latest row -> the highest version indexed
    for d in orphans:
        entity = registry.entity(entity_type_of(d.urn))
        if d.urn not in alive:
            gone[d.urn] = max(gone.get(d.urn, 0), d.index_version or 0)
        elif d.target == "document":
            changes.append(AspectFields(entity.name, d.urn, d.aspect, d.index_version or 0, {}, deleted=True))
        else:
            changes.append(AspectEdges(d.urn, d.aspect, d.index_version or 0, ()))
    for urn, version in sorted(gone.items()):  # a hard delete: the document becomes a tombstone, its edges go
        entity = registry.entity(entity_type_of(urn))
        changes.append(EntityRemoval(entity.name, urn, version, entity.key_aspect))
    if changes:
        # not started: the indices exist; "wait_for": the re-check reads right after
        async with opened_backend(settings, registry, refresh="wait_for", start=False) as backend:
            chunk = max(1, settings.spark_apply_chunk)
            for start in range(0, len(changes), chunk):
                await backend.apply(changes[start : start + chunk])
    return len(changes)


# --- the command ------------------------------------------------------------------------------------------------


def reconcile(
    spark: Any, settings: IndexerSettings, *, repair: bool = False, entities: Sequence[str] | None = None
) -> ReconcileReport:
    """Compare the indices with Postgres (all entity types, or `entities`); with `repair`, fix and re-check."""
    settings = with_database(settings)
    started = time.monotonic()
    registry = current_registry(settings)
    entity_types = _canonical_entities(registry, entities) or sorted(registry.entities)
    report = ReconcileReport(backend=backend_label(settings), entities=entity_types)
    counts, examples, drifts, report.pg_rows, report.index_entries = _check(
        spark, settings, registry, entity_types, collect_all=repair
    )
    report.found, report.counts, report.examples = dict(counts), dict(counts), examples
    if repair and drifts:
        report.repaired = True
        report.repair_changes = asyncio.run(_repair(settings, registry, drifts))
        report.counts, report.remaining, _, _, _ = _check(spark, settings, registry, entity_types, collect_all=False)
    report.duration_s = time.monotonic() - started
    return report
