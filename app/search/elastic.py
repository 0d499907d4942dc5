"""The Elasticsearch/OpenSearch search backend (`SearchBackend` over the official async `elasticsearch` client).

Indices (all behind aliases: alias `<name>` → index `<name>_<hash of its mapping>`; a changed mapping creates the
new index, copies the documents (`_reindex`) and swaps the alias in one `_aliases` call):

* one entity index per entity type (`documents.index_name`): one document per entity, id = urn (a hash when the urn
  is longer than Elasticsearch's 512-byte id limit), with `aspectVersions.<aspect>` (the version each aspect's
  fields come from) and `aspectFields.<aspect>` (not indexed: the fields each aspect contributed, so an aspect's new
  value or delete replaces exactly its own fields; the searchable top level is `documents.merge_aspect_fields` of
  them, as in the Postgres backend);
* the edge index `{prefix}graph_service_v1` (DataHub's name): one document per edge, id = hash(source,
  relationship, destination, aspect);
* the edge-set index `{prefix}graph_service_v1_sets`: one marker per (source, aspect) holding the version and the
  full edge set of that aspect: the truth the edge documents are projected from;
* timeseries indices (`documents.timeseries_index_name`), created on first use: id = DataHub's point id.

Order safety without scripts (OpenSearch and the test server have no painless): `apply` reads the current entity
documents and edge-set markers (`mget`, with `_seq_no`/`_primary_term`), merges the changes in memory (an aspect's
change applies only if its version is >= the version stored for that aspect) and writes them back in ONE `_bulk`
with `if_seq_no`/`if_primary_term` (`op_type=create` for new documents). Conflicted documents are re-read and
merged again. An edge set whose marker write lost a race re-projects the winning marker's edges (so stale edges
written by the loser are overwritten or deleted). Entity removals turn the document into a tombstone
(`entityRemoved: true`, `aspectVersions` kept, no searchable content; excluded from every read; a newer change of
an aspect revives it) and, with `delete_by_query`, delete every edge from or to the entity before the bulk; its
edge-set markers keep their version with an empty set. At equal versions a delete (an empty edge set) wins.

OpenSearch flavor (`search_flavor="opensearch"`): the client sends `application/vnd.elasticsearch+json;
compatible-with=8`, which OpenSearch answers with 406, and checks for the `X-Elastic-Product` response header;
`OpenSearchCompatNode` maps the media types back to plain JSON/NDJSON and supplies the header. Real OpenSearch needs
it as much as the test server does.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import logging
import re
from collections.abc import Iterable
from typing import Any, Literal

import orjson
from elastic_transport import HttpxAsyncHttpNode
from elasticsearch import AsyncElasticsearch, NotFoundError

from app.search import documents
from app.search.model import (
    REMOVED_FIELD,
    TOMBSTONE_FIELD,
    URN_FIELD,
    VERSIONS_FIELD,
    AspectEdges,
    AspectFields,
    Change,
    Direction,
    Edge,
    EntityRemoval,
    SearchFieldSpec,
    SearchHit,
    SearchPage,
    TimeseriesPoint,
    TimeseriesQuery,
)
from app.urns import parse_urn

log = logging.getLogger("metaledger.search.elastic")

ASPECT_FIELDS_FIELD = "aspectFields"  # aspect -> the fields it contributed (not indexed; the merge input)
GRAPH_INDEX = "graph_service_v1"
EDGE_SETS_SUFFIX = "_sets"
MAX_ID_BYTES = 512
BULK_CHUNK_OPS = 5_000  # documents per _bulk request (a huge apply is chunked)
MAX_CONFLICT_RETRIES = 20
EXACT_MATCH_MULTIPLIER = 10.0  # a whole-value keyword match counts this many times the field's boost
TEXT_TYPES = {"TEXT", "TEXT_PARTIAL", "WORD_GRAM", "URN_PARTIAL", "BROWSE_PATH", "BROWSE_PATH_V2"}
# Lineage relationships whose outgoing direction points downstream (the others, DownstreamOf first, point upstream).
DOWNSTREAM_RELATIONSHIPS = frozenset({"Produces", "DataProcessInstanceProduces"})
_COMPAT = re.compile(r"application/vnd\.elasticsearch\+([\w.-]+)\s*;\s*compatible-with=\d+", re.IGNORECASE)


class OpenSearchCompatNode(HttpxAsyncHttpNode):
    """The client's httpx node, speaking plain JSON: `application/vnd.elasticsearch+X; compatible-with=N` in Accept
    and Content-Type (json, x-ndjson for bulk) become `application/X`, and responses without the
    `X-Elastic-Product` header (OpenSearch never sends it) get it, so the client's product check passes."""

    async def perform_request(self, method, target, body=None, headers=None, **kwargs):  # type: ignore[override]
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


def _json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _hash(*parts: Any) -> str:
    return hashlib.sha256(_json(parts)).hexdigest()


def entity_doc_id(urn: str) -> str:
    return urn if len(urn.encode()) <= MAX_ID_BYTES else "sha256:" + hashlib.sha256(urn.encode()).hexdigest()


def edge_doc_id(source: str, relationship: str, destination: str, aspect: str) -> str:
    return _hash(source, relationship, destination, aspect)


def edge_set_id(source: str, aspect: str) -> str:
    return _hash("edge-set", source, aspect)


def mapping_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(_json(body)).hexdigest()[:12]


def _edge_to_doc(edge: Edge, aspect: str, version: int) -> dict[str, Any]:
    return {
        "source": edge.source, "destination": edge.destination, "relationshipType": edge.relationship,
        "sourceType": edge.source_type, "destinationType": edge.destination_type, "via": edge.via,
        "createdOn": edge.created_on, "createdActor": edge.created_actor, "updatedOn": edge.updated_on,
        "updatedActor": edge.updated_actor, "properties": edge.properties or {}, "aspect": aspect,
        "version": version, "isLineage": edge.is_lineage,
    }


def _doc_to_edge(doc: dict[str, Any]) -> Edge:
    return Edge(
        source=doc["source"], destination=doc["destination"], relationship=doc["relationshipType"],
        source_type=doc.get("sourceType") or "", destination_type=doc.get("destinationType") or "",
        via=doc.get("via"), created_on=doc.get("createdOn"), created_actor=doc.get("createdActor"),
        updated_on=doc.get("updatedOn"), updated_actor=doc.get("updatedActor"),
        properties=doc.get("properties") or {}, is_lineage=bool(doc.get("isLineage")),
    )


EDGE_MAPPING: dict[str, Any] = {
    "dynamic": False,
    "properties": {
        "source": {"type": "keyword"}, "destination": {"type": "keyword"},
        "relationshipType": {"type": "keyword"}, "sourceType": {"type": "keyword"},
        "destinationType": {"type": "keyword"}, "via": {"type": "keyword"},
        "createdOn": {"type": "date", "format": "epoch_millis"}, "createdActor": {"type": "keyword"},
        "updatedOn": {"type": "date", "format": "epoch_millis"}, "updatedActor": {"type": "keyword"},
        "properties": {"type": "object", "enabled": False},
        "aspect": {"type": "keyword"}, "version": {"type": "long"}, "isLineage": {"type": "boolean"},
    },
}
EDGE_SET_MAPPING: dict[str, Any] = {
    "dynamic": False,
    "properties": {
        "source": {"type": "keyword"}, "aspect": {"type": "keyword"}, "version": {"type": "long"},
        "edges": {"type": "object", "enabled": False},  # the full edge documents, keyed by edge id
    },
}


def _split_index_body(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """`index_mapping` may give a bare mapping or a create-index body ({"mappings": ..., "settings": ...})."""
    if "mappings" in body or "settings" in body:
        return copy.deepcopy(body.get("mappings") or {}), copy.deepcopy(body.get("settings")) or None
    return copy.deepcopy(body), None


def _entity_mapping(base: dict[str, Any], specs: list[SearchFieldSpec]) -> dict[str, Any]:
    """The documents module's mapping plus the fields this backend relies on: urn, removed, the per-aspect versions
    and field names, and a `keyword` subfield on text search fields (exact-value matches, sorting, filters)."""
    mapping = copy.deepcopy(base)
    props = mapping.setdefault("properties", {})
    props.setdefault(URN_FIELD, {"type": "keyword"})
    props.setdefault(REMOVED_FIELD, {"type": "boolean"})
    props[TOMBSTONE_FIELD] = {"type": "boolean"}
    props[VERSIONS_FIELD] = {"type": "object", "dynamic": True}
    props[ASPECT_FIELDS_FIELD] = {"type": "object", "enabled": False}
    for spec in specs:
        if "." in spec.name:
            continue
        field = props.get(spec.name)
        if field is None:
            continue
        if field.get("type") == "text":
            subfields = field.setdefault("fields", {})
            subfields.setdefault("keyword", {"type": "keyword", "ignore_above": 256})
    return mapping


def _timeseries_mapping(base: dict[str, Any]) -> dict[str, Any]:
    mapping = copy.deepcopy(base)
    props = mapping.setdefault("properties", {})
    props.setdefault("urn", {"type": "keyword"})
    props.setdefault("timestampMillis", {"type": "date", "format": "epoch_millis"})
    props.setdefault("event", {"type": "object", "enabled": False})  # the whole aspect value (DataHub's field)
    props.setdefault("systemMetadata", {"type": "object", "enabled": False})
    return mapping


def _encode_cursor(values: list[Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(values)).decode().rstrip("=")


def _decode_cursor(cursor: str) -> list[Any]:
    try:
        return orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"invalid scrollId {cursor!r}") from exc


class ElasticBackend:
    """`SearchBackend` on Elasticsearch (`search_flavor="elasticsearch"`) or OpenSearch (`"opensearch"`).

    `refresh`: what writes pass as `refresh` ("wait_for": a write is visible to the next search, as sync indexing
    needs; False for bulk loaders that do not need read-your-writes)."""

    def __init__(self, settings: Any, registry: Any, *, refresh: bool | str = "wait_for",
                 client: AsyncElasticsearch | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.prefix: str = settings.search_index_prefix or ""
        self.flavor: str = (settings.search_flavor or "elasticsearch").lower()
        if self.flavor not in ("elasticsearch", "opensearch"):
            raise ValueError(f"search_flavor must be 'elasticsearch' or 'opensearch', not {self.flavor!r}")
        self.refresh = refresh
        self._client = client
        self._ready: set[str] = set()  # aliases known to point at the current mapping
        self._ensure_lock = asyncio.Lock()
        self._specs: dict[str, list[SearchFieldSpec]] = {}
        self._filters: dict[str, dict[str, SearchFieldSpec]] = {}
        self._mappings: dict[str, dict[str, Any]] = {}  # alias -> mapping as created

    # --- client and index lifecycle -------------------------------------------------------------------------------

    @property
    def client(self) -> AsyncElasticsearch:
        if self._client is None:
            kwargs: dict[str, Any] = {"request_timeout": 60}
            if self.flavor == "opensearch":
                kwargs["node_class"] = OpenSearchCompatNode
            else:
                kwargs["node_class"] = "httpxasync"
            self._client = AsyncElasticsearch(self.settings.search_url, **kwargs)
        return self._client

    @property
    def graph_index(self) -> str:
        return f"{self.prefix}{GRAPH_INDEX}"

    @property
    def edge_set_index(self) -> str:
        return f"{self.prefix}{GRAPH_INDEX}{EDGE_SETS_SUFFIX}"

    def entity_index(self, entity_type: str) -> str:
        return documents.index_name(self.prefix, self._entity_name(entity_type))

    def timeseries_index(self, entity_type: str, aspect: str) -> str:
        return documents.timeseries_index_name(self.prefix, self._entity_name(entity_type), aspect)

    def _entity_name(self, entity_type: str) -> str:
        return self.registry.entity(entity_type).name

    def search_specs(self, entity_type: str) -> list[SearchFieldSpec]:
        name = self._entity_name(entity_type)
        if name not in self._specs:
            self._specs[name] = list(documents.search_fields(self.registry, name))
        return self._specs[name]

    def filter_specs(self, entity_type: str) -> dict[str, SearchFieldSpec]:
        name = self._entity_name(entity_type)
        if name not in self._filters:
            self._filters[name] = dict(documents.filter_fields(self.registry, name))
        return self._filters[name]

    def entity_index_body(self, entity_type: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        base, index_settings = _split_index_body(documents.index_mapping(self.registry, self._entity_name(entity_type)))
        return _entity_mapping(base, self.search_specs(entity_type)), index_settings

    async def start(self) -> None:
        await self.client.info()
        entity_types = sorted(self.registry.entities)
        jobs = [(self.graph_index, EDGE_MAPPING, None), (self.edge_set_index, EDGE_SET_MAPPING, None)]
        for entity_type in entity_types:
            mapping, index_settings = self.entity_index_body(entity_type)
            jobs.append((self.entity_index(entity_type), mapping, index_settings))
        semaphore = asyncio.Semaphore(8)

        async def one(alias: str, mapping: dict[str, Any], index_settings: dict[str, Any] | None) -> None:
            async with semaphore:
                await self.ensure_index(alias, mapping, index_settings)

        await asyncio.gather(*(one(*job) for job in jobs))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def ensure_index(self, alias: str, mapping: dict[str, Any], index_settings: dict[str, Any] | None = None) -> str:
        """Make `alias` point at `<alias>_<hash(mapping, settings)>`: create it if missing; if the alias points at an
        index with another mapping, create the new index, copy the documents into it and swap the alias atomically
        (then drop the old index). Returns the concrete index name."""
        digest = mapping_hash({"mappings": mapping, "settings": index_settings or {}})
        target = f"{alias}_{digest}"
        self._mappings[alias] = mapping
        if alias in self._ready:
            return target
        es = self.client
        current: list[str] = []
        try:
            current = sorted((await es.indices.get_alias(name=alias)).body)
        except NotFoundError:
            current = []
        if current == [target] or (len(current) == 1 and current[0].startswith(f"{target}_")):
            # the current mapping, possibly in an index built elsewhere and swapped in (a restore job's
            # `<alias>_<digest>_r<timestamp>`): nothing to do
            self._ready.add(alias)
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
                self._ready.add(alias)
                return current[0]
        if not await es.indices.exists(index=target):
            body: dict[str, Any] = {"mappings": mapping}
            if index_settings:
                body["settings"] = index_settings
            try:
                await es.indices.create(index=target, **body)
            except Exception as exc:  # noqa: BLE001 - a concurrent starter created it first
                if "resource_already_exists" not in str(exc):
                    raise
        sources = [index for index in current if index != target] + ([alias] if concrete_legacy else [])
        for source in sources:
            await es.reindex(source={"index": source}, dest={"index": target}, refresh=True,
                             wait_for_completion=True, conflicts="proceed")
        if concrete_legacy:
            await es.indices.delete(index=alias)
        actions: list[dict[str, Any]] = [{"remove": {"index": index, "alias": alias}} for index in current if index != target]
        actions.append({"add": {"index": target, "alias": alias}})
        await es.indices.update_aliases(actions=actions)
        for index in current:
            if index != target:
                await es.indices.delete(index=index, ignore_unavailable=True)
                log.info("search index %s: mapping changed, reindexed %s into %s", alias, index, target)
        self._ready.add(alias)
        return target

    async def _ensure_timeseries(self, entity_type: str, aspect: str) -> str:
        alias = self.timeseries_index(entity_type, aspect)
        if alias not in self._ready:
            async with self._ensure_lock:
                if alias not in self._ready:
                    base, index_settings = _split_index_body(documents.timeseries_mapping(self.registry, aspect))
                    await self.ensure_index(alias, _timeseries_mapping(base), index_settings)
        return alias

    # --- apply ----------------------------------------------------------------------------------------------------

    async def apply(self, changes: list[Change]) -> None:
        if not changes:
            return
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
        pending: list[tuple[int, Change]] = []
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
        raise RuntimeError(f"search apply: {len(pending)} changes still conflict after {MAX_CONFLICT_RETRIES} retries")

    async def _current_removals(self, removals: list[EntityRemoval]) -> list[EntityRemoval]:
        """The removals not older than the key aspect version indexed for their entity."""
        if not removals:
            return []
        keys = sorted({self._key_of(r) for r in removals})  # type: ignore[type-var]
        found = await self._mget(keys)  # type: ignore[arg-type]
        current = []
        for r in removals:
            doc = found.get(self._key_of(r))  # type: ignore[arg-type]
            versions = ((doc or {}).get("_source") or {}).get(VERSIONS_FIELD) or {}
            if r.aspect is None or int(versions.get(r.aspect, -1)) <= r.version:
                current.append(r)
        return current

    def _key_of(self, change: Change) -> tuple[str, str] | None:
        if isinstance(change, (AspectFields, EntityRemoval)):
            return (self.entity_index(change.entity_type), entity_doc_id(change.urn))
        if isinstance(change, AspectEdges):
            return (self.edge_set_index, edge_set_id(change.source, change.aspect))
        return None

    async def _apply_once(self, changes: list[Change], *, repair_edges: bool) -> set[tuple[str, str]]:
        """One read-merge-write round; returns the keys of the documents whose conditional write conflicted."""
        entity_groups: dict[tuple[str, str], list[AspectFields | EntityRemoval]] = {}
        edge_groups: dict[tuple[str, str], list[AspectEdges]] = {}
        points: list[TimeseriesPoint] = []
        for change in changes:
            key = self._key_of(change)
            if isinstance(change, (AspectFields, EntityRemoval)):
                entity_groups.setdefault(key, []).append(change)  # type: ignore[arg-type]
            elif isinstance(change, AspectEdges):
                edge_groups.setdefault(key, []).append(change)  # type: ignore[arg-type]
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

        for key, group in edge_groups.items():
            found = current.get(key)
            marker = found["_source"] if found else None
            stored_version = marker["version"] if marker else -1
            newest = max(c.version for c in group)
            tied = [c for c in group if c.version == newest]
            # the newest set of this call; on a tie an empty one (a delete), else the later
            winner = next((c for c in tied if not c.edges), tied[-1])
            old_edges: dict[str, dict[str, Any]] = (marker or {}).get("edges") or {}
            # an empty set at the stored version (a delete) is never refilled by a change log of that same version
            stale = winner.version < stored_version or (
                winner.version == stored_version and marker is not None and not old_edges and bool(winner.edges)
            )
            if stale:
                if repair_edges:  # we may have projected a stale set before losing the race: re-project the truth
                    ours = {edge_doc_id(e.source, e.relationship, e.destination, winner.aspect): {} for e in winner.edges}
                    ops.extend((None, op, body) for op, body in self._project_edges(old_edges, ours, found["_version"]))
                continue
            new_edges = {
                edge_doc_id(e.source, e.relationship, e.destination, winner.aspect): _edge_to_doc(e, winner.aspect, winner.version)
                for e in winner.edges
            }
            new_marker = {"source": winner.source, "aspect": winner.aspect, "version": winner.version, "edges": new_edges}
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
            body = dict(point.fields)
            body.update({"urn": point.urn, "timestampMillis": point.timestamp_ms, "event": point.value,
                         "systemMetadata": point.system_metadata})
            ops.append((None, {"index": {"_index": self.timeseries_index(point.entity_type, point.aspect), "_id": point.doc_id}}, body))

        conflicts: set[tuple[str, str]] = set()
        for start in range(0, len(ops), BULK_CHUNK_OPS):
            chunk = ops[start:start + BULK_CHUNK_OPS]
            operations: list[dict[str, Any]] = []
            for _, op, body in chunk:
                operations.append(op)
                if body is not None:
                    operations.append(body)
            response = await self.client.bulk(operations=operations, refresh=self.refresh)
            if not response.get("errors"):
                continue
            errors = []
            for (key, op, _), item in zip(chunk, response["items"], strict=True):
                action, result = next(iter(item.items()))
                status = result.get("status", 200)
                if status < 300:
                    continue
                if status == 409 and key is not None:
                    conflicts.add(key)
                elif status == 409 and result.get("_index", "").startswith(self.graph_index):
                    continue  # an edge projection older than the one stored: stale, dropped
                elif status == 404 and action == "delete":
                    continue  # already gone
                else:
                    errors.append(f"{action} {result.get('_index')}/{result.get('_id')}: {result.get('error')}")
            if errors:
                raise RuntimeError(f"search bulk failed for {len(errors)} documents: {errors[:5]}")
        return conflicts

    @staticmethod
    def _cas(found: dict[str, Any] | None) -> dict[str, Any]:
        return {"if_seq_no": found["_seq_no"], "if_primary_term": found["_primary_term"]} if found else {}

    def _project_edges(self, new_edges: dict[str, dict[str, Any]], old_edges: dict[str, dict[str, Any]],
                       marker_version: int) -> Iterable[tuple[dict[str, Any], dict[str, Any] | None]]:
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
            chunk = keys[start:start + BULK_CHUNK_OPS]
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
            if stored is not None and (change.version < stored or (
                change.version == stored and not change.deleted and change.aspect not in per_aspect
            )):
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
                index=self.edge_set_index, query={"terms": {"source": sorted(urns)}}, size=1000,
                sort=[{"source": "asc"}, {"aspect": "asc"}], source_includes=["source", "aspect", "version"], **kwargs,
            )
            hits = response["hits"]["hits"]
            markers.extend((h["_source"]["source"], h["_source"]["aspect"], int(h["_source"]["version"])) for h in hits)
            if len(hits) < 1000:
                return markers
            after = hits[-1]["sort"]

    async def _delete_edges_of(self, urns: set[str]) -> None:
        urn_list = sorted(urns)
        await self.client.delete_by_query(
            index=self.graph_index, conflicts="proceed", refresh=True,
            query={"bool": {"should": [{"terms": {"source": urn_list}}, {"terms": {"destination": urn_list}}],
                            "minimum_should_match": 1}},
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
        specs = self.filter_specs(entity_type)
        spec = specs.get(key) or next((s for s in specs.values() if s.name == key), None)
        name = spec.name if spec else key
        return self._exact_field(entity_type, name) or name

    def _text_query(self, entity_type: str, query: str) -> dict[str, Any]:
        should: list[dict[str, Any]] = []
        text_fields: list[str] = []
        for spec in self.search_specs(entity_type):
            if not spec.query_by_default:
                continue
            field = self._field_mapping(entity_type, spec.name)
            kind = field.get("type")
            if kind == "text":
                text_fields.append(f"{spec.name}^{spec.boost:g}")
            elif "text" in (field.get("fields") or {}):
                text_fields.append(f"{spec.name}.text^{spec.boost:g}")
            exact = self._exact_field(entity_type, spec.name) if kind in ("text", "keyword") else None
            if exact:
                should.append({"term": {exact: {"value": query, "boost": spec.boost * EXACT_MATCH_MULTIPLIER,
                                                "case_insensitive": True}}})
        should.append({"term": {URN_FIELD: {"value": query, "boost": 10.0 * EXACT_MATCH_MULTIPLIER}}})
        if text_fields:
            should.append({"multi_match": {"query": query, "fields": text_fields, "type": "best_fields"}})
        return {"bool": {"should": should, "minimum_should_match": 1}}

    async def search(
        self, entity_type: str, query: str, *, filters: dict[str, list[str]] | None = None, count: int = 10,
        scroll_id: str | None = None, sort: list[tuple[str, str]] | None = None,
    ) -> SearchPage:
        index = self.entity_index(entity_type)
        text = (query or "").strip()
        must = {"match_all": {}} if text in ("", "*") else self._text_query(entity_type, text)
        filter_clauses: list[dict[str, Any]] = []
        exclude_removed = True
        for key, values in (filters or {}).items():
            if key == REMOVED_FIELD:
                exclude_removed = False
            if not values:
                continue
            filter_clauses.append({"terms": {self._filter_field(entity_type, key): list(values)}})
        bool_query: dict[str, Any] = {"must": [must], "filter": filter_clauses,
                                      "must_not": [{"term": {TOMBSTONE_FIELD: True}}]}  # never a hit, never counted
        if exclude_removed:
            bool_query["must_not"].append({"term": {REMOVED_FIELD: True}})
        sort_clauses: list[dict[str, Any]] = []
        for name, order in sort or []:
            direction = "desc" if order.lower().startswith("desc") else "asc"
            if name in ("_score", "score"):
                sort_clauses.append({"_score": direction})
            else:
                field = self._exact_field(entity_type, name) or name
                sort_clauses.append({field: {"order": direction, "unmapped_type": "keyword"}})
        if not sort_clauses:
            sort_clauses.append({"_score": "desc"})
        sort_clauses.append({URN_FIELD: "asc"})
        aggs = {}
        for key, spec in self.filter_specs(entity_type).items():
            aggs[key] = {"terms": {"field": self._filter_field(entity_type, key), "size": 20}}
        body: dict[str, Any] = {
            "query": {"bool": bool_query}, "sort": sort_clauses, "size": count + 1, "track_total_hits": True,
        }
        if scroll_id:
            body["search_after"] = _decode_cursor(scroll_id)
        else:
            body["aggs"] = aggs  # facets on the first page only (they do not change while scrolling)
        response = await self.client.search(index=index, **body)
        raw = response["hits"]["hits"]
        hits = [self._hit(entity_type, h) for h in raw[:count]]
        next_id = _encode_cursor(raw[count - 1]["sort"]) if len(raw) > count and count > 0 else None
        facets: dict[str, dict[str, int]] = {}
        for key, agg in (response.get("aggregations") or {}).items():
            facets[key] = {self._bucket_key(b): b["doc_count"] for b in agg.get("buckets", [])}
        return SearchPage(hits=hits, total=response["hits"]["total"]["value"], scroll_id=next_id, facets=facets)

    @staticmethod
    def _bucket_key(bucket: dict[str, Any]) -> str:
        if "key_as_string" in bucket:
            return bucket["key_as_string"]
        key = bucket["key"]
        return str(key).lower() if isinstance(key, bool) else str(key)

    def _hit(self, entity_type: str, hit: dict[str, Any]) -> SearchHit:
        source = hit.get("_source") or {}
        fields = {k: v for k, v in source.items() if k != ASPECT_FIELDS_FIELD}
        return SearchHit(urn=source.get(URN_FIELD, hit["_id"]), entity_type=self._entity_name(entity_type),
                         score=float(hit.get("_score") or 0.0), fields=fields)

    async def autocomplete(self, entity_type: str, prefix: str, *, limit: int = 10) -> list[SearchHit]:
        text = (prefix or "").strip()
        if not text:
            return []
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
        query = {"bool": {"should": should, "minimum_should_match": 1, "must_not": [{"term": {REMOVED_FIELD: True}}, {"term": {TOMBSTONE_FIELD: True}}]}}
        response = await self.client.search(index=self.entity_index(entity_type), query=query, size=limit,
                                            sort=[{"_score": "desc"}, {URN_FIELD: "asc"}])
        return [self._hit(entity_type, h) for h in response["hits"]["hits"]]

    # --- graph ----------------------------------------------------------------------------------------------------

    async def relationships(
        self, urn: str, *, direction: Direction, types: list[str] | None = None, start: int = 0, count: int = 100,
    ) -> tuple[list[Edge], int]:
        own, other = ("source", "destination") if direction == "OUTGOING" else ("destination", "source")
        filters: list[dict[str, Any]] = [{"term": {own: urn}}]
        if types:
            filters.append({"terms": {"relationshipType": list(types)}})
        response = await self.client.search(
            index=self.graph_index, query={"bool": {"filter": filters}}, from_=start, size=count,
            sort=[{"relationshipType": "asc"}, {other: "asc"}, {"aspect": "asc"}], track_total_hits=True,
        )
        edges = [_doc_to_edge(h["_source"]) for h in response["hits"]["hits"]]
        return edges, response["hits"]["total"]["value"]

    async def lineage(
        self, urn: str, *, direction: Literal["UPSTREAM", "DOWNSTREAM"], max_hops: int = 3,
    ) -> list[tuple[Edge, int]]:
        """Breadth first over lineage edges (isLineage). UPSTREAM follows DownstreamOf-like edges outgoing (and
        Produces-like edges incoming); DOWNSTREAM the opposite. Each edge once, at the hop it is first reached."""
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
                outgoing_is_up = edge.relationship not in DOWNSTREAM_RELATIONSHIPS
                follows_outgoing = (direction == "UPSTREAM") == outgoing_is_up
                neighbour = edge.destination if follows_outgoing else edge.source
                result.append((edge, hop))
                if neighbour not in visited:
                    visited.add(neighbour)
                    next_frontier.append(neighbour)
            frontier = next_frontier
        return result

    async def _lineage_edges(self, frontier: list[str], direction: str) -> list[tuple[str, dict[str, Any]]]:
        up = sorted(DOWNSTREAM_RELATIONSHIPS)
        out: list[tuple[str, dict[str, Any]]] = []
        for start in range(0, len(frontier), 1000):
            nodes = frontier[start:start + 1000]
            # outgoing edges that point the way we go, or incoming edges of the Produces kind
            forward = {"bool": {"filter": [{"terms": {"source": nodes}}], "must_not": [{"terms": {"relationshipType": up}}]}}
            reverse = {"bool": {"filter": [{"terms": {"destination": nodes}}, {"terms": {"relationshipType": up}}]}}
            if direction == "DOWNSTREAM":
                forward = {"bool": {"filter": [{"terms": {"destination": nodes}}], "must_not": [{"terms": {"relationshipType": up}}]}}
                reverse = {"bool": {"filter": [{"terms": {"source": nodes}}, {"terms": {"relationshipType": up}}]}}
            query = {"bool": {"filter": [{"term": {"isLineage": True}}],
                              "should": [forward, reverse], "minimum_should_match": 1}}
            after: list[Any] | None = None
            while True:
                kwargs: dict[str, Any] = {"search_after": after} if after else {}
                response = await self.client.search(
                    index=self.graph_index, query=query, size=1000,
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
        self, urn: str, aspects: list[str], *, start_ms: int | None = None, end_ms: int | None = None,
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
                    index=self.timeseries_index(entity_type, aspect), query={"bool": {"filter": filters}}, refresh=True,
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
                index=index, query={"bool": {"filter": filters}}, size=max(0, min(query.limit, 10_000)),
                sort=[{"timestampMillis": "desc"}],
            )
        except NotFoundError:
            return []  # no point of this aspect was ever indexed
        points = []
        for hit in response["hits"]["hits"]:
            src = dict(hit["_source"])
            value = src.pop("event", None) or {}
            system_metadata = src.pop("systemMetadata", None)
            points.append(TimeseriesPoint(
                aspect=query.aspect, doc_id=hit["_id"], urn=src.get("urn", query.urn), entity_type=entity_type,
                timestamp_ms=int(src.get("timestampMillis")), fields=src, value=value,
                system_metadata=system_metadata,
            ))
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
