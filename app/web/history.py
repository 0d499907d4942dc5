"""The History tab: the kept versions of each aspect of an entity (who wrote each, when, in which run and trace), a
diff between two versions of one aspect, and the Timeline's change transactions by category.

All of it is read as the session's principal, with the APIs' read rule:
* the versions: the Timeline's read of every kept version (TimelineRepository.versions_in_range over all time, as the
  MCP tools' aspect history reads them), each row kept only if the principal may read it (the entity itself was
  read by `catalog.entity` through EntityReader before the tab loads: an entity it may not see is a 404 page);
* the two versions compared: EntityReader.aspect, the read of v3's `GET …/{aspect}?version=` (the read rule, and the
  values of soft-deleted structured properties left out);
* the change list: TimelineService after the check the timeline route makes (an unreadable entity has none).

Query parameters, all optional: `aspect`, `from`, `to` (the diff; by default the newest version of the aspect changed
last against the one before it), `before` (older versions of `aspect`), `category` (repeated) and `since` (the change
list). A parameter that names nothing there is said on the page; the rest of the tab still shows."""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import orjson

from app.changelog.entity_change_events import SemanticChange, aspect_changes
from app.errors import NotFound, ValidationFailed, clip
from app.timeline.repository import TimelineRepository
from app.timeline.service import CATEGORY_ASPECTS, TimelineService, parse_categories, time_range
from app.web.catalog import short_name
from app.web.paths import HISTORY, entity_url
from app.web.tabs import Tab, TabRequest
from app.write.reader import EntityReader
from app.write.repository import StoredAspect

VERSIONS_PER_PAGE = 10  # versions listed per aspect; the rest a link away
MAX_TRANSACTIONS = 50  # change transactions listed, newest first
MAX_CHANGED_PATHS = 300  # rows of the structural diff
MAX_LINES_COMPARED = 20_000  # lines of each pretty-printed version beyond which no line diff is computed (difflib)
MAX_DIFF_LINES = 2_000  # lines of the line diff shown
MAX_VALUE_CHARS = 300  # of a value shown in the structural diff
MAX_DEPTH = 64  # below this depth a changed subtree is one change (a value nested deeper is shown whole)
_EPOCH = datetime(1970, 1, 1)
_END_OF_TIME = datetime(9999, 12, 31)  # every kept version, whatever the clocks of the writers said
_VERSION = re.compile(r"[0-9]{1,12}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# `since` -> the days of the change list's period (None: all the kept history)
PERIODS: dict[str, tuple[str, int | None]] = {
    "all": ("All kept history", None),
    "day": ("The last 24 hours", 1),
    "week": ("The last 7 days", 7),
    "month": ("The last 30 days", 30),
    "year": ("The last 365 days", 365),
}
CATEGORY_LABELS = {
    "TAG": "Tags",
    "OWNERSHIP": "Ownership",
    "DOCUMENTATION": "Documentation",
    "GLOSSARY_TERM": "Glossary terms",
    "TECHNICAL_SCHEMA": "Schema",
    "DOMAIN": "Domain",
    "DEPRECATION": "Deprecation",
    "LIFECYCLE": "Lifecycle",
    "STRUCTURED_PROPERTY": "Structured properties",
}


class Refused(Exception):
    """A query parameter that names nothing this tab has: said on the page, in place of what it asked for."""


# --- what the template shows


@dataclass(frozen=True, slots=True)
class VersionRow:
    version: int
    latest: bool  # the current value (row 0)
    created_by: str
    created_on: datetime
    run_id: str | None
    trace_id: str | None

    @property
    def actor_name(self) -> str:
        return short_name(self.created_by)

    @property
    def actor_url(self) -> str | None:
        return entity_url(self.created_by)


@dataclass(slots=True)
class AspectHistory:
    name: str
    kept: int  # versions kept of it
    versions: list[VersionRow]  # the page shown, newest first
    compare_urls: dict[int, tuple[int, str]]  # version -> the kept version before it, and the diff of the two
    first_shown: int  # position (1-based, newest first) of the first version shown
    open: bool  # the chosen aspect is shown unfolded
    newer_url: str | None = None
    older_url: str | None = None
    pruned_before: int | None = None  # the oldest kept version, when retention pruned those before it


@dataclass(frozen=True, slots=True)
class PathChange:
    kind: str  # "added", "removed" or "changed"
    path: str
    old: str | None
    new: str | None

    @property
    def marker(self) -> str:
        return {"added": "+", "removed": "−", "changed": "±"}[self.kind]


@dataclass(frozen=True, slots=True)
class DiffLine:
    kind: str  # "add", "del", "hunk", "file" or "same"
    text: str


@dataclass(slots=True)
class Diff:
    aspect: str
    old: VersionRow
    new: VersionRow
    changes: list[PathChange]
    more_changes: bool  # paths past MAX_CHANGED_PATHS were left out
    semantic: list[SemanticChange]
    lines: list[DiffLine]
    lines_note: str | None  # why the line diff is absent or cut


@dataclass(frozen=True, slots=True)
class EventRow:
    category: str
    operation: str
    description: str


@dataclass(frozen=True, slots=True)
class TransactionRow:
    when: datetime
    actor: str
    sem_ver: str
    sem_ver_change: str
    events: list[EventRow]

    @property
    def actor_name(self) -> str:
        return short_name(self.actor)

    @property
    def actor_url(self) -> str | None:
        return entity_url(self.actor)


@dataclass(slots=True)
class ChangeList:
    categories: list[tuple[str, str, bool]]  # (category, label, chosen) of those this entity type has
    since: str
    transactions: list[TransactionRow] = field(default_factory=list)  # newest first, at most MAX_TRANSACTIONS
    total: int = 0
    truncated: dict[str, int] = field(default_factory=dict)  # aspect -> oldest version kept, its predecessors pruned
    complete_from: datetime | None = None


@dataclass(slots=True)
class HistoryPage:
    url: str  # the tab's own path, the forms' action
    aspects: list[AspectHistory]
    focus: str | None  # the aspect whose versions the diff form offers
    focus_versions: list[VersionRow]
    chosen_from: int | None
    chosen_to: int | None
    diff: Diff | None
    changes: ChangeList
    problems: list[str]
    keep_for_diff: list[tuple[str, str]]  # the change list's parameters, carried by the diff forms
    keep_for_changes: list[tuple[str, str]]  # the diff's parameters, carried by the change list's form
    per_page: int = VERSIONS_PER_PAGE
    periods: dict[str, tuple[str, int | None]] = field(default_factory=lambda: PERIODS)


# --- the loader


async def load(tab: TabRequest) -> dict[str, Any]:
    view, params = tab.view, tab.request.query_params
    base = entity_url(view.urn, HISTORY) or ""
    reader = EntityReader(tab.db, tab.registry, tab.session.principal)
    problems: list[str] = []
    by_aspect, floors = await _kept_versions(tab)
    categories, since, keep_for_diff = _change_parameters(tab, problems)
    focus = _focus(params.get("aspect") or None, by_aspect, problems)
    chosen = _diff_parameters(params, problems) if focus is not None else None
    before, chosen_from, chosen_to = chosen or (None, None, None)
    if focus is not None and before is not None and by_aspect[focus][-1].version >= before:
        problems.append(f"No kept version of {focus} is older than {before}: its newest versions are shown.")
        before = None
    asked_aspect = focus if params.get("aspect") else None  # not the default one: the page's own choice
    keep_for_changes = [
        (k, str(v)) for k, v in (("aspect", asked_aspect), ("from", chosen_from), ("to", chosen_to)) if v is not None
    ]

    def link(fragment: str, **wanted: Any) -> str:
        query = [(k, str(v)) for k, v in wanted.items() if v is not None] + keep_for_diff
        return base + ("?" + urlencode(query) if query else "") + "#" + fragment

    aspects = [
        _aspect_history(name, [_version_row(r) for r in by_aspect[name]], floors.get(name, 0), name == focus,
                        before, link)
        for name in (a.name for a in view.aspects)
        if by_aspect.get(name)
    ]  # fmt: skip
    diff = None
    if focus is not None and chosen is not None:
        try:
            diff, chosen_from, chosen_to = await _diff(
                reader, view.entity_type, view.urn, focus, by_aspect[focus], chosen_from, chosen_to
            )
        except Refused as refused:
            problems.append(str(refused))
    page = HistoryPage(
        url=base,
        aspects=aspects,
        focus=focus,
        focus_versions=[_version_row(r) for r in by_aspect[focus]] if focus is not None else [],
        chosen_from=chosen_from,
        chosen_to=chosen_to,
        diff=diff,
        changes=await _change_list(tab, reader, categories, since),
        problems=problems,
        keep_for_diff=keep_for_diff,
        keep_for_changes=keep_for_changes,
    )
    return {"history": page}


TAB = Tab(load=load, styles=("history.css",))


# --- versions


def _version_row(row: StoredAspect) -> VersionRow:
    system = row.system_metadata
    properties = system.get("properties")
    trace = properties.get("telemetryTraceId") if isinstance(properties, dict) else None
    run = system.get("runId")
    return VersionRow(
        version=row.version,
        latest=row.row_version == 0,
        created_by=row.created_by,
        created_on=row.created_on,
        run_id=str(run) if run is not None else None,
        trace_id=str(trace) if trace is not None else None,
    )


async def _kept_versions(tab: TabRequest) -> tuple[dict[str, list[StoredAspect]], dict[str, int]]:
    """Every kept version of the entity's aspects that the principal may read, newest first by aspect, and the
    version floors that tell a first version from one whose predecessors retention pruned."""
    view, principal = tab.view, tab.session.principal
    timeline = TimelineRepository(tab.db)
    names = [a.name for a in view.aspects]  # the aspects of the entity the page read for the principal
    by_aspect: dict[str, list[StoredAspect]] = defaultdict(list)
    for row in await timeline.versions_in_range(view.urn, names, _EPOCH, _END_OF_TIME):
        if principal.may_read(view.entity_type, view.urn, row.aspect, row):
            by_aspect[row.aspect].append(row)
    for versions in by_aspect.values():
        versions.sort(key=lambda r: (r.version, r.row_version == 0), reverse=True)
    floors = await timeline.version_floors(view.urn, sorted(by_aspect)) if by_aspect else {}
    return by_aspect, floors


def _diff_parameters(
    params: Mapping[str, str], problems: list[str]
) -> tuple[int | None, int | None, int | None] | None:
    """`before`, `from` and `to` as versions (each None when absent); None, and a problem said, when one is not."""
    try:
        return (
            _version_parameter(params.get("before"), "before"),
            _version_parameter(params.get("from"), "from"),
            _version_parameter(params.get("to"), "to"),
        )
    except Refused as refused:
        problems.append(str(refused))
        return None


def _version_parameter(raw: str | None, name: str) -> int | None:
    if raw is None or raw == "":
        return None
    if not _VERSION.fullmatch(raw):
        raise Refused(f"“{clip(raw, 40)}” is not a version number: `{name}` takes one, such as 3.")
    return int(raw)


def _focus(raw: str | None, by_aspect: dict[str, list[StoredAspect]], problems: list[str]) -> str | None:
    """The aspect asked for, else the one changed last among those with two kept versions (None: there is none)."""
    if raw is not None:
        if raw in by_aspect:
            return raw
        problems.append(
            f"“{clip(raw, 80)}” is not an aspect of this entity that has versions to show. Its aspects: "
            + ", ".join(sorted(by_aspect))
            + "."
        )
        return None
    changed = [(rows[0].created_on, name) for name, rows in by_aspect.items() if len(rows) >= 2]
    return max(changed)[1] if changed else None


def _aspect_history(
    name: str, kept: list[VersionRow], floor: int, chosen: bool, before: int | None, link: Any
) -> AspectHistory:
    """One aspect's page of versions, newest first: the first page, or (the chosen aspect's) those older than
    `before`."""
    start = 0
    if chosen and before is not None:
        start = next((i for i, v in enumerate(kept) if v.version < before), len(kept))
    shown = kept[start : start + VERSIONS_PER_PAGE]
    compare_urls = {
        v.version: (kept[i + 1].version, link("diff", aspect=name, **{"from": kept[i + 1].version, "to": v.version}))
        for i, v in enumerate(kept)
        if i + 1 < len(kept) and start <= i < start + VERSIONS_PER_PAGE
    }
    history = AspectHistory(name, len(kept), shown, compare_urls, start + 1, chosen)
    if start > 0:
        history.newer_url = link(f"versions-{name}", aspect=name)
    if start + VERSIONS_PER_PAGE < len(kept):
        history.older_url = link(f"versions-{name}", aspect=name, before=shown[-1].version)
    oldest = kept[-1].version
    if oldest > floor + 1:  # neither the first version nor the first after a delete: its predecessors were pruned
        history.pruned_before = oldest
    return history


# --- the diff


async def _diff(
    reader: EntityReader,
    entity_type: str,
    urn: str,
    aspect: str,
    kept_rows: list[StoredAspect],
    chosen_from: int | None,
    chosen_to: int | None,
) -> tuple[Diff, int, int]:
    kept = {r.version: r for r in reversed(kept_rows)}  # a version held by both row 0 and a history row: row 0
    listed = ", ".join(str(v) for v in sorted(kept))
    to_version = chosen_to if chosen_to is not None else max(kept)
    if to_version not in kept:
        raise Refused(f"Version {to_version} of {aspect} is not kept (kept: {listed}).")
    if chosen_from is None:
        older = [v for v in kept if v < to_version]
        if not older:
            raise Refused(
                f"Version {to_version} is the oldest kept version of {aspect}: there is none before it to compare with."
            )
        from_version = max(older)
    elif chosen_from not in kept:
        raise Refused(f"Version {chosen_from} of {aspect} is not kept (kept: {listed}).")
    else:
        from_version = chosen_from
    try:
        # read as v3's GET …/{aspect}?version= reads (0: the current row, whatever its system metadata says)
        old, new = [
            await reader.aspect(entity_type, urn, aspect, 0 if kept[v].row_version == 0 else v)
            for v in (from_version, to_version)
        ]
    except NotFound:
        raise Refused(f"Version {from_version} or {to_version} of {aspect} is no longer kept.") from None
    changes: list[PathChange] = []
    _walk("", old.value, new.value, changes, 0)
    lines, note = _line_diff(old.value, new.value, from_version, to_version)
    diff = Diff(
        aspect=aspect,
        old=_version_row(kept[from_version]),
        new=_version_row(kept[to_version]),
        changes=changes[:MAX_CHANGED_PATHS],
        more_changes=len(changes) > MAX_CHANGED_PATHS,
        semantic=aspect_changes(urn, aspect, old.value, new.value),
        lines=lines,
        lines_note=note,
    )
    return diff, from_version, to_version


def _shown(value: Any) -> str:
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def _key_path(path: str, key: str) -> str:
    if _NAME.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{orjson.dumps(key).decode()}]"


_IDENTITIES = ("fieldPath", "urn", "tag", "owner", "propertyUrn", "dataset", "destinationUrn", "url", "id", "name")


def _identity(old: list[Any], new: list[Any]) -> str | None:
    """The key that names each element of both lists (e.g. a schema field's `fieldPath`), so that an element put in
    front is one addition, not a change of every element after it; None when no key names them all, once each."""
    if not (old or new) or not all(isinstance(e, dict) for e in old + new):
        return None
    for key in _IDENTITIES:
        for items in (old, new):
            names = [e.get(key) for e in items]
            if not all(isinstance(n, (str, int)) and not isinstance(n, bool) for n in names):
                break
            if len(set(names)) != len(names):
                break
        else:
            return key
    return None


def _scalars(old: list[Any], new: list[Any]) -> bool:
    """Whether both lists are sets of distinct scalars (domains, tags as strings, …), compared as sets."""
    for items in (old, new):
        if not all(isinstance(e, (str, int, float, bool)) or e is None for e in items):
            return False
        if len({orjson.dumps(e) for e in items}) != len(items):
            return False
    return True


def _walk(path: str, old: Any, new: Any, out: list[PathChange], depth: int) -> None:
    """The paths where `old` and `new` differ: a key or element added or removed, a value changed."""
    if old == new and type(old) is type(new):
        return
    if len(out) > MAX_CHANGED_PATHS:  # enough to say that more were left out
        return
    here = path or "(the whole value)"
    if depth < MAX_DEPTH and isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys()):
            sub = _key_path(path, key)
            if key not in new:
                out.append(PathChange("removed", sub, _shown(old[key]), None))
            elif key not in old:
                out.append(PathChange("added", sub, None, _shown(new[key])))
            else:
                _walk(sub, old[key], new[key], out, depth + 1)
    elif depth < MAX_DEPTH and isinstance(old, list) and isinstance(new, list):
        _walk_list(path, old, new, out, depth)
    else:
        out.append(PathChange("changed", here, _shown(old), _shown(new)))


def _walk_list(path: str, old: list[Any], new: list[Any], out: list[PathChange], depth: int) -> None:
    key = _identity(old, new)
    if key is not None:
        old_by = {e[key]: e for e in old}
        new_by = {e[key]: e for e in new}
        for name in [n for n in old_by if n not in new_by]:
            out.append(
                PathChange("removed", f"{path}[{key}={orjson.dumps(name).decode()}]", _shown(old_by[name]), None)
            )
        for name, element in new_by.items():
            sub = f"{path}[{key}={orjson.dumps(name).decode()}]"
            if name not in old_by:
                out.append(PathChange("added", sub, None, _shown(element)))
            else:
                _walk(sub, old_by[name], element, out, depth + 1)
    elif _scalars(old, new):
        old_set, new_set = {orjson.dumps(e) for e in old}, {orjson.dumps(e) for e in new}
        for element in old:
            if orjson.dumps(element) not in new_set:
                out.append(PathChange("removed", f"{path}[{_shown(element)}]", _shown(element), None))
        for element in new:
            if orjson.dumps(element) not in old_set:
                out.append(PathChange("added", f"{path}[{_shown(element)}]", None, _shown(element)))
    else:
        for index in range(max(len(old), len(new))):
            sub = f"{path}[{index}]"
            if index >= len(new):
                out.append(PathChange("removed", sub, _shown(old[index]), None))
            elif index >= len(old):
                out.append(PathChange("added", sub, None, _shown(new[index])))
            else:
                _walk(sub, old[index], new[index], out, depth + 1)


def _line_diff(old: Any, new: Any, from_version: int, to_version: int) -> tuple[list[DiffLine], str | None]:
    """A unified diff of the two values pretty-printed (keys sorted), each line marked + or − as well as coloured."""
    pretty = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
    before = orjson.dumps(old, option=pretty).decode().splitlines()
    after = orjson.dumps(new, option=pretty).decode().splitlines()
    if max(len(before), len(after)) > MAX_LINES_COMPARED:
        return [], f"These versions are too large for a line diff (over {MAX_LINES_COMPARED:,} lines)."
    lines: list[DiffLine] = []
    for text in difflib.unified_diff(before, after, f"version {from_version}", f"version {to_version}", lineterm=""):
        if len(lines) == MAX_DIFF_LINES:
            return lines, f"The line diff is cut after {MAX_DIFF_LINES:,} lines."
        if text.startswith(("---", "+++")):
            kind = "file"
        elif text.startswith("@@"):
            kind = "hunk"
        else:
            kind = {"+": "add", "-": "del"}.get(text[:1], "same")
        lines.append(DiffLine(kind, text))
    return lines, None


# --- the change list


def _change_parameters(tab: TabRequest, problems: list[str]) -> tuple[frozenset[str], str, list[tuple[str, str]]]:
    """The categories (none asked for: all this entity type has) and the period asked for, and the same as query
    parameters for the other forms to carry."""
    params = tab.request.query_params
    asked = [c for c in params.getlist("category") if c.strip()]
    categories: frozenset[str] = frozenset()
    if asked:
        try:
            categories = parse_categories(asked)
        except ValidationFailed as refused:
            problems.append(f"The change list shows every category: {clip(refused.message, 200)}.")
    since = params.get("since") or "all"
    if since not in PERIODS:
        problems.append(f"“{clip(since, 40)}” is not a period; the change list shows all the kept history.")
        since = "all"
    keep = [("category", c) for c in sorted(categories)] + ([("since", since)] if since != "all" else [])
    return categories, since, keep


async def _change_list(tab: TabRequest, reader: EntityReader, asked: frozenset[str], since: str) -> ChangeList:
    view = tab.view
    service = TimelineService(tab.db, tab.registry)
    order = list(CATEGORY_LABELS)
    available = sorted(
        (c for c in CATEGORY_ASPECTS if service.aspects_for(view.entity_type, frozenset({c}))),
        key=lambda c: order.index(c) if c in order else len(order),
    )
    chosen = asked or frozenset(available)
    changes = ChangeList(
        categories=[(c, CATEGORY_LABELS.get(c, c.replace("_", " ").capitalize()), c in chosen) for c in available],
        since=since,
    )
    days = PERIODS[since][1]
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    start, end = time_range(0 if days is None else now_ms - days * 86_400_000, now_ms)
    if await reader.unreadable([view.urn]):  # the timeline route's read rule
        return changes
    result = await service.timeline(view.urn, view.entity_type, chosen, start, end, raw=False)
    changes.total = len(result.transactions)
    for transaction in reversed(result.transactions[-MAX_TRANSACTIONS:]):
        changes.transactions.append(
            TransactionRow(
                when=_EPOCH + timedelta(milliseconds=transaction["timestamp"]),
                actor=transaction["actor"],
                sem_ver=transaction["semVer"],
                sem_ver_change=transaction["semVerChange"],
                events=[
                    EventRow(e["category"], e["operation"], e.get("description") or e.get("modifier") or "")
                    for e in transaction["changeEvents"]
                ],
            )
        )
    changes.truncated = result.truncated
    if result.complete_from_ms is not None:
        changes.complete_from = _EPOCH + timedelta(milliseconds=result.complete_from_ms)
    return changes
