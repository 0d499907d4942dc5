"""DataHub's Timeline: an entity's history as change transactions, computed from the versions the aspect store keeps.

Port of DataHub's ``TimelineServiceImpl`` over metaledger's store (row 0 = latest, rows 1..N = older versions, at
most RETENTION_MAX_VERSIONS of them per aspect):

* The categories asked for name the aspects read (``CATEGORY_ASPECTS``, DataHub's dataset registry applied to
  every entity type that has the aspects). Each stored version is diffed against the one before it by the differ
  that also makes the Entity Change Events (``app.changelog.entity_change_events.aspect_changes``); only the changes
  of the categories asked for are kept, and a version without any is no transaction.
* The range is [startTime, endTime] on the versions' ``createdon`` (endTime 0: now; startTime -1: a week before
  endTime, as DataHub). The first version in range is diffed against the newest one before it; a first version
  (1, or the first after a delete) against nothing.
* Versions written at the same millisecond are one transaction. Transactions get semantic versions in time order:
  the first ``0.0.0-computed``, then each bumps MAJOR, MINOR or PATCH by its highest change (NONE: unchanged).
* Retention: when the oldest version kept in range had a predecessor that retention pruned, that version cannot be
  diffed: it only serves as the baseline, and the result says the history is incomplete (``truncated``).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import jsonpatch

from app.changelog.entity_change_events import TIMELINE_ASPECTS, SemanticChange, aspect_changes
from app.db import SessionOrConnection
from app.errors import Issue, ValidationFailed
from app.registry import EntityRegistry
from app.timeline.repository import TimelineRepository
from app.write.repository import StoredAspect

log = logging.getLogger("metaledger.timeline")

# DataHub's ChangeCategory. The aspects each is read from: DataHub's dataset registry (TimelineServiceImpl), plus
# the `documentation` aspect for DOCUMENTATION and, metaledger's own, DEPRECATION and LIFECYCLE (the entity's key
# aspect is added for LIFECYCLE). Categories without aspects are accepted and yield nothing, as in DataHub.
CATEGORY_ASPECTS: dict[str, tuple[str, ...]] = {
    "DOCUMENTATION": (
        "institutionalMemory",
        "editableDatasetProperties",
        "datasetProperties",
        "documentation",
        "editableSchemaMetadata",
        "schemaMetadata",
    ),
    "GLOSSARY_TERM": ("glossaryTerms", "editableSchemaMetadata"),
    "OWNERSHIP": ("ownership",),
    "TECHNICAL_SCHEMA": ("schemaMetadata",),
    "TAG": ("globalTags", "editableSchemaMetadata", "schemaMetadata"),
    "DOMAIN": ("domains",),
    "DEPRECATION": ("deprecation",),
    "LIFECYCLE": ("status",),
    "RUN": (),
    "BUSINESS_ATTRIBUTE": (),
    "STRUCTURED_PROPERTY": ("structuredProperties",),
    "APPLICATION": (),
    "PARENT": (),
    "RELATED_ENTITIES": (),
    "ASSET_MEMBERSHIP": (),
}
# `datahub timeline --category owner` sends OWNERSHIP; older clients sent OWNER.
CATEGORY_ALIASES = {"OWNER": "OWNERSHIP"}

DEFAULT_LOOKBACK_MS = 7 * 24 * 60 * 60 * 1000
_SEMVER_ORDER = {"NONE": 0, "PATCH": 1, "MINOR": 2, "MAJOR": 3}
_EPOCH = datetime(1970, 1, 1)


def parse_categories(raw: list[str]) -> frozenset[str]:
    """The categories of the query: repeated and/or comma-separated (`datahub timeline` joins them with commas),
    any case; 400 naming `categories` for an unknown one or none at all."""
    names = [part.strip().upper() for value in raw for part in value.split(",") if part.strip()]
    if not names:
        raise ValidationFailed("at least one category is required", [Issue("no category", path="$categories")])
    unknown = [n for n in names if n not in CATEGORY_ASPECTS and n not in CATEGORY_ALIASES]
    if unknown:
        raise ValidationFailed(
            f"unknown categories: {', '.join(unknown[:10])}",
            [
                Issue(
                    "unknown category", path="$categories", expected=", ".join(CATEGORY_ASPECTS), found=unknown[0][:100]
                )
            ],
        )
    return frozenset(CATEGORY_ALIASES.get(n, n) for n in names)


def time_range(start_ms: int, end_ms: int, now_ms: int | None = None) -> tuple[int, int]:
    """DataHub's defaults: endTime 0 is now, startTime -1 a week before endTime; 400 when start is after end."""
    end = end_ms if end_ms != 0 else (now_ms if now_ms is not None else int(time.time() * 1000))
    start = start_ms if start_ms != -1 else max(0, end - DEFAULT_LOOKBACK_MS)
    if start > end:
        raise ValidationFailed(
            "startTime is after endTime", [Issue("startTime after endTime", path="$startTime", found=str(start))]
        )
    return start, end


def millis(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def _from_millis(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


@dataclass
class _Step:
    """One version of one aspect with its changes from the version before it."""

    aspect: str
    row: StoredAspect
    previous: dict[str, Any] | None
    changes: list[SemanticChange]


@dataclass
class Timeline:
    transactions: list[dict[str, Any]]
    # aspect -> the oldest version kept in range, whose predecessors retention pruned (empty: the history is whole)
    truncated: dict[str, int] = field(default_factory=dict)
    complete_from_ms: int | None = None  # with `truncated`: the history is whole from this time on


class TimelineService:
    def __init__(self, session: SessionOrConnection, registry: EntityRegistry) -> None:
        self.repo = TimelineRepository(session)
        self.registry = registry

    def aspects_for(self, entity_type: str, categories: frozenset[str]) -> list[str]:
        spec = self.registry.entity(entity_type)
        wanted = {aspect for category in categories for aspect in CATEGORY_ASPECTS[category]}
        if "LIFECYCLE" in categories:
            wanted.add(spec.key_aspect)
        return sorted(a for a in wanted if a in spec.aspect_names and a in TIMELINE_ASPECTS)

    async def timeline(
        self, urn: str, entity_type: str, categories: frozenset[str], start_ms: int, end_ms: int, raw: bool
    ) -> Timeline:
        aspects = self.aspects_for(entity_type, categories)
        rows = await self.repo.versions_in_range(urn, aspects, _from_millis(start_ms), _from_millis(end_ms))
        by_aspect: dict[str, list[StoredAspect]] = defaultdict(list)
        for row in rows:
            by_aspect[row.aspect].append(row)
        floors = await self.repo.version_floors(urn, sorted(by_aspect)) if by_aspect else {}
        start = _from_millis(start_ms)
        steps: list[_Step] = []
        truncated: dict[str, int] = {}
        truncated_at: list[int] = []
        for aspect, versions in sorted(by_aspect.items()):
            versions.sort(key=lambda r: r.version)
            first = versions[0]
            if first.created_on < start:
                previous, pending = first.value, versions[1:]  # the value the range starts from
            elif first.version == floors.get(aspect, 0) + 1:
                previous, pending = None, versions  # the aspect's first version: everything in it is new
            else:
                # Its predecessor was pruned: diffing it against nothing would report everything as added.
                truncated[aspect] = first.version
                truncated_at.append(millis(first.created_on))
                previous, pending = first.value, versions[1:]
            for row in pending:
                changes = [c for c in aspect_changes(urn, aspect, previous, row.value) if c.category in categories]
                if changes:
                    steps.append(_Step(aspect, row, previous, changes))
                previous = row.value
        transactions = _transactions(steps, by_aspect, raw)
        result = Timeline(transactions, truncated, max(truncated_at) if truncated_at else None)
        log.info(
            "timeline computed",
            extra={
                "urn": urn,
                "categories": sorted(categories),
                "aspects": aspects,
                "versions_read": len(rows),
                "transactions": len(transactions),
                "truncated": truncated or None,
            },
        )
        return result


def _transactions(steps: list[_Step], by_aspect: dict[str, list[StoredAspect]], raw: bool) -> list[dict[str, Any]]:
    """DataHub's ChangeTransactions: the steps grouped by millisecond, in time order, with semantic versions."""
    groups: dict[int, list[_Step]] = defaultdict(list)
    for step in steps:
        groups[millis(step.row.created_on)].append(step)
    major = minor = patch = 0
    out = []
    for n, timestamp in enumerate(sorted(groups)):
        group = sorted(groups[timestamp], key=lambda s: s.aspect)
        change = max((c.semver for s in group for c in s.changes), key=_SEMVER_ORDER.__getitem__)
        if n > 0:  # the first transaction is 0.0.0 whatever it changed
            if change == "MAJOR":
                major, minor, patch = major + 1, 0, 0
            elif change == "MINOR":
                minor, patch = minor + 1, 0
            elif change == "PATCH":
                patch += 1
        head = group[0]
        transaction: dict[str, Any] = {
            "timestamp": timestamp,
            "actor": head.row.created_by,
            "semVer": f"{major}.{minor}.{patch}-computed",
            "semVerChange": change,
            "changeEvents": [_event(c, s.row) for s in group for c in s.changes],
            "versionStamp": _version_stamp(by_aspect, timestamp),
        }
        if raw:
            # DataHub keeps one aspect's diff per transaction (the first); we keep the first by aspect name.
            transaction["rawDiff"] = jsonpatch.make_patch(head.previous or {}, head.row.value).patch
        out.append(transaction)
    return out


def _event(change: SemanticChange, row: StoredAspect) -> dict[str, Any]:
    event: dict[str, Any] = {
        "entityUrn": change.entity_urn,
        "category": change.category,
        "operation": change.operation,
    }
    if change.modifier is not None:
        event["modifier"] = change.modifier
    if change.parameters is not None:
        event["parameters"] = change.parameters
    event["auditStamp"] = {"time": millis(row.created_on), "actor": row.created_by}
    event["semVerChange"] = change.semver
    if change.description is not None:
        event["description"] = change.description
    return event


def _version_stamp(by_aspect: dict[str, list[StoredAspect]], timestamp: int) -> str:
    """`aspect:version;...` (DataHub's VersionedUrnUtils.constructVersionStamp): the logical version each aspect read
    had at `timestamp`, aspects in name order."""
    parts = []
    for aspect in sorted(by_aspect):
        current = [r.version for r in by_aspect[aspect] if millis(r.created_on) <= timestamp]
        if current:
            parts.append(f"{aspect}:{max(current)}")
    return ";".join(parts)
