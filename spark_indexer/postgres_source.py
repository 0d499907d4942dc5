"""A parallel Spark reader of the LATEST rows (version = 0) of `metadata_aspect_v2` (PySpark Python Data Source).

`read_latest_aspects(spark, settings, ...)` gives a DataFrame with the columns of `LATEST_SCHEMA`:

    urn string, aspect string, version long (logical: systemMetadata.version, 1 when absent, as the repository),
    metadata string (the aspect JSON as stored), systemmetadata string, createdon timestamp (stored UTC)

The table is split into N buckets by `hashtext(urn)` (N = `spark_restore_partitions`): every aspect of one entity is
in one bucket. Each Spark task reads its bucket with asyncpg through a server-side cursor, in chunks, and yields
Arrow record batches (no per-row Python objects on the Spark side). Filters are pushed into the SQL: entity types
(urn prefix `urn:li:<entity>:`), aspect names, a urn `LIKE` pattern and a `createdon` window `[since, until)`.

`keys_only=True` skips the two JSON columns (reconcile needs only the versions). `ordered=True` has Postgres return
each bucket sorted by (urn, aspect) in byte order (`COLLATE "C"`, the order of Spark's `sortWithinPartitions`), so a
consumer that needs one entity's rows together (restore-indices) can skip Spark's shuffle and sort.

No JDBC jar is needed; the source is registered as `metaledger_latest_aspects` on first use.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

SOURCE_NAME = "metaledger_latest_aspects"
LATEST_SCHEMA = "urn string, aspect string, version long, metadata string, systemmetadata string, createdon timestamp"
KEYS_SCHEMA = "urn string, aspect string, version long, createdon timestamp"
DEFAULT_CHUNK = 5_000  # rows per cursor fetch (and per Arrow batch)

# Logical version as the repository computes it (StoredAspect.version): systemMetadata.version, else 1.
_VERSION_SQL = (
    "CASE WHEN (systemmetadata::jsonb ->> 'version') ~ '^-?[0-9]{1,18}$' "
    "THEN (systemmetadata::jsonb ->> 'version')::bigint ELSE 1 END"
)


def asyncpg_dsn(database_url: str) -> str:
    """`postgresql+asyncpg://...` (SQLAlchemy) → `postgresql://...` (asyncpg)."""
    scheme, sep, rest = database_url.partition("://")
    if not sep:
        raise ValueError(f"not a database URL: {database_url!r}")
    return "postgresql://" + rest if scheme.startswith("postgres") else database_url


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _as_utc_naive(value: datetime | str | None) -> datetime | None:
    """`createdon` is `timestamp` (UTC, no zone): compare with naive UTC datetimes."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


@dataclass(frozen=True)
class RowFilter:
    """Which latest rows to read. Empty lists / None mean "all"."""

    entities: tuple[str, ...] = ()
    aspects: tuple[str, ...] = ()
    urn_like: str | None = None
    since: datetime | None = None  # createdon >= since
    until: datetime | None = None  # createdon < until
    keys: tuple[tuple[str, str], ...] = field(default=())  # exact (urn, aspect) pairs (repair)

    @classmethod
    def of(
        cls,
        *,
        entities: Sequence[str] | None = None,
        aspects: Sequence[str] | None = None,
        urn_like: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
    ) -> RowFilter:
        return cls(
            tuple(entities or ()), tuple(aspects or ()), urn_like or None, _as_utc_naive(since), _as_utc_naive(until)
        )

    @property
    def narrowing(self) -> bool:
        return bool(self.entities or self.aspects or self.urn_like or self.since or self.until or self.keys)

    def to_options(self) -> dict[str, str]:
        return {
            "filter": json.dumps(
                {
                    "entities": list(self.entities),
                    "aspects": list(self.aspects),
                    "urn_like": self.urn_like,
                    "since": self.since.isoformat() if self.since else None,
                    "until": self.until.isoformat() if self.until else None,
                    "keys": [list(k) for k in self.keys],
                }
            )
        }

    @classmethod
    def from_options(cls, options: dict[str, str]) -> RowFilter:
        raw = json.loads(options.get("filter") or "{}")
        return cls(
            tuple(raw.get("entities") or ()),
            tuple(raw.get("aspects") or ()),
            raw.get("urn_like"),
            _as_utc_naive(raw.get("since")),
            _as_utc_naive(raw.get("until")),
            tuple(tuple(k) for k in raw.get("keys") or ()),
        )

    def where(self, params: list[Any]) -> str:
        """SQL conditions (after `version = 0`), appending their parameters to `params`."""
        conditions = ["version = 0"]
        if self.entities:
            params.append([f"urn:li:{_like_escape(e)}:%" for e in self.entities])
            conditions.append(f"urn LIKE ANY(${len(params)}::text[])")
        if self.aspects:
            params.append(list(self.aspects))
            conditions.append(f"aspect = ANY(${len(params)}::text[])")
        if self.urn_like:
            params.append(self.urn_like)
            conditions.append(f"urn LIKE ${len(params)}")
        if self.since:
            params.append(self.since)
            conditions.append(f"createdon >= ${len(params)}")
        if self.until:
            params.append(self.until)
            conditions.append(f"createdon < ${len(params)}")
        if self.keys:
            params.append([k[0] for k in self.keys])
            params.append([k[1] for k in self.keys])
            conditions.append(
                f"(urn, aspect) IN (SELECT * FROM unnest(${len(params) - 1}::text[], ${len(params)}::text[]))"
            )
        return " AND ".join(conditions)


def bucket_sql(partitions: int, params: list[Any]) -> str:
    """The condition selecting one bucket (`$n` = bucket number) of `partitions`: every row of one urn together."""
    params.append(partitions)
    n = len(params)
    params.append(0)  # placeholder: the bucket number, set per partition
    return f"mod(hashtext(urn)::bigint + 2147483648, ${n}::bigint) = ${n + 1}::bigint"


def latest_query(
    row_filter: RowFilter, partitions: int, *, keys_only: bool = False, ordered: bool = False
) -> tuple[str, list[Any]]:
    """The SELECT of one bucket and its parameters (the last one is the bucket number, to be set); `ordered`: sorted
    by (urn, aspect) in byte order."""
    params: list[Any] = []
    where = row_filter.where(params)
    if partitions > 1:
        where += " AND " + bucket_sql(partitions, params)
    columns = "urn, aspect" + f", {_VERSION_SQL} AS version"
    if not keys_only:
        columns += ", metadata, systemmetadata"
    columns += ", createdon"
    order = ' ORDER BY urn COLLATE "C", aspect COLLATE "C"' if ordered else ""
    return f"SELECT {columns} FROM metadata_aspect_v2 WHERE {where}{order}", params


async def count_latest(database_url: str, row_filter: RowFilter) -> int:
    """How many latest rows the filter selects (the progress total)."""
    import asyncpg

    params: list[Any] = []
    sql = f"SELECT count(*) FROM metadata_aspect_v2 WHERE {row_filter.where(params)}"
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        return int(await conn.fetchval(sql, *params))
    finally:
        await conn.close()


async def fetch_latest(database_url: str, row_filter: RowFilter) -> list[dict[str, Any]]:
    """The selected latest rows on the driver (small selections: repair, catch-up checks)."""
    import asyncpg

    sql, params = latest_query(row_filter, 1)
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        return [dict(r) for r in await conn.fetch(sql, *params)]
    finally:
        await conn.close()


class BucketPartition(InputPartition):
    def __init__(self, bucket: int) -> None:
        super().__init__(bucket)
        self.bucket = bucket


class LatestAspectsReader(DataSourceReader):
    def __init__(self, options: dict[str, str], keys_only: bool) -> None:
        self.dsn = asyncpg_dsn(options["database_url"])
        self.partition_count = max(1, int(options.get("partitions") or 1))
        self.chunk = max(100, int(options.get("chunk") or DEFAULT_CHUNK))
        self.row_filter = RowFilter.from_options(options)
        self.keys_only = keys_only
        self.ordered = str(options.get("ordered", "false")).lower() == "true"

    def partitions(self) -> Sequence[InputPartition]:
        return [BucketPartition(i) for i in range(self.partition_count)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import asyncpg
        import pyarrow as pa

        sql, params = latest_query(
            self.row_filter, self.partition_count, keys_only=self.keys_only, ordered=self.ordered
        )
        if self.partition_count > 1:
            params[-1] = cast(BucketPartition, partition).bucket  # Spark hands back the ones `partitions` made
        names = (
            ["urn", "aspect", "version"] + ([] if self.keys_only else ["metadata", "systemmetadata"]) + ["createdon"]
        )
        types = (
            [pa.string(), pa.string(), pa.int64()]
            + ([] if self.keys_only else [pa.string(), pa.string()])
            + [pa.timestamp("us", tz="UTC")]
        )
        schema = pa.schema(list(zip(names, types)))
        loop = asyncio.new_event_loop()
        conn = None
        try:
            conn = loop.run_until_complete(asyncpg.connect(self.dsn))
            loop.run_until_complete(conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"))
            loop.run_until_complete(conn.execute("SET LOCAL jit = off"))
            cursor = loop.run_until_complete(conn.cursor(sql, *params))
            while True:
                rows = loop.run_until_complete(cursor.fetch(self.chunk))
                if not rows:
                    break
                columns = list(zip(*rows))
                arrays = []
                for i, kind in enumerate(types):
                    values: Sequence[Any] = columns[i]
                    if i == len(types) - 1:  # createdon: naive UTC → aware
                        values = [v.replace(tzinfo=UTC) if v is not None else None for v in values]
                    arrays.append(pa.array(values, type=kind))
                yield pa.RecordBatch.from_arrays(arrays, schema=schema)
                if len(rows) < self.chunk:
                    break
            loop.run_until_complete(conn.execute("COMMIT"))
        finally:
            if conn is not None:
                loop.run_until_complete(conn.close())
            loop.close()


class LatestAspectsDataSource(DataSource):
    """Options: `database_url`, `partitions`, `chunk`, `filter` (JSON of `RowFilter`), `keys_only` ("true"),
    `ordered` ("true": each bucket sorted by (urn, aspect), byte order)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _keys_only(self) -> bool:
        return str(self.options.get("keys_only", "false")).lower() == "true"

    def schema(self) -> str:
        return KEYS_SCHEMA if self._keys_only() else LATEST_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return LatestAspectsReader(dict(self.options), self._keys_only())


_registered: set[int] = set()


def register(spark: Any) -> None:
    key = id(spark)
    if key not in _registered:
        spark.dataSource.register(LatestAspectsDataSource)
        _registered.add(key)


def read_latest_aspects(
    spark: Any,
    settings: Any,
    row_filter: RowFilter | None = None,
    *,
    partitions: int | None = None,
    keys_only: bool = False,
    chunk: int = DEFAULT_CHUNK,
    ordered: bool = False,
) -> Any:
    """The latest rows selected by `row_filter`, read by `partitions` (default `spark_restore_partitions`) tasks;
    `ordered`: each partition sorted by (urn, aspect) (byte order) by Postgres."""
    if not settings.database_url:
        raise RuntimeError("METALEDGER_DATABASE_URL is not set: nothing to read metadata_aspect_v2 from")
    register(spark)
    options = {
        "database_url": settings.database_url,
        "partitions": str(partitions or settings.spark_restore_partitions),
        "chunk": str(chunk),
        "keys_only": "true" if keys_only else "false",
        "ordered": "true" if ordered else "false",
        **(row_filter or RowFilter()).to_options(),
    }
    return spark.read.format(SOURCE_NAME).options(**options).load()
