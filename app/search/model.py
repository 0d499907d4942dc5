"""The index model's contract: what a change log does to the indices, and what every search backend offers.

One module builds these records from change logs (`app.search.documents.changes_from_mcl`), for the service and
for `spark_indexer` alike; each backend (`app.search.elastic`, `app.search.postgres`) applies them and answers
the queries. Applying is idempotent and order-safe: every record carries the version of the aspect it comes
from, and a backend never lets an older version overwrite a newer one (for deletes too: a delete at version v
removes only what is at version <= v; at equal versions a delete wins over an upsert).

Hard deletes leave tombstones: an `EntityRemoval` keeps the entity's per-aspect versions (`aspectVersions`) with
`entityRemoved: true` and no searchable content; edge-set markers keep their version with an empty set. A tombstone
is invisible to every read (search, autocomplete, counts and facets, relationships, lineage, `document_versions`);
a change newer than the version it holds for that aspect revives the document, an older or equal one is ignored.
A document whose aspects are all deleted is a tombstone too (the write path logs a DELETE for every aspect of a
deleted entity, so replaying the change logs in any order ends in the same state).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, NamedTuple, Protocol

Direction = Literal["OUTGOING", "INCOMING"]


@dataclass(frozen=True, slots=True)
class SearchFieldSpec:
    """One searchable field of an entity's document, from a `Searchable` annotation of its aspects' schemas
    (built by `app.search.documents.search_fields`)."""

    name: str  # the document field: the annotation's fieldName, else the schema field's name
    field_type: str  # DataHub's FieldType: KEYWORD, TEXT, TEXT_PARTIAL, WORD_GRAM, URN, URN_PARTIAL, BOOLEAN, COUNT, DATETIME, DOUBLE, OBJECT, BROWSE_PATH, BROWSE_PATH_V2, ...
    aspect: str
    boost: float = 1.0
    add_to_filters: bool = False
    filter_name: str | None = None
    autocomplete: bool = False
    query_by_default: bool = True
    has_values_field: str | None = None
    num_values_field: str | None = None


# Fields every entity document has, whatever its aspects.
URN_FIELD = "urn"
REMOVED_FIELD = "removed"  # status.removed: soft-deleted entities are flagged, not dropped
VERSIONS_FIELD = "aspectVersions"  # aspect name -> the version indexed (order-safety, trace, reconcile)
TOMBSTONE_FIELD = "entityRemoved"  # true: a hard-deleted entity's tombstone (versions only, hidden from reads)


@dataclass(frozen=True, slots=True)
class AspectFields:
    """The searchable fields one aspect contributes to its entity's document (`fields` replace whatever that
    aspect contributed before). `deleted`: the aspect was removed, its fields go away."""

    entity_type: str
    urn: str
    aspect: str
    version: int
    fields: dict[str, Any]
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    destination: str
    relationship: str  # e.g. "DownstreamOf", "OwnedBy", "TaggedWith"
    source_type: str
    destination_type: str
    via: str | None = None
    created_on: int | None = None
    created_actor: str | None = None
    updated_on: int | None = None
    updated_actor: str | None = None
    properties: dict[str, Any] = field(default_factory=dict)
    is_lineage: bool = False


# Lineage edges point upstream (`DownstreamOf`, `Consumes`, `TrainedBy`, ...: the source is downstream of the
# destination) except these, whose `Relationship` annotations say `isUpstream: false` (a job `Produces` its output
# dataset, an ML model is `UsedBy` a job): a walk follows them the other way round. Every lineage relationship with
# `isUpstream: false` in DataHub's model is here (tests/unit/test_search_documents.py checks it against the schemas).
DOWNSTREAM_LINEAGE: frozenset[str] = frozenset(
    {"Produces", "DataProcessInstanceProduces", "UsedBy", "MemberOf", "ServiceComposesApi"}
)


def upstream_downstream(edge: Edge) -> tuple[str, str]:
    """(upstream, downstream) ends of a lineage edge."""
    if edge.relationship in DOWNSTREAM_LINEAGE:
        return edge.source, edge.destination
    return edge.destination, edge.source


# An edge whose source is not the entity whose aspect declares it (column-level lineage: a dataset's
# fineGrainedLineages link its schema fields, app.search.documents.field_lineage_edges) is owned by that entity, as
# DataHub's lifecycleOwner: it belongs to the owner's edge set. Its key names the owner as well, so that two
# entities declaring the same field edge (two jobs writing one column) each keep their own, as DataHub's edge
# document id holds the lifecycleOwner.
OWNED_EDGE_SEPARATOR = "\x1f"


def edge_set_aspect(owner: str, aspect: str, edge: Edge) -> str:
    """The aspect an edge is keyed by in the index: the aspect's name, with the owner when the edge's source is not
    the owner (`upstreamLineage\x1furn:li:dataset:...`)."""
    return aspect if edge.source == owner else f"{aspect}{OWNED_EDGE_SEPARATOR}{owner}"


@dataclass(frozen=True, slots=True)
class AspectEdges:
    """The complete set of edges one aspect of `source` declares (it replaces the previous set from that aspect); an
    edge of it may start elsewhere (`edge_set_aspect`)."""

    source: str
    aspect: str
    version: int
    edges: tuple[Edge, ...]


@dataclass(frozen=True, slots=True)
class TimeseriesPoint:
    """One timeseries aspect value. `doc_id` is DataHub's: a hash of timestamp, granularity, urn, partitionSpec and
    messageId, so re-sending a point overwrites it."""

    aspect: str
    doc_id: str
    urn: str
    entity_type: str
    timestamp_ms: int
    fields: dict[str, Any]  # the TimeseriesField values (and timestampMillis, partition, ...)
    value: dict[str, Any]  # the whole aspect, returned by reads
    system_metadata: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class EntityRemoval:
    """Hard delete of an entity (its key aspect `aspect` deleted at `version`): the document becomes a tombstone
    (every aspect deleted at the version indexed), outgoing and incoming edges go, edge-set markers keep their
    version. Ignored when a newer version of the key aspect is indexed (the entity was re-created since)."""

    entity_type: str
    urn: str
    version: int
    aspect: str | None = None  # the key aspect (None: the entity type's, from the registry)


IndexChange = AspectFields | AspectEdges | TimeseriesPoint | EntityRemoval


# DataHub's filter conditions (its FilterOperator / Condition) that the backends answer. A field holds one value or
# an array of them; a criterion matches when any value of the field matches any of `values` (ESUtils'
# getQueryBuilderFromCriterion):
#   EQUAL, IN    the value is one of `values` (exact; "true"/"false" and numbers match their JSON types too)
#   IEQUAL       the same, case-insensitively for strings
#   CONTAIN, START_WITH, END_WITH   a string value contains / starts with / ends with one of `values`,
#                case-insensitively (DataHub's case-insensitive wildcard `*v*`, `v*`, `*v` on the keyword field; no
#                character of `values` is a wildcard); numbers and booleans never match
#   EXISTS       the field has a value (`values` are ignored)
#   GREATER_THAN, GREATER_THAN_OR_EQUAL_TO, LESS_THAN, LESS_THAN_OR_EQUAL_TO   a range: a number compares
#                numerically with the numeric `values` (datetime fields are epoch milliseconds), a string as text
#                (by code point) with every value; booleans never match
# `values` are trimmed for every condition but EQUAL/IN (as DataHub trims them). `negated` inverts any of them.
EQUALITY_CONDITIONS = frozenset({"EQUAL", "IN"})
WILDCARD_CONDITIONS = frozenset({"CONTAIN", "START_WITH", "END_WITH"})
RANGE_CONDITIONS = frozenset({"GREATER_THAN", "GREATER_THAN_OR_EQUAL_TO", "LESS_THAN", "LESS_THAN_OR_EQUAL_TO"})
CONDITIONS = EQUALITY_CONDITIONS | WILDCARD_CONDITIONS | RANGE_CONDITIONS | {"IEQUAL", "EXISTS"}
# DataHub conditions that need its graph-walking query rewriters (container/domain hierarchies): refused.
REFUSED_CONDITIONS = frozenset({"DESCENDANTS_INCL", "ANCESTORS_INCL", "RELATED_INCL"})
MAX_FILTER_VALUES = 1_024  # values of one search's criteria in all (each value is a clause or a few SQL parameters)
MAX_PATTERN_CHARS = 256  # a CONTAIN/START_WITH/END_WITH value (DataHub's keyword subfields hold 256 characters)
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?")


@dataclass(frozen=True, slots=True)
class Criterion:
    """One condition of a search's `any_of` groups: the field (a filter name or a document field; `urn` and
    `removed` included) meets `condition` (one of CONDITIONS, above) with `values`; `negated`: it does not."""

    field: str
    values: tuple[str, ...]
    negated: bool = False
    condition: str = "EQUAL"


class CriterionProblem(NamedTuple):
    message: str
    expected: str
    value: int | None = None  # the position of the value at fault; None: the condition is


def criterion_problem(condition: str, values: Sequence[str]) -> CriterionProblem | None:
    """What is wrong with a criterion's condition and values, or None (app.search.filters names the place)."""
    if condition in REFUSED_CONDITIONS:
        return CriterionProblem(
            f"condition {condition} is not supported (it needs DataHub's hierarchy rewriters)",
            ", ".join(sorted(CONDITIONS)),
        )
    if condition not in CONDITIONS:
        return CriterionProblem(f"unknown condition {condition[:40]}", ", ".join(sorted(CONDITIONS)))
    if condition in WILDCARD_CONDITIONS:
        for position, value in enumerate(values):
            if len(value.strip()) > MAX_PATTERN_CHARS:
                return CriterionProblem(
                    f"a {condition} value is {len(value.strip())} characters long",
                    f"at most {MAX_PATTERN_CHARS} characters",
                    position,
                )
    return None


def number(value: str) -> Decimal | None:
    """A criterion value as a number, when it is written as one (digits, an optional fraction and exponent)."""
    text = value.strip()
    return Decimal(text) if len(text) <= 64 and _NUMBER.fullmatch(text) else None


def range_bounds(condition: str, values: Sequence[str]) -> tuple[Decimal | None, str | None]:
    """The one bound "any of `values`" comes to: (for numbers: the loosest numeric value, None when no value is a
    number; for strings: the loosest of all the values as text, None when there are none)."""
    lower = condition.startswith("GREATER")
    numbers = [n for n in (number(v) for v in values) if n is not None]
    texts = [v.strip() for v in values]
    pick = min if lower else max
    return (pick(numbers) if numbers else None), (pick(texts) if texts else None)


def names_removed(filters: dict[str, list[str]] | None, any_of: Sequence[Sequence[Criterion]] | None) -> bool:
    """Whether a search says anything about `removed`: otherwise soft-deleted entities are hidden."""
    return REMOVED_FIELD in (filters or {}) or any(c.field == REMOVED_FIELD for group in any_of or () for c in group)


@dataclass
class SearchHit:
    urn: str
    entity_type: str
    score: float
    fields: dict[str, Any]


@dataclass
class SearchPage:
    hits: list[SearchHit]
    total: int
    scroll_id: str | None  # opaque; None when there is no next page
    facets: dict[str, dict[str, int]] = field(default_factory=dict)  # filter field -> value -> count


@dataclass(frozen=True)
class EdgeQuery:
    """Which edges `SearchBackend.scroll_edges` pages through. Every given constraint must hold (empty: any);
    `either_urns`: the source or the destination is one of them (lineage anchors)."""

    relationship_types: tuple[str, ...] = ()
    source_types: tuple[str, ...] = ()
    destination_types: tuple[str, ...] = ()
    source_urns: tuple[str, ...] = ()
    destination_urns: tuple[str, ...] = ()
    either_urns: tuple[str, ...] = ()
    lineage_only: bool = False


EdgeKey = tuple[str, str, str, str]  # (source, aspect, relationship, destination): an edge's identity and page order


@dataclass
class EdgePage:
    edges: list[Edge]
    after: EdgeKey | None  # the last edge's key when there may be more; None on the last page


# The most hits one page may ask for: DataHub's `searchService.limits.results.max` (Elasticsearch's
# index.max_result_window). Every protocol's page size is checked against it (over it: a 400 naming it).
MAX_PAGE_SIZE = 10_000


@dataclass
class TimeseriesQuery:
    urn: str
    aspect: str
    start_ms: int | None = None
    end_ms: int | None = None
    limit: int = 10_000
    equals: dict[str, Any] = field(default_factory=dict)  # top-level field -> value (client filters)


class IndexedVersion(NamedTuple):
    """What an index holds for one aspect of an entity, as `SearchBackend.indexed_versions` lists it (reconcile
    compares these with the latest rows of `metadata_aspect_v2`)."""

    urn: str
    aspect: str
    target: Literal["document", "edges"]  # the aspect in its entity's document, or the aspect's edge-set marker
    version: int  # the version indexed
    live: bool  # document: the aspect has fields (not deleted); edges: the marker's set is not empty


@dataclass(frozen=True)
class RebuildTarget:
    """Fresh concrete indices a restore builds while the live ones keep serving (Elasticsearch/OpenSearch):
    alias -> fresh index. Plain data, shipped to the Spark tasks that fill it (`ElasticBackend.writing_into`);
    `ElasticBackend.swap_in` makes it live."""

    indices: dict[str, str]


class IndexRefused(Exception):
    """The backend refused some changes for their data (a document over one of its limits, a value it cannot store).
    Retrying the same changes gives the same answer: their change logs are recorded as indexing failures and skipped
    (app.search.failures). `items`: what the backend said about each refused document."""

    def __init__(self, message: str, items: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.items = list(items)


class SearchUnavailable(Exception):
    """The backend is not started (its server is unreachable)."""


class IndexUnavailable(Exception):
    """The backend could not take the changes now (overloaded, rejected for capacity, a conflict storm): transient, the
    whole batch is retried later and nothing is recorded as failed."""


class SearchBackend(Protocol):
    """What the service and the Spark job need from an index store. Elasticsearch/OpenSearch in production;
    Postgres (tsvector, edge and point tables) in the embedded default. Both pass the same behaviour tests."""

    async def start(self) -> None: ...  # connect; create indices/tables from the registry if missing

    async def close(self) -> None: ...

    async def apply(self, changes: list[IndexChange]) -> None: ...  # idempotent, order-safe, bulk

    async def search(
        self,
        entity_type: str,
        query: str,
        *,
        filters: dict[str, list[str]] | None = None,
        count: int = 10,
        scroll_id: str | None = None,
        sort: list[tuple[str, str]] | None = None,
        any_of: Sequence[Sequence[Criterion]] | None = None,
        facets: bool = True,
        property_facets: Sequence[str] = (),
    ) -> SearchPage: ...

    # `filters` AND together (any of a filter's values); `any_of`, when given, must hold as well: at least one of its
    # groups matches (an empty list matches nothing). Soft-deleted entities are hidden unless either names
    # `removed`. `facets=False`: no facet counts (a scroll that does not show them); with facets, each filter field's
    # and each of `property_facets`' (`structuredProperties.<qualified name>`, counted under that name, as DataHub
    # names a requested facet: app.search.structured_properties). `scroll_id`: a previous page's
    # (a keyset cursor, app.search.cursors; anything else is an InvalidCursor, raised before any query).

    async def autocomplete(self, entity_type: str, prefix: str, *, limit: int = 10) -> list[SearchHit]: ...

    async def relationships(
        self,
        urn: str,
        *,
        direction: Direction,
        types: list[str] | None = None,
        start: int = 0,
        count: int = 100,
    ) -> tuple[list[Edge], int]: ...

    async def lineage(
        self,
        urn: str,
        *,
        direction: Literal["UPSTREAM", "DOWNSTREAM"],
        max_hops: int = 3,
    ) -> list[tuple[Edge, int]]: ...

    async def lineage_hop(self, nodes: Sequence[str], *, direction: Literal["UPSTREAM", "DOWNSTREAM"]) -> list[Edge]:
        """The lineage edges one step from `nodes` follows walking `direction` (as `lineage` follows them): one hop
        of app.search.lineage's walk, which keeps the request's read budget between hops."""
        ...

    async def scroll_edges(self, query: EdgeQuery, *, after: EdgeKey | None = None, count: int = 100) -> EdgePage:
        """Edges matching `query` in key order, the first `count` after `after` (keyset paging: an edge that exists
        throughout a scroll is seen exactly once, whatever else is written meanwhile)."""  # (edge, hop) breadth first; upstream = follow DownstreamOf edges outgoing

    async def timeseries(self, query: TimeseriesQuery) -> list[TimeseriesPoint]: ...  # newest first

    async def document_versions(self, urn: str) -> dict[str, int]: ...  # aspect -> version indexed (trace, reconcile)

    async def delete_timeseries(
        self,
        urn: str,
        aspects: list[str],
        *,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> int: ...  # points of `urn` in those aspects within the (inclusive) range; returns how many

    # --- index lifecycle (restore-indices, reconcile) ------------------------------------------------------------

    async def create_missing_indices(self, entity_types: Sequence[str]) -> None:
        """Create the graph indices and these entity types' indices where they do not exist; existing ones are left
        exactly as they are (no mapping migration). Nothing to do where the schema comes from migrations."""

    async def indexed_versions(self, entity_types: Sequence[str]) -> list[IndexedVersion]:
        """Every aspect version the index holds for these entity types, in documents and edge-set markers. A deleted
        aspect is listed with `live=False`; a tombstoned entity's aspects are listed so or not at all."""
