"""The Lineage tab: the graph of an entity's upstream and downstream neighbourhood, its nodes and edges laid out here
and drawn by the template as inline SVG, with the same neighbourhood as a plain list (what a screen reader reads).

Where it comes from: metaledger's one lineage walk (app.search.lineage: the search backend's `lineage`, as
searchAcrossLineage and `lineage(input:)` walk it), on the search backend as the signed-in principal may search it
(app.api.deps.scoped_search_backend). The walk gives every lineage edge of the entities it expanded, so the graph has
the edges between them too, not only one path to each. An entity is shown when it has a live search document as that
principal searches it — the condition of GraphQL's lineage (app.graphql.lineage.indexed): never ingested or
soft-deleted entities are left out, and so is anything the read rule (app.auth.reads) keeps from the principal. A
schema field the walk reaches is no node of its own (column-level lineage is drawn on request, below).

Column-level edges (`columns=1`) are the schema-field edges the drawn entities' own aspects declare
(`upstreamLineage` and `dataJobInputOutput` fineGrainedLineages, a chart's `inputFields`): the aspect's entity owns
them, as the index keys them (app.search.documents.field_lineage_edges, which reads them here too), and the aspects
are read through app.write.reader.EntityReader as the principal. An edge is drawn when both its fields' entities are
drawn on their own.

The query parameters choose within the tab (`Options.parse`; a value out of range is the default, never an error):
`hops` (1..MAX_HOPS), `direction` (both, upstream, downstream), `columns=1`, `collapse` (auto, platform, degree,
none) and `expand` (a cluster to draw as its entities, repeatable). The work is bounded: at most MAX_NODES entities,
the nearest, with a note saying how many more were reached."""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal
from urllib.parse import unquote, urlencode

from app.api.deps import scoped_search_backend
from app.errors import MetaledgerError
from app.search import lineage
from app.search.documents import FIELD_LINEAGE_ASPECTS, field_lineage_edges
from app.search.model import URN_FIELD, SearchBackend, upstream_downstream
from app.urns import InvalidUrnError, parse_urn
from app.web.catalog import short_name
from app.web.paths import LINEAGE, entity_url
from app.web.tabs import Tab, TabRequest
from app.write.reader import EntityReader

DEFAULT_HOPS, MAX_HOPS = 2, 5
MAX_NODES = 1_000  # entities drawn at most (the nearest): beyond, the tab says how many more were reached
MAX_CANDIDATES = 4 * MAX_NODES  # entities of a walk checked for a live search document at most (the nearest)
AUTO_COLLAPSE = 150  # more entities than this are grouped by platform unless `collapse` says otherwise
MAX_EXPANDED = 50  # `expand` values read at most
MAX_NODE_FIELDS = 25  # schema fields drawn in one node; the others are in the list below the graph
MAX_COLUMN_EDGES = 2_000
SEARCH_CHUNK = 1_000  # URNs per search of live documents (under the backend's MAX_FILTER_VALUES)

Direction = Literal["both", "upstream", "downstream"]
Collapse = Literal["auto", "platform", "degree", "none"]
DIRECTIONS: tuple[Direction, ...] = ("both", "upstream", "downstream")
COLLAPSES: tuple[Collapse, ...] = ("auto", "platform", "degree", "none")

# the drawing's geometry, in SVG user units (CSS pixels at zoom 1)
NODE_W, NODE_H, FIELD_H = 220, 44, 18
GAP_X, GAP_Y, MARGIN = 100, 14, 20
NAME_CHARS, FIELD_CHARS = 28, 30

CLUSTER_ID_CHARS = 12  # a cluster's id: hex digits of a hash of what it groups, stable from one request to the next
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class Options:
    hops: int = DEFAULT_HOPS
    direction: Direction = "both"
    columns: bool = False
    collapse: Collapse = "auto"
    expand: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, single: Mapping[str, str], expand: Sequence[str]) -> Options:
        """The tab's options from its query parameters; anything unexpected is the default."""
        raw_hops = single.get("hops", "")
        # isdigit() alone takes "²", which int() refuses
        hops = int(raw_hops) if raw_hops.isascii() and raw_hops.isdigit() and len(raw_hops) <= 2 else DEFAULT_HOPS
        direction = single.get("direction", "both")
        collapse = single.get("collapse", "auto")
        return cls(
            hops=hops if 1 <= hops <= MAX_HOPS else DEFAULT_HOPS,
            direction=direction if direction in DIRECTIONS else "both",
            columns=single.get("columns") == "1",
            collapse=collapse if collapse in COLLAPSES else "auto",
            expand=frozenset(e for e in expand[:MAX_EXPANDED] if len(e) == CLUSTER_ID_CHARS and set(e) <= _HEX),
        )

    def query(self, **changes: object) -> str:
        """The query string of these options with `changes` (only what differs from the defaults)."""
        chosen = replace(self, **changes)  # type: ignore[arg-type]
        params: list[tuple[str, str]] = []
        if chosen.hops != DEFAULT_HOPS:
            params.append(("hops", str(chosen.hops)))
        if chosen.direction != "both":
            params.append(("direction", chosen.direction))
        if chosen.columns:
            params.append(("columns", "1"))
        if chosen.collapse != "auto":
            params.append(("collapse", chosen.collapse))
        params.extend(("expand", e) for e in sorted(chosen.expand))
        return "?" + urlencode(params) if params else ""


@dataclass(slots=True)
class Reached:
    """An entity of the neighbourhood: `layer` 0 is the page's entity, -n is n hops upstream, +n n hops downstream."""

    urn: str
    entity_type: str
    name: str
    platform: str
    layer: int
    url: str | None
    via: str = ""  # its neighbours one hop nearer the page's entity, as the list says them

    @property
    def hops(self) -> int:
        return abs(self.layer)


@dataclass(slots=True)
class FieldSlot:
    urn: str
    label: str
    title: str
    y: int  # of its text's baseline, in its node


@dataclass(slots=True)
class Node:
    """A drawn box: the page's entity, an entity, or a cluster of entities (`members`) that `url` expands."""

    id: str
    kind: Literal["center", "entity", "cluster"]
    layer: int
    label: str
    meta: str
    title: str
    url: str | None
    members: list[Reached]
    fields: list[FieldSlot] = field(default_factory=list)
    more_fields: int = 0
    x: int = 0
    y: int = 0
    h: int = NODE_H


@dataclass(frozen=True, slots=True)
class Line:
    source: str  # node ids, upstream end first
    target: str
    d: str  # the SVG path
    count: int  # entity edges it stands for (between clusters: more than one)
    column: bool = False


@dataclass(frozen=True, slots=True)
class ColumnEdge:
    upstream: str  # "<entity name>.<field>"
    downstream: str
    upstream_url: str | None
    downstream_url: str | None


@dataclass(slots=True)
class Graph:
    options: Options
    base: str  # the tab's URL, without a query
    nodes: list[Node]
    lines: list[Line]
    upstream: list[Reached]
    downstream: list[Reached]
    column_edges: list[ColumnEdge]
    width: int
    height: int
    truncated: int  # entities reached beyond MAX_NODES (0: none)
    truncated_columns: int  # column-level edges beyond MAX_COLUMN_EDGES
    collapsed: Collapse  # the grouping in effect ("none", or the one `auto` chose)
    clusters: int  # drawn clusters
    list_open: bool  # the list below the graph shown open (not too long)

    @property
    def large(self) -> bool:
        """Too many nodes to read at once: lineage.js leaves out their texts while zoomed out (the texts of 500 nodes
        were half of the browser's work of drawing them, at a scale no one reads them)."""
        return len(self.nodes) > AUTO_COLLAPSE

    def link(self, **changes: object) -> str:
        return self.base + self.options.query(**changes)

    @property
    def edge_count(self) -> int:
        return sum(line.count for line in self.lines if not line.column)


# --- reading the neighbourhood -------------------------------------------------------------------------------------


def _platform(urn: str, document: Mapping[str, object]) -> str:
    """The platform's name: the search document's `platform` (a platform URN), else the one the URN's key names (a
    dataset's platform URN, a chart's or flow's tool, a job's flow's)."""
    held = document.get("platform")
    if isinstance(held, str) and held:
        return held.removeprefix("urn:li:dataPlatform:")
    try:
        parts = parse_urn(urn).parts
    except InvalidUrnError:
        return ""
    first = parts[0] if parts else ""
    if first.startswith("urn:li:dataPlatform:"):
        return first.removeprefix("urn:li:dataPlatform:")
    if first.startswith("urn:li:"):
        return _platform(first, {})
    return first if len(parts) > 1 else ""


def _name(urn: str, document: Mapping[str, object]) -> str:
    held = document.get("name")
    return held if isinstance(held, str) and held else short_name(urn)


async def _live_documents(backend: SearchBackend, urns_by_type: Mapping[str, list[str]]) -> dict[str, dict]:
    """The live search documents of these URNs as the backend (scoped to the principal) finds them: the condition of
    GraphQL's lineage (app.graphql.lineage.indexed), with the documents, which name the entities."""
    found: dict[str, dict] = {}
    for entity_type, urns in urns_by_type.items():
        for start in range(0, len(urns), SEARCH_CHUNK):
            chunk = urns[start : start + SEARCH_CHUNK]
            page = await backend.search(entity_type, "*", filters={URN_FIELD: chunk}, count=len(chunk), facets=False)
            found.update((hit.urn, hit.fields) for hit in page.hits)
    return found


@dataclass(slots=True)
class Neighbourhood:
    center: Reached
    reached: list[Reached]  # nearest first
    edges: set[tuple[str, str]]  # (upstream urn, downstream urn), between `center` and `reached`
    touching: dict[str, list[str]]  # urn -> the urns it has an edge with
    truncated: int
    field_edges: list[tuple[str, str]]  # (upstream field urn, downstream field urn)


async def _walk(
    backend: SearchBackend, urn: str, direction: lineage.Direction, hops: int
) -> tuple[list[lineage.LineageStep], set[tuple[str, str]]]:
    edges = await backend.lineage(urn, direction=direction, max_hops=hops)
    return lineage.steps(urn, direction, edges), {upstream_downstream(edge) for edge, _ in edges}


async def neighbourhood(tab: TabRequest, backend: SearchBackend, options: Options) -> Neighbourhood:
    view = tab.view
    directions: list[lineage.Direction] = [
        d for d in ("UPSTREAM", "DOWNSTREAM") if options.direction in ("both", d.lower())
    ]
    walks = await asyncio.gather(*(_walk(backend, view.urn, d, options.hops) for d in directions))
    layers: dict[str, tuple[int, str]] = {}  # urn -> (signed hops, entity type): the nearer side wins
    edges: set[tuple[str, str]] = set()
    for d, (steps, walked_edges) in zip(directions, walks):
        sign = -1 if d == "UPSTREAM" else 1
        edges |= walked_edges
        for step in steps:
            if step.entity_type == lineage.SCHEMA_FIELD or step.urn == view.urn:
                continue
            known = layers.get(step.urn)
            if known is None or step.degree < abs(known[0]):
                layers[step.urn] = (sign * step.degree, step.entity_type)
    nearest = sorted(layers, key=lambda u: (abs(layers[u][0]), layers[u][0], u))
    candidates = nearest[:MAX_CANDIDATES]
    by_type: dict[str, list[str]] = {}
    for urn in candidates:
        by_type.setdefault(layers[urn][1], []).append(urn)
    types = {view.urn: view.entity_type, **{urn: layers[urn][1] for urn in candidates}}
    # the column-level edges are read while the search finds which entities are shown; those of others are dropped
    documents, declared = await asyncio.gather(
        _live_documents(backend, by_type), _field_edges(tab, types) if options.columns else _nothing()
    )
    live = [urn for urn in candidates if urn in documents]
    truncated = max(len(live) - MAX_NODES, 0) + (len(nearest) - len(candidates))
    center = Reached(
        view.urn, view.entity_type, view.name, view.platform or _platform(view.urn, {}), 0, entity_url(view.urn)
    )
    reached = [
        Reached(
            urn,
            layers[urn][1],
            _name(urn, documents[urn]),
            _platform(urn, documents[urn]),
            layers[urn][0],
            entity_url(urn),
        )
        for urn in live[:MAX_NODES]
    ]
    shown = {view.urn, *(r.urn for r in reached)}
    kept = {(up, down) for up, down in edges if up in shown and down in shown and up != down}
    touching: dict[str, list[str]] = {}
    for up, down in kept:
        touching.setdefault(up, []).append(down)
        touching.setdefault(down, []).append(up)
    entity_of = {center.urn: center, **{r.urn: r for r in reached}}
    for r in reached:
        nearer = sorted(entity_of[n].name for n in touching.get(r.urn, ()) if entity_of[n].hops == r.hops - 1)
        if r.hops > 1 and nearer:
            r.via = "via " + ", ".join(nearer[:3]) + (f" and {len(nearer) - 3} more" if len(nearer) > 3 else "")
    field_edges = [(up, down) for up, down, owners in declared if owners[0] in shown and owners[1] in shown]
    return Neighbourhood(center, reached, kept, touching, truncated, field_edges)


async def _nothing() -> list[tuple[str, str, tuple[str, str]]]:
    return []


async def _field_edges(tab: TabRequest, types: Mapping[str, str]) -> list[tuple[str, str, tuple[str, str]]]:
    """(upstream field, downstream field, (their entities)) of the column-level lineage the aspects of these entities
    (urn -> entity type) declare, as the principal reads them, between fields of these entities."""
    wanted: list[tuple[str, list[str] | None]] = []
    for urn, entity_type in types.items():
        spec = tab.registry.entities.get(entity_type)
        declaring = sorted(FIELD_LINEAGE_ASPECTS & spec.aspect_names) if spec is not None else []
        if declaring:
            wanted.append((urn, declaring))
    reader = EntityReader(tab.db, tab.registry, tab.session.principal)
    rows = await reader.latest_of_many(wanted) if wanted else {}
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for urn, stored in rows.items():
        for row in stored:
            for edge in field_lineage_edges(row.aspect, urn, types[urn], row.value):
                upstream, downstream = upstream_downstream(edge)
                owners = (_field_of(upstream)[0], _field_of(downstream)[0])
                if owners[0] in types and owners[1] in types:
                    found[(upstream, downstream)] = owners
    return sorted((up, down, owners) for (up, down), owners in found.items())


# --- grouping and layout -------------------------------------------------------------------------------------------


def _cluster_id(*key: object) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:CLUSTER_ID_CHARS]


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _field_of(field_urn: str) -> tuple[str, str]:
    """(the entity, the field's path as people write it) of a schema field's URN: DataHub's v2 path segments
    (`[version=2.0].[type=struct].a`) left out."""
    try:
        parts = parse_urn(field_urn).parts
    except InvalidUrnError:
        return "", field_urn
    if len(parts) < 2:
        return "", field_urn
    path = unquote(parts[1])
    return parts[0], ".".join(p for p in path.split(".") if not p.startswith("[")) or path


def _groups(hood: Neighbourhood, mode: Collapse) -> dict[str, str]:
    """urn -> the id of the cluster it is drawn in, for `mode` (platform: the entities of one platform at one hop;
    degree: the entities with one edge, hanging off the same entity at one hop). A group of one is no cluster."""
    key_of: dict[str, tuple[object, ...]] = {}
    if mode == "platform":
        key_of = {r.urn: ("platform", r.layer, r.platform) for r in hood.reached}
    elif mode == "degree":
        for r in hood.reached:
            others = hood.touching.get(r.urn, [])
            if len(others) == 1:
                key_of[r.urn] = ("degree", r.layer, others[0])
    sizes: dict[tuple[object, ...], int] = {}
    for key in key_of.values():
        sizes[key] = sizes.get(key, 0) + 1
    return {urn: _cluster_id(*key) for urn, key in key_of.items() if sizes[key] > 1}


def _nodes(hood: Neighbourhood, mode: Collapse, options: Options, base: str) -> tuple[list[Node], dict[str, str]]:
    """The drawn nodes and the node id of each entity."""
    clusters = _groups(hood, mode) if mode != "none" else {}
    center = hood.center
    nodes = [
        Node(
            "n0",
            "center",
            0,
            _clip(center.name, NAME_CHARS),
            " · ".join(p for p in (center.platform, center.entity_type) if p),
            center.urn,
            center.url,
            [center],
        )
    ]
    node_of = {center.urn: "n0"}
    drawn_clusters: dict[str, Node] = {}
    for r in hood.reached:
        cluster = clusters.get(r.urn)
        if cluster is not None and cluster not in options.expand:
            node = drawn_clusters.get(cluster)
            if node is None:
                node = Node(
                    f"c{cluster}",
                    "cluster",
                    r.layer,
                    "",
                    "",
                    "",
                    base + options.query(expand=options.expand | {cluster}),
                    [],
                )
                drawn_clusters[cluster] = node
                nodes.append(node)
            node.members.append(r)
            node_of[r.urn] = node.id
            continue
        nodes.append(
            Node(
                f"n{len(nodes)}",
                "entity",
                r.layer,
                _clip(r.name, NAME_CHARS),
                " · ".join(p for p in (r.platform, r.entity_type) if p),
                f"{r.name} ({r.platform})" if r.platform else r.name,
                r.url,
                [r],
            )
        )
        node_of[r.urn] = nodes[-1].id
    for node in drawn_clusters.values():
        platforms = sorted({m.platform for m in node.members if m.platform})
        what = ", ".join(platforms[:3]) + ("…" if len(platforms) > 3 else "") or "entities"
        hop_text = f"{abs(node.layer)} hop{'s' if abs(node.layer) > 1 else ''} {'up' if node.layer < 0 else 'down'}"
        node.label = _clip(f"{len(node.members)} × {what}", NAME_CHARS)
        node.meta = f"{hop_text}stream · expand"
        names = ", ".join(m.name for m in node.members[:8]) + (", …" if len(node.members) > 8 else "")
        node.title = f"{len(node.members)} entities ({names}): expand the group"
    return nodes, node_of


def _order(nodes: list[Node], neighbours: Mapping[str, set[str]]) -> dict[int, list[Node]]:
    """The nodes of each layer in an order with few crossings, cheaply: outward from the page's entity, each layer by
    the mean position of its neighbours in the layer before it (the barycenter heuristic), then once more by its
    neighbours in both adjacent layers."""
    layers: dict[int, list[Node]] = {}
    for node in nodes:
        layers.setdefault(node.layer, []).append(node)
    position: dict[str, float] = {}
    layer_of = {node.id: node.layer for node in nodes}

    def place(layer: int, nearer: Iterable[int]) -> None:
        wanted = set(nearer)

        def key(node: Node) -> tuple[float, str]:
            known = [position[n] for n in neighbours.get(node.id, ()) if n in position and layer_of[n] in wanted]
            return (sum(known) / len(known) if known else math.inf, node.label)

        ordered = sorted(layers[layer], key=key)
        layers[layer] = ordered
        for index, node in enumerate(ordered):
            position[node.id] = (index + 0.5) / len(ordered)

    outward = sorted(layers, key=lambda layer: (abs(layer), layer))
    for layer in outward:
        place(layer, (layer - 1, layer + 1) if layer == 0 else (layer - (1 if layer > 0 else -1),))
    for layer in outward[1:]:
        place(layer, (layer - 1, layer + 1))
    return layers


def _place(layers: Mapping[int, list[Node]]) -> tuple[int, int]:
    """Coordinates: a column per layer, upstream on the left; each column centred on the tallest. (width, height)"""
    low = min(layers)
    heights = {layer: sum(n.h for n in column) + GAP_Y * (len(column) - 1) for layer, column in layers.items()}
    tallest = max(heights.values())
    for layer, column in layers.items():
        y = MARGIN + (tallest - heights[layer]) / 2
        for node in column:
            node.x = MARGIN + (layer - low) * (NODE_W + GAP_X)
            node.y = round(y)
            y += node.h + GAP_Y
    return MARGIN * 2 + (max(layers) - low + 1) * NODE_W + (max(layers) - low) * GAP_X, MARGIN * 2 + round(tallest)


def _curve(x1: int, y1: int, x2: int, y2: int) -> str:
    bend = max(abs(x2 - x1) // 2, 60)
    return f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"


def layout(hood: Neighbourhood, options: Options, base: str) -> Graph:
    mode: Collapse = options.collapse
    if mode == "auto":
        mode = "platform" if len(hood.reached) > AUTO_COLLAPSE else "none"
    nodes, node_of = _nodes(hood, mode, options, base)
    by_id = {node.id: node for node in nodes}
    counted: dict[tuple[str, str], int] = {}
    for up, down in hood.edges:
        pair = (node_of[up], node_of[down])
        if pair[0] != pair[1]:
            counted[pair] = counted.get(pair, 0) + 1
    neighbours: dict[str, set[str]] = {}
    for a, b in counted:
        neighbours.setdefault(a, set()).add(b)
        neighbours.setdefault(b, set()).add(a)
    column_edges, truncated_columns, field_pairs = _columns(hood, by_id, node_of)
    layers = _order(nodes, neighbours)
    width, height = _place(layers)
    lines = [
        Line(a, b, _curve(by_id[a].x + NODE_W, by_id[a].y + NODE_H // 2, by_id[b].x, by_id[b].y + NODE_H // 2), n)
        for (a, b), n in sorted(counted.items())
    ]
    slot_y = {slot.urn: (node, node.y + slot.y - FIELD_H // 4) for node in nodes for slot in node.fields}
    for up, down in field_pairs:
        (left, y1), (right, y2) = slot_y[up], slot_y[down]
        lines.append(Line(left.id, right.id, _curve(left.x + NODE_W, y1, right.x, y2), 1, column=True))
    return Graph(
        options=options,
        base=base,
        nodes=nodes,
        lines=lines,
        upstream=sorted((r for r in hood.reached if r.layer < 0), key=lambda r: (r.hops, r.name, r.urn)),
        downstream=sorted((r for r in hood.reached if r.layer > 0), key=lambda r: (r.hops, r.name, r.urn)),
        column_edges=column_edges,
        width=width,
        height=height,
        truncated=hood.truncated,
        truncated_columns=truncated_columns,
        collapsed=mode,
        clusters=sum(1 for node in nodes if node.kind == "cluster"),
        list_open=len(hood.reached) <= AUTO_COLLAPSE,
    )


def _columns(
    hood: Neighbourhood, by_id: Mapping[str, Node], node_of: Mapping[str, str]
) -> tuple[list[ColumnEdge], int, list[tuple[str, str]]]:
    """The column-level edges for the list (at most MAX_COLUMN_EDGES), the fields each entity node draws, and the
    field pairs drawn (both fields in a node of their own entity, among its first MAX_NODE_FIELDS)."""
    names = {hood.center.urn: hood.center, **{r.urn: r for r in hood.reached}}
    shown = hood.field_edges[:MAX_COLUMN_EDGES]
    split = {f: _field_of(f) for pair in shown for f in pair}
    listed: list[ColumnEdge] = []
    wanted: dict[str, dict[str, None]] = {}  # node id -> its fields in the edges, in order
    for up, down in shown:
        (up_parent, up_label), (down_parent, down_label) = split[up], split[down]
        listed.append(
            ColumnEdge(
                f"{names[up_parent].name}.{up_label}",
                f"{names[down_parent].name}.{down_label}",
                names[up_parent].url,
                names[down_parent].url,
            )
        )
        for parent, field_urn in ((up_parent, up), (down_parent, down)):
            if by_id[node_of[parent]].kind != "cluster":
                wanted.setdefault(node_of[parent], {})[field_urn] = None
    drawn: set[str] = set()
    for node_id, fields in wanted.items():
        node = by_id[node_id]
        ordered = sorted(fields, key=lambda f: split[f][1])[:MAX_NODE_FIELDS]
        node.fields = [
            FieldSlot(f, _clip(split[f][1], FIELD_CHARS), split[f][1], NODE_H + i * FIELD_H + FIELD_H // 2 + 4)
            for i, f in enumerate(ordered)
        ]
        node.more_fields = len(fields) - len(ordered)
        node.h = NODE_H + FIELD_H * (len(node.fields) + (1 if node.more_fields else 0)) + 4
        drawn.update(ordered)
    pairs = [(up, down) for up, down in shown if up in drawn and down in drawn]
    return listed, max(len(hood.field_edges) - MAX_COLUMN_EDGES, 0), pairs


# --- the tab -------------------------------------------------------------------------------------------------------


async def _load(tab: TabRequest) -> dict[str, object]:
    options = Options.parse(tab.params, tab.request.query_params.getlist("expand"))
    base = entity_url(tab.view.urn, LINEAGE) or tab.request.url.path
    shown: dict[str, object] = {"options": options, "max_hops": MAX_HOPS, "node_width": NODE_W}
    try:
        backend = await scoped_search_backend(tab.request, tab.session.principal)
        hood = await neighbourhood(tab, backend, options)
    except MetaledgerError as error:  # no search backend now: the tab says so, the page is still the entity's
        return {**shown, "graph": None, "lineage_error": error.message}
    return {**shown, "graph": layout(hood, options, base)}


TAB = Tab(load=_load, styles=("lineage.css",), scripts=("lineage.js",))
