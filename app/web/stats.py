"""The Stats tab: a dataset's profiles over time (row count, column count, null counts per field) as charts and
tables, and its operations.

Both are timeseries aspects (`datasetProfile`, `operation`), read from the search backend's timeseries store as
`POST /aspects?action=getTimeseriesAspectValues` reads them (app.api.restli.aspects): through the backend as the
signed-in principal may search it, after waiting (bounded) for the indexer to apply what was written before the page
was asked for, newest first, bounded. The query parameters choose the time range (`range`) and the field whose null
counts are drawn (`field`; every field, up to FIELDS_CHARTED, without it)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from app.api.deps import get_index_wait, scoped_search_backend
from app.errors import MetaledgerError
from app.search.model import TimeseriesPoint, TimeseriesQuery
from app.web.catalog import short_name
from app.web.charts import DAY_MS, LineChart, Timed, line_chart
from app.web.paths import entity_url
from app.web.tabs import Tab, TabRequest

PROFILE = "datasetProfile"
OPERATION = "operation"
PROFILES_SHOWN = 100
OPERATIONS_SHOWN = 50
FIELDS_CHARTED = 12  # small multiples drawn when no one field is chosen
MAX_FIELD_PARAM = 1000
# `range` -> (label, days back; None: every profile kept, the newest PROFILES_SHOWN of them)
RANGES: dict[str, tuple[str, int | None]] = {
    "7d": ("Last 7 days", 7),
    "30d": ("Last 30 days", 30),
    "90d": ("Last 90 days", 90),
    "365d": ("Last year", 365),
    "all": ("All time", None),
}
DEFAULT_RANGE = "all"


def _count(raw: Any) -> int | None:
    """A count as a profile holds it (a long; some writers send it as a string)."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit() and len(raw) < 20:
        return int(raw)
    return None


def _millis(value: dict[str, Any], key: str, fallback: int) -> int:
    found = _count(value.get(key))
    return found if found is not None and found >= 0 else fallback


@dataclass(frozen=True, slots=True)
class ProfileRow(Timed):
    at: int  # timestampMillis
    rows: int | None
    columns: int | None
    nulls: dict[str, int | None]  # fieldPath -> nullCount


@dataclass(frozen=True, slots=True)
class OperationRow(Timed):
    at: int  # when the operation happened (lastUpdatedTimestamp), else when it was reported
    kind: str
    actor: str | None
    actor_url: str | None
    rows_affected: int | None
    source: str | None


@dataclass(slots=True)
class Stats:
    range: str
    ranges: dict[str, tuple[str, int | None]]
    profiles: list[ProfileRow] = field(default_factory=list)  # newest first
    fields: list[str] = field(default_factory=list)  # every field profiled, in the newest profile's order first
    chosen_field: str | None = None
    charted_fields: list[str] = field(default_factory=list)
    rows_chart: LineChart | None = None
    columns_chart: LineChart | None = None
    null_charts: list[LineChart] = field(default_factory=list)
    operations: list[OperationRow] = field(default_factory=list)
    unavailable: str | None = None  # why nothing could be read (no search backend now)
    limit: int = PROFILES_SHOWN


def _profile(point: TimeseriesPoint) -> ProfileRow:
    value = point.value
    nulls: dict[str, int | None] = {}
    for profiled in value.get("fieldProfiles") or []:
        if isinstance(profiled, dict) and isinstance(profiled.get("fieldPath"), str):
            nulls[profiled["fieldPath"]] = _count(profiled.get("nullCount"))
    return ProfileRow(
        _millis(value, "timestampMillis", point.timestamp_ms),
        _count(value.get("rowCount")),
        _count(value.get("columnCount")),
        nulls,
    )


def _operation(point: TimeseriesPoint) -> OperationRow:
    value = point.value
    kind = str(value.get("operationType") or "UNKNOWN")
    if kind == "CUSTOM" and isinstance(value.get("customOperationType"), str):
        kind = value["customOperationType"]
    actor = value.get("actor") if isinstance(value.get("actor"), str) else None
    source = value.get("sourceType")
    return OperationRow(
        at=_millis(value, "lastUpdatedTimestamp", point.timestamp_ms),
        kind=kind,
        actor=short_name(actor) if actor else None,
        actor_url=entity_url(actor) if actor else None,
        rows_affected=_count(value.get("numAffectedRows")),
        source=source if isinstance(source, str) else None,
    )


def _series(profiles: list[ProfileRow], pick: Any) -> list[tuple[int, int]]:
    return [(p.at, value) for p in profiles if (value := pick(p)) is not None]


async def stats(tab: TabRequest) -> Stats:
    params = tab.params
    chosen_range = params.get("range", DEFAULT_RANGE)
    if chosen_range not in RANGES:
        chosen_range = DEFAULT_RANGE
    found = Stats(range=chosen_range, ranges=RANGES)
    days = RANGES[chosen_range][1]
    # open at its end: a profile stamped later than this server's clock (a writer's clock ahead) is still shown
    start = None if days is None else int(time.time() * 1000) - days * DAY_MS
    try:
        backend = await scoped_search_backend(tab.request, tab.session.principal)
        caught_up = await get_index_wait(tab.request)
        await caught_up()  # a profile written just before the page was asked for is on it
        profiles = await backend.timeseries(
            TimeseriesQuery(urn=tab.view.urn, aspect=PROFILE, start_ms=start, limit=PROFILES_SHOWN)
        )
        operations = await backend.timeseries(
            TimeseriesQuery(urn=tab.view.urn, aspect=OPERATION, start_ms=start, limit=OPERATIONS_SHOWN)
        )
    except MetaledgerError as error:
        found.unavailable = error.message
        return found
    found.profiles = [_profile(p) for p in profiles]
    found.operations = [_operation(p) for p in operations]
    for profile in found.profiles:
        found.fields.extend(path for path in profile.nulls if path not in found.fields)
    wanted = params.get("field", "")[:MAX_FIELD_PARAM]
    found.chosen_field = wanted if wanted in found.fields else None
    found.charted_fields = [found.chosen_field] if found.chosen_field else found.fields[:FIELDS_CHARTED]
    found.rows_chart = line_chart("stats-rows", "Row count", "rows", _series(found.profiles, lambda p: p.rows))
    found.columns_chart = line_chart(
        "stats-columns", "Column count", "columns", _series(found.profiles, lambda p: p.columns)
    )
    found.null_charts = [
        line_chart(
            f"stats-nulls-{index}",
            f"Null count of {path}",
            "nulls",
            _series(found.profiles, lambda p, path=path: p.nulls.get(path)),
        )
        for index, path in enumerate(found.charted_fields)
    ]
    return found


async def _load(tab: TabRequest) -> dict[str, object]:
    return {"stats": await stats(tab)}


TAB = Tab(load=_load, styles=("stats.css",))
