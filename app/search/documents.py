"""The index model: turns Metadata Change Logs into index changes (`app.search.model.IndexChange`).

One module for the service (sync indexing, embedded worker) and for `spark_indexer`. Pure Python, no I/O.
Everything is derived from the registry's schema annotations, following DataHub:

- ``Searchable`` (entity-registry ``SearchableAnnotation``; ``SearchDocumentTransformer``): each annotated path is
  walked in the aspect value (``*`` = every array element / map value); a field holds the scalar found, or the
  list of scalars when the path crosses an array/map. ``hasValuesFieldName`` adds a boolean,
  ``numValuesFieldName`` a count. Map values under ``/*`` are indexed as ``key=value`` (DataHub's form for
  ``customProperties``). ``BROWSE_PATH_V2`` is DataHub's ``␟``-joined path.
- ``Relationship`` (``RelationshipAnnotation``; the graph's edge extraction): one edge per URN found at the
  annotated path, with ``createdOn``/``createdActor``/``updatedOn``/``updatedActor``/``properties``/``via`` read
  from paths relative to the same array element.
- ``structuredProperties`` (``setStructuredPropertiesSearchValue``): a field per property held,
  ``structuredProperties.<id>`` (app.search.structured_properties).
- ``TimeseriesField`` (``TimeseriesAspectTransformer``): the aspect-level document of a timeseries value, with
  DataHub's document id (see :func:`timeseries_doc_id`).

Pegasus path overrides on an outer field (``SchemaField.globalTags`` rewriting ``GlobalTags.tags``' ``/*/tag``
to ``fieldTags`` / ``SchemaFieldTaggedWith``) win over the inner record's own annotation, as in Pegasus; an
override holding only ``v3`` hints does not replace the inner annotation.

What the index can hold (:class:`IndexLimits`, from the settings ``search_max_field_chars`` and
``search_max_document_chars``): the changes are the index's copy of a value, so values the backends cannot store are
made storable here, once for every backend and the Spark job (the stored aspect is never touched). NUL characters
are stripped (Postgres text and jsonb refuse them); each string of a document is cut to ``field_chars``
(keyword-typed values, whose whole value is one term, to at most :data:`KEYWORD_MAX_CHARS`: Lucene refuses terms
over 32,766 bytes); the strings of one aspect's contribution count against ``document_chars`` (fields of higher
boost first; a list stops where the budget ends). Edges whose destination URN is longer than
:data:`EDGE_URN_MAX_BYTES` are dropped (no index key holds them). Timeseries values (their only store is the index)
lose their NUL characters only. The fast path costs one substring search per change log: a value whose JSON text
has no ``\\u0000`` and is shorter than every cap cannot hold anything to clean.

Extractors are compiled once per (registry, aspect), and the field specs (:func:`search_fields`,
:func:`filter_fields`) once per (registry, entity type), cached by registry identity and generation (a runtime model
set swaps the registry's models in place): the one cache both backends read. Backend-neutral: how a backend stores
these (Elasticsearch mappings: `app.search.elastic_mappings`; Postgres tables: `app.search.postgres`) is the backend's
business.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import orjson

from app.changelog.entity_change_events import schema_field_urn
from app.registry import EntityRegistry
from app.registry.schema import AliasedUnion, Array, Enum, Map, Primitive, Record, Type, Union
from app.search import structured_properties
from app.search.model import (
    REMOVED_FIELD,
    URN_FIELD,
    VERSIONS_FIELD,
    AspectEdges,
    AspectFields,
    Edge,
    EntityRemoval,
    IndexChange,
    SearchFieldSpec,
    TimeseriesPoint,
)
from app.urns import type_of

__all__ = [
    "search_fields",
    "filter_fields",
    "timeseries_fields",
    "indexed_aspects",
    "changes_from_mcl",
    "timeseries_doc_id",
    "merge_aspect_fields",
    "BROWSE_PATH_V2_DELIMITER",
    "IndexLimits",
    "DEFAULT_LIMITS",
    "KEYWORD_MAX_CHARS",
]

BROWSE_PATH_V2_DELIMITER = "\u241f"  # DataHub's "␟"

# DataHub's SearchableAnnotation: types matched by the default query when queryByDefault is not given.
_DEFAULT_QUERY_TYPES = frozenset({"TEXT", "TEXT_PARTIAL", "WORD_GRAM", "URN", "URN_PARTIAL"})
_UPSERT_TYPES = frozenset({"UPSERT", "CREATE", "RESTATE", "PATCH", "CREATE_ENTITY", "UPDATE"})

# A keyword-typed value is one term: at most 4 bytes per character in UTF-8, so 8,191 characters stay under Lucene's
# 32,766-byte term limit (Elasticsearch refuses the whole document otherwise: "immense term").
KEYWORD_MAX_CHARS = 8_191
# Field types indexed as one keyword term (elastic_mappings: `keyword` without `ignore_above`).
_KEYWORD_TYPES = frozenset({"KEYWORD", "URN", "URN_PARTIAL", "BROWSE_PATH", "BROWSE_PATH_V2"})
# An edge's destination (or via) longer than this (UTF-8) is dropped: it is part of the edge's key (a Postgres btree
# row holds at most ~2,700 bytes) and no valid URN is this long (DataHub: 512 bytes).
EDGE_URN_MAX_BYTES = 1_024
# Keys of OBJECT-typed values become Elasticsearch field names (DataHub caps them at 255 characters): longer keys are cut.
_MAX_KEY_CHARS = 255


@dataclass(frozen=True, slots=True)
class IndexLimits:
    """How much of a value the index copy holds (the settings `search_max_field_chars`, `search_max_document_chars`)."""

    field_chars: int = 32_768  # each string of a document
    document_chars: int = 100_000  # all the strings of one aspect's contribution (every other value counts 1)
    # A value whose JSON text is at most this long (and has no NUL escape) needs no cleaning: none of its strings,
    # nor their sum, can be over a cap (derived).
    clean_below: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "clean_below", min(self.field_chars, KEYWORD_MAX_CHARS, self.document_chars))

    @classmethod
    def from_settings(cls, settings: Any) -> IndexLimits:
        return cls(
            field_chars=int(getattr(settings, "search_max_field_chars", 32_768)),
            document_chars=int(getattr(settings, "search_max_document_chars", 100_000)),
        )


DEFAULT_LIMITS = IndexLimits()


# ---------------------------------------------------------------------------------------------------------
# Compiled per-aspect specs
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _FieldExtractor:
    spec: SearchFieldSpec
    segments: tuple[str, ...]
    map_leaf: bool  # the path ends in a map's "*": values are indexed as "key=value"


@dataclass(frozen=True, slots=True)
class _EdgeExtractor:
    name: str
    segments: tuple[str, ...]
    is_lineage: bool
    created_on: tuple[str, ...] | None
    created_actor: tuple[str, ...] | None
    updated_on: tuple[str, ...] | None
    updated_actor: tuple[str, ...] | None
    properties: tuple[str, ...] | None
    via: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class _TsField:
    name: str
    segments: tuple[str, ...]
    kind: str  # "scalar" | "json"


@dataclass(frozen=True, slots=True)
class _AspectModel:
    name: str
    is_timeseries: bool
    is_key: bool
    fields: tuple[_FieldExtractor, ...]
    edges: tuple[_EdgeExtractor, ...]
    ts_fields: tuple[_TsField, ...]
    keyword_fields: frozenset[str] = frozenset()  # document fields indexed as one keyword term
    budget_order: tuple[
        str, ...
    ] = ()  # document fields by boost, highest first: the order the document budget is spent


# registry -> (its generation when the entries were made, the entries)
_CACHE: weakref.WeakKeyDictionary[Any, tuple[int, dict[Any, Any]]] = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def _registry_cache(registry: EntityRegistry) -> dict[Any, Any]:
    """The entries derived from `registry` as it is now: a registry swapped in place by a runtime model set
    (`EntityRegistry.replace_with` bumps `generation`) starts a new cache, in every process that holds one."""
    generation = registry.generation
    held = _CACHE.get(registry)
    if held is None or held[0] != generation:
        with _CACHE_LOCK:
            held = _CACHE.get(registry)
            if held is None or held[0] != generation:
                held = (generation, {})
                _CACHE[registry] = held
    return held[1]


def _split(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.strip("/").split("/") if p)


def _effective_annotations(aspect_spec: Any) -> dict[str, dict[str, Any]]:
    """Annotations per path with Pegasus override precedence: the override declared on the outermost field
    wins (an override made only of ``v3`` hints does not replace anything)."""
    best: dict[tuple[str, str], tuple[int, Any]] = {}
    for fa in aspect_spec.field_annotations:
        depth = len(_split(fa.path))
        for name, value in fa.annotations.items():
            if isinstance(value, dict) and value and all(isinstance(k, str) and k.startswith("/") for k in value):
                targets = [(fa.path + sub, v) for sub, v in value.items()]
            else:
                targets = [(fa.path, value)]
            for target, v in targets:
                if isinstance(v, dict) and v and set(v) <= {"v3"}:
                    continue  # search-v3 hints only
                key = (target, name)
                prev = best.get(key)
                if prev is None or depth < prev[0]:
                    best[key] = (depth, v)
    out: dict[str, dict[str, Any]] = {}
    for (target, name), (_, v) in best.items():
        out.setdefault(target, {})[name] = v
    return out


def type_at_path(root: Record, segments: tuple[str, ...]) -> tuple[Type | None, str | None, bool]:
    """(type at the path, the schema field name the path ends in, whether the last "*" is a map's)."""
    t: Type | None = root
    field_name: str | None = None
    map_leaf = False
    for seg in segments:
        map_leaf = False
        if t is None:
            return None, field_name, False
        if seg == "*":
            if isinstance(t, Array):
                t = t.items
            elif isinstance(t, Map):
                t = t.values
                map_leaf = True
            else:
                return None, field_name, False
            continue
        if isinstance(t, Record):
            f = next((f for f in t.fields if f.name == seg), None)
            if f is None:
                return None, field_name, False
            t, field_name = f.type, seg
        elif isinstance(t, (Union, AliasedUnion)):
            t = next((m for k, m in t.members if k == seg), None)
        else:
            return None, field_name, False
    return t, field_name, map_leaf


def _default_field_type(t: Type | None) -> str:
    # DataHub SearchableAnnotation.getDefaultFieldType: INT -> COUNT, MAP -> KEYWORD, FLOAT/DOUBLE -> DOUBLE, else TEXT
    if isinstance(t, Primitive):
        if t.kind == "int":
            return "COUNT"
        if t.kind in ("float", "double"):
            return "DOUBLE"
    if isinstance(t, Map):
        return "KEYWORD"
    return "TEXT"


def _bool(v: Any, default: bool) -> bool:
    if v is None:
        return default
    if isinstance(v, str):
        return v.strip().lower() == "true"
    return bool(v)


def _rel_segments(path: Any, dest_segments: tuple[str, ...]) -> tuple[str, ...] | None:
    if not isinstance(path, str) or not path:
        return None
    return _split(path)


def _compile_aspect(aspect_spec: Any) -> _AspectModel:
    root = aspect_spec.type
    eff = _effective_annotations(aspect_spec)
    fields: list[_FieldExtractor] = []
    edges: list[_EdgeExtractor] = []
    ts: list[_TsField] = []
    for path in sorted(eff, key=lambda p: (p.count("/"), p)):
        ann = eff[path]
        segments = _split(path)
        if any(s.startswith("$") for s in segments):
            continue  # "$key" (MAP_ARRAY on map keys): not supported
        t, schema_field, map_leaf = type_at_path(root, segments)
        s = ann.get("Searchable")
        if isinstance(s, dict):
            ftype = s.get("fieldType") or _default_field_type(t)
            if ftype == "MAP_ARRAY":
                pass
            else:
                name = s.get("fieldName") or schema_field or segments[-1]
                spec = SearchFieldSpec(
                    name=name,
                    field_type=ftype,
                    aspect=aspect_spec.name,
                    boost=float(s.get("boostScore", 1.0)),
                    add_to_filters=_bool(s.get("addToFilters"), False),
                    filter_name=s.get("filterNameOverride") or None,
                    autocomplete=_bool(s.get("enableAutocomplete"), False),
                    query_by_default=_bool(s.get("queryByDefault"), ftype in _DEFAULT_QUERY_TYPES),
                    has_values_field=s.get("hasValuesFieldName") or None,
                    num_values_field=s.get("numValuesFieldName") or None,
                )
                fields.append(_FieldExtractor(spec, segments, map_leaf and ftype != "OBJECT"))
        r = ann.get("Relationship")
        if isinstance(r, dict) and r.get("name"):
            edges.append(
                _EdgeExtractor(
                    name=r["name"],
                    segments=segments,
                    is_lineage=_bool(r.get("isLineage"), False),
                    created_on=_rel_segments(r.get("createdOn"), segments),
                    created_actor=_rel_segments(r.get("createdActor"), segments),
                    updated_on=_rel_segments(r.get("updatedOn"), segments),
                    updated_actor=_rel_segments(r.get("updatedActor"), segments),
                    properties=_rel_segments(r.get("properties"), segments),
                    via=_rel_segments(r.get("via"), segments),
                )
            )
        if aspect_spec.is_timeseries and isinstance(ann.get("TimeseriesField"), dict) and "*" not in segments:
            kind = "scalar" if isinstance(t, (Primitive, Enum)) else "json"
            ts.append(_TsField(schema_field or segments[-1], segments, kind))
    keyword_fields = frozenset(fx.spec.name for fx in fields if fx.spec.field_type in _KEYWORD_TYPES)
    by_boost = sorted(range(len(fields)), key=lambda i: (-fields[i].spec.boost, i))
    budget_order = tuple(dict.fromkeys(fields[i].spec.name for i in by_boost))
    return _AspectModel(
        aspect_spec.name,
        bool(aspect_spec.is_timeseries),
        bool(aspect_spec.is_key),
        tuple(fields),
        tuple(edges),
        tuple(ts),
        keyword_fields,
        budget_order,
    )


def _aspect_model(registry: EntityRegistry, aspect: str) -> _AspectModel | None:
    cache = _registry_cache(registry)
    key = ("aspect", aspect)
    m = cache.get(key, _MISSING)
    if m is _MISSING:
        spec = registry.aspects.get(aspect)
        m = _compile_aspect(spec) if spec is not None else None
        cache[key] = m
    return m


_MISSING = object()


# ---------------------------------------------------------------------------------------------------------
# Value walking
# ---------------------------------------------------------------------------------------------------------


def _walk(
    value: Any, segments: tuple[str, ...], i: int, idx: tuple[Any, ...]
) -> Iterator[tuple[Any, tuple[Any, ...], Any]]:
    """Yield (leaf, indices of each "*" crossed, map key of the last "*" or None)."""
    n = len(segments)
    while i < n:
        if value is None:
            return
        seg = segments[i]
        if seg == "*":
            if isinstance(value, list):
                for j, v in enumerate(value):
                    yield from _walk(v, segments, i + 1, idx + (j,))
            elif isinstance(value, dict):
                for k, v in value.items():
                    if i + 1 == n:
                        yield v, idx + (k,), k
                    else:
                        yield from _walk(v, segments, i + 1, idx + (k,))
            return
        if not isinstance(value, dict):
            return
        value = value.get(seg)
        i += 1
    if value is not None:
        yield value, idx, None


def _get_at(value: Any, segments: tuple[str, ...], idx: tuple[Any, ...]) -> Any:
    """Value at a path whose "*" are bound, in order, to ``idx`` (the element of the edge's destination)."""
    k = 0
    for seg in segments:
        if value is None:
            return None
        if seg == "*":
            if k >= len(idx):
                return None
            key = idx[k]
            k += 1
            if isinstance(value, list) and isinstance(key, int) and 0 <= key < len(value):
                value = value[key]
            elif isinstance(value, dict):
                value = value.get(key)
            else:
                return None
        elif isinstance(value, dict):
            value = value.get(seg)
        else:
            return None
    return value


def _scalar(v: Any) -> Any:
    if isinstance(v, (dict, list)):
        return orjson.dumps(v).decode()
    return v


def _extend_unique(target: list[Any], items: list[Any]) -> list[Any]:
    """Append the items not in `target` yet, in order: linear for hashable items (a list of 100,000 field paths must not
    cost 10^10 comparisons), pairwise only for unhashable ones (OBJECT values)."""
    seen: set[Any] = set()
    unhashable: list[Any] = []
    for x in target:
        try:
            seen.add(x)
        except TypeError:
            unhashable.append(x)
    for x in items:
        try:
            if x in seen:
                continue
            seen.add(x)
        except TypeError:
            if x in unhashable:
                continue
            unhashable.append(x)
        target.append(x)
    return target


def _extract_fields(model: _AspectModel, value: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fx in model.fields:
        spec = fx.spec
        many = "*" in fx.segments
        found: list[Any] = []
        for leaf, _idx, mkey in _walk(value, fx.segments, 0, ()):
            if fx.map_leaf and mkey is not None:
                found.append(f"{mkey}={leaf}")
            elif isinstance(leaf, list) and spec.field_type != "OBJECT":
                found.extend(_scalar(x) for x in leaf if x is not None)
                many = True
            elif spec.field_type == "OBJECT" or not isinstance(leaf, dict):
                found.append(leaf if spec.field_type == "OBJECT" else _scalar(leaf))
            else:
                found.append(_scalar(leaf))
        name = spec.name
        if spec.field_type == "BROWSE_PATH_V2":
            ids = [str(x) for x in found]
            found = [BROWSE_PATH_V2_DELIMITER + BROWSE_PATH_V2_DELIMITER.join(ids)] if ids else []
            many = False
        if found:
            if many:
                prev = out.get(name)
                if isinstance(prev, list):
                    _extend_unique(prev, found)
                elif prev is not None:
                    out[name] = _extend_unique([prev], found)
                else:
                    out[name] = _extend_unique([], found)
            elif name not in out:
                out[name] = found[0]
        if spec.has_values_field:
            out[spec.has_values_field] = bool(out.get(spec.has_values_field)) or bool(found)
        if spec.num_values_field:
            out[spec.num_values_field] = int(out.get(spec.num_values_field) or 0) + len(found)
    return out


def _as_int(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _extract_edges(model: _AspectModel, urn: str, entity_type: str, value: dict[str, Any]) -> tuple[Edge, ...]:
    out: list[Edge] = []
    seen: set[tuple[str, str, str | None]] = set()
    for ex in model.edges:
        for leaf, idx, _ in _walk(value, ex.segments, 0, ()):
            dests = leaf if isinstance(leaf, list) else [leaf]
            for dest in dests:
                if not isinstance(dest, str) or not dest:
                    continue
                via = _get_at(value, ex.via, idx) if ex.via else None
                via = via if isinstance(via, str) else None
                key = (dest, ex.name, via)
                if key in seen:
                    continue
                seen.add(key)
                props = _get_at(value, ex.properties, idx) if ex.properties else None
                ca = _get_at(value, ex.created_actor, idx) if ex.created_actor else None
                ua = _get_at(value, ex.updated_actor, idx) if ex.updated_actor else None
                out.append(
                    Edge(
                        source=urn,
                        destination=dest,
                        relationship=ex.name,
                        source_type=entity_type,
                        destination_type=type_of(dest),
                        via=via,
                        created_on=_as_int(_get_at(value, ex.created_on, idx)) if ex.created_on else None,
                        created_actor=ca if isinstance(ca, str) else None,
                        updated_on=_as_int(_get_at(value, ex.updated_on, idx)) if ex.updated_on else None,
                        updated_actor=ua if isinstance(ua, str) else None,
                        properties=dict(props) if isinstance(props, dict) else {},
                        is_lineage=ex.is_lineage,
                    )
                )
    return tuple(out)


# Column-level lineage (DataHub's GraphIndexUtils): the `@Relationship` annotations link an aspect's entity to others
# only, so DataHub adds, by hand, `DownstreamOf` edges between schema fields from three aspects: a dataset's
# `upstreamLineage.fineGrainedLineages` and a job's `dataJobInputOutput.fineGrainedLineages` (each downstream field
# DownstreamOf each upstream field of an entry; `via` the job, or the entry's query) and a chart's `inputFields` (the
# chart's own field DownstreamOf the field it reads). The edges' source is a schema field, not the aspect's entity:
# the aspect's entity owns them (DataHub's lifecycleOwner), so they are part of its edge set, replaced and removed
# with it (the backends key them by that owner as well: app.search.model.edge_set_aspect).
FIELD_LINEAGE_ASPECTS = frozenset({"upstreamLineage", "dataJobInputOutput", "inputFields"})
_SCHEMA_FIELD = "schemaField"


def _field_edge(source: Any, destination: Any, via: Any) -> Edge | None:
    source = _edge_urn(source) if isinstance(source, str) else None
    destination = _edge_urn(destination) if isinstance(destination, str) else None
    if not source or not destination or source == destination:
        return None  # a field is not its own upstream (DataHub would store the loop; a walk never follows it)
    if type_of(source) != _SCHEMA_FIELD or type_of(destination) != _SCHEMA_FIELD:
        return None  # DataHub's lineage registry walks a schema field's DownstreamOf edges to schema fields only
    return Edge(
        source=source,
        destination=destination,
        relationship="DownstreamOf",
        source_type=type_of(source),
        destination_type=type_of(destination),
        via=_edge_urn(via) if isinstance(via, str) else None,
        is_lineage=True,
    )


def field_lineage_edges(aspect: str, urn: str, entity_type: str, value: dict[str, Any]) -> tuple[Edge, ...]:
    """The schema-field lineage edges an aspect value declares (none for any other aspect), each once."""
    if aspect not in FIELD_LINEAGE_ASPECTS:
        return ()
    found: dict[tuple[str, str], Edge] = {}

    def add(edge: Edge | None) -> None:
        # the edge's key holds its owner as well (app.search.model.edge_set_aspect): beyond this, no index key holds it
        if edge is not None and len(f"{edge.source}{edge.destination}{urn}".encode()) <= 2 * EDGE_URN_MAX_BYTES:
            found.setdefault((edge.source, edge.destination), edge)

    if aspect == "inputFields":
        for item in value.get("fields") or ():
            if not isinstance(item, dict):
                continue
            schema_field = item.get("schemaField")
            field_path = schema_field.get("fieldPath") if isinstance(schema_field, dict) else None
            if isinstance(field_path, str) and field_path:
                add(_field_edge(schema_field_urn(urn, field_path), item.get("schemaFieldUrn"), None))
        return tuple(found.values())
    for entry in value.get("fineGrainedLineages") or ():
        if not isinstance(entry, dict):
            continue
        # DataHub stops at the first entry without downstreams or upstreams (a `break`); every other entry counts here
        upstreams, downstreams = entry.get("upstreams") or (), entry.get("downstreams") or ()
        via = urn if entity_type == "dataJob" else entry.get("query")
        for downstream in downstreams if isinstance(downstreams, list) else ():
            for upstream in upstreams if isinstance(upstreams, list) else ():
                add(_field_edge(downstream, upstream, via))
    return tuple(found.values())


# ---------------------------------------------------------------------------------------------------------
# Timeseries document id (DataHub TimeseriesAspectTransformer.getDocId)
# ---------------------------------------------------------------------------------------------------------


def _java_string_hash(s: str) -> int:
    b = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(b), 2):
        h = (31 * h + ((b[i] << 8) | b[i + 1])) & 0xFFFFFFFF
    return h


def _java_hashmap_order(d: dict[str, Any]) -> list[str]:
    """Key order of a java.util.HashMap (as a Pegasus DataMap) holding ``d``, inserted in ``d``'s order."""
    n = 16
    while len(d) > n * 0.75:
        n *= 2
    keyed = []
    for pos, k in enumerate(d):
        h = _java_string_hash(k)
        h ^= h >> 16
        keyed.append(((h & (n - 1)), pos, k))
    keyed.sort()
    return [k for _, _, k in keyed]


def _java_json(v: Any) -> str:
    """Jackson's writeValueAsString of a Pegasus DataMap/DataList (HashMap key order, compact)."""
    if isinstance(v, dict):
        return "{" + ",".join(_json_str(k) + ":" + _java_json(v[k]) for k in _java_hashmap_order(v)) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_java_json(x) for x in v) + "]"
    return orjson.dumps(v).decode() if not isinstance(v, str) else _json_str(v)


def _json_str(s: str) -> str:
    return orjson.dumps(s).decode()


def _ts_common(urn: str, value: dict[str, Any]) -> dict[str, Any]:
    """The common part of DataHub's timeseries document (urn, timestampMillis, eventGranularity as JSON text,
    partitionSpec, messageId)."""
    ts = value.get("timestampMillis")
    if ts is None:
        raise ValueError("timeseries aspect without timestampMillis")
    doc: dict[str, Any] = {"urn": urn, "timestampMillis": int(ts)}
    eg = value.get("eventGranularity")
    if eg is not None:
        doc["eventGranularity"] = _java_json(eg)
    ps = value.get("partitionSpec")
    if isinstance(ps, dict):
        partition, time_partition = ps.get("partition"), ps.get("timePartition")
        if partition is not None and time_partition is not None:
            raise ValueError("Both partition and timePartition cannot be specified in partitionSpec")
        if partition is not None:
            doc["partitionSpec"] = {"partition": str(partition)}
        elif time_partition is not None:
            doc["partitionSpec"] = {"timePartition": _java_json(time_partition)}
    mid = value.get("messageId")
    if mid is not None:
        doc["messageId"] = str(mid)
    return doc


def _doc_id_from_common(doc: dict[str, Any], collection_id: str | None = None) -> str:
    s = str(doc["timestampMillis"])
    if "eventGranularity" in doc:
        s += _json_str(doc["eventGranularity"])  # a text node: its toString() is the quoted JSON string
    s += _json_str(doc["urn"])
    if collection_id is not None:
        s += collection_id
    if "messageId" in doc:
        s += _json_str(doc["messageId"])
    ps = doc.get("partitionSpec")
    if ps is not None:
        ((k, v),) = ps.items()
        s += "{" + _json_str(k) + ":" + _json_str(v) + "}"
    return hashlib.md5(s.encode("utf-8")).hexdigest()


def timeseries_doc_id(urn: str, value: dict) -> str:
    """DataHub's id of the aspect-level timeseries document: md5 hex (DataHub's default ``ELASTIC_ID_HASH_ALGO``)
    of ``timestampMillis`` + JSON(eventGranularity text) + JSON(urn) + JSON(messageId) + partitionSpec object,
    each part only when present (``TimeseriesAspectTransformer.getDocId``)."""
    return _doc_id_from_common(_ts_common(urn, value))


# ---------------------------------------------------------------------------------------------------------
# Index limits: what the backends cannot hold is made storable (module docstring)
# ---------------------------------------------------------------------------------------------------------


class _Budget:
    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


def _bounded(value: Any, cap: int, budget: _Budget) -> Any:
    """`value` with NUL stripped from every string (and key), each string cut to `cap` characters and to what is left
    of `budget`; a list or object stops where the budget ends. Non-strings count 1."""
    if isinstance(value, str):
        if "\x00" in value:
            value = value.replace("\x00", "")
        limit = cap if cap < budget.left else max(budget.left, 0)
        if len(value) > limit:
            value = value[:limit]
        budget.left -= max(len(value), 1)
        return value
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            if budget.left <= 0:
                break
            out.append(_bounded(item, cap, budget))
        return out
    if isinstance(value, dict):
        obj: dict[str, Any] = {}
        for key, item in value.items():
            if budget.left <= 0:
                break
            if isinstance(key, str):
                key = key.replace("\x00", "")[:_MAX_KEY_CHARS] if "\x00" in key or len(key) > _MAX_KEY_CHARS else key
                budget.left -= len(key)
            obj[key] = _bounded(item, cap, budget)
        return obj
    budget.left -= 1
    return value


def _bounded_fields(model: _AspectModel, fields: dict[str, Any], limits: IndexLimits) -> dict[str, Any]:
    """An aspect's document fields within the limits, the budget spent on fields of higher boost first (then the
    others: the urn, has/num values, ...). The key order stays as extracted."""
    budget = _Budget(limits.document_chars)
    keyword_cap = min(limits.field_chars, KEYWORD_MAX_CHARS)
    bounded: dict[str, Any] = {}
    for name in (*(n for n in model.budget_order if n in fields), *(n for n in fields if n not in model.budget_order)):
        if name in bounded:
            continue
        cap = keyword_cap if name in model.keyword_fields else limits.field_chars
        bounded[name] = _bounded(fields[name], cap, budget)
    return {name: bounded[name] for name in fields}


def _without_nul(value: Any) -> Any:
    """`value` with NUL stripped from every string and key (nothing cut)."""
    if isinstance(value, str):
        return value.replace("\x00", "") if "\x00" in value else value
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    if isinstance(value, dict):
        return {(k.replace("\x00", "") if isinstance(k, str) else k): _without_nul(v) for k, v in value.items()}
    return value


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    if isinstance(value, dict):
        return any((isinstance(k, str) and "\x00" in k) or _has_nul(v) for k, v in value.items())
    return False


def _edge_urn(value: str | None) -> str | None:
    """An edge's URN as the index holds it: NUL stripped; None when it is too long to be a key."""
    if value is None:
        return None
    if "\x00" in value:
        value = value.replace("\x00", "")
    if len(value) > EDGE_URN_MAX_BYTES // 4 and len(value.encode("utf-8", "surrogatepass")) > EDGE_URN_MAX_BYTES:
        return None
    return value


def _bounded_edges(edges: tuple[Edge, ...]) -> tuple[Edge, ...]:
    out: list[Edge] = []
    for edge in edges:
        destination = _edge_urn(edge.destination)
        if not destination:
            continue  # not a URN any index can key an edge on
        out.append(
            dataclasses.replace(
                edge,
                destination=destination,
                destination_type=type_of(destination),
                via=_edge_urn(edge.via),
                created_actor=_edge_urn(edge.created_actor),
                updated_actor=_edge_urn(edge.updated_actor),
                properties=_without_nul(edge.properties),
            )
        )
    return tuple(out)


def _json_text_is_clean(text: str | bytes, limits: IndexLimits) -> bool:
    """Whether an aspect value's JSON text certainly holds nothing to clean: no NUL escape (raw control characters
    are not valid JSON) and short enough that no string of it, nor their sum, reaches a cap."""
    if len(text) > limits.clean_below:
        return False
    return "\\u0000" not in text if isinstance(text, str) else b"\\u0000" not in text


# ---------------------------------------------------------------------------------------------------------
# Changes from a change log
# ---------------------------------------------------------------------------------------------------------


def _aspect_value(container: Any, limits: IndexLimits = DEFAULT_LIMITS) -> tuple[dict[str, Any] | None, bool]:
    """(the aspect value, whether it certainly needs no cleaning: see `_json_text_is_clean`; a value that is not JSON
    text is walked)."""
    if not isinstance(container, dict):
        return None, True
    v = container.get("value")
    clean = False
    if isinstance(v, (str, bytes)):
        clean = _json_text_is_clean(v, limits)
        v = orjson.loads(v)
    return (v, clean) if isinstance(v, dict) else (None, True)


def _version_of(sm: Any) -> int | None:
    if isinstance(sm, dict):
        return _as_int(sm.get("version"))
    return None


def changes_from_mcl(mcl: dict, registry, limits: IndexLimits = DEFAULT_LIMITS) -> list[IndexChange]:
    """The index changes of one change log: [] for aspects/entities with nothing to index. Values are the index's
    copy, within `limits` (NUL stripped, strings capped: module docstring)."""
    entity_type = mcl.get("entityType")
    urn = mcl.get("entityUrn")
    aspect = mcl.get("aspectName")
    if not entity_type or not urn or not aspect:
        return []
    espec = registry.entities.get(entity_type)
    if espec is None:
        try:
            espec = registry.entity(entity_type)
        except Exception:
            return []
        entity_type = espec.name
    if aspect not in espec.aspect_names:
        return []
    model = _aspect_model(registry, aspect)
    if model is None:
        return []
    change_type = (mcl.get("changeType") or "UPSERT").upper()

    if model.is_timeseries:
        if change_type == "DELETE":
            return []
        value, clean = _aspect_value(mcl.get("aspect"), limits)
        if value is None or value.get("timestampMillis") is None:
            return []
        ts = int(value["timestampMillis"])
        sm = mcl.get("systemMetadata") if isinstance(mcl.get("systemMetadata"), dict) else None
        if sm is not None and _has_nul(sm):
            sm, clean = _without_nul(sm), False
        common = _ts_common(urn, value)
        fields = dict(common)
        fields["timestampMillis"] = ts
        fields["isExploded"] = False
        if sm and sm.get("runId"):
            fields["runId"] = sm["runId"]
        for tf in model.ts_fields:
            v = _get_at(value, tf.segments, ())
            if v is not None:
                fields[tf.name] = v if tf.kind == "scalar" else _java_json(v)
        doc_id = _doc_id_from_common(common)  # of the value as sent (DataHub's id)
        searchable = _extract_fields(model, value) if model.fields else None
        if not clean:  # the point's fields are keyword terms; its value loses NUL only (the index is its only store)
            fields = _bounded(fields, min(limits.field_chars, KEYWORD_MAX_CHARS), _Budget(limits.document_chars))
            value = _without_nul(value)
            if searchable is not None:
                searchable = _bounded_fields(model, searchable, limits)
        out: list[IndexChange] = [
            TimeseriesPoint(
                aspect=aspect,
                doc_id=doc_id,
                urn=urn,
                entity_type=entity_type,
                timestamp_ms=ts,
                fields=fields,
                value=value,
                system_metadata=sm,
            )
        ]
        if (
            searchable is not None
        ):  # Searchable fields of a timeseries aspect: the latest point feeds the entity document
            out.append(AspectFields(entity_type, urn, aspect, ts, searchable))
        return out

    if change_type == "DELETE":
        version = _version_of(mcl.get("previousSystemMetadata"))
        if version is None:
            version = _version_of(mcl.get("systemMetadata")) or 0
        if model.is_key or aspect == espec.key_aspect:
            return [EntityRemoval(entity_type, urn, version, espec.key_aspect)]
        out = [AspectFields(entity_type, urn, aspect, version, {}, deleted=True)]
        if model.edges:
            out.append(AspectEdges(urn, aspect, version, ()))
        return out

    if change_type not in _UPSERT_TYPES:
        return []
    holds_properties = aspect == structured_properties.STRUCTURED_PROPERTIES_ASPECT
    if not model.fields and not model.edges and not model.is_key and not holds_properties:
        return []
    value, clean = _aspect_value(mcl.get("aspect"), limits)
    if value is None:
        return []
    version = _version_of(mcl.get("systemMetadata")) or 0
    fields = _extract_fields(model, value)
    if holds_properties:
        fields.update(structured_properties.document_fields(value))
    if model.is_key or aspect == espec.key_aspect:
        fields[URN_FIELD] = urn
        p = value.get("platform")
        if "platform" not in fields and isinstance(p, str) and p.startswith("urn:li:dataPlatform:"):
            fields["platform"] = p
    if not clean:
        fields = _bounded_fields(model, fields, limits)
    out = [AspectFields(entity_type, urn, aspect, version, fields)]
    if model.edges:
        edges = _extract_edges(model, urn, entity_type, value)
        edges = edges if clean else _bounded_edges(edges)
        out.append(AspectEdges(urn, aspect, version, edges + field_lineage_edges(aspect, urn, entity_type, value)))
    return out


def merge_aspect_fields(
    per_aspect: dict[str, dict[str, Any]], versions: dict[str, int] | None = None
) -> dict[str, Any]:
    """One entity document from the fields each aspect contributes (for backends that store whole documents).
    The same field from several aspects (``hasDescription``, ``tags``, ...) is merged: lists are unioned,
    booleans OR-ed, counts of ``num*`` fields summed; otherwise the first aspect in key order wins."""
    doc: dict[str, Any] = {}
    for aspect in sorted(per_aspect):
        for k, v in per_aspect[aspect].items():
            if k not in doc:
                doc[k] = list(v) if isinstance(v, list) else v
                continue
            prev = doc[k]
            if isinstance(prev, bool) and isinstance(v, bool):
                doc[k] = prev or v
            elif isinstance(prev, list) or isinstance(v, list):
                merged = prev if isinstance(prev, list) else [prev]
                doc[k] = _extend_unique(merged, v if isinstance(v, list) else [v])
            elif k.startswith("num") and isinstance(prev, int) and isinstance(v, int):
                doc[k] = prev + v
    doc.setdefault(REMOVED_FIELD, False)
    if versions is not None:
        doc[VERSIONS_FIELD] = dict(versions)
    return doc


# ---------------------------------------------------------------------------------------------------------
# Field specs (one cache per registry, shared by both backends)
# ---------------------------------------------------------------------------------------------------------


def search_fields(registry, entity_type: str) -> tuple[SearchFieldSpec, ...]:
    """Every searchable field of an entity's document (key aspect first), one spec per field name: when several
    aspects declare the same name the first type is kept and the flags are combined (max boost, any filter /
    autocomplete / default query). Computed once per (registry, entity type); the result is shared, immutable."""
    cache = _registry_cache(registry)
    key = ("fields", entity_type)
    got = cache.get(key)
    if got is not None:
        return got
    espec = registry.entity(entity_type)
    order = list(espec.aspects_in_order) or [espec.key_aspect] + sorted(
        a for a in espec.aspect_names if a != espec.key_aspect
    )
    by_name: dict[str, SearchFieldSpec] = {}
    for aspect in order:
        model = _aspect_model(registry, aspect)
        if model is None:
            continue
        for fx in model.fields:
            s = fx.spec
            prev = by_name.get(s.name)
            if prev is None:
                by_name[s.name] = s
            else:
                by_name[s.name] = SearchFieldSpec(
                    name=prev.name,
                    field_type=prev.field_type,
                    aspect=prev.aspect,
                    boost=max(prev.boost, s.boost),
                    add_to_filters=prev.add_to_filters or s.add_to_filters,
                    filter_name=prev.filter_name or s.filter_name,
                    autocomplete=prev.autocomplete or s.autocomplete,
                    query_by_default=prev.query_by_default or s.query_by_default,
                    has_values_field=prev.has_values_field or s.has_values_field,
                    num_values_field=prev.num_values_field or s.num_values_field,
                )
    result = tuple(by_name.values())
    cache[key] = result
    return result


def filter_fields(registry, entity_type: str) -> Mapping[str, SearchFieldSpec]:
    """Filter name (the document field name) -> spec, for the ``addToFilters`` fields (cached and shared like
    :func:`search_fields`: read-only)."""
    cache = _registry_cache(registry)
    key = ("filters", entity_type)
    got = cache.get(key)
    if got is None:
        got = MappingProxyType({s.name: s for s in search_fields(registry, entity_type) if s.add_to_filters})
        cache[key] = got
    return got


def indexed_aspects(registry, entity_type: str) -> tuple[frozenset[str], frozenset[str]]:
    """(the aspects of an entity type whose latest value goes into its document: Searchable fields, Relationship
    annotations or the key aspect; those of them that also declare edges). Timeseries aspects are not in either."""
    spec = registry.entity(entity_type)
    doc_aspects: set[str] = set()
    edge_aspects: set[str] = set()
    for aspect in spec.aspect_names:
        model = _aspect_model(registry, aspect)
        if model is None or model.is_timeseries:
            continue
        if (
            model.fields
            or model.edges
            or model.is_key
            or aspect in (spec.key_aspect, structured_properties.STRUCTURED_PROPERTIES_ASPECT)
        ):
            doc_aspects.add(aspect)
        if model.edges:
            edge_aspects.add(aspect)
    return frozenset(doc_aspects), frozenset(edge_aspects)


def timeseries_fields(registry, aspect: str) -> list[tuple[str, str, Type | None]]:
    """The ``TimeseriesField`` fields of a timeseries aspect's documents: (field name, ``"scalar"`` (the value as
    is) or ``"json"`` (JSON text), the schema type at its path), in annotation order."""
    spec = registry.aspect_spec(aspect)
    model = _aspect_model(registry, aspect)
    if model is None:
        return []
    return [(tf.name, tf.kind, type_at_path(spec.type, tf.segments)[0]) for tf in model.ts_fields]
