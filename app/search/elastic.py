"""The Elasticsearch/OpenSearch search backend (`SearchBackend` over the official async `elasticsearch` client).

Indices (all behind aliases: alias `<name>` → index `<name>_<hash of its mapping>`; a changed mapping creates the
new index, copies the documents (`_reindex`) and swaps the alias in one `_aliases` call, except when a runtime model
set is taken up (`_follow_registry`, at the next write or read after the registry's generation moved): then a new
entity type's index is created, and a mapping that only adds fields is put on the live index (PUT _mapping, the new
digest kept in its `_meta`, so a restart finds it current):

* one entity index per entity type (`elastic_mappings.index_name`): one document per entity, id = urn (a hash when the urn
  is longer than Elasticsearch's 512-byte id limit), with `aspectVersions.<aspect>` (the version each aspect's
  fields come from) and `aspectFields.<aspect>` (not indexed: the fields each aspect contributed, so an aspect's new
  value or delete replaces exactly its own fields; the searchable top level is `documents.merge_aspect_fields` of
  them, as in the Postgres backend);
* the edge index `{prefix}graph_service_v1` (DataHub's name): one document per edge, id = hash(source,
  relationship, destination, aspect);
* the edge-set index `{prefix}graph_service_v1_sets`: one marker per (source, aspect) holding the version and the
  full edge set of that aspect: the truth the edge documents are projected from;
* timeseries indices (`elastic_mappings.timeseries_index_name`), created on first use: id = DataHub's point id.

Mappings: `app.search.elastic_mappings`. Field specs: `app.search.documents` (one cache per registry).

Order safety without scripts (OpenSearch and the test server have no painless): `apply` reads the current entity
documents and edge-set markers (`mget`, with `_seq_no`/`_primary_term`), merges the changes in memory (an aspect's
change applies only if its version is >= the version stored for that aspect) and writes them back in ONE `_bulk`
with `if_seq_no`/`if_primary_term` (`op_type=create` for new documents). Conflicted documents are re-read and
merged again. An edge set whose marker write lost a race re-projects the winning marker's edges (so stale edges
written by the loser are overwritten or deleted). Entity removals turn the document into a tombstone
(`entityRemoved: true`, `aspectVersions` kept, no searchable content; excluded from every read; a newer change of
an aspect revives it) and, with `delete_by_query`, delete every edge from or to the entity before the bulk; its
edge-set markers keep their version with an empty set. At equal versions a delete (an empty edge set) wins.
Item errors of a bulk: a document refused for its data (mapping conflict, immense term, over a limit) raises
`IndexRefused` once the whole bulk is sent (the other documents are written; the worker isolates and records the
change log: app.search.failures); items rejected with 429 or 5xx raise `IndexUnavailable` (the batch is retried).

Index lifecycle (restore-indices): `create_rebuild_target` builds fresh concrete indices `<alias>_<digest>_r<stamp>`
(same mappings as `ensure_index`'s `<alias>_<digest>`) while the aliases keep serving the old ones; backends made by
`writing_into(target)` (the Spark tasks) fill them; `swap_in(target)` points every alias at its fresh index in ONE
`_aliases` call and deletes the old indices; `drop_rebuild_target` deletes a target that is abandoned.
`create_missing_indices` creates only the aliases that do not exist (an in-place restore); `indexed_versions` lists
what the index holds (reconcile).

OpenSearch flavor (`search_flavor="opensearch"`): the client sends `application/vnd.elasticsearch+json;
compatible-with=8`, which OpenSearch answers with 406, and checks for the `X-Elastic-Product` response header;
`OpenSearchCompatNode` maps the media types back to plain JSON/NDJSON and supplies the header. Real OpenSearch needs
it as much as the test server does.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import re
import sys
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import ROUND_CEILING, ROUND_FLOOR
from typing import TYPE_CHECKING, Any, Literal

import orjson
from elastic_transport import HttpxAsyncHttpNode
from elasticsearch import AsyncElasticsearch, BadRequestError, NotFoundError

from app.limits import MAX_LONG, MIN_LONG
from app.registry import EntityRegistry
from app.search import documents, elastic_mappings, query_syntax
from app.search.cursors import decode_keyset, keyset_cursor
from app.search.elastic_mappings import ASPECT_FIELDS_FIELD, EDGE_MAPPING, EDGE_SET_MAPPING, mapping_hash
from app.search.model import (
    DOWNSTREAM_LINEAGE,
    EQUALITY_CONDITIONS,
    RANGE_CONDITIONS,
    REMOVED_FIELD,
    TOMBSTONE_FIELD,
    URN_FIELD,
    VERSIONS_FIELD,
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
    IndexRefused,
    IndexUnavailable,
    RebuildTarget,
    SearchFieldSpec,
    SearchHit,
    SearchPage,
    TimeseriesPoint,
    TimeseriesQuery,
    edge_set_aspect,
    names_removed,
    number,
    range_bounds,
)
from app.search.structured_properties import document_field
from app.urns import parse_urn

log = logging.getLogger("metaledger.search.elastic")

GRAPH_INDEX = "graph_service_v1"
EDGE_SETS_SUFFIX = "_sets"
MAX_ID_BYTES = 512
BULK_CHUNK_OPS = 5_000  # documents per _bulk request (a huge apply is chunked)
SCAN_PAGE = 1_000  # hits per search_after page of a scan
INDEX_CREATE_CONCURRENCY = 8
MAX_CONFLICT_RETRIES = 20
EXACT_MATCH_MULTIPLIER = 10.0  # a whole-value keyword match counts this many times the field's boost
TEXT_TYPES = {"TEXT", "TEXT_PARTIAL", "WORD_GRAM", "URN_PARTIAL", "BROWSE_PATH", "BROWSE_PATH_V2"}
_META_KEY = "metaledger"  # in an index mapping's `_meta`: the digests of the body it was made or grown to
_COMPAT = re.compile(r"application/vnd\.elasticsearch\+([\w.-]+)\s*;\s*compatible-with=\d+", re.IGNORECASE)


class OpenSearchCompatNode(HttpxAsyncHttpNode):
    """The client's httpx node, speaking plain JSON: `application/vnd.elasticsearch+X; compatible-with=N` in Accept
    and Content-Type (json, x-ndjson for bulk) become `application/X`, and responses without the
    `X-Elastic-Product` header (OpenSearch never sends it) get it, so the client's product check passes."""

    async def perform_request(self, method, target, body=None, headers=None, **kwargs):
        if headers:
            headers = headers.copy()
            for name in ("accept", "content-type"):
                value = headers.get(name)
                if value:
                    headers[name] = _COMPAT.sub(r"application/\1", value)
        response = await super().perform_request(method, target, body=body, headers=headers, **kwargs)
        if "x-elastic-product" not in response.meta.headers:
            response.meta.headers["x-elastic-product"] = "Elasticsearch"
        return response


if TYPE_CHECKING:
    from elastic_transport import JsonSerializer as _SerializerBase  # what `_fast_serializers` mixes it into
else:
    _SerializerBase = object


class _OrjsonFirst(_SerializerBase):
    """Request bodies with orjson (bulk bodies are tens of MB per second; the stdlib encoder is ~10x slower), and
    exactly the client's stdlib encoding for what orjson refuses (lone surrogates, integers over 64 bits, non-string
    keys); responses decoded with orjson, falling back the same way."""

    def json_dumps(self, data: Any) -> bytes:
        try:
            return orjson.dumps(data, default=self.default)
        except TypeError:
            return super().json_dumps(data)

    def json_loads(self, data: bytes) -> Any:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return super().json_loads(data)


def _fast_serializers() -> dict[str, Any]:
    from elasticsearch import serializer as es_serializer

    out: dict[str, Any] = {}
    for base in (
        es_serializer.JsonSerializer,
        es_serializer.NdjsonSerializer,
        es_serializer.CompatibilityModeJsonSerializer,
        es_serializer.CompatibilityModeNdjsonSerializer,
    ):
        cls = type(f"Orjson{base.__name__}", (_OrjsonFirst, base), {})
        out[base.mimetype] = cls()
    return out


def _json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _body_digest(mapping: dict[str, Any], index_settings: dict[str, Any] | None) -> str:
    """The digest of an index body, in its concrete index's name (`<alias>_<digest>`): a changed body is a new index."""
    return mapping_hash({"mappings": mapping, "settings": index_settings or {}})


def _with_meta(mapping: dict[str, Any], index_settings: dict[str, Any] | None) -> dict[str, Any]:
    """`mapping` with the `_meta` digests that let a later `ensure_index` grow the index in place or find it grown."""
    made = {"digest": _body_digest(mapping, index_settings), "settings": mapping_hash(index_settings or {})}
    return {**mapping, "_meta": {**(mapping.get("_meta") or {}), _META_KEY: made}}


def _create_body(mapping: dict[str, Any], index_settings: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"mappings": _with_meta(mapping, index_settings)}
    if index_settings:
        body["settings"] = index_settings
    return body


def _hash(*parts: Any) -> str:
    return hashlib.sha256(_json(parts)).hexdigest()


def entity_doc_id(urn: str) -> str:
    return urn if len(urn.encode()) <= MAX_ID_BYTES else "sha256:" + hashlib.sha256(urn.encode()).hexdigest()


def edge_doc_id(source: str, relationship: str, destination: str, aspect: str) -> str:
    return _hash(source, relationship, destination, aspect)


def edge_set_id(source: str, aspect: str) -> str:
    return _hash("edge-set", source, aspect)


def _edge_to_doc(edge: Edge, aspect: str, version: int) -> dict[str, Any]:
    return {
        "source": edge.source,
        "destination": edge.destination,
        "relationshipType": edge.relationship,
        "sourceType": edge.source_type,
        "destinationType": edge.destination_type,
        "via": edge.via,
        "createdOn": edge.created_on,
        "createdActor": edge.created_actor,
        "updatedOn": edge.updated_on,
        "updatedActor": edge.updated_actor,
        "properties": edge.properties or {},
        "aspect": aspect,
        "version": version,
        "isLineage": edge.is_lineage,
    }


def _doc_to_edge(doc: dict[str, Any]) -> Edge:
    return Edge(
        source=doc["source"],
        destination=doc["destination"],
        relationship=doc["relationshipType"],
        source_type=doc.get("sourceType") or "",
        destination_type=doc.get("destinationType") or "",
        via=doc.get("via"),
        created_on=doc.get("createdOn"),
        created_actor=doc.get("createdActor"),
        updated_on=doc.get("updatedOn"),
        updated_actor=doc.get("updatedActor"),
        properties=doc.get("properties") or {},
        is_lineage=bool(doc.get("isLineage")),
    )


def _item_error(error: Any) -> str:
    """A bulk item's error, short: its type and reason (and the cause's), never the document."""
    if not isinstance(error, dict):
        return str(error)[:500]
    text = f"{error.get('type')}: {str(error.get('reason'))[:400]}"
    cause = error.get("caused_by")
    if isinstance(cause, dict):
        text += f" (caused by {cause.get('type')}: {str(cause.get('reason'))[:300]})"
    return text


_INTEGER_KINDS = frozenset({"long", "integer", "short", "byte", "date", "date_nanos"})
_NUMBER_KINDS = _INTEGER_KINDS | {"double", "float", "half_float", "scaled_float"}
_MAX_DOUBLE = sys.float_info.max
_RANGE_KEYS = {
    "GREATER_THAN": "gt",
    "GREATER_THAN_OR_EQUAL_TO": "gte",
    "LESS_THAN": "lt",
    "LESS_THAN_OR_EQUAL_TO": "lte",
}


def _wildcard_escape(text: str) -> str:
    """A value matched literally inside a wildcard pattern (`*`, `?` and the escape character escaped)."""
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("?", "\\?")


def _number_query(name: str, kind: str, condition: str, values: list[str]) -> dict[str, Any]:
    """A criterion on a number or date field: IEQUAL as EQUAL on the numeric values, a range on the bound any of
    the values gives; patterns, and values that are no numbers, match nothing (Elasticsearch would refuse them).
    Integer fields get integer bounds within a long (a fractional or out-of-range bound is refused there too)."""
    numbers = [n for n in (number(v) for v in values) if n is not None]
    if condition == "IEQUAL":
        if kind in _INTEGER_KINDS:
            wanted: list[Any] = [int(n) for n in numbers if n == n.to_integral_value() and MIN_LONG <= n <= MAX_LONG]
        else:
            wanted = [float(n) for n in numbers if abs(n) <= _MAX_DOUBLE]
        return {"terms": {name: wanted}} if wanted else {"match_none": {}}
    if condition not in RANGE_CONDITIONS:
        return {"match_none": {}}
    bound, _ = range_bounds(condition, values)
    if bound is None:
        return {"match_none": {}}
    if kind not in _INTEGER_KINDS:
        limited = max(min(float(bound), _MAX_DOUBLE), -_MAX_DOUBLE)
        return {"range": {name: {_RANGE_KEYS[condition]: limited}}}
    if condition.startswith("GREATER"):  # as `gte` an integer
        at_least = (
            int(bound.to_integral_value(ROUND_FLOOR)) + 1
            if condition == "GREATER_THAN"
            else int(bound.to_integral_value(ROUND_CEILING))
        )
        return {"match_none": {}} if at_least > MAX_LONG else {"range": {name: {"gte": max(at_least, MIN_LONG)}}}
    at_most = (
        int(bound.to_integral_value(ROUND_CEILING)) - 1
        if condition == "LESS_THAN"
        else int(bound.to_integral_value(ROUND_FLOOR))
    )
    return {"match_none": {}} if at_most < MIN_LONG else {"range": {name: {"lte": min(at_most, MAX_LONG)}}}


class ElasticBackend:
    """`SearchBackend` on Elasticsearch (`search_flavor="elasticsearch"`) or OpenSearch (`"opensearch"`).

    `refresh`: what writes pass as `refresh` ("wait_for": a write is visible to the next search, as sync indexing
    needs; False for bulk loaders that do not need read-your-writes). `target`: a restore's fresh indices: the entity,
    graph and edge-set names resolve to them instead of the aliases (see `writing_into`)."""

    def __init__(
        self,
        settings: Any,
        registry: EntityRegistry,
        *,
        refresh: bool | str = "wait_for",
        client: AsyncElasticsearch | None = None,
        target: RebuildTarget | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.prefix: str = settings.search_index_prefix or ""
        self.flavor: str = (settings.search_flavor or "elasticsearch").lower()
        if self.flavor not in ("elasticsearch", "opensearch"):
            raise ValueError(f"search_flavor must be 'elasticsearch' or 'opensearch', not {self.flavor!r}")
        self.refresh = refresh
        self.target = target
        self._redirect: dict[str, str] = dict(target.indices) if target is not None else {}
        self._client = client
        self._ready: dict[str, str] = {}  # alias -> the body digest (`_body_digest`) it is known to have
        self._ensure_lock = asyncio.Lock()
        self._mappings: dict[str, dict[str, Any]] = {}  # alias -> mapping as created
        self._timeseries: dict[str, str] = {}  # timeseries alias -> its aspect, for those ensured
        # The registry generation the indices follow (`_follow_registry`: a runtime model set moves it).
        self._generation = registry.generation
        self._follow_lock = asyncio.Lock()

    # --- client, names, field specs -------------------------------------------------------------------------------

    @property
    def client(self) -> AsyncElasticsearch:
        if self._client is None:
            kwargs: dict[str, Any] = {"request_timeout": 60, "serializers": _fast_serializers()}
            if self.flavor == "opensearch":
                kwargs["node_class"] = OpenSearchCompatNode
            else:
                kwargs["node_class"] = "httpxasync"
            self._client = AsyncElasticsearch(self.settings.search_url, **kwargs)
        return self._client

    @property
    def graph_alias(self) -> str:
        return f"{self.prefix}{GRAPH_INDEX}"

    @property
    def edge_set_alias(self) -> str:
        return f"{self.prefix}{GRAPH_INDEX}{EDGE_SETS_SUFFIX}"

    def entity_alias(self, entity_type: str) -> str:
        return elastic_mappings.index_name(self.prefix, self._entity_name(entity_type))

    @property
    def graph_index(self) -> str:
        """The edge index this backend reads and writes: the alias, or the rebuild target's fresh index."""
        return self._redirect.get(self.graph_alias, self.graph_alias)

    @property
    def edge_set_index(self) -> str:
        return self._redirect.get(self.edge_set_alias, self.edge_set_alias)

    def entity_index(self, entity_type: str) -> str:
        alias = self.entity_alias(entity_type)
        return self._redirect.get(alias, alias)

    def timeseries_index(self, entity_type: str, aspect: str) -> str:
        return elastic_mappings.timeseries_index_name(self.prefix, self._entity_name(entity_type), aspect)

    def _entity_name(self, entity_type: str) -> str:
        return self.registry.entity(entity_type).name

    def search_specs(self, entity_type: str) -> tuple[SearchFieldSpec, ...]:
        return documents.search_fields(self.registry, self._entity_name(entity_type))

    def filter_specs(self, entity_type: str) -> Mapping[str, SearchFieldSpec]:
        return documents.filter_fields(self.registry, self._entity_name(entity_type))

    def entity_index_body(self, entity_type: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        return elastic_mappings.entity_index_body(self.registry, self._entity_name(entity_type))

    def _index_specs(self, entity_types: Sequence[str]) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
        """(alias, mapping, index settings) of the graph, edge-set and these entity types' indices."""
        specs: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
            (self.graph_alias, EDGE_MAPPING, None),
            (self.edge_set_alias, EDGE_SET_MAPPING, None),
        ]
        for entity_type in entity_types:
            mapping, index_settings = self.entity_index_body(entity_type)
            specs.append((self.entity_alias(entity_type), mapping, index_settings))
        return specs

    # --- index lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.target is not None:
            return  # writing into a rebuild target: its indices exist (create_rebuild_target made them)
        await self.client.info()
        self._generation = self.registry.generation
        await self._ensure_all(self._index_specs(sorted(self.registry.entities)), grow=False)

    async def _ensure_all(
        self, specs: Sequence[tuple[str, dict[str, Any], dict[str, Any] | None]], *, grow: bool
    ) -> None:
        semaphore = asyncio.Semaphore(INDEX_CREATE_CONCURRENCY)

        async def one(alias: str, mapping: dict[str, Any], index_settings: dict[str, Any] | None) -> None:
            async with semaphore:
                await self.ensure_index(alias, mapping, index_settings, grow=grow)

        await asyncio.gather(*(one(*spec) for spec in specs))

    async def _follow_registry(self) -> None:
        """Take up a runtime model set (the registry's generation moved) before this backend writes or reads with
        it: a new entity type's index created; an index whose mapping changed grown in place (`ensure_index` with
        `grow`), so the new fields are mapped as their annotations say before any document holds them (dynamic
        mapping would guess, and a guess cannot be changed later)."""
        if self.target is not None or self._generation == self.registry.generation:
            return
        async with self._follow_lock:
            generation = self.registry.generation
            if generation == self._generation:
                return
            specs = self._index_specs(sorted(self.registry.entities))
            specs += [
                (alias, *elastic_mappings.timeseries_index_body(self.registry, aspect))
                for alias, aspect in self._timeseries.items()
                if aspect in self.registry.aspects
            ]
            await self._ensure_all(
                [spec for spec in specs if self._ready.get(spec[0]) != _body_digest(*spec[1:])], grow=True
            )
            self._generation = generation

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def ensure_index(
        self, alias: str, mapping: dict[str, Any], index_settings: dict[str, Any] | None = None, *, grow: bool = False
    ) -> str:
        """Make `alias` point at `<alias>_<hash(mapping, settings)>`: create it if missing; if the alias points at an
        index with another mapping, create the new index, copy the documents into it and swap the alias atomically
        (then drop the old index). Returns the concrete index name.

        An index grown in place to this mapping (its `_meta` says so) is current too. `grow` (a runtime model set
        taken up): the alias's index of the same settings takes the mapping in place with a PUT _mapping, which
        Elasticsearch allows when it only adds (fields, subfields); a change it refuses is copied as above."""
        digest = _body_digest(mapping, index_settings)
        target = f"{alias}_{digest}"
        self._mappings[alias] = mapping
        if self._ready.get(alias) == digest:
            return target
        es = self.client
        current = await self._alias_members(alias)
        if current == [target] or (len(current) == 1 and current[0].startswith(f"{target}_")):
            # the current mapping, possibly in an index built elsewhere and swapped in (a restore job's
            # `<alias>_<digest>_r<timestamp>`): nothing to do
            self._ready[alias] = digest
            return current[0]
        if len(current) == 1 and await self._grown_in_place(current[0], mapping, index_settings, grow=grow):
            self._ready[alias] = digest
            return current[0]
        concrete_legacy = False
        if not current and alias != target and await es.indices.exists(index=alias):
            # `exists` is also true for an alias: another starter (a second worker, a Spark task) may have added it
            # since we looked. Only a concrete index under the alias's name is a legacy index to copy from.
            try:
                current = sorted((await es.indices.get_alias(name=alias)).body)
            except NotFoundError:
                concrete_legacy = True
            if current == [target] or (len(current) == 1 and current[0].startswith(f"{target}_")):
                self._ready[alias] = digest
                return current[0]
        if not await es.indices.exists(index=target):
            try:
                await es.indices.create(index=target, **_create_body(mapping, index_settings))
            except Exception as exc:  # noqa: BLE001 - a concurrent starter created it first
                if "resource_already_exists" not in str(exc):
                    raise
        sources = [index for index in current if index != target] + ([alias] if concrete_legacy else [])
        for source in sources:
            await es.reindex(
                source={"index": source},
                dest={"index": target},
                refresh=True,
                wait_for_completion=True,
                conflicts="proceed",
            )
        if concrete_legacy:
            await es.indices.delete(index=alias)
        actions: list[dict[str, Any]] = [
            {"remove": {"index": index, "alias": alias}} for index in current if index != target
        ]
        actions.append({"add": {"index": target, "alias": alias}})
        await es.indices.update_aliases(actions=actions)
        for index in current:
            if index != target:
                await es.indices.delete(index=index, ignore_unavailable=True)
                log.info("search index %s: mapping changed, reindexed %s into %s", alias, index, target)
        self._ready[alias] = digest
        return target

    async def _grown_in_place(
        self, index: str, mapping: dict[str, Any], index_settings: dict[str, Any] | None, *, grow: bool
    ) -> bool:
        """Whether `index` has `mapping` in place: grown to it before (its `_meta` names the body's digest), or now
        (`grow`, same settings as it was created with, and Elasticsearch takes the mapping as an addition)."""
        es = self.client
        meta = next(iter((await es.indices.get_mapping(index=index)).body.values()))["mappings"].get("_meta") or {}
        made = meta.get(_META_KEY) or {}
        digest = _body_digest(mapping, index_settings)
        if made.get("digest") == digest:
            return True
        if not grow or made.get("settings") != mapping_hash(index_settings or {}):
            return False  # made before digests were kept, or of other settings: copied into a new index
        put = {key.removeprefix("_"): value for key, value in _with_meta(mapping, index_settings).items()}
        try:
            await es.indices.put_mapping(index=index, **put)
        except BadRequestError as error:  # a field whose type changed: not an addition
            log.info("search index %s: mapping not grown in place (%s); copying it into a new index", index, error)
            return False
        log.info("search index %s: mapping grown in place", index, extra={"digest": digest})
        return True

    async def _ensure_timeseries(self, entity_type: str, aspect: str) -> str:
        alias = self.timeseries_index(entity_type, aspect)
        if alias not in self._ready:
            async with self._ensure_lock:
                if alias not in self._ready:
                    mapping, index_settings = elastic_mappings.timeseries_index_body(self.registry, aspect)
                    await self.ensure_index(alias, mapping, index_settings)
                    self._timeseries[alias] = aspect
        return alias

    async def create_missing_indices(self, entity_types: Sequence[str]) -> None:
        """Create the graph, edge-set and these entity types' aliases that do not exist yet (`ensure_index`);
        existing ones are left exactly as they are, even with an older mapping (an in-place restore)."""
        for alias, mapping, index_settings in self._index_specs(entity_types):
            if not await self.client.indices.exists(index=alias):
                await self.ensure_index(alias, mapping, index_settings)

    async def create_rebuild_target(
        self, entity_types: Sequence[str] = (), *, stamp: str | None = None
    ) -> RebuildTarget:
        """Fresh concrete indices `<alias>_<digest>_r<stamp>` (the mapping and settings `ensure_index` gives) for the
        graph and edge-set indices and for the entity indices of `entity_types` (every entity type when empty),
        while the aliases keep serving the old ones. With `entity_types`, the fresh graph and edge-set indices start
        with the other entity types' edges (copied with `_reindex`, versions kept). Nothing is left behind when this
        fails. `stamp`: default now (UTC, to the microsecond)."""
        stamp = stamp or datetime.now(UTC).strftime("%Y%m%d%H%M%S%f")
        selected = list(entity_types) or sorted(self.registry.entities)
        indices: dict[str, str] = {}
        semaphore = asyncio.Semaphore(INDEX_CREATE_CONCURRENCY)

        async def create(alias: str, mapping: dict[str, Any], index_settings: dict[str, Any] | None) -> None:
            name = f"{alias}_{_body_digest(mapping, index_settings)}_r{stamp}"
            async with semaphore:
                await self.client.indices.create(index=name, **_create_body(mapping, index_settings))
            indices[alias] = name

        try:
            await asyncio.gather(*(create(*spec) for spec in self._index_specs(selected)))
            if entity_types:
                await self._copy_edges_except(indices, entity_types)
        except BaseException:
            await self._delete_indices(list(indices.values()))
            raise
        return RebuildTarget(indices)

    def writing_into(self, target: RebuildTarget) -> ElasticBackend:
        """A backend (not started, its own client) that writes and reads the target's fresh indices instead of the
        aliases: what fills a rebuild target."""
        return ElasticBackend(self.settings, self.registry, refresh=self.refresh, target=target)

    async def swap_in(self, target: RebuildTarget) -> list[str]:
        """Make a rebuild target live: refresh it, point every alias at its fresh index in ONE `_aliases` call (a
        concrete index squatting on an alias's name is removed in that call too), then delete the indices the
        aliases left; returns those. When the swap fails, the target is dropped and the aliases are unchanged."""
        try:
            old = await self._swap_aliases(target.indices)
        except BaseException:
            await self.drop_rebuild_target(target)
            raise
        await self._delete_indices(old)
        return old

    async def drop_rebuild_target(self, target: RebuildTarget) -> None:
        """Delete a rebuild target's fresh indices (an abandoned rebuild)."""
        await self._delete_indices(list(target.indices.values()))

    async def _alias_members(self, alias: str) -> list[str]:
        try:
            return sorted((await self.client.indices.get_alias(name=alias)).body)
        except NotFoundError:
            return []

    async def _delete_indices(self, names: list[str]) -> None:
        for start in range(0, len(names), 50):
            chunk = names[start : start + 50]
            if chunk:
                await self.client.indices.delete(index=",".join(chunk), ignore_unavailable=True)

    async def _copy_edges_except(self, indices: dict[str, str], entity_types: Sequence[str]) -> None:
        """Copy the edges and edge sets whose source is not of `entity_types` from the live graph indices into the
        fresh ones (`indices`: alias -> fresh index)."""
        prefixes = [{"prefix": {"source": f"urn:li:{e}:"}} for e in entity_types]
        for alias in (self.graph_alias, self.edge_set_alias):
            if not await self._alias_members(alias):
                continue
            await self.client.reindex(
                source={"index": alias, "query": {"bool": {"must_not": prefixes}}},
                # keep `_version`: edge documents are versioned by their marker's `_version` (see _project_edges)
                dest={"index": indices[alias], "version_type": "external"},
                refresh=True,
                wait_for_completion=True,
                conflicts="proceed",
            )

    async def _swap_aliases(self, indices: dict[str, str]) -> list[str]:
        """Point every alias at its fresh index in ONE `_aliases` call; returns the indices it left (to delete)."""
        es = self.client
        await es.indices.refresh(index=",".join(indices.values()))
        actions: list[dict[str, Any]] = []
        old: list[str] = []
        for alias, fresh in sorted(indices.items()):
            members = await self._alias_members(alias)
            if not members and await es.indices.exists(index=alias):
                actions.append({"remove_index": {"index": alias}})  # a concrete index squatting on the alias name
            for index in members:
                if index != fresh:
                    actions.append({"remove": {"index": index, "alias": alias}})
                    old.append(index)
            actions.append({"add": {"index": fresh, "alias": alias}})
        await es.indices.update_aliases(actions=actions)
        return old

    # --- reconcile ------------------------------------------------------------------------------------------------

    async def indexed_versions(self, entity_types: Sequence[str]) -> list[IndexedVersion]:
        """`search_after` over each entity index (`aspectVersions`; an aspect is live when it is in `aspectFields`,
        a deleted aspect keeps only its version; tombstones are skipped) and over the edge-set index (markers of
        sources of these entity types; live when the set is not empty)."""
        entries: list[IndexedVersion] = []
        for entity_type in entity_types:
            async for hit in self._scan(
                self.entity_index(entity_type),
                {"match_all": {}},
                [URN_FIELD],
                [URN_FIELD, VERSIONS_FIELD, ASPECT_FIELDS_FIELD, TOMBSTONE_FIELD],
            ):
                source = hit["_source"]
                if source.get(TOMBSTONE_FIELD) is True:
                    continue  # a tombstone is "no document"
                urn = source.get(URN_FIELD) or hit["_id"]
                live = source.get(ASPECT_FIELDS_FIELD) or {}
                for aspect, version in (source.get(VERSIONS_FIELD) or {}).items():
                    entries.append(IndexedVersion(urn, aspect, "document", int(version), aspect in live))
        prefixes = [{"prefix": {"source": f"urn:li:{e}:"}} for e in entity_types]
        query = {"bool": {"should": prefixes, "minimum_should_match": 1}}
        async for hit in self._scan(
            self.edge_set_index, query, ["source", "aspect"], ["source", "aspect", "version", "edges"]
        ):
            source = hit["_source"]
            entries.append(
                IndexedVersion(
                    source["source"], source["aspect"], "edges", int(source["version"]), bool(source.get("edges"))
                )
            )
        return entries

    async def _scan(
        self, index: str, query: dict[str, Any], sort_fields: list[str], source: list[str]
    ) -> AsyncIterator[dict[str, Any]]:
        """Every hit of `query` in `index` (none when the index does not exist), `SCAN_PAGE` per `search_after` page."""
        after: list[Any] | None = None
        while True:
            kwargs: dict[str, Any] = {"search_after": after} if after else {}
            try:
                response = await self.client.search(
                    index=index,
                    query=query,
                    size=SCAN_PAGE,
                    sort=[{f: "asc"} for f in sort_fields],
                    source=source,  # type: ignore[arg-type]  # the client's hint leaves out `_source`'s list form
                    **kwargs,
                )
            except NotFoundError:
                return
            hits = response["hits"]["hits"]
            for hit in hits:
                yield hit
            if len(hits) < SCAN_PAGE:
                return
            after = hits[-1]["sort"]

    # --- apply ----------------------------------------------------------------------------------------------------

    async def apply(self, changes: list[IndexChange]) -> None:
        if not changes:
            return
        await self._follow_registry()
        for change in changes:
            if isinstance(change, TimeseriesPoint):
                await self._ensure_timeseries(change.entity_type, change.aspect)
        removals = await self._current_removals([c for c in changes if isinstance(c, EntityRemoval)])
        # An entity removal comes before the bulk: it deletes every edge from or to the entity; the edge sets of the
        # same call that were declared before the removal are emptied (their version stays), those declared after it
        # are written. A removal older than the key aspect indexed (the entity was re-created since) does nothing.
        removal_pos: dict[str, int] = {}
        for i, change in enumerate(changes):
            if isinstance(change, EntityRemoval) and change in removals:
                removal_pos[change.urn] = i
        pending: list[tuple[int, IndexChange]] = []
        for i, c in enumerate(changes):
            if isinstance(c, AspectEdges) and removal_pos.get(c.source, -1) > i:
                c = AspectEdges(c.source, c.aspect, c.version, ())  # removed with the entity: its version stays
            pending.append((i, c))
        if removals:
            removed = {r.urn for r in removals}
            # the markers keep their version with an empty set (an older edge set cannot come back)
            for source, aspect, version in await self._edge_markers_of(removed):
                pending.append((removal_pos[source], AspectEdges(source, aspect, version, ())))
            await self._delete_edges_of(removed)
        for attempt in range(MAX_CONFLICT_RETRIES + 1):
            retry = await self._apply_once([c for _, c in pending], repair_edges=attempt > 0)
            if not retry:
                return
            pending = [(i, c) for i, c in pending if self._key_of(c) in retry]
            log.debug("search apply: %d documents conflicted, retrying", len(retry))
        raise IndexUnavailable(
            f"search apply: {len(pending)} changes still conflict after {MAX_CONFLICT_RETRIES} retries"
        )

    async def _current_removals(self, removals: list[EntityRemoval]) -> list[EntityRemoval]:
        """The removals not older than the key aspect version indexed for their entity."""
        if not removals:
            return []
        keys = sorted({self._entity_key(r) for r in removals})
        found = await self._mget(keys)
        current = []
        for r in removals:
            doc = found.get(self._entity_key(r))
            versions = ((doc or {}).get("_source") or {}).get(VERSIONS_FIELD) or {}
            if r.aspect is None or int(versions.get(r.aspect, -1)) <= r.version:
                current.append(r)
        return current

    def _key_of(self, change: IndexChange) -> tuple[str, str] | None:
        if isinstance(change, (AspectFields, EntityRemoval)):
            return self._entity_key(change)
        if isinstance(change, AspectEdges):
            return self._edge_set_key(change)
        return None

    def _entity_key(self, change: AspectFields | EntityRemoval) -> tuple[str, str]:
        return (self.entity_index(change.entity_type), entity_doc_id(change.urn))

    def _edge_set_key(self, change: AspectEdges) -> tuple[str, str]:
        return (self.edge_set_index, edge_set_id(change.source, change.aspect))

    async def _apply_once(self, changes: list[IndexChange], *, repair_edges: bool) -> set[tuple[str, str]]:
        """One read-merge-write round; returns the keys of the documents whose conditional write conflicted."""
        entity_groups: dict[tuple[str, str], list[AspectFields | EntityRemoval]] = {}
        edge_groups: dict[tuple[str, str], list[AspectEdges]] = {}
        points: list[TimeseriesPoint] = []
        for change in changes:
            if isinstance(change, (AspectFields, EntityRemoval)):
                entity_groups.setdefault(self._entity_key(change), []).append(change)
            elif isinstance(change, AspectEdges):
                edge_groups.setdefault(self._edge_set_key(change), []).append(change)
            elif isinstance(change, TimeseriesPoint):
                points.append(change)
            else:
                raise TypeError(f"not a search change: {change!r}")
        keys = list(entity_groups) + list(edge_groups)
        current = await self._mget(keys)
        ops: list[tuple[tuple[str, str] | None, dict[str, Any], dict[str, Any] | None]] = []

        for key, group in entity_groups.items():
            found = current.get(key)
            doc = copy.deepcopy(found["_source"]) if found else None
            new_doc = self._merge_entity(doc, group)
            if new_doc == doc:
                continue
            index, doc_id = key
            if new_doc is None:
                ops.append((key, {"delete": {"_index": index, "_id": doc_id, **self._cas(found)}}, None))
            elif found is None:
                ops.append((key, {"create": {"_index": index, "_id": doc_id}}, new_doc))
            else:
                ops.append((key, {"index": {"_index": index, "_id": doc_id, **self._cas(found)}}, new_doc))

        for key, edge_sets in edge_groups.items():
            found = current.get(key)
            marker = found["_source"] if found else None
            stored_version = marker["version"] if marker else -1
            newest = max(c.version for c in edge_sets)
            tied = [c for c in edge_sets if c.version == newest]
            # the newest set of this call; on a tie an empty one (a delete), else the later
            winner = next((c for c in tied if not c.edges), tied[-1])
            old_edges: dict[str, dict[str, Any]] = (marker or {}).get("edges") or {}
            # an empty set at the stored version (a delete) is never refilled by a change log of that same version
            stale = winner.version < stored_version or (
                winner.version == stored_version and marker is not None and not old_edges and bool(winner.edges)
            )
            if stale:
                if repair_edges:  # we may have projected a stale set before losing the race: re-project the truth
                    assert found is not None  # stale: a marker is stored (versions are never negative)
                    ours: dict[str, dict[str, Any]] = {
                        edge_doc_id(
                            e.source, e.relationship, e.destination, edge_set_aspect(winner.source, winner.aspect, e)
                        ): {}
                        for e in winner.edges
                    }
                    ops.extend((None, op, body) for op, body in self._project_edges(old_edges, ours, found["_version"]))
                continue
            # an edge that starts elsewhere (a schema field's lineage) is keyed by its owner too (app.search.model)
            new_edges = {
                edge_doc_id(e.source, e.relationship, e.destination, aspect): _edge_to_doc(e, aspect, winner.version)
                for e in winner.edges
                for aspect in (edge_set_aspect(winner.source, winner.aspect, e),)
            }
            new_marker = {
                "source": winner.source,
                "aspect": winner.aspect,
                "version": winner.version,
                "edges": new_edges,
            }
            if marker == new_marker and not repair_edges:
                continue
            index, doc_id = key
            if found is None:
                ops.append((key, {"create": {"_index": index, "_id": doc_id}}, new_marker))
            else:
                ops.append((key, {"index": {"_index": index, "_id": doc_id, **self._cas(found)}}, new_marker))
            marker_version = found["_version"] + 1 if found else 1  # what this conditional write makes it
            ops.extend((None, op, body) for op, body in self._project_edges(new_edges, old_edges, marker_version))

        for point in points:
            point_doc = dict(point.fields)
            point_doc.update(
                {
                    "urn": point.urn,
                    "timestampMillis": point.timestamp_ms,
                    "event": point.value,
                    "systemMetadata": point.system_metadata,
                }
            )
            ops.append(
                (
                    None,
                    {"index": {"_index": self.timeseries_index(point.entity_type, point.aspect), "_id": point.doc_id}},
                    point_doc,
                )
            )

        conflicts: set[tuple[str, str]] = set()
        for start in range(0, len(ops), BULK_CHUNK_OPS):
            chunk = ops[start : start + BULK_CHUNK_OPS]
            operations: list[dict[str, Any]] = []
            for _, op, body in chunk:
                operations.append(op)
                if body is not None:
                    operations.append(body)
            response = await self.client.bulk(operations=operations, refresh=self.refresh)
            if not response.get("errors"):
                continue
            errors, busy = [], []
            for (doc_key, _op, _), item in zip(chunk, response["items"], strict=True):
                action, result = next(iter(item.items()))
                status = result.get("status", 200)
                if status < 300:
                    continue
                if status == 409 and doc_key is not None:
                    conflicts.add(doc_key)
                elif status == 409 and result.get("_index", "").startswith(self.graph_index):
                    continue  # an edge projection older than the one stored: stale, dropped
                elif status == 404 and action == "delete":
                    continue  # already gone
                elif status == 429 or status >= 500:  # the cluster is busy or failing: not this document's fault
                    busy.append(f"{action} {result.get('_index')}/{result.get('_id')}: {status} {result.get('error')}")
                else:  # mapping conflicts, immense terms, documents over a limit: the data's
                    errors.append(
                        f"{action} {result.get('_index')}/{result.get('_id')}: {_item_error(result.get('error'))}"
                    )
            if busy:
                raise IndexUnavailable(f"search bulk: {len(busy)} documents rejected for now: {busy[:3]}")
            if errors:
                raise IndexRefused(f"search bulk refused {len(errors)} documents: {errors[:5]}", errors)
        return conflicts

    @staticmethod
    def _cas(found: dict[str, Any] | None) -> dict[str, Any]:
        return {"if_seq_no": found["_seq_no"], "if_primary_term": found["_primary_term"]} if found else {}

    def _project_edges(
        self, new_edges: dict[str, dict[str, Any]], old_edges: dict[str, dict[str, Any]], marker_version: int
    ) -> Iterable[tuple[dict[str, Any], dict[str, Any] | None]]:
        """Edge documents from an edge set, versioned externally by the `_version` of the marker they come from, so
        a projection from an older marker that lands late is rejected (409, ignored) instead of resurrecting edges."""
        versioning = {"version": marker_version, "version_type": "external_gte"}
        for doc_id, doc in new_edges.items():
            yield {"index": {"_index": self.graph_index, "_id": doc_id, **versioning}}, doc
        for doc_id in old_edges.keys() - new_edges.keys():
            yield {"delete": {"_index": self.graph_index, "_id": doc_id, **versioning}}, None

    async def _mget(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for start in range(0, len(keys), BULK_CHUNK_OPS):
            chunk = keys[start : start + BULK_CHUNK_OPS]
            response = await self.client.mget(docs=[{"_index": i, "_id": d} for i, d in chunk], realtime=True)
            for key, doc in zip(chunk, response["docs"], strict=True):
                if doc.get("found"):
                    found[key] = doc
        return found

    @staticmethod
    def _merge_entity(doc: dict[str, Any] | None, group: list[AspectFields | EntityRemoval]) -> dict[str, Any] | None:
        """Fold the changes of one entity, in order, into its document (None: no document)."""
        per_aspect: dict[str, dict[str, Any]] = copy.deepcopy((doc or {}).get(ASPECT_FIELDS_FIELD) or {})
        versions: dict[str, int] = dict((doc or {}).get(VERSIONS_FIELD) or {})
        exists = doc is not None
        urn = (doc or {}).get(URN_FIELD)
        changed = False
        for change in group:
            if isinstance(change, EntityRemoval):
                if change.aspect is not None and versions.get(change.aspect, -1) > change.version:
                    continue  # the entity was re-created since: an old removal
                # a tombstone: every aspect deleted at the version indexed, the key aspect at the removal's
                per_aspect, exists, changed, urn = {}, True, True, urn or change.urn
                if change.aspect is not None:
                    versions[change.aspect] = max(versions.get(change.aspect, -1), change.version)
                continue
            stored = versions.get(change.aspect)
            if stored is not None and (
                change.version < stored
                or (change.version == stored and not change.deleted and change.aspect not in per_aspect)
            ):
                continue  # older than what is indexed (or deleted at this very version): never regress
            exists, changed, urn = True, True, change.urn
            versions[change.aspect] = change.version
            if change.deleted:
                per_aspect.pop(change.aspect, None)
            else:
                per_aspect[change.aspect] = {
                    k: v for k, v in change.fields.items() if k not in (VERSIONS_FIELD, ASPECT_FIELDS_FIELD)
                }
        if not exists:
            return None
        if not changed:
            return doc
        if not per_aspect:  # no live aspect: a tombstone (versions only, hidden from every read)
            return {URN_FIELD: urn, TOMBSTONE_FIELD: True, VERSIONS_FIELD: versions, ASPECT_FIELDS_FIELD: {}}
        merged = documents.merge_aspect_fields(per_aspect, versions)
        merged[URN_FIELD] = urn
        merged[ASPECT_FIELDS_FIELD] = per_aspect
        return merged

    async def _edge_markers_of(self, urns: set[str]) -> list[tuple[str, str, int]]:
        """(source, aspect, version) of every edge-set marker of `urns`."""
        markers: list[tuple[str, str, int]] = []
        after: list[Any] | None = None
        while True:
            kwargs: dict[str, Any] = {"search_after": after} if after else {}
            response = await self.client.search(
                index=self.edge_set_index,
                query={"terms": {"source": sorted(urns)}},
                size=1000,
                sort=[{"source": "asc"}, {"aspect": "asc"}],
                source_includes=["source", "aspect", "version"],
                **kwargs,
            )
            hits = response["hits"]["hits"]
            markers.extend((h["_source"]["source"], h["_source"]["aspect"], int(h["_source"]["version"])) for h in hits)
            if len(hits) < 1000:
                return markers
            after = hits[-1]["sort"]

    async def _delete_edges_of(self, urns: set[str]) -> None:
        urn_list = sorted(urns)
        await self.client.delete_by_query(
            index=self.graph_index,
            conflicts="proceed",
            refresh=True,
            query={
                "bool": {
                    "should": [{"terms": {"source": urn_list}}, {"terms": {"destination": urn_list}}],
                    "minimum_should_match": 1,
                }
            },
        )

    # --- search ---------------------------------------------------------------------------------------------------

    def _field_mapping(self, entity_type: str, name: str) -> dict[str, Any]:
        mapping = self._mappings.get(self.entity_index(entity_type))
        if mapping is None:
            mapping, _ = self.entity_index_body(entity_type)
        node: dict[str, Any] = mapping
        for part in name.split("."):
            node = (node.get("properties") or {}).get(part) or {}
        return node

    def _exact_field(self, entity_type: str, name: str) -> str | None:
        """The keyword field to match/filter/sort `name` by whole value (None: no such field)."""
        field = self._field_mapping(entity_type, name)
        kind = field.get("type")
        if kind == "text":
            return f"{name}.keyword" if "keyword" in (field.get("fields") or {}) else None
        if kind in ("keyword", "boolean", "long", "integer", "double", "float", "date", "short", "byte"):
            return name
        if not field:
            return name  # unmapped (dynamic) field: let the engine decide
        return None

    def _filter_field(self, entity_type: str, key: str) -> str:
        name = self._document_field(entity_type, key)
        return self._exact_field(entity_type, name) or name

    def _document_field(self, entity_type: str, key: str) -> str:
        """The document field a filter or sort name is answered on: a filter's field, a structured property's
        (app.search.structured_properties), or the name itself."""
        specs = self.filter_specs(entity_type)
        spec = specs.get(key) or next((s for s in specs.values() if s.name == key), None)
        return spec.name if spec else document_field(key)

    def _text_fields(self, entity_type: str) -> list[str]:
        """The analyzed fields a text query searches, with their boosts: the default search fields' (their `text`
        subfield where the field itself is a keyword)."""
        text_fields: list[str] = []
        for spec in self.search_specs(entity_type):
            if not spec.query_by_default:
                continue
            field = self._field_mapping(entity_type, spec.name)
            if field.get("type") == "text":
                text_fields.append(f"{spec.name}^{spec.boost:g}")
            elif "text" in (field.get("fields") or {}):
                text_fields.append(f"{spec.name}.text^{spec.boost:g}")
        return text_fields

    @staticmethod
    def _query_string(term: query_syntax.Term, fields: list[str]) -> dict[str, Any]:
        """One word or phrase of a structured query, as DataHub's structured query is answered: `query_string`,
        AND between the words a term analyzes to, wildcards analyzed."""
        return {
            "query_string": {
                "query": query_syntax.lucene_word(term),
                "fields": fields,
                "default_operator": "AND",
                "analyze_wildcard": True,
                "lenient": True,
            }
        }

    def _structured_query(self, entity_type: str, node: query_syntax.Node) -> dict[str, Any]:
        """A structured query's tree (app.search.query_syntax) as a bool query: each word a `query_string` on the
        default text fields, a field's words on that field (an URN-valued keyword field also by the URN's last
        part: `tags:pii` finds `urn:li:tag:PII`)."""
        if isinstance(node, query_syntax.Term):
            if node.field is None:
                return self._query_string(node, self._text_fields(entity_type) or [URN_FIELD])
            return self._field_term_query(entity_type, node)
        if isinstance(node, query_syntax.Every):
            if node.field is None:
                return {"match_all": {}}
            return {"exists": {"field": self._document_field(entity_type, node.field)}}
        if isinstance(node, query_syntax.Nothing):
            return {"match_none": {}}
        if isinstance(node, query_syntax.Not):
            return {"bool": {"must_not": [self._structured_query(entity_type, node.child)]}}
        children = [self._structured_query(entity_type, child) for child in node.children]
        if isinstance(node, query_syntax.And):
            return {"bool": {"must": children}}
        return {"bool": {"should": children, "minimum_should_match": 1}}

    def _field_term_query(self, entity_type: str, term: query_syntax.Term) -> dict[str, Any]:
        name = self._document_field(entity_type, term.field or "")
        field = self._field_mapping(entity_type, name)
        kind = field.get("type")
        should: list[dict[str, Any]] = []
        if kind == "text":
            should.append(self._query_string(term, [name]))
        elif "text" in (field.get("fields") or {}):
            should.append(self._query_string(term, [f"{name}.text"]))
        if kind == "keyword" or name == URN_FIELD:
            pattern = "".join(
                c if i in term.wild else ("\\" + c if c in "*?\\" else c) for i, c in enumerate(term.text)
            )
            should.append({"wildcard": {name: {"value": pattern, "case_insensitive": True}}})
            if not term.phrase:  # an URN's last part
                should.append({"wildcard": {name: {"value": "*:" + pattern, "case_insensitive": True}}})
        if not should:  # a number, a boolean, a date, a field not mapped (which matches nothing)
            should.append(self._query_string(term, [name]))
        return should[0] if len(should) == 1 else {"bool": {"should": should, "minimum_should_match": 1}}

    def _text_query(self, entity_type: str, query: str) -> dict[str, Any]:
        tree = query_syntax.parsed(query)
        if tree is not None:
            return self._structured_query(entity_type, tree)
        should: list[dict[str, Any]] = []
        text_fields = self._text_fields(entity_type)
        for spec in self.search_specs(entity_type):
            if not spec.query_by_default:
                continue
            field = self._field_mapping(entity_type, spec.name)
            kind = field.get("type")
            exact = self._exact_field(entity_type, spec.name) if kind in ("text", "keyword") else None
            if exact:
                should.append(
                    {
                        "term": {
                            exact: {
                                "value": query,
                                "boost": spec.boost * EXACT_MATCH_MULTIPLIER,
                                "case_insensitive": True,
                            }
                        }
                    }
                )
        should.append({"term": {URN_FIELD: {"value": query, "boost": 10.0 * EXACT_MATCH_MULTIPLIER}}})
        if text_fields:
            should.append({"multi_match": {"query": query, "fields": text_fields, "type": "best_fields"}})
        return {"bool": {"should": should, "minimum_should_match": 1}}

    def _criterion_query(self, entity_type: str, criterion: Criterion) -> dict[str, Any]:
        """One criterion (app.search.model's CONDITIONS) as DataHub's ESUtils builds it: EQUAL/IN a `terms` query on
        the exact field; IEQUAL and the patterns case-insensitive `term`/`wildcard` queries on it (any value);
        EXISTS an `exists` query; comparisons a `range` on the field, numeric for number and date fields (a value
        that is not a number never matches them), as text for keywords. A condition that cannot apply to the
        field's type (a pattern on a number, a comparison on a boolean) matches nothing, where Elasticsearch would
        refuse the query."""
        condition = criterion.condition
        if not criterion.field or "*" in criterion.field or "?" in criterion.field:
            return {"match_none": {}}  # no document field has such a name (the engine reads it as a field pattern)
        if condition in EQUALITY_CONDITIONS:
            return (
                {"terms": {self._filter_field(entity_type, criterion.field): list(criterion.values)}}
                if criterion.values
                else {"match_none": {}}
            )
        name = self._document_field(entity_type, criterion.field)
        if condition == "EXISTS":
            return {"exists": {"field": name}}
        values = [v.strip() for v in criterion.values]
        kind = self._field_mapping(entity_type, name).get("type")
        if not values:
            return {"match_none": {}}
        if kind == "boolean":
            wanted = sorted({v.lower() for v in values} & {"true", "false"})
            return {"terms": {name: wanted}} if condition == "IEQUAL" and wanted else {"match_none": {}}
        if kind in _NUMBER_KINDS:
            return _number_query(name, kind, condition, values)
        exact = self._exact_field(entity_type, name)
        if exact is None:  # a text field without a keyword subfield, an object: no whole value to test
            return {"match_none": {}}
        if condition in RANGE_CONDITIONS:
            _, bound = range_bounds(condition, values)
            return {"range": {exact: {_RANGE_KEYS[condition]: bound}}}
        if condition == "IEQUAL":
            should = [{"term": {exact: {"value": v, "case_insensitive": True}}} for v in values]
        else:
            before = "*" if condition in ("CONTAIN", "END_WITH") else ""
            after = "*" if condition in ("CONTAIN", "START_WITH") else ""
            should = [
                {"wildcard": {exact: {"value": before + _wildcard_escape(v) + after, "case_insensitive": True}}}
                for v in values
            ]
        return {"bool": {"should": should, "minimum_should_match": 1}}

    def _any_of_query(self, entity_type: str, any_of: Sequence[Sequence[Criterion]]) -> dict[str, Any]:
        """At least one group matches; a group, every criterion (`_criterion_query`, or its negation). A criterion
        without values never matches, unless it is an EXISTS."""
        groups: list[dict[str, Any]] = []
        for group in any_of:
            must: list[dict[str, Any]] = []
            must_not: list[dict[str, Any]] = []
            for criterion in group:
                (must_not if criterion.negated else must).append(self._criterion_query(entity_type, criterion))
            groups.append({"bool": {"filter": must, "must_not": must_not}})
        return {"bool": {"should": groups, "minimum_should_match": 1}} if groups else {"match_none": {}}

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
    ) -> SearchPage:
        await self._follow_registry()
        index = self.entity_index(entity_type)
        text = (query or "").strip()
        must = {"match_all": {}} if text in ("", "*") else self._text_query(entity_type, text)
        filter_clauses: list[dict[str, Any]] = []
        for key, values in (filters or {}).items():
            if values:
                filter_clauses.append({"terms": {self._filter_field(entity_type, key): list(values)}})
        if any_of is not None:
            filter_clauses.append(self._any_of_query(entity_type, any_of))
        bool_query: dict[str, Any] = {
            "must": [must],
            "filter": filter_clauses,
            "must_not": [{"term": {TOMBSTONE_FIELD: True}}],
        }  # never a hit, never counted
        if not names_removed(filters, any_of):
            bool_query["must_not"].append({"term": {REMOVED_FIELD: True}})
        sort_clauses: list[dict[str, Any]] = []
        for name, order in sort or []:
            direction = "desc" if order.lower().startswith("desc") else "asc"
            if name in ("_score", "score"):
                sort_clauses.append({"_score": direction})
            else:
                name = self._document_field(entity_type, name)
                field = self._exact_field(entity_type, name) or name
                sort_clauses.append({field: {"order": direction, "unmapped_type": "keyword"}})
        if not sort_clauses:
            sort_clauses.append({"_score": "desc"})
        sort_clauses.append({URN_FIELD: "asc"})
        aggs = {}
        for key in self.filter_specs(entity_type):
            aggs[key] = {"terms": {"field": self._filter_field(entity_type, key), "size": 20}}
        # a dynamic field: a keyword, or a double for numbers (none until a value is indexed)
        for key in property_facets:
            aggs[key] = {"terms": {"field": document_field(key), "size": 20}}
        body: dict[str, Any] = {
            "query": {"bool": bool_query},
            "sort": sort_clauses,
            "size": count + 1,
            "track_total_hits": True,
        }
        if scroll_id:  # the values of the sort clauses, the urn's last
            after = decode_keyset(scroll_id, keys=len(sort_clauses) - 1, by_relevance=not sort)
            body["search_after"] = [*after.keys, after.urn]
        elif facets:
            body["aggs"] = aggs  # facets on the first page only (they do not change while scrolling)
        response = await self.client.search(index=index, **body)
        raw = response["hits"]["hits"]
        hits = [self._hit(entity_type, h) for h in raw[:count]]
        next_id = (
            keyset_cursor(raw[count - 1]["sort"][:-1], raw[count - 1]["sort"][-1])
            if len(raw) > count and count > 0
            else None
        )
        facet_counts: dict[str, dict[str, int]] = {}
        for key, agg in (response.get("aggregations") or {}).items():
            facet_counts[key] = {self._bucket_key(b): b["doc_count"] for b in agg.get("buckets", [])}
        return SearchPage(hits=hits, total=response["hits"]["total"]["value"], scroll_id=next_id, facets=facet_counts)

    @staticmethod
    def _bucket_key(bucket: dict[str, Any]) -> str:
        if "key_as_string" in bucket:
            return bucket["key_as_string"]
        key = bucket["key"]
        return str(key).lower() if isinstance(key, bool) else str(key)

    def _hit(self, entity_type: str, hit: dict[str, Any]) -> SearchHit:
        source = hit.get("_source") or {}
        fields = {k: v for k, v in source.items() if k != ASPECT_FIELDS_FIELD}
        return SearchHit(
            urn=source.get(URN_FIELD, hit["_id"]),
            entity_type=self._entity_name(entity_type),
            score=float(hit.get("_score") or 0.0),
            fields=fields,
        )

    async def autocomplete(self, entity_type: str, prefix: str, *, limit: int = 10) -> list[SearchHit]:
        text = (prefix or "").strip()
        if not text:
            return []
        await self._follow_registry()
        names = [s.name for s in self.search_specs(entity_type) if s.autocomplete] or [
            s.name for s in self.search_specs(entity_type) if s.field_type in TEXT_TYPES and s.query_by_default
        ]
        should: list[dict[str, Any]] = []
        for spec in self.search_specs(entity_type):
            if spec.name not in names:
                continue
            exact = self._exact_field(entity_type, spec.name)
            if exact:
                should.append({"prefix": {exact: {"value": text, "case_insensitive": True, "boost": spec.boost * 2}}})
            field = self._field_mapping(entity_type, spec.name)
            if field.get("type") == "text":
                should.append({"match_phrase_prefix": {spec.name: {"query": text, "boost": spec.boost}}})
            elif "text" in (field.get("fields") or {}):
                should.append({"match_phrase_prefix": {f"{spec.name}.text": {"query": text, "boost": spec.boost}}})
        should.append({"prefix": {URN_FIELD: {"value": text, "case_insensitive": True}}})
        query = {
            "bool": {
                "should": should,
                "minimum_should_match": 1,
                "must_not": [{"term": {REMOVED_FIELD: True}}, {"term": {TOMBSTONE_FIELD: True}}],
            }
        }
        response = await self.client.search(
            index=self.entity_index(entity_type), query=query, size=limit, sort=[{"_score": "desc"}, {URN_FIELD: "asc"}]
        )
        return [self._hit(entity_type, h) for h in response["hits"]["hits"]]

    # --- graph ----------------------------------------------------------------------------------------------------

    async def relationships(
        self,
        urn: str,
        *,
        direction: Direction,
        types: list[str] | None = None,
        start: int = 0,
        count: int = 100,
    ) -> tuple[list[Edge], int]:
        own, other = ("source", "destination") if direction == "OUTGOING" else ("destination", "source")
        filters: list[dict[str, Any]] = [{"term": {own: urn}}]
        if types:
            filters.append({"terms": {"relationshipType": list(types)}})
        response = await self.client.search(
            index=self.graph_index,
            query={"bool": {"filter": filters}},
            from_=start,
            size=count,
            sort=[{"relationshipType": "asc"}, {other: "asc"}, {"aspect": "asc"}],
            track_total_hits=True,
        )
        edges = [_doc_to_edge(h["_source"]) for h in response["hits"]["hits"]]
        return edges, response["hits"]["total"]["value"]

    async def scroll_edges(
        self, query: EdgeQuery, *, after: tuple[str, str, str, str] | None = None, count: int = 100
    ) -> EdgePage:
        """`search_after` on (source, aspect, relationshipType, destination), the edge's identity: a stable total
        order, so an edge that exists throughout a scroll is returned once whatever is written meanwhile."""
        filters: list[dict[str, Any]] = []
        for field, values in (
            ("relationshipType", query.relationship_types),
            ("sourceType", query.source_types),
            ("destinationType", query.destination_types),
            ("source", query.source_urns),
            ("destination", query.destination_urns),
        ):
            if values:
                filters.append({"terms": {field: list(values)}})
        if query.either_urns:
            either = list(query.either_urns)
            filters.append(
                {
                    "bool": {
                        "should": [{"terms": {"source": either}}, {"terms": {"destination": either}}],
                        "minimum_should_match": 1,
                    }
                }
            )
        if query.lineage_only:
            filters.append({"term": {"isLineage": True}})
        body: dict[str, Any] = {
            "query": {"bool": {"filter": filters}},
            "size": count + 1,
            "track_total_hits": False,
            "sort": [{"source": "asc"}, {"aspect": "asc"}, {"relationshipType": "asc"}, {"destination": "asc"}],
        }
        if after is not None:
            body["search_after"] = list(after)
        response = await self.client.search(index=self.graph_index, **body)
        raw = response["hits"]["hits"]
        page = raw[:count]
        last = page[-1]["sort"] if page and len(raw) > count else None
        return EdgePage(edges=[_doc_to_edge(h["_source"]) for h in page], after=tuple(last) if last else None)

    async def lineage(
        self,
        urn: str,
        *,
        direction: Literal["UPSTREAM", "DOWNSTREAM"],
        max_hops: int = 3,
    ) -> list[tuple[Edge, int]]:
        """Breadth first over lineage edges (isLineage). UPSTREAM follows DownstreamOf-like edges outgoing (and
        Produces-like edges, `DOWNSTREAM_LINEAGE`, incoming); DOWNSTREAM the opposite. Each edge once, at the hop it
        is first reached."""
        visited = {urn}
        frontier = [urn]
        seen_edges: set[str] = set()
        result: list[tuple[Edge, int]] = []
        for hop in range(1, max_hops + 1):
            if not frontier:
                break
            next_frontier: list[str] = []
            for edge_id, doc in await self._lineage_edges(frontier, direction):
                if edge_id in seen_edges:
                    continue
                seen_edges.add(edge_id)
                edge = _doc_to_edge(doc)
                outgoing_is_up = edge.relationship not in DOWNSTREAM_LINEAGE
                follows_outgoing = (direction == "UPSTREAM") == outgoing_is_up
                neighbour = edge.destination if follows_outgoing else edge.source
                result.append((edge, hop))
                if neighbour not in visited:
                    visited.add(neighbour)
                    next_frontier.append(neighbour)
            frontier = next_frontier
        return result

    async def lineage_hop(self, nodes: Sequence[str], *, direction: Literal["UPSTREAM", "DOWNSTREAM"]) -> list[Edge]:
        """One hop of the lineage walk (app.search.lineage.walk): the lineage edges a step from `nodes` follows."""
        return [_doc_to_edge(doc) for _, doc in await self._lineage_edges(list(nodes), direction)]

    async def _lineage_edges(self, frontier: list[str], direction: str) -> list[tuple[str, dict[str, Any]]]:
        up = sorted(DOWNSTREAM_LINEAGE)
        out: list[tuple[str, dict[str, Any]]] = []
        for start in range(0, len(frontier), 1000):
            nodes = frontier[start : start + 1000]
            # outgoing edges that point the way we go, or incoming edges of the Produces kind
            forward = {
                "bool": {"filter": [{"terms": {"source": nodes}}], "must_not": [{"terms": {"relationshipType": up}}]}
            }
            reverse = {"bool": {"filter": [{"terms": {"destination": nodes}}, {"terms": {"relationshipType": up}}]}}
            if direction == "DOWNSTREAM":
                forward = {
                    "bool": {
                        "filter": [{"terms": {"destination": nodes}}],
                        "must_not": [{"terms": {"relationshipType": up}}],
                    }
                }
                reverse = {"bool": {"filter": [{"terms": {"source": nodes}}, {"terms": {"relationshipType": up}}]}}
            query = {
                "bool": {
                    "filter": [{"term": {"isLineage": True}}],
                    "should": [forward, reverse],
                    "minimum_should_match": 1,
                }
            }
            after: list[Any] | None = None
            while True:
                kwargs: dict[str, Any] = {"search_after": after} if after else {}
                response = await self.client.search(
                    index=self.graph_index,
                    query=query,
                    size=1000,
                    sort=[{"source": "asc"}, {"relationshipType": "asc"}, {"destination": "asc"}, {"aspect": "asc"}],
                    **kwargs,
                )
                hits = response["hits"]["hits"]
                out.extend((h["_id"], h["_source"]) for h in hits)
                if len(hits) < 1000:
                    break
                after = hits[-1]["sort"]
        return out

    # --- timeseries and versions ----------------------------------------------------------------------------------

    async def delete_timeseries(
        self,
        urn: str,
        aspects: list[str],
        *,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> int:
        entity_type = self._entity_name(parse_urn(urn).entity_type)
        filters: list[dict[str, Any]] = [{"term": {"urn": urn}}]
        bounds = {k: v for k, v in (("gte", start_ms), ("lte", end_ms)) if v is not None}
        if bounds:
            filters.append({"range": {"timestampMillis": bounds}})
        deleted = 0
        for aspect in aspects:
            try:
                response = await self.client.delete_by_query(
                    index=self.timeseries_index(entity_type, aspect),
                    query={"bool": {"filter": filters}},
                    refresh=True,
                )
            except NotFoundError:
                continue  # no point of this aspect was ever indexed
            deleted += int(response.get("deleted", 0))
        return deleted

    async def timeseries(self, query: TimeseriesQuery) -> list[TimeseriesPoint]:
        entity_type = self._entity_name(parse_urn(query.urn).entity_type)
        index = self.timeseries_index(entity_type, query.aspect)
        filters: list[dict[str, Any]] = [{"term": {"urn": query.urn}}]
        if query.start_ms is not None or query.end_ms is not None:
            bounds: dict[str, Any] = {}
            if query.start_ms is not None:
                bounds["gte"] = query.start_ms
            if query.end_ms is not None:
                bounds["lte"] = query.end_ms
            filters.append({"range": {"timestampMillis": bounds}})
        for name, value in query.equals.items():
            filters.append({"terms" if isinstance(value, list) else "term": {name: value}})
        try:
            response = await self.client.search(
                index=index,
                query={"bool": {"filter": filters}},
                size=max(0, min(query.limit, 10_000)),
                sort=[{"timestampMillis": "desc"}],
            )
        except NotFoundError:
            return []  # no point of this aspect was ever indexed
        points = []
        for hit in response["hits"]["hits"]:
            src = dict(hit["_source"])
            value = src.pop("event", None) or {}
            system_metadata = src.pop("systemMetadata", None)
            points.append(
                TimeseriesPoint(
                    aspect=query.aspect,
                    doc_id=hit["_id"],
                    urn=src.get("urn", query.urn),
                    entity_type=entity_type,
                    timestamp_ms=int(src["timestampMillis"]),
                    fields=src,
                    value=value,
                    system_metadata=system_metadata,
                )
            )
        return points

    async def document_versions(self, urn: str) -> dict[str, int]:
        index = self.entity_index(parse_urn(urn).entity_type)
        try:
            doc = await self.client.get(index=index, id=entity_doc_id(urn), realtime=True)
        except NotFoundError:
            return {}
        if doc["_source"].get(TOMBSTONE_FIELD):
            return {}
        return {k: int(v) for k, v in (doc["_source"].get(VERSIONS_FIELD) or {}).items()}
