"""DataHub's Kafka record schemas (Avro), loaded and parsed once per process.

`MetadataChangeProposal`, `MetadataChangeLog`, `PlatformEvent` and `MetadataChangeEvent` are the `.avsc` files the
installed `acryl-datahub` package ships (`datahub/metadata/schemas/`, found the way `app.registry` finds them: from
the distribution's files, its code is never imported). `FailedMetadataChangeProposal`, `FailedMetadataChangeEvent`
and `MetadataAuditEvent` are not shipped: they are written from DataHub's PDL (`metadata-models/.../mxe/*.pdl`) and
kept next to this module (`app/avro/schemas/*.avsc`). Those files name the types they share with the shipped schemas
(`com.linkedin.pegasus2avro.mxe.MetadataChangeProposal`, `com.linkedin.events.KafkaAuditHeader`, the snapshots...)
instead of copying them; `schema()` resolves them into one self-contained schema (each named type defined at its
first use, referred to by its full name after), which is what a registry serves.

Schema ids are DataHub's fixed ones (GMS `SchemaIdOrdinal`): a consumer already pointed at a GMS registry sees the
same ids. DataHub's older ids of a record (e.g. MCP 0 and 9) resolve to the current schema: the old versions are
not in the package (documented limitation; the fields DataHub added since are all optional with defaults).
"""

from __future__ import annotations

import copy
import importlib.metadata
import threading
from pathlib import Path
from typing import Any

import orjson

PACKAGE = "acryl-datahub"
PACKAGE_SCHEMAS = "datahub/metadata/schemas"
REPO_SCHEMAS = Path(__file__).resolve().parent / "schemas"
NAMESPACE = "com.linkedin.pegasus2avro.mxe"

MCP = "MetadataChangeProposal"
MCL = "MetadataChangeLog"
PLATFORM_EVENT = "PlatformEvent"
MCE = "MetadataChangeEvent"
FMCP = "FailedMetadataChangeProposal"
FMCE = "FailedMetadataChangeEvent"
MAE = "MetadataAuditEvent"

SHIPPED = (MCP, MCL, PLATFORM_EVENT, MCE)  # in the acryl-datahub package
WRITTEN = (FMCP, FMCE, MAE)  # written from DataHub's PDL, in app/avro/schemas/
RECORD_NAMES = SHIPPED + WRITTEN

# DataHub's fixed ids, old versions included (they resolve to the current schema).
DATAHUB_SCHEMA_IDS: dict[int, str] = {
    0: MCP,
    9: MCP,
    16: MCP,
    1: FMCP,
    10: FMCP,
    17: FMCP,
    2: MCL,
    11: MCL,
    18: MCL,
    3: MCL,
    12: MCL,
    19: MCL,  # MetadataChangeLog_Timeseries_v1: same record
    4: PLATFORM_EVENT,
    5: MCE,
    13: MCE,
    20: MCE,
    6: FMCE,
    14: FMCE,
    21: FMCE,
    7: MAE,
    15: MAE,
    22: MAE,
}

# Topic role → the record it carries and DataHub's current id for it.
ROLE_RECORD: dict[str, str] = {
    "mcp": MCP,
    "fmcp": FMCP,
    "mcl_versioned": MCL,
    "mcl_timeseries": MCL,
    "platform_event": PLATFORM_EVENT,
    "mce": MCE,
    "fmce": FMCE,
    "mae": MAE,
}
CURRENT_SCHEMA_ID: dict[str, int] = {
    "mcp": 16,
    "fmcp": 17,
    "mcl_versioned": 18,
    "mcl_timeseries": 19,
    "platform_event": 4,
    "mce": 20,
    "fmce": 21,
    "mae": 22,
}

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = frozenset({"record", "error", "enum", "fixed"})

_lock = threading.RLock()
_documents: dict[str, dict[str, Any]] = {}
_texts: dict[str, str] = {}
_parsed: dict[str, Any] = {}
_named: dict[str, dict[str, Any]] | None = None


class SchemaNotFound(LookupError):
    """A record name metaledger has no schema for, or the acryl-datahub package is not installed."""


def package_schema_dir() -> Path:
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError as error:
        raise SchemaNotFound(
            f"the {PACKAGE} package is not installed: DataHub's Kafka record schemas come from it"
        ) from error
    return Path(str(dist.locate_file(PACKAGE_SCHEMAS)))


def full_name(name: str, namespace: str | None) -> str:
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def _normalize(schema: Any, namespace: str | None, named: dict[str, dict[str, Any]]) -> Any:
    """A copy of `schema` where every named type carries an explicit namespace and every reference is a full name;
    each named definition is also collected in `named` (full name → definition)."""
    if isinstance(schema, str):
        return schema if schema in PRIMITIVES else full_name(schema, namespace)
    if isinstance(schema, list):
        return [_normalize(branch, namespace, named) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    if kind in NAMED:
        name = full_name(schema["name"], schema.get("namespace", namespace))
        space, _, short = name.rpartition(".")
        out = dict(schema, name=short, namespace=space) if space else dict(schema, name=short)
        if kind in ("record", "error"):
            out["fields"] = [dict(f, type=_normalize(f["type"], space or None, named)) for f in schema["fields"]]
        named.setdefault(name, out)
        return out
    if kind == "array":
        return dict(schema, items=_normalize(schema["items"], namespace, named))
    if kind == "map":
        return dict(schema, values=_normalize(schema["values"], namespace, named))
    if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind not in PRIMITIVES):
        return _normalize(kind, namespace, named)
    return schema


def _resolve(schema: Any, named: dict[str, dict[str, Any]], defined: set[str]) -> Any:
    """A normalized schema made self-contained: a name not yet defined is replaced by its definition (the first
    time), a definition already given earlier by its name."""
    if isinstance(schema, str):
        if schema in PRIMITIVES:
            return schema
        if schema in defined:
            return schema
        if schema not in named:
            raise SchemaNotFound(f"named type {schema!r} is not defined in DataHub's schemas")
        return _resolve(copy.deepcopy(named[schema]), named, defined)
    if isinstance(schema, list):
        return [_resolve(branch, named, defined) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    if kind in NAMED:
        name = full_name(schema["name"], schema.get("namespace"))
        if name in defined:
            return name
        defined.add(name)
        if kind in ("record", "error"):
            return dict(schema, fields=[dict(f, type=_resolve(f["type"], named, defined)) for f in schema["fields"]])
        return schema
    if kind == "array":
        return dict(schema, items=_resolve(schema["items"], named, defined))
    if kind == "map":
        return dict(schema, values=_resolve(schema["values"], named, defined))
    return schema


def _shipped_named() -> dict[str, dict[str, Any]]:
    global _named
    if _named is None:
        named: dict[str, dict[str, Any]] = {}
        folder = package_schema_dir()
        for record in SHIPPED:
            _normalize(orjson.loads((folder / f"{record}.avsc").read_bytes()), None, named)
        _named = named
    return _named


def self_contained(template: dict[str, Any]) -> dict[str, Any]:
    """`template` made self-contained: each named type it refers to (by full name) and does not define is defined at
    its first use, from the types the template defines itself and DataHub's shipped record schemas (which hold every
    aspect of DataHub's model, through the MCE's snapshots). Raises SchemaNotFound for a name defined nowhere."""
    own: dict[str, dict[str, Any]] = {}
    normalized = _normalize(template, None, own)
    return _resolve(normalized, {**_shipped_named(), **own}, set())


def schema(record_name: str) -> dict[str, Any]:
    """The record's schema: a self-contained Avro schema document (do not mutate)."""
    document = _documents.get(record_name)
    if document is not None:
        return document
    if record_name not in RECORD_NAMES:
        raise SchemaNotFound(f"no schema for record {record_name!r}; known: {', '.join(RECORD_NAMES)}")
    with _lock:
        if record_name not in _documents:
            if record_name in SHIPPED:
                document = orjson.loads((package_schema_dir() / f"{record_name}.avsc").read_bytes())
            else:
                template = orjson.loads((REPO_SCHEMAS / f"{record_name}.avsc").read_bytes())
                named = _shipped_named()
                document = _resolve(_normalize(template, None, {}), named, set())
            _documents[record_name] = document
    return _documents[record_name]


def schema_text(record_name: str) -> str:
    """The schema as the JSON text a registry serves for it (compact; the same text every time)."""
    text = _texts.get(record_name)
    if text is None:
        text = _texts[record_name] = orjson.dumps(schema(record_name)).decode()
    return text


def parsed(record_name: str) -> Any:
    """The record's schema parsed by fastavro (once per process)."""
    result = _parsed.get(record_name)
    if result is None:
        import fastavro

        with _lock:
            result = _parsed.get(record_name)
            if result is None:
                result = _parsed[record_name] = fastavro.parse_schema(copy.deepcopy(schema(record_name)))
    return result


def record_name_of(schema_document: Any) -> str | None:
    """The full name of a schema document's top-level record (None for a schema that is not a named record)."""
    if isinstance(schema_document, dict) and schema_document.get("type") in NAMED and "name" in schema_document:
        return full_name(schema_document["name"], schema_document.get("namespace"))
    return None
