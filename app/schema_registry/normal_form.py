"""Avro schemas as the registry keeps them: validated, in one normal form, and fingerprinted.

The normal form is the schema's JSON with every name fully qualified (`namespace` keys dropped, except where a
null-namespace type sits inside a namespaced one), `{"type": "int"}` written `"int"`, keys in a fixed order and
no whitespace. Documentation and custom properties are kept: they are part of what a producer registered. Two texts
that differ only in layout, key order or namespace spelling have the same normal form, hence the same fingerprint
(SHA-256 of the normal form) and the same id.

Validation follows the Avro specification where fastavro is lenient: valid and unique names, field names and enum
symbols, unions without nested unions or duplicate branches, defaults that match their type (a union's default
matches its first branch), a fixed's size; then fastavro parses the result, so whatever is accepted can be read.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import fastavro
import orjson

from app.schema_registry.errors import InvalidSchema

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED_KINDS = frozenset({"record", "error", "enum", "fixed"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FIELD_ORDERS = frozenset({"ascending", "descending", "ignore"})
_KEY_ORDER = {
    key: rank
    for rank, key in enumerate(
        [
            "type",
            "name",
            "namespace",
            "doc",
            "fields",
            "symbols",
            "items",
            "values",
            "size",
            "default",
            "aliases",
            "order",
        ]
    )
}
# Types nested deeper than this are refused (DataHub's deepest, MetadataChangeEvent, nests 17 levels): the checks
# that follow recurse through the nesting.
MAX_DEPTH = 64
_INT_RANGE = (-(2**31), 2**31 - 1)
_LONG_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class NormalSchema:
    """A validated schema in normal form. `names` maps each named type's full name to its definition."""

    schema: Any
    text: str
    fingerprint: str
    names: dict[str, dict[str, Any]] = field(repr=False, compare=False)


def normalize(text: str) -> NormalSchema:
    """Parse, validate and normalize a schema's JSON text; raises InvalidSchema naming what is wrong and where."""
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise InvalidSchema(f"Invalid schema: not valid JSON: {error}") from None
    return normalize_json(document)


def normalize_json(document: Any) -> NormalSchema:
    names: dict[str, dict[str, Any]] = {}
    try:
        schema = _Normalizer(names).schema(document, "", "$")
        text = orjson.dumps(schema).decode()
        fastavro.parse_schema(orjson.loads(text), named_schemas={})
    except InvalidSchema:
        raise
    except RecursionError:
        raise InvalidSchema("Invalid schema: nested too deeply") from None
    except Exception as error:  # noqa: BLE001 - fastavro's parse errors are of many types
        raise InvalidSchema(f"Invalid schema: {type(error).__name__}: {error}") from None
    return NormalSchema(schema, text, hashlib.sha256(text.encode()).hexdigest(), names)


def _ordered(items: dict[str, Any]) -> dict[str, Any]:
    return dict(sorted(items.items(), key=lambda kv: (_KEY_ORDER.get(kv[0], len(_KEY_ORDER)), kv[0])))


def _invalid(path: str, message: str) -> InvalidSchema:
    return InvalidSchema(f"Invalid schema at {path}: {message}")


def _full_name(name: Any, namespace: str, path: str, what: str = "name") -> tuple[str, str]:
    """(full name, its namespace) of a name as written in a context whose namespace is `namespace`."""
    if not isinstance(name, str) or not name:
        raise _invalid(path, f"a {what} must be a non-empty string, found {orjson.dumps(name).decode()[:100]}")
    parts = name.split(".")
    if not all(_NAME.match(part) for part in parts):
        raise _invalid(path, f"{name!r} is not a valid Avro {what}")
    if len(parts) > 1:
        return name, ".".join(parts[:-1])
    return (f"{namespace}.{name}" if namespace else name), namespace


class _Normalizer:
    def __init__(self, names: dict[str, dict[str, Any]]) -> None:
        self.names = names
        self.depth = 0

    def schema(self, node: Any, namespace: str, path: str) -> Any:
        if isinstance(node, str):
            return self.reference(node, namespace, path)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _invalid(path[:200] + "...", f"types are nested more than {MAX_DEPTH} levels deep")
            if isinstance(node, list):
                return self.union(node, namespace, path)
            if isinstance(node, dict):
                return self.complex(node, namespace, path)
        finally:
            self.depth -= 1
        raise _invalid(path, f"a schema is a string, an array or an object, found {orjson.dumps(node).decode()[:100]}")

    def reference(self, name: str, namespace: str, path: str) -> str:
        if name in PRIMITIVES:
            return name
        if name in NAMED_KINDS or name in ("array", "map"):
            raise _invalid(path, f"{name!r} must be written as an object with its attributes")
        full, _ = _full_name(name, namespace, path, "type name")
        if full in self.names:
            return full
        if "." not in name and name in self.names:  # as Avro's Java parser: an unqualified name not found in the
            return name  # current namespace is looked up in the null namespace
        raise _invalid(path, f"unknown type {name!r} (a named type must be defined before it is used)")

    def union(self, branches: list[Any], namespace: str, path: str) -> list[Any]:
        if not branches:
            raise _invalid(path, "a union needs at least one branch")
        normal: list[Any] = []
        seen: set[str] = set()
        for index, branch in enumerate(branches):
            where = f"{path}[{index}]"
            if isinstance(branch, list):
                raise _invalid(where, "a union may not directly contain another union")
            result = self.schema(branch, namespace, where)
            key = branch_key(result, self.names)
            if key in seen:
                raise _invalid(where, f"the union has two branches of type {key!r}")
            seen.add(key)
            normal.append(result)
        return normal

    def complex(self, node: dict[str, Any], namespace: str, path: str) -> Any:
        if "type" not in node:
            raise _invalid(path, "a schema object needs a 'type'")
        kind = node["type"]
        if isinstance(kind, (dict, list)):
            # {"type": {...}}: the nested schema is the schema (properties beside it would be lost: refuse them)
            if len(node) > 1:
                raise _invalid(path, "'type' must name a type when the object has other attributes")
            return self.schema(kind, namespace, f"{path}.type")
        if not isinstance(kind, str):
            raise _invalid(path, f"'type' must be a string, found {orjson.dumps(kind).decode()[:100]}")
        if kind in PRIMITIVES:
            extra = {k: v for k, v in node.items() if k != "type"}
            return _ordered({"type": kind, **extra}) if extra else kind
        if kind in NAMED_KINDS:
            return self.named(kind, node, namespace, path)
        if kind == "array":
            if "items" not in node:
                raise _invalid(path, "an array needs 'items'")
            items = self.schema(node["items"], namespace, f"{path}.items")
            return _ordered({**_props(node, {"type", "items"}), "type": "array", "items": items})
        if kind == "map":
            if "values" not in node:
                raise _invalid(path, "a map needs 'values'")
            values = self.schema(node["values"], namespace, f"{path}.values")
            return _ordered({**_props(node, {"type", "values"}), "type": "map", "values": values})
        # {"type": "SomeNamedType"}: a reference to a named type
        if len(node) > 1:
            raise _invalid(path, f"unknown type {kind!r} with attributes")
        return self.reference(kind, namespace, f"{path}.type")

    def named(self, kind: str, node: dict[str, Any], enclosing: str, path: str) -> dict[str, Any]:
        raw_namespace = node.get("namespace", enclosing)
        if raw_namespace is None:
            raw_namespace = ""
        if not isinstance(raw_namespace, str) or (
            raw_namespace and not all(_NAME.match(p) for p in raw_namespace.split("."))
        ):
            raise _invalid(path, f"{raw_namespace!r} is not a valid namespace")
        full, namespace = _full_name(node.get("name"), raw_namespace, f"{path}.name")
        if full in PRIMITIVES or full.rsplit(".", 1)[-1] in PRIMITIVES:
            raise _invalid(f"{path}.name", f"{full!r} redefines a primitive type")
        if full in self.names:
            raise _invalid(f"{path}.name", f"the type {full!r} is defined twice")
        out: dict[str, Any] = {**_props(node, {"type", "name", "namespace", "fields", "symbols", "size", "aliases"})}
        out["type"] = kind
        out["name"] = full
        if "." not in full and enclosing:
            out["namespace"] = ""  # keeps it out of the enclosing namespace when read back
        if "aliases" in node:
            out["aliases"] = _aliases(node["aliases"], namespace, f"{path}.aliases")
        self.names[full] = out  # before the fields: a record may refer to itself
        if kind in ("record", "error"):
            out["fields"] = self.fields(node.get("fields"), namespace, f"{path}.fields")
        elif kind == "enum":
            out["symbols"] = _symbols(node.get("symbols"), f"{path}.symbols")
            if "default" in out and out["default"] not in out["symbols"]:
                raise _invalid(f"{path}.default", f"the enum default {out['default']!r} is not one of its symbols")
        else:
            size = node.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise _invalid(f"{path}.size", "a fixed needs a 'size' that is a non-negative integer")
            out["size"] = size
        ordered = _ordered(out)
        out.clear()
        out.update(ordered)
        return out

    def fields(self, fields: Any, namespace: str, path: str) -> list[dict[str, Any]]:
        if not isinstance(fields, list):
            raise _invalid(path, "a record needs 'fields', an array")
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        for index, spec in enumerate(fields):
            where = f"{path}[{index}]"
            if not isinstance(spec, dict):
                raise _invalid(where, "a field is an object")
            name = spec.get("name")
            if not isinstance(name, str) or not _NAME.match(name):
                raise _invalid(f"{where}.name", f"{orjson.dumps(name).decode()[:100]} is not a valid field name")
            if name in seen:
                raise _invalid(f"{where}.name", f"the field {name!r} is defined twice")
            seen.add(name)
            if "type" not in spec:
                raise _invalid(where, f"the field {name!r} needs a 'type'")
            normal = {**_props(spec, {"name", "type", "aliases"}), "name": name}
            normal["type"] = self.schema(spec["type"], namespace, f"{where}.type")
            if "aliases" in spec:
                aliases = spec["aliases"]
                if not isinstance(aliases, list) or not all(isinstance(a, str) and _NAME.match(a) for a in aliases):
                    raise _invalid(f"{where}.aliases", "field aliases are an array of field names")
                normal["aliases"] = aliases
            if "order" in spec and spec["order"] not in _FIELD_ORDERS:
                raise _invalid(f"{where}.order", f"order is one of {sorted(_FIELD_ORDERS)}")
            if "default" in spec:
                problem = default_problem(normal["type"], spec["default"], self.names)
                if problem:
                    raise _invalid(f"{where}.default", f"the default of field {name!r} {problem}")
            out.append(_ordered(normal))
        return out


def _props(node: dict[str, Any], exclude: set[str]) -> dict[str, Any]:
    """The attributes other than `exclude` (documentation, defaults, custom properties), objects inside them with
    sorted keys: JSON objects are unordered."""
    return {k: _sorted_json(v) for k, v in node.items() if k not in exclude}


def _sorted_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted_json(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_json(v) for v in value]
    return value


def _aliases(aliases: Any, namespace: str, path: str) -> list[str]:
    if not isinstance(aliases, list):
        raise _invalid(path, "aliases are an array of names")
    return [_full_name(alias, namespace, path, "alias")[0] for alias in aliases]


def _symbols(symbols: Any, path: str) -> list[str]:
    if not isinstance(symbols, list):
        raise _invalid(path, "an enum needs 'symbols', an array")
    seen: set[str] = set()
    for symbol in symbols:
        if not isinstance(symbol, str) or not _NAME.match(symbol):
            raise _invalid(path, f"{orjson.dumps(symbol).decode()[:100]} is not a valid enum symbol")
        if symbol in seen:
            raise _invalid(path, f"the symbol {symbol!r} appears twice")
        seen.add(symbol)
    return list(symbols)


def resolve(schema: Any, names: dict[str, dict[str, Any]]) -> Any:
    """A normal-form schema with a reference replaced by its definition and `{"type": <primitive>, ...}` (a logical
    type) by the primitive: what is left is a primitive name, a union (list) or a complex type (dict)."""
    if isinstance(schema, str):
        return schema if schema in PRIMITIVES else names[schema]
    if isinstance(schema, dict) and schema["type"] in PRIMITIVES:
        return schema["type"]
    return schema


def type_of(schema: Any) -> str:
    """'int', 'record', 'union', ... of a resolved schema."""
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "union"
    return "record" if schema["type"] == "error" else schema["type"]


def branch_key(schema: Any, names: dict[str, dict[str, Any]]) -> str:
    """What makes two union branches the same: the type, or the full name of a named type."""
    resolved = resolve(schema, names)
    if isinstance(resolved, dict) and "name" in resolved:
        return resolved["name"]
    return type_of(resolved)


def display(schema: Any, names: dict[str, dict[str, Any]]) -> str:
    """A short name of a schema for messages."""
    resolved = resolve(schema, names)
    if isinstance(resolved, list):
        return "[" + ", ".join(display(branch, names) for branch in resolved) + "]"
    if isinstance(resolved, dict):
        if "name" in resolved:
            return f"{resolved['type']} {resolved['name']}"
        if resolved["type"] == "array":
            return f"array<{display(resolved['items'], names)}>"
        return f"map<{display(resolved['values'], names)}>"
    return resolved


def default_problem(schema: Any, value: Any, names: dict[str, dict[str, Any]], depth: int = 0) -> str | None:
    """Why `value` is not a valid default for `schema` (None when it is)."""
    if depth > 200:
        return "is nested too deeply"
    resolved = resolve(schema, names)
    kind = type_of(resolved)
    shown = orjson.dumps(value).decode()[:100]
    if kind == "union":
        problem = default_problem(resolved[0], value, names, depth + 1)
        return (
            None
            if problem is None
            else f"must match the union's first branch ({display(resolved[0], names)}): {problem}"
        )
    checks = {
        "null": lambda v: v is None,
        "boolean": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and _INT_RANGE[0] <= v <= _INT_RANGE[1],
        "long": lambda v: isinstance(v, int) and not isinstance(v, bool) and _LONG_RANGE[0] <= v <= _LONG_RANGE[1],
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "double": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bytes": lambda v: isinstance(v, str),
        "string": lambda v: isinstance(v, str),
    }
    if kind in checks:
        return None if checks[kind](value) else f"{shown} is not a valid {kind}"
    if kind == "fixed":
        return (
            None
            if isinstance(value, str) and len(value) == resolved["size"]
            else f"{shown} is not a {resolved['size']}-byte fixed"
        )
    if kind == "enum":
        return None if value in resolved["symbols"] else f"{shown} is not a symbol of {resolved['name']}"
    if kind == "array":
        if not isinstance(value, list):
            return f"{shown} is not an array"
        for item in value:
            problem = default_problem(resolved["items"], item, names, depth + 1)
            if problem:
                return problem
        return None
    if kind == "map":
        if not isinstance(value, dict):
            return f"{shown} is not an object"
        for item in value.values():
            problem = default_problem(resolved["values"], item, names, depth + 1)
            if problem:
                return problem
        return None
    # a record
    if not isinstance(value, dict):
        return f"{shown} is not an object"
    for spec in resolved.get("fields", []):  # (a record still being defined has no fields yet: accepted)
        if spec["name"] in value:
            problem = default_problem(spec["type"], value[spec["name"]], names, depth + 1)
            if problem:
                return f"field {spec['name']!r}: {problem}"
        elif "default" not in spec:
            return f"field {spec['name']!r} is missing"
    return None
