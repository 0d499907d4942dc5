"""The embedded search backend: search documents, the relationship/lineage graph and timeseries points in Postgres.

Tables come from migration 0003 (`search_aspect_fields`, `search_document`, `search_edge`, `search_edge_version`,
`timeseries_point`; `search_edge.owner` from 0015), the index of `search_document.exact_names` from 0010 (a text query is answered by two GIN
indexes), each aspect's pieces of the document and the aggregates that combine them from 0013. All statements run on the asyncpg connection under a SQLAlchemy `AsyncEngine` connection; bulk statements
take parallel arrays (`unnest`), so a batch of any size costs a fixed number of round trips.

Applying changes (`apply`), in one READ COMMITTED transaction:

1. transaction-level advisory locks on every URN the batch touches (sorted: no deadlocks between batches), so two
   batches that touch one entity rebuild its document one after the other (no lost update of the merged fields);
2. aspect fields: `INSERT ... ON CONFLICT (urn, aspect) DO UPDATE ... WHERE stored.version <= EXCLUDED.version`:
   an older version never overwrites a newer one; a delete keeps the row as a version marker (`deleted`, no fields).
   With its fields the row holds the aspect's pieces of the document, derived from them alone (`aspect_text`): the
   weighted tsvector of its text (at most `search_max_document_chars` characters, weight A first), its exact names
   and how much text the vector holds;
3. edges: the (source, aspect) version marker is upserted the same way; for the sets it accepted, the old edges are
   deleted and the new ones inserted;
4. documents of the touched URNs are rebuilt in one statement by combining their aspects' rows, parsing no text
   but the URN: merged fields, versions, `removed`, `search_vector` (the aspects' vectors concatenated in aspect
   order while their text is within `search_max_document_chars` in all, so that no entity's tsvector reaches
   Postgres's 1 MB limit however many aspects it has, then the URN's) and `exact_names`; a document with no live
   aspect left becomes a tombstone (`entity_removed`, its versions only, hidden from every read);
5. timeseries points are upserted by (aspect, doc_id); entity removals (unless the key aspect is indexed at a newer
   version: re-created since) mark every aspect row deleted at the version it holds (the key aspect's at the
   removal's version) and delete the edges in both directions; the edge version markers stay, so an older edge set
   is not projected again. At equal versions a delete (or an empty edge set) wins.

A batch is applied in order: changes up to an `EntityRemoval` are applied before it, the ones after it after it.

For restore-indices and reconcile: `clear(entity_types)` deletes entity types' rows (there is no shadow build on
Postgres: a restore is always in place), `indexed_versions` lists what the tables hold per aspect.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app import read_deadline
from app.db import PooledConnection, driver_connection
from app.registry import EntityRegistry
from app.replicas import read_engine
from app.search import documents, query_syntax
from app.search.cursors import decode_keyset, keyset_cursor
from app.search.model import (
    DOWNSTREAM_LINEAGE,
    EQUALITY_CONDITIONS,
    RANGE_CONDITIONS,
    REMOVED_FIELD,
    URN_FIELD,
    WILDCARD_CONDITIONS,
    AspectEdges,
    AspectFields,
    Criterion,
    Direction,
    Edge,
    EdgePage,
    EdgeQuery,
    EntityRemoval,
    IndexChange,
    IndexedVersion,
    SearchFieldSpec,
    SearchHit,
    SearchPage,
    TimeseriesPoint,
    TimeseriesQuery,
    edge_set_aspect,
    names_removed,
    range_bounds,
)
from app.search.structured_properties import FIELD_PREFIX as PROPERTY_FIELD_PREFIX
from app.search.structured_properties import document_field

log = logging.getLogger("metaledger.search.postgres")

# Advisory lock class of search documents (pg_advisory_xact_lock(class, hashtext(urn))); app.changelog.outbox uses
# 0x4D4C0001..4.
DOCUMENT_LOCK_CLASS = 0x4D4C0010
# An exact name/id match outranks any full-text rank (ts_rank_cd is at most a few units).
EXACT_MATCH_BONUS = 1000.0
# Searches are planned from search_document's statistics, which autovacuum gathers when its naptime and its workers
# (busy with larger tables while a catalog is loaded) let it: minutes after 10,000 datasets were written the table
# had none, and a text search read every document of its types through the (entity_type, urn) index, 195 ms a
# statement instead of 0.3 through the GIN indexes. So after every ANALYZE_CHECK_DOCUMENTS documents it rebuilt, a
# backend has the table analyzed (in the background) when it never was or this fraction of it changed since, and
# at most once every ANALYZE_MIN_INTERVAL_S once it was: a small catalog written over and over (800 documents, 6,000
# aspect writes a second) changed by the fraction at every check, and was analyzed twice a second (9 µs of Postgres
# an aspect write, and a statistics sample of a table whose shape had not changed).
ANALYZE_CHECK_DOCUMENTS = 1_000
ANALYZE_CHANGED_FRACTION = 0.2
ANALYZE_MIN_INTERVAL_S = 60.0
# A process's cache of search results (`_ResultCache`): at most this many rows in all (a page's rows hold their
# documents' fields), of statements of at most this many rows, each for at most this long (what bounds a result kept
# past a write whose version move was lost: a crash between its commit and the move).
RESULT_CACHE_ROWS = 20_000
RESULT_CACHE_STATEMENT_ROWS = 2_000
RESULT_CACHE_TTL_S = 60.0
# Field weights when the registry gives no spec for a field (documents built by hand, fields outside annotations).
_NAME_FIELDS = ("name", "id", "displayname", "title", "qualifiedname")
_TEXT_TYPES = {"TEXT", "TEXT_PARTIAL", "WORD_GRAM", "KEYWORD", "URN", "URN_PARTIAL"}
_NOT_TEXT_TYPES = {"BOOLEAN", "COUNT", "DATETIME", "DOUBLE", "OBJECT", "MAP_ARRAY"}
# What `clear` deletes: table, URN column.
_CLEARED_TABLES = (
    ("search_document", "urn"),
    ("search_aspect_fields", "urn"),
    ("search_edge", "source"),
    ("search_edge_version", "source"),
)
_RANGE_OPERATORS = {
    "GREATER_THAN": ">",
    "GREATER_THAN_OR_EQUAL_TO": ">=",
    "LESS_THAN": "<",
    "LESS_THAN_OR_EQUAL_TO": "<=",
}
_WEBSEARCH_SYNTAX = re.compile(r'"|(^|\s)-\w|\s(or|OR)\s')
_TOKEN = re.compile(r"\w+")
# The parts of a word of a structured query (app.search.query_syntax): letters and digits, with the wildcards in
# them; what is between parts splits them, as `index_text` splits the text indexed.
_WORD_PARTS = re.compile(r"(?:[^\W_]|[*?])+")
_WORDS = re.compile(r"[^\W_]+")


def field_weight(spec: SearchFieldSpec) -> tuple[str, bool]:
    """(tsvector weight, counts as an exact name) of a field: high-boost keyword/id/name fields are A and exact
    names, other names B, plain text C, everything else (URNs, low boosts, not queried by default) D."""
    text_like = spec.field_type.upper() in _TEXT_TYPES
    if spec.field_type.upper() in _NOT_TEXT_TYPES or not spec.query_by_default:
        return "D", False
    if spec.boost >= 5 and text_like:
        return "A", True
    if spec.boost >= 2 or spec.name.lower() in _NAME_FIELDS:
        return "B", spec.name.lower() in _NAME_FIELDS
    if spec.field_type.upper() in {"TEXT", "TEXT_PARTIAL", "WORD_GRAM"} and spec.boost >= 1:
        return "C", False
    return "D", False


def field_weights(specs: Sequence[SearchFieldSpec]) -> dict[str, tuple[str, bool]]:
    """Document field -> (weight, exact name) of an entity type's specs: one field may come from several annotations,
    the strongest wins."""
    weights: dict[str, tuple[str, bool]] = {}
    for spec in specs:
        weight, is_exact = field_weight(spec)
        previous = weights.get(spec.name)
        if previous is None or (weight, not is_exact) < (previous[0], not previous[1]):
            weights[spec.name] = (weight, is_exact)
    return weights


def _unspecified_weight(name: str) -> tuple[str, bool]:
    """(weight, exact name) of a field no spec names (documents built by hand, fields outside annotations)."""
    lowered = name.lower()
    if lowered in _NAME_FIELDS:
        return "A", True
    return ("C" if "description" in lowered else "D"), False


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, out)
    elif isinstance(value, list):
        for item in value:
            _strings(item, out)


def aspect_text(
    fields: Mapping[str, Any], weights: Mapping[str, tuple[str, bool]], max_chars: int,
) -> tuple[list[str | None], list[str], int]:  # fmt: skip
    """An aspect's pieces of its entity's text search: (its text by weight A..D, at most `max_chars` characters in
    all, the heavier weights first, each as indexed (`index_text`); the lower-cased text of its exact-name fields;
    the characters of text kept). A field's text is every string in its value; structured property values are left
    out (they are found by their filters, which leave out soft-deleted properties' values)."""
    groups: dict[str, list[str]] = {"A": [], "B": [], "C": [], "D": []}
    exact: list[str] = []
    for name, value in fields.items():
        if name.startswith(PROPERTY_FIELD_PREFIX):
            continue
        strings: list[str] = []
        _strings(value, strings)
        if not strings:
            continue
        text = " ".join(strings)
        weight, is_exact = weights.get(name) or _unspecified_weight(name)
        groups[weight].append(text)
        if is_exact:
            exact.append(text.lower())
    left = max_chars
    texts: list[str | None] = []
    for weight in "ABCD":
        kept = " ".join(groups[weight])[:left] if groups[weight] else None
        left -= len(kept or "")
        texts.append(None if kept is None else index_text(kept))
    return texts, exact, max_chars - left


def _json(value: Any) -> Any:
    if value is None or not isinstance(value, str | bytes):
        return value
    return orjson.loads(value)


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _lexeme(word: str, *, prefix: bool = False) -> str:
    """One quoted tsquery operand (a word the parser may split further, as it splits the text indexed)."""
    return "'" + word.replace("\\", "\\\\").replace("'", "''") + "'" + (":*" if prefix else "")


def _like_pattern(part: str) -> str:
    """A LIKE pattern of a word with wildcards (`*`: any characters, `?`: one)."""
    return "".join({"*": "%", "?": "_"}.get(c) or ("\\" + c if c in "%_\\" else c) for c in part)


def _prefix_tsquery(text: str) -> str | None:
    tokens = [t.lower() for t in _TOKEN.findall(text)]
    return " & ".join(f"'{t}':*" for t in tokens) or None


# --- SQL ------------------------------------------------------------------------------------------------------

_STALE_STATISTICS = """
SELECT c.reltuples < 0 OR coalesce(s.n_mod_since_analyze, 0) > $1 * c.reltuples
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = 'search_document'::regclass
"""
# The search index's version (migration 0021): read as a search's reads begin (-1: none, nothing is cached), moved
# after every write of the documents commits, in a transaction of its own that does not wait for its WAL to be
# flushed (a move a crash loses leaves a result cached for RESULT_CACHE_TTL_S at most).
_READ_VERSION = "coalesce((SELECT max(version) FROM search_index_version), -1)"
_MOVE_VERSION = (
    "BEGIN; SET LOCAL synchronous_commit = off; UPDATE search_index_version SET version = version + 1; COMMIT"
)

_LOCK_URNS = """
SELECT count(pg_advisory_xact_lock($1::int, h)) FROM (
    SELECT DISTINCT hashtext(u) AS h FROM unnest($2::text[]) AS u ORDER BY 1
) s
"""


# Every ASCII character that is not a letter or a digit, to a space (`index_text`).
_SEPARATORS_TO_SPACES = str.maketrans({chr(c): " " for c in range(1, 128) if not chr(c).isalnum()})


def index_text(text: str) -> str:
    """The text indexed for `text`: as written (the parser keeps `db.orders`, e-mails, ...) and split on every ASCII
    character that is not a letter or digit (so `orders` finds `db.orders`). Split here, not by Postgres: a
    `regexp_replace(.., '[^[:alnum:]]+', ' ', 'g')` in the statement cost Postgres 17 µs a 100-character text, twice
    the `to_tsvector` of it (`translate` with these 95 characters, 43 µs); the `simple` parser splits on the
    non-ASCII ones itself: the vectors of random strings of ASCII and non-ASCII letters, digits and punctuation are
    the regular expression's (tests/integration/test_search_index_text.py), so documents indexed before and after
    are found alike."""
    return f"{text} {text.translate(_SEPARATORS_TO_SPACES)}"


# An aspect's weighted tsvector, from its text in four weight groups (columns text_a..text_d: `aspect_text`, split).
ASPECT_VECTOR_SQL = " || ".join(
    f"setweight(to_tsvector('simple', coalesce(text_{w}, '')), '{w.upper()}')" for w in "abcd"
)

# What separates a facet value's field from its value in `search_document.facet_values` (the ASCII unit separator:
# not in a field name).
FACET_SEPARATOR = chr(31)


def facet_values_sql(fields: str, keys: str) -> str:
    """SQL of a document's facet values (`search_document.facet_values`, migration 0018), from its merged fields
    (`fields`, a jsonb expression) and the document fields of its entity type's filters (`keys`, a jsonb array
    expression): each distinct value of those fields and of its structured properties, an array's elements one by one,
    as `field<FACET_SEPARATOR>value` (JSON null left out). A facet counts these, not the matches' fields: a search
    matching 100,000 documents would read and expand every one of their `fields`."""
    return f"""ARRAY(
        SELECT DISTINCT f.key || chr(31) || v.value
        FROM jsonb_each({fields}) f
        CROSS JOIN LATERAL jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(f.value) = 'array' THEN f.value ELSE jsonb_build_array(f.value) END
        ) v(value)
        WHERE v.value IS NOT NULL
          AND (coalesce(({keys}) ? f.key, false) OR starts_with(f.key, '{PROPERTY_FIELD_PREFIX}'))
    )"""


# An aspect's row holds its pieces of the document, derived from its fields alone: the fields, the weighted
# tsvector of its text and its exact names (`aspect_text`). $7..$10: its text by weight, $11: exact names (a JSON
# array), $12: the characters of text the vector is built from.
_UPSERT_ASPECT_FIELDS = f"""
INSERT INTO search_aspect_fields AS s (urn, aspect, entity_type, version, deleted, fields, search_vector, exact_names,
                                       text_chars, updated_at)
SELECT urn, aspect, entity_type, version, deleted, fields::jsonb, {ASPECT_VECTOR_SQL},
       ARRAY(SELECT jsonb_array_elements_text(exact::jsonb)), text_chars, now()
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::boolean[], $6::text[],
            $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::int[])
     AS x(urn, aspect, entity_type, version, deleted, fields, text_a, text_b, text_c, text_d, exact, text_chars)
ON CONFLICT (urn, aspect) DO UPDATE
SET entity_type = EXCLUDED.entity_type, version = EXCLUDED.version, deleted = EXCLUDED.deleted,
    fields = EXCLUDED.fields, search_vector = EXCLUDED.search_vector, exact_names = EXCLUDED.exact_names,
    text_chars = EXCLUDED.text_chars, updated_at = EXCLUDED.updated_at
WHERE s.version < EXCLUDED.version OR (s.version = EXCLUDED.version AND (EXCLUDED.deleted OR NOT s.deleted))
"""

# Rebuild the documents of the touched urns ($1) by combining their aspects' rows, in aspect order (a field two
# aspects hold: the later one's value), with no text to parse but the URN's ($4: each URN's `index_text`, in $1's
# order): fields merged, versions, the concatenated tsvectors of the aspects whose text, counted in aspect order, is
# within $2 characters (a tsvector holds 1 MB), exact names, facet values ($3: entity type -> its filters' document
# fields). The aggregates come from migration 0013.
_REBUILD_DOCUMENTS = rf"""
WITH rows AS (
    SELECT a.urn, a.aspect, a.entity_type, a.version, a.deleted, a.fields, a.search_vector, a.exact_names,
           sum(a.text_chars) FILTER (WHERE NOT a.deleted) OVER (PARTITION BY a.urn ORDER BY a.aspect) AS text_upto
    FROM search_aspect_fields a WHERE a.urn = ANY($1::text[])
), docs AS (
    SELECT urn, min(entity_type) AS entity_type, jsonb_object_agg(aspect, version) AS aspect_versions,
           bool_or(NOT deleted) AS live,
           search_jsonb_merge(fields ORDER BY aspect) FILTER (WHERE NOT deleted) AS fields,
           search_tsvector_concat(search_vector ORDER BY aspect) FILTER (WHERE NOT deleted AND text_upto <= $2)
               AS search_vector,
           search_array_concat(exact_names ORDER BY aspect) FILTER (WHERE NOT deleted) AS exact_names
    FROM rows GROUP BY urn
), gone AS (
    DELETE FROM search_document d USING unnest($1::text[]) AS t(urn)
    WHERE d.urn = t.urn AND NOT EXISTS (SELECT 1 FROM docs WHERE docs.urn = t.urn)
)
INSERT INTO search_document AS d (urn, entity_type, fields, aspect_versions, removed, search_vector, exact_names,
                                  facet_values, entity_removed, updated_at)
SELECT urn, entity_type, fields, aspect_versions, coalesce(fields -> 'removed' = 'true'::jsonb, false),
       coalesce(search_vector, ''::tsvector) || setweight(to_tsvector('simple', u.text), 'D'),
       array_append(coalesce(exact_names, '{{}}'), lower(urn)),
       {facet_values_sql("fields", "$3::jsonb -> entity_type")}, false, now()
FROM docs JOIN unnest($1::text[], $4::text[]) AS u(urn, text) USING (urn) WHERE live
UNION ALL
-- a document with no live aspect left: a tombstone (its versions only, hidden from every read)
SELECT urn, entity_type, '{{"entityRemoved": true}}'::jsonb, aspect_versions, false, ''::tsvector, '{{}}', '{{}}',
       true, now()
FROM docs WHERE NOT live
ON CONFLICT (urn) DO UPDATE
SET entity_type = EXCLUDED.entity_type, fields = EXCLUDED.fields, aspect_versions = EXCLUDED.aspect_versions,
    removed = EXCLUDED.removed, search_vector = EXCLUDED.search_vector, exact_names = EXCLUDED.exact_names,
    facet_values = EXCLUDED.facet_values, entity_removed = EXCLUDED.entity_removed, updated_at = EXCLUDED.updated_at
"""

# An edge set applies when newer than the marker; at an equal version only if it is empty (a delete) or the stored
# set is not (an idempotent replay): the empty set a delete or an entity removal left is never refilled by an older
# change log of the same version.
_UPSERT_EDGE_VERSIONS = """
WITH c AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::boolean[]) AS c(source, aspect, version, empty)
)
INSERT INTO search_edge_version AS s (source, aspect, version)
SELECT c.source, c.aspect, c.version FROM c
LEFT JOIN search_edge_version v ON v.source = c.source AND v.aspect = c.aspect
WHERE v.version IS NULL OR v.version < c.version OR (v.version = c.version AND (
    c.empty OR EXISTS (SELECT 1 FROM search_edge e WHERE e.source = c.source AND e.aspect = c.aspect)
    OR EXISTS (SELECT 1 FROM search_edge e WHERE e.owner = c.source AND e.aspect = c.aspect || chr(31) || c.source)))
ON CONFLICT (source, aspect) DO UPDATE SET version = EXCLUDED.version
WHERE s.version <= EXCLUDED.version
RETURNING source, aspect
"""

# An edge set's rows: its own edges, and the ones it owns that start elsewhere (schema fields' lineage, keyed by an
# aspect that names the owner: app.search.model.edge_set_aspect).
_DELETE_EDGE_SETS = """
DELETE FROM search_edge e USING unnest($1::text[], $2::text[]) AS k(source, aspect)
WHERE (e.source = k.source AND e.aspect = k.aspect)
   OR (e.owner = k.source AND e.aspect = k.aspect || chr(31) || k.source)
"""

_EDGE_COLUMNS = (
    "source, aspect, relationship, destination, version, source_type, destination_type, is_lineage, via, "
    "created_on, created_actor, updated_on, updated_actor, properties, owner"
)

_INSERT_EDGES = f"""
INSERT INTO search_edge ({_EDGE_COLUMNS})
SELECT source, aspect, relationship, destination, version, source_type, destination_type, is_lineage, via,
       created_on, created_actor, updated_on, updated_actor, properties::jsonb, owner
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::boolean[],
            $9::text[], $10::bigint[], $11::text[], $12::bigint[], $13::text[], $14::text[], $15::text[])
     AS e(source, aspect, relationship, destination, version, source_type, destination_type, is_lineage, via,
          created_on, created_actor, updated_on, updated_actor, properties, owner)
ON CONFLICT (source, aspect, relationship, destination) DO UPDATE
SET version = EXCLUDED.version, source_type = EXCLUDED.source_type, destination_type = EXCLUDED.destination_type,
    is_lineage = EXCLUDED.is_lineage, via = EXCLUDED.via, created_on = EXCLUDED.created_on,
    created_actor = EXCLUDED.created_actor, updated_on = EXCLUDED.updated_on, updated_actor = EXCLUDED.updated_actor,
    properties = EXCLUDED.properties, owner = EXCLUDED.owner
"""

_UPSERT_POINTS = """
INSERT INTO timeseries_point (doc_id, aspect, urn, entity_type, timestamp_ms, fields, value, system_metadata)
SELECT doc_id, aspect, urn, entity_type, timestamp_ms, fields::jsonb, value::jsonb, system_metadata::jsonb
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::text[])
     AS p(doc_id, aspect, urn, entity_type, timestamp_ms, fields, value, system_metadata)
ON CONFLICT (aspect, doc_id) DO UPDATE
SET urn = EXCLUDED.urn, entity_type = EXCLUDED.entity_type, timestamp_ms = EXCLUDED.timestamp_ms,
    fields = EXCLUDED.fields, value = EXCLUDED.value, system_metadata = EXCLUDED.system_metadata
"""

# Entity removals ($1 urn, $2 entity type, $3 key aspect, $4 version; one per urn, the newest): skipped when the key
# aspect is indexed at a newer version; otherwise every aspect row is marked deleted at its version, the key aspect's
# at least at the removal's, and the edges from and to the entity are deleted (the version markers stay).
_REMOVE_ENTITIES = """
WITH r AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS r(urn, entity_type, aspect, version)
), live AS (
    SELECT r.* FROM r WHERE NOT EXISTS (
        SELECT 1 FROM search_aspect_fields a WHERE a.urn = r.urn AND a.aspect = r.aspect AND a.version > r.version)
), tombstoned AS (
    UPDATE search_aspect_fields a
    SET deleted = true, fields = '{}'::jsonb, search_vector = ''::tsvector, exact_names = '{}', text_chars = 0,
        updated_at = now()
    FROM live WHERE a.urn = live.urn AND a.aspect <> live.aspect AND NOT a.deleted
), keys AS (
    INSERT INTO search_aspect_fields AS a (urn, aspect, entity_type, version, deleted, fields, updated_at)
    SELECT urn, aspect, entity_type, version, true, '{}'::jsonb, now() FROM live
    ON CONFLICT (urn, aspect) DO UPDATE
    SET version = GREATEST(a.version, EXCLUDED.version), deleted = true, fields = '{}'::jsonb,
        search_vector = ''::tsvector, exact_names = '{}', text_chars = 0, updated_at = now()
), outgoing AS (
    DELETE FROM search_edge e USING live WHERE e.source = live.urn
), owned AS (
    DELETE FROM search_edge e USING live WHERE e.owner = live.urn
), incoming AS (
    DELETE FROM search_edge e USING live WHERE e.destination = live.urn
)
SELECT urn FROM live
"""


def _edge(record: asyncpg.Record) -> Edge:
    return Edge(
        source=record["source"], destination=record["destination"], relationship=record["relationship"],
        source_type=record["source_type"], destination_type=record["destination_type"], via=record["via"],
        created_on=record["created_on"], created_actor=record["created_actor"], updated_on=record["updated_on"],
        updated_actor=record["updated_actor"], properties=_json(record["properties"]) or {},
        is_lineage=record["is_lineage"],
    )  # fmt: skip


_EDGE_SELECT = (
    "source, destination, relationship, source_type, destination_type, via, created_on, created_actor, "
    "updated_on, updated_actor, properties::text AS properties, is_lineage"
)


class _ResultCache:
    """A process's search results (the rows of a statement, by its text and parameters), each answered again while
    the search index is at the version it was read at (`search_index_version`, moved after every write of the
    documents commits; versions only grow) and for RESULT_CACHE_TTL_S at most: a repeated search — the same page
    reloaded, the facets and totals counted beside every page of a scroll, a search many people run — reads its
    matches once per version, as Elasticsearch's request cache answers a repeated count and aggregation until the
    index changes. The text and parameters are the whole of what decides the rows (the read rule's scope among
    them), so one caller's result is never another's. A version read before a search began is the one its rows
    are kept at: rows read later can be newer than it, never older. A statement being read at a version is read
    once: the searches asking for it meanwhile wait for its rows (20 requests a second for a search that takes a
    second to count would otherwise all count it, each slower for the others)."""

    def __init__(self) -> None:
        # statement and parameters -> (version, until, rows), least recently used first
        self._rows: OrderedDict[tuple[str, str], tuple[int, float, list[asyncpg.Record]]] = OrderedDict()
        self._held = 0  # rows in all, and one for each statement
        self._newest = 0  # the newest version seen: rows of older versions are never answered again
        # statement and parameters -> (version, its rows once read) of the statements being read
        self._reading: dict[tuple[str, str], tuple[int, asyncio.Future[list[asyncpg.Record]]]] = {}

    async def read(
        self, key: tuple[str, str], version: int, fetch: Callable[[], Awaitable[list[asyncpg.Record]]]
    ) -> list[asyncpg.Record]:
        """The rows of a statement at `version`: kept, being read by another search (a read that fails or is
        cancelled leaves each of its waiters to read for itself), or read by `fetch` and kept."""
        while True:
            rows = self.get(key, version)
            if rows is not None:
                return rows
            reading = self._reading.get(key)
            if reading is None or reading[0] != version:
                break
            await asyncio.wait([reading[1]])
            if not reading[1].cancelled():
                return reading[1].result()
        future: asyncio.Future[list[asyncpg.Record]] = asyncio.get_running_loop().create_future()
        self._reading[key] = (version, future)
        try:
            rows = await fetch()
            self.put(key, version, rows)
            future.set_result(rows)
            return rows
        finally:
            if not future.done():
                future.cancel()
            if self._reading.get(key, (0, None))[1] is future:
                del self._reading[key]

    def _seen(self, version: int) -> None:
        if version > self._newest:
            self._newest = version
            self._rows.clear()
            self._held = 0

    def get(self, key: tuple[str, str], version: int) -> list[asyncpg.Record] | None:
        self._seen(version)
        found = self._rows.get(key)
        if found is None or found[0] != version or found[1] < time.monotonic():
            return None
        self._rows.move_to_end(key)
        return found[2]

    def put(self, key: tuple[str, str], version: int, rows: list[asyncpg.Record]) -> None:
        self._seen(version)
        if version < self._newest or len(rows) > RESULT_CACHE_STATEMENT_ROWS:
            return
        replaced = self._rows.pop(key, None)
        if replaced is not None:
            self._held -= len(replaced[2]) + 1
        self._rows[key] = (version, time.monotonic() + RESULT_CACHE_TTL_S, rows)
        self._held += len(rows) + 1  # an empty result held too
        while self._held > RESULT_CACHE_ROWS:
            _, (_, _, dropped) = self._rows.popitem(last=False)
            self._held -= len(dropped) + 1


class _Reads:
    """A search's read connection, at the index version read as it began: a fetch the result cache holds at that
    version is answered from it, and the connection's read transaction (`begin`) is begun at the first fetch it does
    not hold. A search answered from the cache is one statement, the version's, instead of three round trips (BEGIN
    with the settings, the version, COMMIT): twice a search with its facets."""

    def __init__(
        self, conn: asyncpg.Connection, cache: _ResultCache, version: int, begin: Callable[[], Awaitable[Any]]
    ) -> None:
        self._conn, self._cache, self._version, self._begin = conn, cache, version, begin
        self.began = False

    async def fetch(self, sql: str, *params: Any) -> list[asyncpg.Record]:
        if self._version < 0:
            return await self._fetch(sql, params)
        return await self._cache.read((sql, repr(params)), self._version, lambda: self._fetch(sql, params))

    async def _fetch(self, sql: str, params: Sequence[Any]) -> list[asyncpg.Record]:
        if not self.began:
            await self._begin()
            self.began = True
        return list(await self._conn.fetch(sql, *params))


@dataclass(slots=True)
class _Counted:
    """The matches of one entity type: how many, and how many have each facet value (field -> value -> matches)."""

    total: int = 0
    values: dict[str, dict[str, int]] = field(default_factory=dict)

    def facets(self, names: Mapping[str, str]) -> dict[str, dict[str, int]]:
        """The counts of each facet (facet name -> its document field), every one named, empty or not."""
        return {name: dict(self.values.get(field_name, {})) for name, field_name in names.items()}


async def _count(reads: _Reads, where: str, params: Sequence[Any], fields: Iterable[str]) -> dict[str, _Counted]:
    """Entity type -> its matches of `where` (a condition on `d`, search_document, with `params`), counted with the
    values of `fields` in one statement: each match is one NULL entry (the total) and its facet values of those
    fields (migration 0018), distinct per document, so a value's count is the matches that have it."""
    wanted = sorted(set(fields))
    if wanted:
        rows = await reads.fetch(
            f"""
            SELECT d.entity_type, e.entry, count(*) AS n
            FROM search_document d
            CROSS JOIN LATERAL unnest(array_prepend(NULL::text, d.facet_values)) e(entry)
            WHERE {where} AND (e.entry IS NULL OR split_part(e.entry, chr(31), 1) = ANY(${len(params) + 1}::text[]))
            GROUP BY d.entity_type, e.entry
            """,
            *params,
            wanted,
        )
    else:
        rows = await reads.fetch(
            f"SELECT d.entity_type, NULL AS entry, count(*) AS n FROM search_document d WHERE {where} GROUP BY 1",
            *params,
        )
    counted: dict[str, _Counted] = {}
    for r in rows:
        of_type = counted.setdefault(r["entity_type"], _Counted())
        if r["entry"] is None:
            of_type.total = r["n"]
        else:
            field_name, _, value = r["entry"].partition(FACET_SEPARATOR)
            of_type.values.setdefault(field_name, {})[value] = r["n"]
    return counted


@dataclass(frozen=True, slots=True)
class _Recorded:
    """A count-only search of a `CountBatch`: its conditions but the entity type's (parameters from $2 on)."""

    entity_type: str
    where: str
    params: list[Any]
    facet_names: dict[str, str]


class CountBatch:
    """Count-only searches of several entity types (`PostgresBackend.search(..., count=0, batch=)`), answered
    together by `run`: those whose conditions are the same but for the entity type (a text query, filters the types
    name alike: most searches across types) in one statement, `entity_type = ANY(...)`, totals and facets at once. A
    search across DataHub's 23 searchable types was a statement per type for the totals and another for the facets,
    each reading the query's matches again. Recorded through `search`, so what a wrapper adds to a search (the read
    rule's scope: app.auth.reads) is in it."""

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend
        self._recorded: list[_Recorded] = []

    def __len__(self) -> int:
        return len(self._recorded)

    def add(self, entity_type: str, where: str, params: list[Any], facet_names: dict[str, str]) -> None:
        self._recorded.append(_Recorded(entity_type, where, params, facet_names))

    async def run(self) -> list[SearchPage]:
        """A page (a total and facets, no hits) for each search recorded, in their order."""
        groups: dict[tuple[str, str], list[int]] = {}
        for i, recorded in enumerate(self._recorded):
            groups.setdefault((recorded.where, repr(recorded.params)), []).append(i)
        counted: dict[int, _Counted] = {}
        async with self._backend._reads() as reads:
            for (where, _), members in groups.items():
                group = [self._recorded[i] for i in members]
                by_type = await _count(
                    reads,
                    f"d.entity_type = ANY($1::text[]) AND {where}",
                    [sorted({r.entity_type for r in group}), *group[0].params],
                    {name for r in group for name in r.facet_names.values()},
                )
                counted.update((i, by_type.get(self._recorded[i].entity_type, _Counted())) for i in members)
        return [
            SearchPage(hits=[], total=counted[i].total, scroll_id=None, facets=counted[i].facets(r.facet_names))
            for i, r in enumerate(self._recorded)
        ]


class PostgresBackend:
    """`SearchBackend` on the service's own Postgres (the embedded default)."""

    def __init__(self, settings: Any, registry: EntityRegistry, engine: AsyncEngine) -> None:
        self._settings = settings
        self._registry = registry
        self._engine = engine
        # the most text an entity's tsvector is built from (the search documents' per-document limit)
        self._max_text = documents.IndexLimits.from_settings(settings).document_chars
        # entity type -> `field_weights`, of the registry's generation `_weights_of` (a runtime model set moves it)
        self._weights: dict[str, dict[str, tuple[str, bool]]] = {}
        self._weights_of = registry.generation
        self._rebuilt = 0  # documents rebuilt since the statistics were last looked at
        self._analyzing: asyncio.Task[None] | None = None
        self._analyzed_at: float | None = None  # time.monotonic() of this backend's last ANALYZE
        self._results = _ResultCache()

    # --- lifecycle ------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Nothing to create: the tables come from migration 0003, applied when the service starts."""

    async def close(self) -> None:
        """The engine belongs to the service, which disposes of it; an analysis under way is cancelled."""
        if self._analyzing is not None:
            self._analyzing.cancel()
            await asyncio.gather(self._analyzing, return_exceptions=True)

    async def create_missing_indices(self, entity_types: Sequence[str]) -> None:
        """Nothing to create: the tables come from migration 0003."""

    async def clear(self, entity_types: Sequence[str] = ()) -> dict[str, int]:
        """Delete these entity types' rows (every row when empty) of `search_document`, `search_aspect_fields`,
        `search_edge` (edges from them) and `search_edge_version`, in one transaction; returns table -> rows deleted.
        Timeseries points are not touched. There is no shadow build here: search on those types is incomplete until
        they are indexed again."""
        patterns = [f"urn:li:{_like_escape(e)}:%" for e in entity_types]
        cleared: dict[str, int] = {}
        async with self._connection(readonly=False, moves_version=True) as conn:
            for table, column in _CLEARED_TABLES:
                if (
                    patterns and table == "search_edge"
                ):  # an owned edge (a field's, app.search.model) goes with its owner
                    status = await conn.execute(
                        "DELETE FROM search_edge WHERE source LIKE ANY($1::text[]) AND owner IS NULL", patterns
                    )
                    owned = await conn.execute("DELETE FROM search_edge WHERE owner LIKE ANY($1::text[])", patterns)
                    cleared[table] = int(status.split()[-1]) + int(owned.split()[-1])
                    continue
                if patterns:
                    status = await conn.execute(f"DELETE FROM {table} WHERE {column} LIKE ANY($1::text[])", patterns)
                else:
                    status = await conn.execute(f"DELETE FROM {table}")
                cleared[table] = int(status.split()[-1])
        return cleared

    async def indexed_versions(self, entity_types: Sequence[str]) -> list[IndexedVersion]:
        """`search_aspect_fields` (live unless `deleted`) and `search_edge_version` (live when the set has edges) of
        URNs of these entity types. A tombstoned entity's aspects are listed, deleted."""
        patterns = [f"urn:li:{_like_escape(e)}:%" for e in entity_types]
        async with self._connection() as conn:
            docs = await conn.fetch(
                "SELECT urn, aspect, version, NOT deleted AS live FROM search_aspect_fields WHERE urn LIKE ANY($1::text[])",
                patterns,
            )
            edges = await conn.fetch(
                """
                SELECT v.source, v.aspect, v.version,
                       EXISTS (SELECT 1 FROM search_edge e WHERE e.source = v.source AND e.aspect = v.aspect)
                       OR EXISTS (SELECT 1 FROM search_edge e
                                  WHERE e.owner = v.source AND e.aspect = v.aspect || chr(31) || v.source) AS live
                FROM search_edge_version v WHERE v.source LIKE ANY($1::text[])
                """,
                patterns,
            )
        entries = [IndexedVersion(r["urn"], r["aspect"], "document", int(r["version"]), bool(r["live"])) for r in docs]
        entries += [
            IndexedVersion(r["source"], r["aspect"], "edges", int(r["version"]), bool(r["live"])) for r in edges
        ]
        return entries

    @asynccontextmanager
    async def _reads(self) -> AsyncIterator[_Reads]:
        """A read connection for searches, answered from the result cache where it holds their rows at the index
        version read first (`_Reads`); its read transaction, when one was begun, ends with it."""
        async with PooledConnection(await read_engine(self._engine)) as connection, AsyncExitStack() as transaction:
            raw = await connection.driver()
            version = await raw.fetchval(f"SELECT {_READ_VERSION}")
            yield _Reads(raw, self._results, version, lambda: transaction.enter_async_context(self._reading(raw)))

    @asynccontextmanager
    async def _reading(self, raw: asyncpg.Connection, *, walking: bool = False) -> AsyncIterator[None]:
        """A read transaction on `raw` (READ COMMITTED, read-only) with `_connection`'s settings for a read, begun
        with them in one round trip; committed, or rolled back when what ran in it raised."""
        # a read past its budget is cancelled (QueryCanceledError: a 503 with Retry-After; a lineage hop's ends the
        # walk, app.search.lineage)
        timeout_ms = read_deadline.statement_timeout_ms(self._settings.read_timeout_s, walking=walking)
        deadline = f", set_config('statement_timeout', '{timeout_ms}', true)" if timeout_ms else ""
        try:  # the BEGIN too: cancelled after it, the transaction is ended here, not left to the pool's check
            await raw.execute(
                "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY; SELECT set_config('jit', 'off', true), "
                f"set_config('plan_cache_mode', 'force_custom_plan', true){deadline}"
            )
            yield
        except BaseException:
            if raw.is_in_transaction():
                await raw.execute("ROLLBACK")
            raise
        await raw.execute("COMMIT")

    @asynccontextmanager
    async def _connection(
        self, *, readonly: bool = True, moves_version: bool = False, walking: bool = False
    ) -> AsyncIterator[asyncpg.Connection]:
        """A driver connection in a READ COMMITTED transaction (read-only unless writing), JIT off: the planner
        cannot estimate jsonb_each/unnest, overestimates and would JIT-compile for seconds, for nothing. A write of
        the documents `moves_version` once it commits (the result cache's, `_reads`).

        Reads are planned for their parameters every time (`plan_cache_mode = force_custom_plan`): asyncpg prepares
        each statement, and after five executions Postgres may switch to a generic plan, estimated without the
        values. How many documents a filter value or a query matches is what a search plan depends on, and the
        generic estimate (every `fields @>` taken as selective) can be far off: the count of a browse on one
        platform of 100k documents took 56-87 ms on its generic plan instead of 21-25 ms. Planning one of these
        statements costs a fraction of a millisecond.

        A read runs under what is left of its request's budget (app.read_deadline; a lineage hop under what is
        left of its walking share, `walking`), outside a request under METALEDGER_READ_TIMEOUT_S. A request's
        reads go to its read replica when it has one (app.replicas)."""
        if readonly:
            async with PooledConnection(await read_engine(self._engine)) as connection:
                raw = await connection.driver()
                async with self._reading(raw, walking=walking):
                    yield raw
            return
        async with PooledConnection(self._engine) as connection:
            raw = await connection.driver()
            async with raw.transaction(isolation="read_committed"):
                await raw.execute("SET LOCAL jit = off")
                yield raw
            if moves_version:  # committed: a search that reads the new version reads what was written
                await raw.execute(_MOVE_VERSION)

    def count_batch(self) -> CountBatch:
        """A batch of count-only searches answered in as few statements as their conditions allow (`CountBatch`)."""
        return CountBatch(self)

    # --- registry-derived field specs (`app.search.documents`' cache) ---------------------------------------------
    def search_fields(self, entity_type: str) -> Sequence[SearchFieldSpec]:
        try:
            return documents.search_fields(self._registry, entity_type)
        except KeyError:  # an entity type the registry does not know (documents built by hand)
            return ()

    def filter_fields(self, entity_type: str) -> Mapping[str, SearchFieldSpec]:
        try:
            return documents.filter_fields(self._registry, entity_type)
        except KeyError:
            return {}

    def _facet_fields_json(self, entity_types: Iterable[str]) -> str:
        """JSON of entity type -> the document fields of its filters, for these types: the fields whose values a
        rebuilt document keeps as its facet values (`facet_values_sql`)."""
        return orjson.dumps(
            {t: sorted({spec.name for spec in self.filter_fields(t).values()}) for t in set(entity_types)}
        ).decode()

    def _field_weights(self, entity_type: str) -> dict[str, tuple[str, bool]]:
        if self._weights_of != self._registry.generation:
            self._weights, self._weights_of = {}, self._registry.generation
        weights = self._weights.get(entity_type)
        if weights is None:
            weights = self._weights[entity_type] = field_weights(self.search_fields(entity_type))
        return weights

    # --- apply ----------------------------------------------------------------------------------------------------
    async def apply(self, changes: list[IndexChange]) -> None:
        if not changes:
            return
        async with self._connection(readonly=False, moves_version=True) as conn:
            touched = sorted(
                {
                    c.urn if not isinstance(c, AspectEdges) else c.source
                    for c in changes
                    if not isinstance(c, TimeseriesPoint)
                }
            )
            if touched:
                await conn.fetchval(_LOCK_URNS, DOCUMENT_LOCK_CLASS, touched)
            segment: list[IndexChange] = []
            removals: list[EntityRemoval] = []
            for change in changes:
                if isinstance(change, EntityRemoval):
                    if segment:
                        await self._apply_segment(conn, segment)
                        segment = []
                    removals.append(change)
                else:
                    if removals:
                        await self._remove(conn, removals)
                        removals = []
                    segment.append(change)
            if segment:
                await self._apply_segment(conn, segment)
            if removals:
                await self._remove(conn, removals)
        self._rebuilt += len({c.urn for c in changes if isinstance(c, AspectFields | EntityRemoval)})
        if (
            self._rebuilt >= ANALYZE_CHECK_DOCUMENTS
            and (self._analyzing is None or self._analyzing.done())
            and (self._analyzed_at is None or time.monotonic() - self._analyzed_at >= ANALYZE_MIN_INTERVAL_S)
        ):
            self._rebuilt = 0
            self._analyzing = asyncio.create_task(self._analyze_if_stale())

    async def _analyze_if_stale(self) -> None:
        """ANALYZE search_document when Postgres never has, or ANALYZE_CHANGED_FRACTION of it changed since (see
        ANALYZE_CHECK_DOCUMENTS; at most every ANALYZE_MIN_INTERVAL_S); not when another analysis (autovacuum's)
        holds the table. A failure is logged: the next check tries again, and autovacuum still gets to it."""
        try:
            async with self._engine.connect() as connection:
                raw = driver_connection(await connection.get_raw_connection())
                if await raw.fetchval(_STALE_STATISTICS, ANALYZE_CHANGED_FRACTION):
                    async with raw.transaction():
                        await raw.execute("SET LOCAL lock_timeout = '1s'; ANALYZE search_document")
                    self._analyzed_at = time.monotonic()
        except asyncpg.LockNotAvailableError:
            pass
        except Exception:  # noqa: BLE001
            log.warning("analyzing search_document failed", exc_info=True)

    async def _apply_segment(self, conn: asyncpg.Connection, changes: Sequence[IndexChange]) -> None:
        # Within one statement a row can be written once: keep the newest version per key (the later one on a tie,
        # as if applied in order).
        fields: dict[tuple[str, str], AspectFields] = {}
        edges: dict[tuple[str, str], AspectEdges] = {}
        points: dict[tuple[str, str], TimeseriesPoint] = {}
        for change in changes:
            if isinstance(change, AspectFields):
                key = (change.urn, change.aspect)
                kept = fields.get(key)
                if (
                    kept is None
                    or kept.version < change.version
                    or (kept.version == change.version and (change.deleted or not kept.deleted))
                ):  # the newest, a delete on a tie (as the table's upsert decides)
                    fields[key] = change
            elif isinstance(change, AspectEdges):
                key = (change.source, change.aspect)
                kept_edges = edges.get(key)
                if (
                    kept_edges is None
                    or kept_edges.version < change.version
                    or (kept_edges.version == change.version and (not change.edges or bool(kept_edges.edges)))
                ):
                    edges[key] = change
            elif isinstance(change, TimeseriesPoint):
                points[(change.aspect, change.doc_id)] = change
            else:
                raise TypeError(f"not an index change: {change!r}")
        if fields:
            await self._apply_fields(conn, list(fields.values()))
        if edges:
            await self._apply_edges(conn, list(edges.values()))
        if points:
            await self._apply_points(conn, list(points.values()))

    async def _apply_fields(self, conn: asyncpg.Connection, changes: list[AspectFields]) -> None:
        texts: list[list[str | None]] = [[], [], [], []]
        exact: list[str] = []
        chars: list[int] = []
        for c in changes:
            by_weight, names, kept = aspect_text(
                {} if c.deleted else c.fields, self._field_weights(c.entity_type), self._max_text
            )
            for column, text in zip(texts, by_weight):
                column.append(text)
            exact.append(orjson.dumps(names).decode())
            chars.append(kept)
        await conn.execute(
            _UPSERT_ASPECT_FIELDS,
            [c.urn for c in changes],
            [c.aspect for c in changes],
            [c.entity_type for c in changes],
            [c.version for c in changes],
            [c.deleted for c in changes],
            ["{}" if c.deleted else orjson.dumps(c.fields, default=str).decode() for c in changes],
            *texts,
            exact,
            chars,
        )
        await self._rebuild(conn, {c.urn for c in changes}, (c.entity_type for c in changes))

    async def _rebuild(self, conn: asyncpg.Connection, urns: Iterable[str], entity_types: Iterable[str]) -> None:
        ordered = sorted(urns)
        await conn.execute(
            _REBUILD_DOCUMENTS,
            ordered,
            self._max_text,
            self._facet_fields_json(entity_types),
            [index_text(urn) for urn in ordered],
        )

    async def _apply_edges(self, conn: asyncpg.Connection, changes: list[AspectEdges]) -> None:
        accepted = await conn.fetch(
            _UPSERT_EDGE_VERSIONS,
            [c.source for c in changes],
            [c.aspect for c in changes],
            [c.version for c in changes],
            [not c.edges for c in changes],
        )
        keys = {(r["source"], r["aspect"]) for r in accepted}
        if not keys:
            return
        await conn.execute(_DELETE_EDGE_SETS, [k[0] for k in keys], [k[1] for k in keys])
        rows: dict[tuple[str, str, str, str], tuple[AspectEdges, Edge]] = {}
        for change in changes:
            if (change.source, change.aspect) not in keys:
                continue
            for edge in change.edges:
                key = (edge.source, edge_set_aspect(change.source, change.aspect, edge), edge.relationship)
                rows[(*key, edge.destination)] = (change, edge)
        if not rows:
            return
        keyed = list(rows.items())
        values = [value for _, value in keyed]
        await conn.execute(
            _INSERT_EDGES,
            [key[0] for key, _ in keyed],
            [key[1] for key, _ in keyed],
            [e.relationship for _, e in values],
            [e.destination for _, e in values],
            [c.version for c, _ in values],
            [e.source_type for _, e in values],
            [e.destination_type for _, e in values],
            [e.is_lineage for _, e in values],
            [e.via for _, e in values],
            [e.created_on for _, e in values],
            [e.created_actor for _, e in values],
            [e.updated_on for _, e in values],
            [e.updated_actor for _, e in values],
            [orjson.dumps(e.properties or {}, default=str).decode() for _, e in values],
            [None if e.source == c.source else c.source for c, e in values],
        )

    async def _apply_points(self, conn: asyncpg.Connection, points: list[TimeseriesPoint]) -> None:
        await conn.execute(
            _UPSERT_POINTS,
            [p.doc_id for p in points],
            [p.aspect for p in points],
            [p.urn for p in points],
            [p.entity_type for p in points],
            [p.timestamp_ms for p in points],
            [orjson.dumps(p.fields, default=str).decode() for p in points],
            [orjson.dumps(p.value, default=str).decode() for p in points],
            [
                None if p.system_metadata is None else orjson.dumps(p.system_metadata, default=str).decode()
                for p in points
            ],
        )

    async def _remove(self, conn: asyncpg.Connection, removals: list[EntityRemoval]) -> None:
        newest: dict[str, EntityRemoval] = {}
        for r in removals:
            if r.urn not in newest or newest[r.urn].version <= r.version:
                newest[r.urn] = r
        rows = [newest[u] for u in sorted(newest)]
        removed = await conn.fetch(
            _REMOVE_ENTITIES,
            [r.urn for r in rows],
            [r.entity_type for r in rows],
            [r.aspect or self._registry.entity(r.entity_type).key_aspect for r in rows],
            [r.version for r in rows],
        )
        if removed:
            await self._rebuild(conn, (r["urn"] for r in removed), (r.entity_type for r in rows))

    # --- search ---------------------------------------------------------------------------------------------------
    def _document_field(self, entity_type: str, name: str) -> str:
        """The document field a filter or sort name is answered on: a filter's field, a structured property's
        (app.search.structured_properties), or the name itself."""
        specs = self.filter_fields(entity_type)
        return specs[name].name if name in specs else document_field(name)

    def _facet_names(self, entity_type: str, property_facets: Sequence[str]) -> dict[str, str]:
        """Facet name -> its document field: the entity type's filters and the structured properties asked for."""
        return {name: spec.name for name, spec in self.filter_fields(entity_type).items()} | {
            name: document_field(name) for name in property_facets
        }

    def _filter_sql(self, entity_type: str, filters: dict[str, list[str]] | None, params: list[Any]) -> list[str]:
        """Conditions on `d.fields` (jsonb containment, GIN `jsonb_path_ops`): for each filter, any of its values,
        as a scalar or as an element of an array; "true"/"false" and numbers also match their JSON types."""
        conditions: list[str] = []
        for name, values in (filters or {}).items():
            if values:
                conditions.append(self._field_condition(entity_type, name, values, params))
        return conditions

    def _any_of_sql(self, entity_type: str, any_of: Sequence[Sequence[Criterion]], params: list[Any]) -> str:
        """One condition: the document matches at least one group, a group when it matches every criterion."""
        groups: list[str] = []
        for group in any_of:
            conditions = []
            for criterion in group:
                if criterion.condition in EQUALITY_CONDITIONS:  # the GIN-indexable containment path
                    condition = self._field_condition(entity_type, criterion.field, criterion.values, params)
                else:
                    condition = self._other_condition(entity_type, criterion, params)
                conditions.append(f"NOT {condition}" if criterion.negated else condition)
            groups.append("(" + " AND ".join(conditions) + ")" if conditions else "true")
        return "(" + " OR ".join(groups) + ")" if groups else "false"

    def _field_condition(self, entity_type: str, name: str, values: Sequence[str], params: list[Any]) -> str:
        """The field (by filter or document name) has any of `values`; no values: it never matches."""
        if not values:
            return "false"
        field_name = self._document_field(entity_type, name)
        if field_name == "urn":
            params.append(list(values))
            return f"d.urn = ANY(${len(params)}::text[])"
        if field_name == "removed":
            wanted = {str(v).lower() == "true" for v in values}
            params.append(list(wanted))
            return f"d.removed = ANY(${len(params)}::boolean[])"
        candidates: list[str] = []
        for value in values:
            typed: list[Any] = [value]
            if isinstance(value, str):
                if value.lower() in ("true", "false"):
                    typed.append(value.lower() == "true")
                else:
                    try:
                        typed.append(int(value))
                    except ValueError:
                        try:
                            typed.append(float(value))
                        except ValueError:
                            pass
            for v in typed:
                candidates.append(orjson.dumps({field_name: v}).decode())
                candidates.append(orjson.dumps({field_name: [v]}).decode())
        ors = []
        for candidate in candidates:
            params.append(candidate)
            ors.append(f"d.fields @> ${len(params)}::jsonb")
        return "(" + " OR ".join(ors) + ")"

    def _other_condition(self, entity_type: str, criterion: Criterion, params: list[Any]) -> str:
        """A criterion other than EQUAL/IN (app.search.model's CONDITIONS) as a condition that is never NULL (it
        may be negated): on the `urn`/`removed` columns, or on any element of the document field (a scalar is an
        array of one). Strings compare by code point (COLLATE "C", as Elasticsearch compares keywords); LIKE
        patterns are escaped (backslash, LIKE's default escape character)."""
        condition = criterion.condition
        values = [v.strip() for v in criterion.values]
        if condition != "EXISTS" and not values:
            return "false"
        name = self._document_field(entity_type, criterion.field)

        def param(value: Any, cast: str) -> str:
            params.append(value)
            return f"${len(params)}::{cast}"

        def text_test(text: str) -> str:  # a condition on a string (SQL text expression)
            if condition == "IEQUAL":
                return f"lower({text}) = ANY({param([v.lower() for v in values], 'text[]')})"
            if condition in WILDCARD_CONDITIONS:
                before = "%" if condition in ("CONTAIN", "END_WITH") else ""
                after = "%" if condition in ("CONTAIN", "START_WITH") else ""
                patterns = [before + _like_escape(v) + after for v in values]
                return f"{text} ILIKE ANY({param(patterns, 'text[]')})"
            _, bound = range_bounds(condition, values)
            return f'{text} COLLATE "C" {_RANGE_OPERATORS[condition]} {param(bound, "text")}'

        if name == URN_FIELD:
            return "true" if condition == "EXISTS" else f"coalesce({text_test('d.urn')}, false)"
        if name == REMOVED_FIELD:
            if condition == "EXISTS":
                return "true"
            if condition == "IEQUAL":
                return self._field_condition(entity_type, name, values, params)
            return "false"  # booleans never match a pattern or a range
        key = param(name, "text")
        if condition == "EXISTS":
            return f"coalesce((d.fields -> {key}) NOT IN ('null'::jsonb, '[]'::jsonb), false)"
        element_text = "(e.v #>> '{}')"
        # CASE, not AND: the cast must only ever see a value of its type (AND does not fix an evaluation order)
        tests = [f"CASE WHEN jsonb_typeof(e.v) = 'string' THEN {text_test(element_text)} ELSE false END"]
        if condition in RANGE_CONDITIONS:
            bound, _ = range_bounds(condition, values)
            if bound is not None:
                tests.append(
                    f"CASE WHEN jsonb_typeof(e.v) = 'number' THEN (e.v)::numeric {_RANGE_OPERATORS[condition]} "
                    f"{param(str(bound), 'numeric')} ELSE false END"
                )
        elements = (
            f"jsonb_array_elements(CASE WHEN jsonb_typeof(d.fields -> {key}) = 'array' THEN d.fields -> {key} "
            f"ELSE jsonb_build_array(d.fields -> {key}) END) e(v)"
        )
        any_element = f"EXISTS (SELECT 1 FROM {elements} WHERE {' OR '.join(tests)})"
        if condition == "IEQUAL":  # numbers and booleans: as EQUAL
            return f"({any_element} OR {self._field_condition(entity_type, name, values, params)})"
        return any_element

    def _query_sql(self, entity_type: str, query: str, params: list[Any]) -> tuple[str | None, str]:
        """(match condition, score expression) for a query; None for all documents ("*" or empty). A structured
        query (DataHub's `/q ` prefix) is parsed (app.search.query_syntax), the rest is full text."""
        text = (query or "").strip()
        tree = query_syntax.parsed(text)
        if tree is not None:
            return self._structured_sql(entity_type, tree, params)
        if text in ("", "*"):
            return None, "0::float8"
        if _WEBSEARCH_SYNTAX.search(text):
            params.append(text)
            tsquery = f"websearch_to_tsquery('simple', ${len(params)})"
        else:
            prefix = _prefix_tsquery(text)
            if prefix is None:
                return None, "0::float8"
            params.append(prefix)
            tsquery = f"to_tsquery('simple', ${len(params)})"
        params.append(text.lower())
        exact = len(params)
        # Both arms are answered by a GIN index (search_vector: 0003, exact_names: 0010), the OR by a BitmapOr of
        # the two. `x = ANY(exact_names)` would be the same test, but no index answers it: Postgres would read the
        # whole table for every text query.
        match = f"(d.search_vector @@ {tsquery} OR d.exact_names @> ARRAY[${exact}::text])"
        score = (
            f"(ts_rank_cd(d.search_vector, {tsquery})::float8"
            f" + CASE WHEN ${exact}::text = ANY(d.exact_names) THEN {EXACT_MATCH_BONUS} ELSE 0 END)"
        )
        return match, score

    def _structured_sql(self, entity_type: str, tree: query_syntax.Node, params: list[Any]) -> tuple[str | None, str]:
        """(match condition, score expression) of a structured query's tree: the words of the default fields in one
        tsquery where they can be (the GIN index of `search_vector` answers it), a field's words on that field's
        values, a wildcard inside a word on the words indexed (LIKE); ranked by its words that must be present."""

        def tsquery(text: str) -> str:
            params.append(text)
            return f"to_tsquery('simple', ${len(params)})"

        def like(pattern: str) -> str:
            params.append(pattern)
            return f"${len(params)}"

        def word_parts(term: query_syntax.Term) -> tuple[list[str], list[str]]:
            """(tsquery operands, LIKE patterns on single words) of a term: a phrase's words adjacent; a word's
            parts all present (as an analyzer splits `user+transaction`), one ending in `*` a prefix, one with a
            wildcard elsewhere a LIKE on the words indexed (and a prefix when it starts with letters)."""
            if term.phrase:
                return [" <-> ".join(_lexeme(w) for w in _WORDS.findall(term.text.lower()))], []
            parts = _WORD_PARTS.findall(term.text.lower())
            if len(parts) > 1 and not _WORDS.search(parts[-1]):  # `revenue_*`: the part before it is a prefix
                parts[-2:] = [parts[-2] + "*"]
            operands, patterns = [], []
            for part in parts:
                literal = re.split(r"[*?]", part, maxsplit=1)[0]
                if part == literal:
                    operands.append(_lexeme(part))
                    continue
                if literal:
                    operands.append(_lexeme(literal, prefix=True))
                if part != literal + "*" and _WORDS.search(part):
                    patterns.append(_like_pattern(part))
            return operands, patterns

        def value_condition(name: str, operands: list[str], patterns: list[str]) -> str:
            """A value of document field `name` has the words (split as the text indexed is)."""
            params.append(name)
            values = (
                "(SELECT d.urn AS value) v"
                if name == URN_FIELD
                else f"jsonb_array_elements_text(CASE jsonb_typeof(d.fields -> ${len(params)}::text) WHEN 'array' "
                f"THEN d.fields -> ${len(params)}::text ELSE jsonb_build_array(d.fields -> ${len(params)}::text) END) "
                "v(value)"
            )
            tests = []
            if operands:
                tests.append(
                    f"to_tsvector('simple', regexp_replace(v.value, '[^[:alnum:]]+', ' ', 'g')) @@ "
                    f"{tsquery(' & '.join(operands))}"
                )
            for pattern in patterns:
                tests.append(
                    f"EXISTS (SELECT 1 FROM regexp_split_to_table(lower(v.value), '[^[:alnum:]]+') w "
                    f"WHERE w LIKE {like(pattern)})"
                )
            return f"EXISTS (SELECT 1 FROM {values} WHERE {' AND '.join(tests) or 'true'})"

        # A rendered node: ("ts", tsquery text) while it is one tsquery of the default fields, else ("sql", condition)
        def render(node: query_syntax.Node) -> tuple[str, str]:
            if isinstance(node, query_syntax.Term):
                operands, patterns = word_parts(node)
                if node.field is not None:
                    return "sql", value_condition(self._document_field(entity_type, node.field), operands, patterns)
                if not patterns:
                    return "ts", " & ".join(operands)
                tests = [f"d.search_vector @@ {tsquery(' & '.join(operands))}"] if operands else []
                tests += [
                    f"EXISTS (SELECT 1 FROM unnest(tsvector_to_array(d.search_vector)) w WHERE w LIKE {like(p)})"
                    for p in patterns
                ]
                return "sql", "(" + " AND ".join(tests) + ")"
            if isinstance(node, query_syntax.Every):
                if node.field is None or self._document_field(entity_type, node.field) == URN_FIELD:
                    return "sql", "true"
                params.append(self._document_field(entity_type, node.field))
                return "sql", f"coalesce(d.fields -> ${len(params)}::text, 'null'::jsonb) <> 'null'::jsonb"
            if isinstance(node, query_syntax.Nothing):
                return "sql", "false"
            if isinstance(node, query_syntax.Not):
                kind, inner = render(node.child)
                return (kind, f"!({inner})") if kind == "ts" else (kind, f"NOT {inner}")
            rendered = [render(child) for child in node.children]
            if all(kind == "ts" for kind, _ in rendered):
                joiner = " & " if isinstance(node, query_syntax.And) else " | "
                return "ts", "(" + joiner.join(inner for _, inner in rendered) + ")"
            joiner = " AND " if isinstance(node, query_syntax.And) else " OR "
            return "sql", "(" + joiner.join(as_condition(kind, inner) for kind, inner in rendered) + ")"

        def as_condition(kind: str, inner: str) -> str:
            return f"d.search_vector @@ {tsquery(inner)}" if kind == "ts" else inner

        kind, inner = render(tree)
        if kind == "ts":
            query = tsquery(inner)
            return f"d.search_vector @@ {query}", f"ts_rank_cd(d.search_vector, {query})::float8"
        ranked = [
            " & ".join(word_parts(t)[0])
            for t in query_syntax.positive_terms(tree)
            if t.field is None and word_parts(t)[0]
        ]
        condition = as_condition(kind, inner)
        if not ranked:
            return condition, "0::float8"
        # A literal, not a parameter: the count of the same condition takes no score (its text is quoted words of
        # letters and digits, and tsquery operators)
        literal = "'" + " | ".join(f"({r})" for r in ranked).replace("'", "''") + "'"
        return condition, f"ts_rank_cd(d.search_vector, to_tsquery('simple', {literal}))::float8"

    async def search(
        self, entity_type: str, query: str, *, filters: dict[str, list[str]] | None = None, count: int = 10,
        scroll_id: str | None = None, sort: list[tuple[str, str]] | None = None,
        any_of: Sequence[Sequence[Criterion]] | None = None, facets: bool = True, property_facets: Sequence[str] = (),
        batch: CountBatch | None = None, total: bool = True,
    ) -> SearchPage:  # fmt: skip
        """`SearchBackend.search`; and `batch` (a count-only search): recorded in it, answered by its `run` (the page
        returned is empty); `total=False`: the page's total is not counted (0), its caller knows it."""
        params: list[Any] = [entity_type]
        conditions = ["d.entity_type = $1"]
        match, score = self._query_sql(entity_type, query, params)
        if match:
            conditions.append(match)
        conditions += self._filter_sql(entity_type, filters, params)
        if any_of is not None:
            conditions.append(self._any_of_sql(entity_type, any_of, params))
        if not names_removed(filters, any_of):
            conditions.append("NOT d.removed")
        conditions.append("NOT d.entity_removed")  # tombstones: never a hit, never counted
        where = " AND ".join(conditions)
        base_params = list(params)
        facet_names = self._facet_names(entity_type, property_facets) if facets else {}
        if batch is not None:
            if count or scroll_id:
                raise ValueError("a batch takes count-only searches (count 0, no scroll id)")
            batch.add(entity_type, " AND ".join(conditions[1:]), params[1:], facet_names)
            return SearchPage(hits=[], total=0, scroll_id=None)

        # Sort: by one document field (jsonb order) or by score, then urn; the page key is (sort key, urn).
        if sort:
            field_name, order = sort[0]
            params.append(self._document_field(entity_type, field_name))
            key_expr = f"coalesce(d.fields -> ${len(params)}::text, 'null'::jsonb)"
            descending = order.upper().startswith("DESC")
            key_cast = "jsonb"
        else:
            key_expr = score
            descending = True
            key_cast = "float8"
        keyset = ""
        if scroll_id:
            after = decode_keyset(scroll_id, keys=1, by_relevance=not sort)
            key, after_urn = after.keys[0], after.urn
            params.append(orjson.dumps(key).decode() if key_cast == "jsonb" else float(key))
            k = f"${len(params)}::text::jsonb" if key_cast == "jsonb" else f"${len(params)}::float8"
            params.append(after_urn)
            u = f"${len(params)}::text"
            op = "<" if descending else ">"
            keyset = f"WHERE (s.sort_key {op} {k} OR (s.sort_key = {k} AND s.urn > {u}))"
        params.append(count + 1)
        limit = len(params)
        direction = "DESC" if descending else "ASC"
        # Only the sort key of every match: the page's own rows are read again by urn for what a hit shows (a
        # document's fields as text, for each of 100,000 matches, cost as much as ranking them), and a page sorted
        # by a field is scored for its own rows only.
        sql = f"""
            SELECT p.urn, d.entity_type, {"p.sort_key" if key_cast == "float8" else score} AS score,
                   d.fields::text AS fields, p.sort_key::text AS sort_key
            FROM (
                SELECT s.urn, s.sort_key FROM (
                    SELECT d.urn, {key_expr} AS sort_key FROM search_document d WHERE {where}
                ) s {keyset}
                ORDER BY s.sort_key {direction}, s.urn
                LIMIT ${limit}
            ) p JOIN search_document d ON d.urn = p.urn
            ORDER BY p.sort_key {direction}, p.urn
        """
        async with self._reads() as reads:
            rows = await reads.fetch(sql, *params) if count > 0 else []  # count 0: the total alone
            counted = (
                (await _count(reads, where, base_params, facet_names.values())).get(entity_type, _Counted())
                if total or facet_names
                else _Counted()
            )
        hits = [
            SearchHit(urn=r["urn"], entity_type=r["entity_type"], score=r["score"], fields=_json(r["fields"]))
            for r in rows[:count]
        ]
        next_scroll = None
        if len(rows) > count and hits:
            last = rows[count - 1]
            key = orjson.loads(last["sort_key"]) if key_cast == "jsonb" else float(last["sort_key"])
            next_scroll = keyset_cursor([key], last["urn"])
        return SearchPage(hits=hits, total=counted.total, scroll_id=next_scroll, facets=counted.facets(facet_names))

    async def autocomplete(self, entity_type: str, prefix: str, *, limit: int = 10) -> list[SearchHit]:
        """Documents with a name/id starting with `prefix` first (shortest name first), then the ones with a word
        starting with it (full-text rank)."""
        text = (prefix or "").strip().lower()
        if not text:
            return []
        tsquery = _prefix_tsquery(text)
        like = _like_escape(text) + "%"
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"""
                SELECT d.urn, d.entity_type, d.fields::text AS fields,
                       (SELECT min(length(n)) FROM unnest(d.exact_names) n WHERE n LIKE $2 AND n <> lower(d.urn)) AS name_len,
                       {"ts_rank_cd(d.search_vector, to_tsquery('simple', $3))::float8" if tsquery else "0::float8"} AS rank
                FROM search_document d
                WHERE d.entity_type = $1 AND NOT d.removed AND NOT d.entity_removed
                  AND (EXISTS (SELECT 1 FROM unnest(d.exact_names) n WHERE n LIKE $2 AND n <> lower(d.urn))
                       {"OR d.search_vector @@ to_tsquery('simple', $3)" if tsquery else ""})
                ORDER BY name_len NULLS LAST, rank DESC, d.urn
                LIMIT {int(limit)}
                """,
                entity_type,
                like,
                *([tsquery] if tsquery else []),
            )
        return [
            SearchHit(
                urn=r["urn"],
                entity_type=r["entity_type"],
                score=(EXACT_MATCH_BONUS / (1 + r["name_len"])) if r["name_len"] is not None else r["rank"],
                fields=_json(r["fields"]),
            )  # fmt: skip
            for r in rows
        ]

    # --- graph ----------------------------------------------------------------------------------------------------
    async def relationships(
        self, urn: str, *, direction: Direction, types: list[str] | None = None, start: int = 0, count: int = 100,
    ) -> tuple[list[Edge], int]:  # fmt: skip
        column, other = ("source", "destination") if direction == "OUTGOING" else ("destination", "source")
        params: list[Any] = [urn]
        condition = f"{column} = $1"
        if types:
            params.append(list(types))
            condition += f" AND relationship = ANY(${len(params)}::text[])"
        async with self._connection() as conn:
            total = await conn.fetchval(f"SELECT count(*) FROM search_edge WHERE {condition}", *params)
            rows = await conn.fetch(
                f"""
                SELECT {_EDGE_SELECT} FROM search_edge WHERE {condition}
                ORDER BY relationship, {other}, aspect
                OFFSET ${len(params) + 1} LIMIT ${len(params) + 2}
                """,
                *params,
                start,
                count,
            )
        return [_edge(r) for r in rows], total

    async def lineage(
        self, urn: str, *, direction: Literal["UPSTREAM", "DOWNSTREAM"], max_hops: int = 3,
    ) -> list[tuple[Edge, int]]:  # fmt: skip
        """Breadth first over lineage edges: UPSTREAM follows them outgoing (`DownstreamOf` points upstream),
        DOWNSTREAM incoming; the ones that point downstream (`DOWNSTREAM_LINEAGE`: a job `Produces` its output) the
        other way round. Each edge once, at its first hop; each node is expanded once (cycles end)."""
        upstream = direction == "UPSTREAM"
        # the step from node n: forward edges (source = n -> next = destination), reversed ones the other way.
        forward_from, forward_to = ("source", "destination") if upstream else ("destination", "source")
        sql = f"""
            WITH RECURSIVE walk(node, hop, visited) AS (
                SELECT $1::text COLLATE "C", 0, ARRAY[$1::text COLLATE "C"]
                UNION ALL
                SELECT step.next, w.hop + 1, w.visited || step.next
                FROM walk w
                CROSS JOIN LATERAL (
                    SELECT e.{forward_to} AS next FROM search_edge e
                    WHERE e.{forward_from} = w.node AND e.is_lineage AND NOT e.relationship = ANY($3::text[])
                    UNION
                    SELECT e.{forward_from} AS next FROM search_edge e
                    WHERE e.{forward_to} = w.node AND e.is_lineage AND e.relationship = ANY($3::text[])
                ) step
                WHERE w.hop < $2 AND NOT step.next = ANY(w.visited)
            ), nodes AS (
                SELECT node, min(hop) AS hop FROM walk GROUP BY node
            ), edges AS (
                SELECT DISTINCT ON (e.source, e.aspect, e.relationship, e.destination) e.*, n.hop + 1 AS hop
                FROM nodes n
                JOIN search_edge e ON e.is_lineage AND (
                    (e.{forward_from} = n.node AND NOT e.relationship = ANY($3::text[]))
                    OR (e.{forward_to} = n.node AND e.relationship = ANY($3::text[])))
                WHERE n.hop < $2
                ORDER BY e.source, e.aspect, e.relationship, e.destination, n.hop
            )
            SELECT {_EDGE_SELECT}, hop FROM edges ORDER BY hop, relationship, source, destination
        """
        async with self._connection() as conn:
            rows = await conn.fetch(sql, urn, max_hops, sorted(DOWNSTREAM_LINEAGE))
        return [(_edge(r), r["hop"]) for r in rows]

    async def lineage_hop(self, nodes: Sequence[str], *, direction: Literal["UPSTREAM", "DOWNSTREAM"]) -> list[Edge]:
        """One hop of the lineage walk (app.search.lineage.walk): the lineage edges a step from `nodes` follows, as
        `lineage` follows them. A hop the walk's budget cancels is `DeadlineExceeded`."""
        forward_from, forward_to = ("source", "destination") if direction == "UPSTREAM" else ("destination", "source")
        sql = f"""
            SELECT {_EDGE_SELECT} FROM search_edge
            WHERE {forward_from} = ANY($1::text[]) AND is_lineage AND NOT relationship = ANY($2::text[])
            UNION ALL
            SELECT {_EDGE_SELECT} FROM search_edge
            WHERE {forward_to} = ANY($1::text[]) AND is_lineage AND relationship = ANY($2::text[])
        """
        try:
            async with self._connection(walking=True) as conn:
                rows = await conn.fetch(sql, list(nodes), sorted(DOWNSTREAM_LINEAGE))
        except asyncpg.QueryCanceledError as error:
            budget = read_deadline.current()
            if budget is None or budget.walk_remaining_s() > 0:
                raise  # not the walk's budget (METALEDGER_READ_TIMEOUT_S outside a request, an operator's cancel)
            raise read_deadline.DeadlineExceeded("the lineage walk ran out of its time budget") from error
        return [_edge(r) for r in rows]

    async def scroll_edges(
        self, query: EdgeQuery, *, after: tuple[str, str, str, str] | None = None, count: int = 100
    ) -> EdgePage:
        """Keyset paging in primary-key order (source, aspect, relationship, destination): each page is one index
        range scan from the previous page's last key, so concurrent writes never shift an existing edge's place."""
        params: list[Any] = []
        conditions: list[str] = []

        def any_of(column: str, values: Sequence[str]) -> None:
            if values:
                params.append(list(values))
                conditions.append(f"{column} = ANY(${len(params)}::text[])")

        any_of("relationship", query.relationship_types)
        any_of("source_type", query.source_types)
        any_of("destination_type", query.destination_types)
        any_of("source", query.source_urns)
        any_of("destination", query.destination_urns)
        if query.either_urns:
            params.append(list(query.either_urns))
            conditions.append(f"(source = ANY(${len(params)}::text[]) OR destination = ANY(${len(params)}::text[]))")
        if query.lineage_only:
            conditions.append("is_lineage")
        if after is not None:
            params.extend(after)
            n = len(params)
            conditions.append(f"(source, aspect, relationship, destination) > (${n - 3}, ${n - 2}, ${n - 1}, ${n})")
        params.append(count + 1)
        where = " AND ".join(conditions) or "true"
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"""
                SELECT {_EDGE_SELECT}, aspect FROM search_edge WHERE {where}
                ORDER BY source, aspect, relationship, destination LIMIT ${len(params)}
                """,
                *params,
            )
        page = rows[:count]
        last = page[-1] if page and len(rows) > count else None
        return EdgePage(
            edges=[_edge(r) for r in page],
            after=(last["source"], last["aspect"], last["relationship"], last["destination"]) if last else None,
        )

    # --- timeseries -----------------------------------------------------------------------------------------------
    async def delete_timeseries(
        self,
        urn: str,
        aspects: list[str],
        *,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> int:
        async with self._connection(readonly=False) as conn:
            status = await conn.execute(
                """
                DELETE FROM timeseries_point
                WHERE urn = $1 AND aspect = ANY($2::text[])
                  AND ($3::bigint IS NULL OR timestamp_ms >= $3) AND ($4::bigint IS NULL OR timestamp_ms <= $4)
                """,
                urn,
                list(aspects),
                start_ms,
                end_ms,
            )
        return int(status.rsplit(" ", 1)[1])

    async def timeseries(self, query: TimeseriesQuery) -> list[TimeseriesPoint]:
        params: list[Any] = [query.urn, query.aspect]
        conditions = ["urn = $1", "aspect = $2"]
        if query.start_ms is not None:
            params.append(query.start_ms)
            conditions.append(f"timestamp_ms >= ${len(params)}")
        if query.end_ms is not None:
            params.append(query.end_ms)
            conditions.append(f"timestamp_ms <= ${len(params)}")
        if query.equals:
            params.append(orjson.dumps(query.equals, default=str).decode())
            conditions.append(f"fields @> ${len(params)}::text::jsonb")
        params.append(query.limit)
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"""
                SELECT doc_id, aspect, urn, entity_type, timestamp_ms, fields::text AS fields, value::text AS value,
                       system_metadata::text AS system_metadata
                FROM timeseries_point WHERE {" AND ".join(conditions)}
                ORDER BY timestamp_ms DESC, doc_id
                LIMIT ${len(params)}
                """,
                *params,
            )
        return [
            TimeseriesPoint(
                aspect=r["aspect"],
                doc_id=r["doc_id"],
                urn=r["urn"],
                entity_type=r["entity_type"],
                timestamp_ms=r["timestamp_ms"],
                fields=_json(r["fields"]),
                value=_json(r["value"]),
                system_metadata=_json(r["system_metadata"]),
            )  # fmt: skip
            for r in rows
        ]

    async def document_versions(self, urn: str) -> dict[str, int]:
        async with self._connection() as conn:
            rows = await conn.fetch(
                """
                SELECT aspect, version FROM search_aspect_fields WHERE urn = $1
                AND NOT EXISTS (SELECT 1 FROM search_document d WHERE d.urn = $1 AND d.entity_removed)
                """,
                urn,
            )
        return {r["aspect"]: r["version"] for r in rows}
