"""Searching several entity types as one result list (GraphQL's scrollAcrossEntities and searchAcrossEntities), and
filtering a lineage walk the same way (scrollAcrossLineage, searchAcrossLineage).

The backends page one entity type at a time, each with a keyset cursor on (sort key, urn). A search across types
walks them in the order given, one after the other; its cursor is composite: which type it is in, and that type's
cursor (the position after the last hit returned). Because the per-type cursors are keyset positions, not offsets,
entities written or deleted between pages never cause an entity that exists throughout to be skipped or returned
twice. The total is counted once, on the first page, and carried in the cursor: a scroll's pages agree on it.

The cursor also carries a fingerprint of the search (types, query, filters, sort): a cursor handed to another
search is refused rather than silently paging through something else.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import orjson

from app import read_deadline
from app.errors import Issue, ValidationFailed
from app.limits import clip
from app.search import lineage
from app.search.cursors import (
    AcrossCursor,
    InvalidCursor,
    LineageCursor,
    across_cursor,
    decode_across,
    decode_lineage,
    decode_offset,
    lineage_cursor,
)
from app.search.lineage import Path
from app.search.model import (
    EQUALITY_CONDITIONS,
    MAX_PAGE_SIZE,
    REMOVED_FIELD,
    URN_FIELD,
    Criterion,
    SearchBackend,
    SearchHit,
    SearchPage,
)


@dataclass(frozen=True, slots=True)
class TypeSearch:
    """What to search in one entity type: its `any_of` groups (None: no such condition). Per type, because the
    caller resolves type-dependent criteria (DataHub's `_entityType`) before it gets here."""

    entity_type: str
    any_of: tuple[tuple[Criterion, ...], ...] | None = None
    include_removed: bool = False  # soft-deleted entities too (unless `any_of` says otherwise about `removed`)

    @property
    def filters(self) -> dict[str, list[str]] | None:
        return {REMOVED_FIELD: []} if self.include_removed else None  # an empty list: either value


@dataclass(frozen=True, slots=True)
class AcrossPage:
    hits: list[SearchHit]
    total: int
    scroll_id: str | None  # None: no further page


def _fingerprint(searches: Sequence[TypeSearch], query: str, sort: list[tuple[str, str]] | None) -> str:
    described = [
        [
            s.entity_type,
            s.include_removed,
            [[[c.field, list(c.values), c.negated, c.condition] for c in g] for g in s.any_of]
            if s.any_of is not None
            else None,
        ]
        for s in searches
    ]
    return hashlib.sha256(orjson.dumps([described, query, sort])).hexdigest()[:16]


def _batches(backend: SearchBackend) -> bool:
    """Whether the backend answers count-only searches in batches (app.search.postgres.CountBatch: `count_batch()`,
    `search(..., batch=)`); such a backend also counts a page's total only when asked (`search(..., total=)`)."""
    return callable(getattr(backend, "count_batch", None))


async def _counted(
    backend: SearchBackend,
    searches: Sequence[TypeSearch],
    query: str,
    *,
    facets: bool,
    property_facets: Sequence[str] = (),
) -> list[SearchPage]:
    """The count-only page of each search (its total, and its facets with `facets`): in as few statements as the
    backend's batch makes of them (every type at once where the conditions do not depend on the type), else one
    search per type, concurrently. The batch is filled through `search`, so what a wrapper of the backend adds to a
    search (the read rule's scope) is in it; a search a wrapper answered itself leaves the batch short, and then
    every search is run on its own."""

    def search(s: TypeSearch, **batch: Any) -> Awaitable[SearchPage]:
        return backend.search(
            s.entity_type,
            query,
            filters=s.filters,
            count=0,
            any_of=s.any_of,
            facets=facets,
            property_facets=property_facets,
            **batch,
        )

    batch = cast(Any, backend).count_batch() if _batches(backend) else None
    if batch is not None and searches:
        for s in searches:
            await search(s, batch=batch)
        if len(batch) == len(searches):
            return list(await batch.run())
    return list(await asyncio.gather(*(search(s) for s in searches)))


async def _type_totals(backend: SearchBackend, searches: Sequence[TypeSearch], query: str) -> list[int]:
    """The matches of each search."""
    return [page.total for page in await _counted(backend, searches, query, facets=False)]


@dataclass(frozen=True, slots=True)
class AcrossFacets:
    totals: dict[str, int]  # entity type -> its matches
    values: dict[str, dict[str, int]]  # filter field -> value -> matches, summed over the types


async def facets_across(
    backend: SearchBackend, searches: Sequence[TypeSearch], query: str, property_facets: Sequence[str] = ()
) -> AcrossFacets:
    """The facet counts of a search across types: each type's matches counted by the values of its filter fields
    and of `property_facets` (`_counted`), summed field by field."""
    pages = await _counted(backend, searches, query, facets=True, property_facets=property_facets)
    totals: dict[str, int] = {}
    values: dict[str, dict[str, int]] = {}
    for search, page in zip(searches, pages, strict=True):
        totals[search.entity_type] = totals.get(search.entity_type, 0) + page.total
        for name, counts in page.facets.items():
            summed = values.setdefault(name, {})
            for value, n in counts.items():
                summed[value] = summed.get(value, 0) + n
    return AcrossFacets(totals, values)


async def scroll_across(
    backend: SearchBackend,
    searches: Sequence[TypeSearch],
    query: str,
    *,
    count: int,
    scroll_id: str | None = None,
    sort: list[tuple[str, str]] | None = None,
) -> AcrossPage:
    """One page of at most `count` hits (0..MAX_PAGE_SIZE) across `searches`, in their order, from `scroll_id`
    (a previous page's; None: the first page; InvalidCursor when it is not one). A page may end at a type's end with
    fewer hits; the last page has no scroll id."""
    if not 0 <= count <= MAX_PAGE_SIZE:
        raise ValidationFailed(
            f"count must be between 0 and {MAX_PAGE_SIZE}",
            [Issue("out of range", path="$count", expected=f"0..{MAX_PAGE_SIZE}", found=str(count))],
        )
    fingerprint = _fingerprint(searches, query, sort)
    first = not scroll_id
    cursor = (
        AcrossCursor(0, None, 0, fingerprint)
        if not scroll_id
        else decode_across(scroll_id, fingerprint=fingerprint, types=len(searches))
    )
    if count == 0 or not searches:
        total = sum(await _type_totals(backend, searches, query)) if first else cursor.total
        return AcrossPage([], total, None)
    # A first page across types counts every type at once: the total, and the types it need not walk (a search
    # for one name across DataHub's 23 searchable types walked 22 empty ones, a page and a count query each, one
    # after the other). An entity written into a type counted empty while the scroll runs is one written during it.
    counted = await _type_totals(backend, searches, query) if first and len(searches) > 1 else None
    # a page's own total is wanted on a single type's first page only (a batching backend counts it only then)
    page_totals: dict[str, Any] = {"total": first and counted is None} if _batches(backend) else {}
    hits: list[SearchHit] = []
    reached = 0  # one type's first page: its matches (the search counts them)
    position, after = cursor.position, cursor.after
    while position < len(searches) and len(hits) < count:
        if counted is not None and counted[position] == 0:
            position += 1
            continue
        search = searches[position]
        try:
            page = await backend.search(
                search.entity_type,
                query,
                filters=search.filters,
                count=count - len(hits),
                scroll_id=after,
                sort=sort,
                any_of=search.any_of,
                facets=False,
                **page_totals,
            )
        except InvalidCursor as error:  # the type's cursor inside this one: the client gave this one
            raise InvalidCursor(scroll_id or "", error.reason) from None
        hits.extend(page.hits)
        reached += page.total
        if page.scroll_id:  # more of this type: the page is full
            after = page.scroll_id
            break
        position, after = position + 1, None
    if counted is not None:
        total = sum(counted)
        while after is None and position < len(searches) and counted[position] == 0:
            position += 1  # no next page that could only be empty
    else:
        total = reached if first else cursor.total
    next_id = across_cursor(AcrossCursor(position, after, total, fingerprint)) if position < len(searches) else None
    return AcrossPage(hits, total, next_id)


async def search_across(
    backend: SearchBackend,
    searches: Sequence[TypeSearch],
    query: str,
    *,
    start: int,
    count: int,
    sort: list[tuple[str, str]] | None = None,
) -> AcrossPage:
    """Offset paging (searchAcrossEntities' start/count): the hits `start..start+count` of the same order as
    `scroll_across`, read through it (start + count is at most MAX_PAGE_SIZE, as DataHub limits it)."""
    if start < 0 or count < 0 or start + count > MAX_PAGE_SIZE:
        raise ValidationFailed(
            f"start + count must be at most {MAX_PAGE_SIZE}",
            [
                Issue(
                    "out of range",
                    path="$start",
                    expected=f"start + count <= {MAX_PAGE_SIZE}",
                    found=f"{start} + {count}",
                )
            ],
        )
    hits: list[SearchHit] = []
    scroll_id: str | None = None
    page = await scroll_across(backend, searches, query, count=start + count, sort=sort)
    while True:
        hits.extend(page.hits)
        scroll_id = page.scroll_id
        if len(hits) >= start + count or not scroll_id:
            break
        page = await scroll_across(
            backend, searches, query, count=start + count - len(hits), scroll_id=scroll_id, sort=sort
        )
    return AcrossPage(hits[start : start + count], page.total, None)


# --- lineage ------------------------------------------------------------------------------------------------------

DEGREE_FIELD = "degree"  # DataHub's virtual filter of a lineage search: the hop count ("1", "2", "3+")


@dataclass(frozen=True, slots=True)
class LineageHit:
    urn: str
    entity_type: str
    degree: int  # the fewest hops from the start
    # (urn, entity type) from the start to this entity (or to one of its schema fields, one path each), along a
    # shortest path: DataHub's `paths`
    paths: tuple[Path, ...]


def _degree_test(criteria: Sequence[Criterion]) -> tuple[Callable[[int], bool], int | None]:
    """A predicate on the degree, and the most hops it can accept (None: no bound)."""
    tests: list[Callable[[int], bool]] = []
    bound: int | None = 0 if criteria else None
    for criterion in criteria:
        if criterion.condition not in EQUALITY_CONDITIONS:
            raise ValidationFailed(
                f"the degree filter takes EQUAL or IN, not {criterion.condition}",
                [
                    Issue(
                        "unsupported condition",
                        path="$input.orFilters",
                        expected="EQUAL or IN",
                        found=criterion.condition,
                    )
                ],
            )
        exact: set[int] = set()
        at_least: int | None = None
        for value in criterion.values:
            text = value.strip()
            if text.endswith("+") and text[:-1].isdigit():
                at_least = min(at_least or int(text[:-1]), int(text[:-1]))
            elif text.isdigit():
                exact.add(int(text))
            else:
                raise ValidationFailed(
                    f"degree filter value {clip(value, 40)!r} is not a hop count (1, 2, 3+)",
                    [Issue("not a degree", path="$input.orFilters", found=clip(value, 40))],
                )

        def matches(
            d: int, exact: set[int] = exact, at_least: int | None = at_least, negated: bool = criterion.negated
        ) -> bool:
            return (d in exact or (at_least is not None and d >= at_least)) != negated

        tests.append(matches)
        if bound is not None:
            bound = None if criterion.negated or at_least is not None else max(bound, max(exact, default=0))
    return (lambda degree: all(test(degree) for test in tests)), bound


def lineage_hops(searches: Sequence[TypeSearch], cap: int) -> int:
    """How far a lineage walk must go for these searches' degree filters (at most `cap`)."""
    hops = 0
    for search in searches:
        for group in search.any_of if search.any_of is not None else ((),):
            _, bound = _degree_test([c for c in group if c.field == DEGREE_FIELD])
            hops = max(hops, cap if bound is None else bound)
    return min(max(hops, 1), cap)


# A lineage search's answer is built as far as its request's budget allows and continued by its cursor: the walk
# (app.search.lineage.WalkState) and its filtering go on where the previous page stopped, kept per walk in the
# process (`_WALKS`); a page that lands in a process without it (another worker's cursor, or one evicted) walks again
# from the start to the cursor's position. Every stage is measured against the one budget: walking and filtering
# stop at its gathering share (app.read_deadline.FINISH_SHARE kept back), and a page holds no more results than the
# share kept back completes (RESULT_FINISH_S each).
LINEAGE_CURSOR_LIFETIME_S = 600.0  # how long a walk is kept after its last page, and a lineage cursor is good for
MAX_WALKS = 64  # walks kept at once (the least recently used goes first) ...
MAX_WALKED = 1_000_000  # ... and entities reached, summed over them
FILTER_CHUNK = 500  # hits a filtering statement asks about (per entity type): the budget cuts between them
# What completing one result of a page takes (GraphQL's fields, serialising, sending): 0.03-0.12 ms for pages of
# 333-666 results of bench/reads.py --mix deadline (`degree entity { urn }`) after their walk was done, 0.17 ms for
# the 7,031 of an unbudgeted page, on a 2-core machine at load 5-8. A 500 ms budget's fifth kept back completes 666;
# a query selecting more of each result (its entity's aspects) takes longer than this allows for.
RESULT_FINISH_S = 0.00015


Step = Literal["ask", "finish", "filter"]  # a step of a lineage search: a hop's statement, its end, a filtering one


@dataclass(slots=True)
class LineageWalk:
    """A lineage search's walk and its answer so far: the hits the searches accepted, in the answer's order (by degree,
    then urn), the finished hops' hits not yet asked about, and whether the walk found entities past the degrees it
    answers (`capped`: it walks one hop further than MAX hops to tell)."""

    fingerprint: str
    walk: lineage.WalkState
    answer_hops: int
    group_fields: bool
    hits: list[LineageHit] = field(default_factory=list)
    unfiltered: list[LineageHit] = field(default_factory=list)
    targets: set[str] = field(default_factory=set)  # every result found (a grouped parent at its fewest hops only)
    capped: bool = False
    # how long its last step of each kind took (finishing a hop: an edge of it)
    took: dict[Step, float] = field(default_factory=lambda: {"ask": 0.0, "finish": 0.0, "filter": 0.0})
    used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def complete(self) -> bool:
        return self.walk.done and not self.unfiltered

    async def gather(self, backend: SearchBackend, searches: Sequence[TypeSearch], query: str) -> bool:
        """Walks and filters on, one statement at a time, until the walk is complete or the request's gathering share
        is spent. Whether it got any further."""
        budget = read_deadline.current()
        further = False
        while not self.complete:
            step: Step = "filter" if self.unfiltered else "finish" if self.walk.asked_all else "ask"
            # a step is begun only when what is left of the share holds one like it, by what the last one of its
            # kind took (finishing a hop: by its edges; a filtering statement is not cancelled before the budget's
            # end): but at least one a page, so that a walk whose steps each take longer than the share moves on
            size = len(self.walk.edges) if step == "finish" else 1
            expected = self.took[step] * size if further else 0.0
            if budget is not None and budget.walk_remaining_s() <= expected:
                break
            began = time.monotonic()
            try:
                if step == "filter":
                    await self._filter_next(backend, searches, query)
                elif step == "finish":
                    self._finish_hop()
                else:
                    await self.walk.ask(backend)
            except Exception:
                if budget is None or budget.walk_remaining_s() > 0:
                    raise
                break  # the budget is spent: whatever the backend raised, it raised for lack of time
            self.took[step] = (time.monotonic() - began) / max(size, 1)
            further = True
        return further

    def _finish_hop(self) -> None:
        reached = self.walk.finish_hop()
        if self.walk.hops > self.answer_hops:
            self.capped = self.capped or bool(reached)
            return
        if self.group_fields:
            grouped = lineage.by_parent(self.walk.start, reached)
            new = [LineageHit(g.urn, g.entity_type, g.degree, tuple(g.paths)) for g in grouped]
        else:
            new = [LineageHit(s.urn, s.entity_type, s.degree, (s.path,)) for s in reached]
        new = [hit for hit in new if hit.urn not in self.targets]
        self.targets.update(hit.urn for hit in new)
        self.unfiltered.extend(new)

    async def _filter_next(self, backend: SearchBackend, searches: Sequence[TypeSearch], query: str) -> None:
        chunk = self.unfiltered[:FILTER_CHUNK]
        kept = await _accepted(backend, chunk, searches, query)
        self.hits.extend(hit for hit in chunk if hit.urn in kept)
        del self.unfiltered[: len(chunk)]


class _Walks:
    """The walks of this process's lineage cursors: bounded (MAX_WALKS, MAX_WALKED), the least recently used first
    out, none kept past LINEAGE_CURSOR_LIFETIME_S after its last page."""

    def __init__(self) -> None:
        self._walks: OrderedDict[str, LineageWalk] = OrderedDict()

    def get(self, walk_id: str) -> LineageWalk | None:
        self._expire()
        found = self._walks.get(walk_id)
        if found is not None:
            self._walks.move_to_end(walk_id)
            found.used = time.monotonic()
        return found

    def put(self, walk: LineageWalk) -> str:
        self._expire()
        walk_id = secrets.token_urlsafe(12)
        self._walks[walk_id] = walk
        while len(self._walks) > MAX_WALKS or (
            len(self._walks) > 1 and sum(len(w.walk.paths) for w in self._walks.values()) > MAX_WALKED
        ):
            self._walks.popitem(last=False)
        return walk_id

    def clear(self) -> None:
        self._walks.clear()

    def _expire(self) -> None:
        oldest = time.monotonic() - LINEAGE_CURSOR_LIFETIME_S
        while self._walks and next(iter(self._walks.values())).used < oldest:
            self._walks.popitem(last=False)


_WALKS = _Walks()


@dataclass(frozen=True, slots=True)
class LineageAsked:
    """What a lineage search asks: from `urn`, `direction`, the entities within `hops` (walking one hop further when
    `tell_cap`, to say whether the cap cut it) that `searches` and `query` accept; schema fields as their parent
    unless `group_fields` is off (DataHub's default grouping of a lineage search). `caller`: whose search it is (a
    cursor, and the walk it continues, are good for that caller's search only)."""

    urn: str
    direction: Literal["UPSTREAM", "DOWNSTREAM"]
    searches: Sequence[TypeSearch]
    query: str
    hops: int
    tell_cap: bool
    group_fields: bool
    caller: str

    def fingerprint(self) -> str:
        asked = [self.urn, self.direction, self.hops, self.tell_cap, self.group_fields, self.caller]
        return hashlib.sha256(orjson.dumps([asked, _fingerprint(self.searches, self.query, None)])).hexdigest()[:16]

    def begin(self) -> LineageWalk:
        walk = lineage.WalkState.begin(self.urn, self.direction, self.hops + self.tell_cap)
        return LineageWalk(self.fingerprint(), walk, self.hops, self.group_fields)


@dataclass(frozen=True, slots=True)
class LineagePage:
    """A page of a lineage search: its hits (by degree, then urn: the order of the whole answer), the results found
    so far (all of them once the walk is complete), `partial` when the request's budget cut the page short of its
    count or the hop cap cut the walk, and the cursor of the next page (None: the answer is complete)."""

    hits: list[LineageHit]
    total: int
    partial: bool
    scroll_id: str | None


def page_most(count: int) -> int:
    """The most results a page of `count` holds: what the share of the request's budget kept back to answer
    completes (at least one)."""
    budget = read_deadline.current()
    if budget is None:
        return count
    return min(count, max(1, int(budget.seconds * read_deadline.FINISH_SHARE / RESULT_FINISH_S)))


async def _page(
    backend: SearchBackend,
    asked: LineageAsked,
    walk: LineageWalk,
    start: int,
    count: int,
    *,
    continued: bool,
) -> tuple[list[LineageHit], bool, bool]:
    """The hits `start..` (at most `count`, at most what the budget completes) of `walk`, gathered on to its end
    within the budget (so that a page's `total` is the whole answer's whenever the budget allows: the pages after
    it only read what was found); whether the page is cut (short of `count`, the answer not ended), and whether
    it ends the answer.
    A cut page with nothing to show is `DeadlineExceeded`, unless it `continued` a cursor's walk and got further
    (its cursor then continues from there)."""
    most = page_most(count)
    async with walk.lock:
        further = await walk.gather(backend, asked.searches, asked.query)
        hits = walk.hits[start : start + most]
        ended = walk.complete and start + len(hits) >= len(walk.hits)
    cut = len(hits) < count and not ended
    if cut and not hits and not (continued and further):
        raise read_deadline.DeadlineExceeded("the lineage search found nothing within its time budget").with_issues(
            [Issue("nothing found within the budget", expected=f"a larger {read_deadline.HEADER}")],
            "the lineage search found nothing within its time budget: retry with a larger one",
        )
    if cut:
        read_deadline.mark_partial()
    return hits, cut, ended


async def scroll_lineage(
    backend: SearchBackend, asked: LineageAsked, *, count: int, scroll_id: str | None = None
) -> LineagePage:
    """A page of a lineage search from `scroll_id` (a previous page's; None: the first; an offset a cursor of this
    service gave before walks were kept is taken too): the walk continued where that page stopped (this process's,
    or walked again to its position), never repeating a result nor leaving one out. InvalidCursor when it is no
    cursor of this search, tampered with or expired."""
    fingerprint = asked.fingerprint()
    walk: LineageWalk | None = None
    if not scroll_id:
        start = 0
    elif scroll_id.isascii() and scroll_id.isdigit():
        start = decode_offset(scroll_id)
    else:
        cursor = decode_lineage(
            scroll_id, fingerprint=fingerprint, now=time.time(), lifetime_s=LINEAGE_CURSOR_LIFETIME_S
        )
        start, walk = cursor.position, _WALKS.get(cursor.walk)
        if walk is not None and (walk.fingerprint != fingerprint or start > len(walk.hits)):
            raise InvalidCursor(scroll_id, "not a cursor of this service")
    if walk is None:
        walk = asked.begin()
        walk_id = _WALKS.put(walk)
    else:
        walk_id = cursor.walk
    hits, cut, ended = await _page(backend, asked, walk, start, count, continued=bool(scroll_id))
    next_id = None
    if not ended:
        next_id = lineage_cursor(LineageCursor(walk_id, start + len(hits), fingerprint, int(time.time())))
    return LineagePage(hits, len(walk.hits), cut or (ended and walk.capped), next_id)


async def search_lineage(backend: SearchBackend, asked: LineageAsked, *, start: int, count: int) -> LineagePage:
    """Offset paging (searchAcrossLineage's start/count): the whole walk within the budget (its total), the hits
    `start..start+count` of it."""
    walk = asked.begin()
    hits, cut, _ = await _page(backend, asked, walk, start, count, continued=False)
    return LineagePage(hits, len(walk.hits), cut or not walk.complete or walk.capped, None)


async def _accepted(
    backend: SearchBackend, hits: Sequence[LineageHit], searches: Sequence[TypeSearch], query: str
) -> dict[str, LineageHit]:
    """The `hits` the searches accept: a search's groups filter on degree here; the rest of each group, the query and
    the soft-delete rule are the backend's, asked about the hits by urn."""
    by_type: dict[str, list[LineageHit]] = {}
    for hit in hits:
        by_type.setdefault(hit.entity_type, []).append(hit)
    found = {hit.urn: hit for hit in hits}
    kept: dict[str, LineageHit] = {}
    for search in searches:
        candidates = by_type.get(search.entity_type, [])
        for group in search.any_of if search.any_of is not None else ((),):
            degree_ok, _ = _degree_test([c for c in group if c.field == DEGREE_FIELD])
            rest = tuple(c for c in group if c.field != DEGREE_FIELD)
            urns = [h.urn for h in candidates if degree_ok(h.degree) and h.urn not in kept]
            for chunk_start in range(0, len(urns), 1_000):
                chunk = urns[chunk_start : chunk_start + 1_000]
                filters = {URN_FIELD: chunk, **(search.filters or {})}
                page = await backend.search(
                    search.entity_type, query, filters=filters, count=len(chunk), any_of=(rest,), facets=False
                )
                kept.update((hit.urn, found[hit.urn]) for hit in page.hits)
    return kept
