"""The lineage walk: the one every lineage surface reads (`GET /openapi/v1/lineage/{urn}`, GraphQL's
`searchAcrossLineage`/`scrollAcrossLineage` through app.search.across, `lineage(input:)` of the entity types).

A backend gives the lineage edges breadth first, each with the hop it was reached at (`SearchBackend.lineage`);
`steps` turns them into the entities reached, each once at its fewest hops, with one shortest path from the start
(DataHub's `paths`: the start first, then each entity on the way, a step's `via` entity (the query of a lineage
edge, the job of a job's column lineage) before the entity it leads to). Which way an edge is followed is the
edge's: `DownstreamOf`-like edges point upstream, `DOWNSTREAM_LINEAGE` ones (a job `Produces` its output) point
downstream, so a job between two datasets (`dataJobInputOutput`) is on the walk in both directions.

Column-level lineage is the same walk from a schema field: the edges between schema fields come from
`fineGrainedLineages` (app.search.documents.field_lineage_edges). `by_parent` groups a walk's schema fields under
their parent entity, as DataHub's lineage search answers a column's lineage: the datasets, each with the paths to
its fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from app import read_deadline
from app.errors import Issue
from app.search.model import DOWNSTREAM_LINEAGE, Edge, SearchBackend
from app.urns import InvalidUrnError, parse_urn, type_of

Direction = Literal["UPSTREAM", "DOWNSTREAM"]
Path = tuple[tuple[str, str], ...]  # (urn, entity type), from the start
SCHEMA_FIELD = "schemaField"
SCHEMA_FIELD_PREFIX = "urn:li:schemaField:("


def schema_field_parent(urn: str) -> str | None:
    """The parent entity of a schema field's URN (`urn:li:schemaField:(<parent>,<fieldPath>)`): its first key part,
    as DataHub reads it. None when `urn` is no schema field's."""
    if not urn.startswith(SCHEMA_FIELD_PREFIX):
        return None
    try:
        parts = parse_urn(urn).parts
    except InvalidUrnError:
        return None
    return parts[0] or None if len(parts) >= 2 else None


@dataclass(frozen=True, slots=True)
class LineageStep:
    """An entity the walk reached: at its fewest hops (`degree`), along `path`, by `edge` (the last step's edge: its
    relationship type and stamps)."""

    urn: str
    entity_type: str
    degree: int
    path: Path
    edge: Edge


def far_end(edge: Edge, direction: Direction) -> tuple[str, str, str]:
    """(the entity a step along `edge` reaches, its type, the entity it starts from), walking `direction`."""
    upstream_first = edge.relationship in DOWNSTREAM_LINEAGE  # its source is the upstream end
    if (direction == "UPSTREAM") == upstream_first:
        return edge.source, edge.source_type or type_of(edge.source), edge.destination
    return edge.destination, edge.destination_type or type_of(edge.destination), edge.source


def steps(
    urn: str, direction: Direction, edges: Iterable[tuple[Edge, int]], known: dict[str, Path] | None = None
) -> list[LineageStep]:
    """The entities reached by `edges` (a backend's breadth-first walk from `urn`: each edge with its hop), each once,
    by degree then URN. Among the edges of one hop the order is the edge's own (relationship, source, destination),
    not the backend's, so every backend gives the same path. `known`: the paths of the entities reached before these
    edges' hops (a walk continued hop by hop, WalkState), which the new ones are added to."""
    by_hop: dict[int, list[Edge]] = {}
    for edge, hop in edges:
        by_hop.setdefault(hop, []).append(edge)
    paths: dict[str, Path] = {urn: ((urn, type_of(urn)),)} if known is None else known
    found: dict[str, LineageStep] = {}
    for hop in sorted(by_hop):
        for edge in sorted(by_hop[hop], key=lambda e: (e.relationship, e.source, e.destination, e.via or "")):
            other, other_type, near = far_end(edge, direction)
            if other in paths or near not in paths:
                continue  # reached already (at fewer hops, or earlier in this one), or from nowhere the walk reached
            before = paths[near]
            via = (edge.via, type_of(edge.via)) if edge.via and edge.via not in (other, near) else None
            path = (*before, *((via,) if via else ()), (other, other_type))
            paths[other] = path
            found[other] = LineageStep(other, other_type, hop, path, edge)
    return sorted(found.values(), key=lambda s: (s.degree, s.urn))


@dataclass(frozen=True, slots=True)
class Walked:
    """A walk's entities (`steps`), and whether it stopped short of its `max_hops` (`partial`): its request's read
    budget ran out (app.read_deadline), so `steps` are every entity within the hops it finished, and only them."""

    steps: list[LineageStep]
    partial: bool = False


# the most frontier entities one statement of a hop asks about: a hop over thousands (the 4th hop from a warehouse
# hub) is several statements, so a budget cuts it between them and a continued walk (WalkState) keeps what they found
FRONTIER_CHUNK = 500


@dataclass(slots=True)
class WalkState:
    """A breadth-first walk that can stop between any two of its statements and be continued later (a lineage
    search's cursor, app.search.across): the hops it finished, the hop under way (its frontier, how much of it was
    asked about, the edges found so far) and every entity reached with its path (its visited set)."""

    start: str
    direction: Direction
    max_hops: int
    hops: int = 0  # hops finished
    frontier: list[str] = field(default_factory=list)  # the entities the next hop starts from
    asked: int = 0  # how many of them the hop under way asked about
    edges: list[Edge] = field(default_factory=list)  # what those statements found
    paths: dict[str, Path] = field(default_factory=dict)  # every entity reached (the start too) -> its path

    @classmethod
    def begin(cls, start: str, direction: Direction, max_hops: int) -> WalkState:
        return cls(start, direction, max_hops, frontier=[start], paths={start: ((start, type_of(start)),)})

    @property
    def done(self) -> bool:
        return self.hops >= self.max_hops or not self.frontier

    @property
    def asked_all(self) -> bool:
        """Whether the hop under way asked about its whole frontier (`finish_hop` is next)."""
        return self.asked >= len(self.frontier)

    async def ask(self, backend: SearchBackend) -> None:
        """One statement more of the hop under way: the edges of its next FRONTIER_CHUNK frontier entities.
        `DeadlineExceeded` when the request's walking budget (app.read_deadline) is spent before it or cancels it:
        the state is as before."""
        budget = read_deadline.current()
        if budget is not None and budget.walk_remaining_s() <= 0:
            raise read_deadline.DeadlineExceeded("the lineage walk ran out of its time budget")
        chunk = self.frontier[self.asked : self.asked + FRONTIER_CHUNK]
        self.edges.extend(await backend.lineage_hop(chunk, direction=self.direction))
        self.asked += len(chunk)

    def finish_hop(self) -> list[LineageStep]:
        """The hop whose frontier was asked about whole, finished: the entities first reached on it (by urn, as
        `steps` orders them), which the next hop starts from."""
        hop = self.hops + 1
        reached = steps(self.start, self.direction, ((e, hop) for e in self.edges), known=self.paths)
        self.hops, self.frontier, self.asked, self.edges = hop, [s.urn for s in reached], 0, []
        return reached


async def walk(backend: SearchBackend, urn: str, *, direction: Direction, max_hops: int) -> Walked:
    """The entities `max_hops` or fewer lineage hops from `urn` (every backend, every surface), breadth first
    (`WalkState`: a hop is one backend statement per FRONTIER_CHUNK entities of its frontier,
    `SearchBackend.lineage_hop`): each edge once, at the hop its near end was first reached.

    A statement the request's read budget cancels, or would have no time left for, ends the walk with the hops
    before it (partial, marked on the request: `X-Metaledger-Partial`). A walk whose first hop the budget ends has
    nothing to show: `DeadlineExceeded`, a 504 with Retry-After."""
    state = WalkState.begin(urn, direction, max_hops)
    found: list[LineageStep] = []
    while not state.done:
        if state.asked_all:
            found.extend(state.finish_hop())
            continue
        try:
            await state.ask(backend)
        except read_deadline.DeadlineExceeded as error:
            if state.hops == 0:
                raise error.with_issues(
                    [Issue("no hop within the budget", expected=f"a larger {read_deadline.HEADER}")],
                    "the lineage walk found nothing within its time budget: retry with a larger one",
                ) from None
            read_deadline.mark_partial()
            return Walked(found, partial=True)
    return Walked(found)


@dataclass(slots=True)
class Grouped:
    """An entity of a walk with its schema fields folded into it: its fewest hops, and one path per step that
    reached it or one of its fields at those hops (each path ends at that field: a shortest path)."""

    urn: str
    entity_type: str
    degree: int
    paths: list[Path] = field(default_factory=list)


def by_parent(start: str, walked: Sequence[LineageStep]) -> list[Grouped]:
    """DataHub's lineage search's grouping of schema fields into their parent (a dataset): each field the walk reached
    counts as its parent, at the field's degree, with the path to the field; a parent reached at fewer hops keeps
    the paths of those (a walk continued hop by hop answers it before it walks further). The start itself is never a
    result (a field's sibling field of the same dataset makes the dataset one). By degree then URN."""
    grouped: dict[str, Grouped] = {}
    for step in walked:
        target, target_type = step.urn, step.entity_type
        if target_type == SCHEMA_FIELD and (parent := schema_field_parent(target)) is not None:
            target, target_type = parent, type_of(parent)
        if target == start:
            continue
        known = grouped.get(target)
        if known is None:
            grouped[target] = Grouped(target, target_type, step.degree, [step.path])
        elif step.degree == known.degree and step.path not in known.paths:  # `walked` is by degree
            known.paths.append(step.path)
    return sorted(grouped.values(), key=lambda g: (g.degree, g.urn))
