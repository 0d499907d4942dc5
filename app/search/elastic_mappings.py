"""What the Elasticsearch/OpenSearch indices look like: DataHub's index names and mappings, and the fields the
backend (`app.search.elastic.ElasticBackend`) adds to them.

* `index_mapping` / `timeseries_mapping`: DataHub's mappings of an entity index (from the registry's `Searchable`
  fields, `app.search.documents.search_fields`) and of a timeseries aspect's index (its `TimeseriesField` fields);
* `entity_index_body` / `timeseries_index_body`: what the backend creates, i.e. those plus its own fields (urn,
  removed, tombstone, per-aspect versions and fields, a `keyword` subfield on text search fields);
* `EDGE_MAPPING`, `EDGE_SET_MAPPING`: the graph's edge index and edge-set (marker) index;
* `mapping_hash`: the digest in a concrete index's name (`<alias>_<digest>`), so a changed mapping is a new index.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import orjson

from app.registry.schema import Primitive, Type
from app.search import documents
from app.search.model import REMOVED_FIELD, TOMBSTONE_FIELD, URN_FIELD, VERSIONS_FIELD, SearchFieldSpec
from app.search.structured_properties import FIELD_PREFIX, STRUCTURED_PROPERTIES_ASPECT

ASPECT_FIELDS_FIELD = "aspectFields"  # aspect -> the fields it contributed (not indexed; the merge input)
_TEXT_TYPES = frozenset({"TEXT", "TEXT_PARTIAL", "WORD_GRAM"})

EDGE_MAPPING: dict[str, Any] = {
    "dynamic": False,
    "properties": {
        "source": {"type": "keyword"},
        "destination": {"type": "keyword"},
        "relationshipType": {"type": "keyword"},
        "sourceType": {"type": "keyword"},
        "destinationType": {"type": "keyword"},
        "via": {"type": "keyword"},
        "createdOn": {"type": "date", "format": "epoch_millis"},
        "createdActor": {"type": "keyword"},
        "updatedOn": {"type": "date", "format": "epoch_millis"},
        "updatedActor": {"type": "keyword"},
        "properties": {"type": "object", "enabled": False},
        "aspect": {"type": "keyword"},
        "version": {"type": "long"},
        "isLineage": {"type": "boolean"},
    },
}
EDGE_SET_MAPPING: dict[str, Any] = {
    "dynamic": False,
    "properties": {
        "source": {"type": "keyword"},
        "aspect": {"type": "keyword"},
        "version": {"type": "long"},
        "edges": {"type": "object", "enabled": False},  # the full edge documents, keyed by edge id
    },
}


def mapping_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]


# --- index names (DataHub's) --------------------------------------------------------------------------------------


def index_name(prefix: str, entity_type: str) -> str:
    """DataHub's entity index name: ``{prefix}{entity}index_v2`` (lower-cased entity name)."""
    return f"{prefix}{entity_type.lower()}index_v2"


def timeseries_index_name(prefix: str, entity_type: str, aspect: str) -> str:
    """DataHub's timeseries index name: ``{prefix}{entity}_{aspect}aspect_v1`` (lower-cased)."""
    return f"{prefix}{entity_type.lower()}_{aspect.lower()}aspect_v1"


# --- DataHub's mappings -------------------------------------------------------------------------------------------


def _field_mapping(spec: SearchFieldSpec) -> dict[str, Any]:
    t = spec.field_type
    if t in _TEXT_TYPES:
        m: dict[str, Any] = {
            "type": "text",
            "fields": {"keyword": {"type": "keyword", "ignore_above": 256}},
        }
        if spec.autocomplete:
            m["fields"]["ngram"] = {"type": "search_as_you_type"}
        return m
    if t == "URN":
        m = {"type": "keyword", "fields": {"text": {"type": "text"}}}
        if spec.autocomplete:
            m["fields"]["ngram"] = {"type": "search_as_you_type"}
        return m
    if t == "URN_PARTIAL":
        return {"type": "keyword", "fields": {"text": {"type": "text"}, "ngram": {"type": "search_as_you_type"}}}
    if t == "BOOLEAN":
        return {"type": "boolean"}
    if t == "COUNT":
        return {"type": "long"}
    if t == "DATETIME":
        return {"type": "date", "format": "epoch_millis"}
    if t == "DOUBLE":
        return {"type": "double"}
    if t in ("OBJECT", "MAP_ARRAY"):
        return {"type": "object", "dynamic": True}
    if t in ("BROWSE_PATH", "BROWSE_PATH_V2"):
        return {"type": "keyword", "fields": {"text": {"type": "text"}}}
    # KEYWORD and anything unknown
    m = {"type": "keyword"}
    if spec.autocomplete:
        m["fields"] = {"ngram": {"type": "search_as_you_type"}}
    return m


def index_mapping(registry, entity_type: str) -> dict:
    """Elasticsearch/OpenSearch mapping of the entity index: ``{"properties": {...}}``."""
    props: dict[str, Any] = {
        URN_FIELD: {"type": "keyword"},
        REMOVED_FIELD: {"type": "boolean"},
        VERSIONS_FIELD: {"type": "object", "dynamic": True},
    }
    for spec in documents.search_fields(registry, entity_type):
        if spec.name not in (URN_FIELD, REMOVED_FIELD):
            props[spec.name] = _field_mapping(spec)
        if spec.has_values_field and spec.has_values_field not in props:
            props[spec.has_values_field] = {"type": "boolean"}
        if spec.num_values_field and spec.num_values_field not in props:
            props[spec.num_values_field] = {"type": "long"}
    mapping: dict[str, Any] = {"dynamic": True, "properties": props}
    if STRUCTURED_PROPERTIES_ASPECT in registry.entity(entity_type).aspect_names:
        # DataHub's dynamic object of structured property values (app.search.structured_properties): a string is one
        # keyword (a date too: no date detection), a number a double, whatever the first value seen was
        props[STRUCTURED_PROPERTIES_ASPECT] = {"type": "object", "dynamic": True}
        mapping["dynamic_templates"] = [
            {
                f"structured_property_{kind}": {
                    "path_match": f"{FIELD_PREFIX}*",
                    "match_mapping_type": kind,
                    "mapping": {"type": "double" if kind in ("long", "double") else "keyword"},
                }
            }
            for kind in ("string", "date", "long", "double")
        ]
    return mapping


def _ts_type_mapping(t: Type | None) -> dict[str, Any]:
    if isinstance(t, Primitive):
        if t.kind in ("int", "long"):
            return {"type": "long"}
        if t.kind in ("float", "double"):
            return {"type": "double"}
        if t.kind == "boolean":
            return {"type": "boolean"}
    return {"type": "keyword"}


def timeseries_mapping(registry, aspect: str) -> dict:
    """Mapping of a timeseries aspect's index (DataHub's timeseries MappingsBuilder, aspect-level documents)."""
    props: dict[str, Any] = {
        "urn": {"type": "keyword"},
        "timestampMillis": {"type": "date", "format": "epoch_millis"},
        "eventGranularity": {"type": "keyword"},
        "partitionSpec": {"properties": {"partition": {"type": "keyword"}, "timePartition": {"type": "keyword"}}},
        "messageId": {"type": "keyword"},
        "runId": {"type": "keyword"},
        "isExploded": {"type": "boolean"},
        "event": {"type": "object", "enabled": False},
        "systemMetadata": {"type": "object", "enabled": False},
    }
    for name, kind, schema_type in documents.timeseries_fields(registry, aspect):
        if name not in props:
            props[name] = _ts_type_mapping(schema_type) if kind == "scalar" else {"type": "keyword"}
    return {"properties": props}


# --- what the backend creates -------------------------------------------------------------------------------------


def _split_index_body(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """`index_mapping` may give a bare mapping or a create-index body ({"mappings": ..., "settings": ...})."""
    if "mappings" in body or "settings" in body:
        return copy.deepcopy(body.get("mappings") or {}), copy.deepcopy(body.get("settings")) or None
    return copy.deepcopy(body), None


def _entity_mapping(base: dict[str, Any], specs: tuple[SearchFieldSpec, ...]) -> dict[str, Any]:
    """DataHub's mapping plus the fields the backend relies on: urn, removed, the per-aspect versions and field
    names, and a `keyword` subfield on text search fields (exact-value matches, sorting, filters)."""
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


def entity_index_body(registry, entity_type: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(mapping, index settings or None) of an entity index (`entity_type`: the registry's name)."""
    base, index_settings = _split_index_body(index_mapping(registry, entity_type))
    return _entity_mapping(base, documents.search_fields(registry, entity_type)), index_settings


def timeseries_index_body(registry, aspect: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(mapping, index settings or None) of a timeseries aspect's index."""
    base, index_settings = _split_index_body(timeseries_mapping(registry, aspect))
    return _timeseries_mapping(base), index_settings
