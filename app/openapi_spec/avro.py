"""Avro -> JSON Schema: DataHub's aspect schemas (the registry's ``.avsc``) as JSON Schema components describing the
**Pegasus JSON** wire form:

* a record field typed ``["null", T]`` / ``[T, "null"]`` is an optional Pegasus field: property of type ``T``,
  not required (``null`` is not part of the schema: Pegasus clients omit the field);
* any other union is a Pegasus union: an object with exactly one member key, the member's full name without
  ``pegasus2avro.`` (``{"com.linkedin.schema.StringType": {}}``) or the type name for unnamed members
  (``{"string": "x"}``, ``"array"``, ``"map"``) -> ``oneOf`` of single-property objects;
* a record with a ``fieldDiscriminator`` enum field is a Pegasus union with aliases (``{"costCode": "x"}``);
* fields with a default are not required and carry the default converted to Pegasus JSON.

Every named Avro type (record / enum / fixed) becomes one component, named by its short name, qualified by the
shortest namespace suffix that makes it unique when short names collide (``schema.Foo`` / ``other.Foo``) or clash
with a name app.openapi_spec.document generates. The same type defined inline in several ``.avsc`` files is emitted
once and referenced with ``$ref``. Output is deterministic: components are sorted by name; record properties keep
their declaration order.

The registry is duck-typed: ``entities`` (``name``, ``key_aspect``, ``aspect_names``, ``doc``) and ``aspects``
(``schema``: the raw .avsc). When an aspect references a named type defined in no aspect document, the
registry's other model documents (``registry._documents``: ``[(source, raw avsc)]``) are searched as well.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from app.registry import EntityRegistry

log = logging.getLogger(__name__)

API_PREFIX = "/openapi/v3/entity"
REF_PREFIX = "#/components/schemas/"
SYSTEM_METADATA_RECORD = "com.linkedin.mxe.SystemMetadata"

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PRIMITIVE_SCHEMAS: dict[str, dict[str, Any]] = {
    "null": {"type": "null"},
    "boolean": {"type": "boolean"},
    "int": {"type": "integer", "format": "int32"},
    "long": {"type": "integer", "format": "int64"},
    "float": {"type": "number", "format": "float"},
    "double": {"type": "number", "format": "double"},
    "bytes": {"type": "string"},
    "string": {"type": "string"},
}
_NAMED_KINDS = frozenset({"record", "error", "enum", "fixed"})
_DISCRIMINATOR = "fieldDiscriminator"

# Components this module writes besides the converted Avro types.
ERROR_RESPONSE = "ErrorResponse"
ERROR_ISSUE = "ErrorIssue"
BATCH_GET_ASPECT_REQUEST = "BatchGetAspectRequest"
ASPECT_HEADERS = "AspectHeaders"
GENERIC_JSON_PATCH = "GenericJsonPatch"
ASPECT_PATCH_REQUEST = "AspectPatchRequest"


def schema_ref(name: str) -> dict[str, str]:
    return {"$ref": REF_PREFIX + name}


def canonical_name(fullname: str) -> str:
    """``com.linkedin.pegasus2avro.schema.SchemaField`` -> ``com.linkedin.schema.SchemaField`` (Pegasus name)."""
    return fullname.replace("pegasus2avro.", "", 1)


def upper_first(name: str) -> str:
    return name[:1].upper() + name[1:]


def _full_avro_name(name: str, namespace: str) -> str:
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def _namespace_of(avro_fullname: str) -> str:
    return avro_fullname.rpartition(".")[0]


# --------------------------------------------------------------------------------------------------------------
# Named-type pool
# --------------------------------------------------------------------------------------------------------------


@dataclass
class _Definition:
    name: str  # canonical (Pegasus) full name
    raw: dict[str, Any]
    namespace: str  # Avro namespace of the type: where names referenced inside it are resolved
    source: str  # the aspect (document) it was read from


@dataclass
class _Pool:
    """Every named type reachable from the documents, by canonical full name (all definitions kept)."""

    definitions: dict[str, list[_Definition]] = field(default_factory=lambda: defaultdict(list))
    references: set[str] = field(default_factory=set)  # canonical names referenced by name

    def undefined(self) -> set[str]:
        return self.references - self.definitions.keys()

    def add_document(self, source: str, raw: Any, *, named: bool = True) -> str | None:
        """Register the named types of one .avsc document; returns the canonical name of its top-level type."""
        top = self._walk(raw, "", source)
        if top is None and named:
            raise ValueError(f"{source}: the top-level schema is not a named type")
        return top

    def _walk(self, t: Any, namespace: str, source: str) -> str | None:
        if isinstance(t, str):
            if t not in PRIMITIVES:
                self.references.add(canonical_name(_full_avro_name(t, namespace)))
            return None
        if isinstance(t, list):
            for branch in t:
                self._walk(branch, namespace, source)
            return None
        if not isinstance(t, dict):
            raise ValueError(f"{source}: not an Avro type: {t!r}")
        kind = t.get("type")
        if isinstance(kind, (dict, list)):
            return self._walk(kind, namespace, source)
        if kind in _NAMED_KINDS:
            full = _full_avro_name(t["name"], t.get("namespace", namespace))
            name = canonical_name(full)
            own_namespace = _namespace_of(full)
            self.definitions[name].append(_Definition(name, t, own_namespace, source))
            if kind in ("record", "error"):
                for f in t.get("fields", ()):
                    self._walk(f["type"], own_namespace, source)
            return name
        if kind == "array":
            self._walk(t["items"], namespace, source)
        elif kind == "map":
            self._walk(t["values"], namespace, source)
        elif isinstance(kind, str):
            self._walk(kind, namespace, source)
        return None


def _assign_names(type_names: Iterable[str], reserved: frozenset[str]) -> dict[str, str]:
    """Component name per canonical full name: the short name, or the shortest unique dotted suffix."""
    by_short: dict[str, list[str]] = defaultdict(list)
    for full in sorted(set(type_names)):
        by_short[full.rpartition(".")[2]].append(full)
    names: dict[str, str] = {}
    for short, fulls in sorted(by_short.items()):
        if len(fulls) == 1 and short not in reserved:
            names[fulls[0]] = short
            continue
        depth = 1
        while True:
            candidates = {f: ".".join(f.split(".")[-(depth + 1) :]) for f in fulls}
            if len(set(candidates.values())) == len(fulls) and not reserved.intersection(candidates.values()):
                names.update(candidates)
                break
            if depth > max(f.count(".") for f in fulls):  # pragma: no cover - full names are unique
                raise ValueError(f"cannot find unique component names for {fulls}")
            depth += 1
    return names


# --------------------------------------------------------------------------------------------------------------
# Avro -> JSON Schema (Pegasus JSON)
# --------------------------------------------------------------------------------------------------------------


class _Converter:
    def __init__(self, chosen: Mapping[str, _Definition], names: Mapping[str, str]) -> None:
        self.chosen = chosen
        self.names = names

    # -- references ---------------------------------------------------------------------------------------------
    def _resolve(self, ref: str, namespace: str) -> str:
        name = canonical_name(_full_avro_name(ref, namespace))
        if name not in self.chosen:
            raise ValueError(f"reference to undefined Avro type {ref!r} (namespace {namespace!r})")
        return name

    def _ref(self, canonical: str) -> dict[str, Any]:
        return schema_ref(self.names[canonical])

    def _named(self, t: Any, namespace: str) -> _Definition | None:
        """The definition a type refers to (inline definition or reference), or None for unnamed types."""
        if isinstance(t, str):
            return None if t in PRIMITIVES else self.chosen[self._resolve(t, namespace)]
        if isinstance(t, dict):
            kind = t.get("type")
            if isinstance(kind, (dict, list)):
                return self._named(kind, namespace)
            if kind in _NAMED_KINDS:
                return self.chosen[canonical_name(_full_avro_name(t["name"], t.get("namespace", namespace)))]
            if isinstance(kind, str) and kind not in PRIMITIVES and kind not in ("array", "map"):
                return self._named(kind, namespace)
        return None

    def member_key(self, t: Any, namespace: str) -> str:
        """Pegasus JSON key of a union member."""
        named = self._named(t, namespace)
        if named is not None:
            return named.name
        if isinstance(t, str):
            return t
        kind = t["type"]
        if isinstance(kind, (dict, list)):
            return self.member_key(kind, namespace)
        return kind  # primitive name, "array" or "map"

    # -- types --------------------------------------------------------------------------------------------------
    def type_schema(self, t: Any, namespace: str) -> dict[str, Any]:
        if isinstance(t, str):
            if t in PRIMITIVES:
                return dict(_PRIMITIVE_SCHEMAS[t])
            return self._ref(self._resolve(t, namespace))
        if isinstance(t, list):
            return self.union_schema(t, namespace, include_null=True)
        kind = t.get("type")
        if isinstance(kind, (dict, list)):
            return self.type_schema(kind, namespace)
        if kind in PRIMITIVES:
            return dict(_PRIMITIVE_SCHEMAS[kind])
        if kind == "array":
            return {"type": "array", "items": self.type_schema(t["items"], namespace)}
        if kind == "map":
            return {"type": "object", "additionalProperties": self.type_schema(t["values"], namespace)}
        named = self._named(t, namespace)
        if named is None:
            raise ValueError(f"unsupported Avro type {t!r}")
        return self._ref(named.name)

    def union_schema(self, branches: list[Any], namespace: str, *, include_null: bool) -> dict[str, Any]:
        members: list[dict[str, Any]] = []
        for branch in branches:
            if branch == "null":
                if include_null:
                    members.append({"type": "null"})
                continue
            key = self.member_key(branch, namespace)
            members.append(_single_key_object(key, self.type_schema(branch, namespace)))
        return {"oneOf": members}

    def field_schema(self, f: Mapping[str, Any], namespace: str) -> tuple[dict[str, Any], bool]:
        """(property schema, required) of one record field."""
        t = f["type"]
        optional = False
        if isinstance(t, list) and "null" in t:
            optional = True
            non_null = [b for b in t if b != "null"]
            if len(non_null) == 1:
                schema = self.type_schema(non_null[0], namespace)
            else:
                schema = self.union_schema(non_null, namespace, include_null=False)
        else:
            schema = self.type_schema(t, namespace)
        has_default = "default" in f
        if has_default:
            value = self.default(t, f["default"], namespace, in_field=True)
            if value is not None:
                schema["default"] = value
        _describe(schema, f.get("doc"), f)
        return schema, not (optional or has_default)

    def definition_schema(self, d: _Definition) -> dict[str, Any]:
        raw = d.raw
        kind = raw["type"]
        if kind == "enum":
            schema: dict[str, Any] = {"type": "string", "enum": list(raw["symbols"])}
            symbol_docs = raw.get("symbolDocs") or {}
            if symbol_docs:
                schema["x-enum-descriptions"] = [symbol_docs.get(s, "") for s in raw["symbols"]]
        elif kind == "fixed":
            size = int(raw["size"])
            schema = {"type": "string", "minLength": size, "maxLength": size}
        elif (members := self._aliased_union_members(raw, d.namespace)) is not None:
            schema = {
                "oneOf": [
                    _single_key_object(f["name"], self.type_schema(_non_null(f["type"]), d.namespace)) for f in members
                ]
            }
        else:
            properties: dict[str, Any] = {}
            required: list[str] = []
            for f in raw.get("fields", ()):
                prop, is_required = self.field_schema(f, d.namespace)
                properties[f["name"]] = prop
                if is_required:
                    required.append(f["name"])
            schema = {"type": "object", "properties": properties}
            if required:
                schema["required"] = required
            schema["additionalProperties"] = False
        _describe(schema, raw.get("doc"), raw)
        return schema

    def _aliased_union_members(self, raw: Mapping[str, Any], namespace: str) -> list[dict[str, Any]] | None:
        """The member fields if this record is Pegasus's Avro encoding of a union with aliases."""
        if raw.get("type") not in ("record", "error"):
            return None
        fields = list(raw.get("fields", ()))
        disc = next((f for f in fields if f["name"] == _DISCRIMINATOR), None)
        if disc is None:
            return None
        named = self._named(disc["type"], namespace)
        if named is None or named.raw.get("type") != "enum":
            return None
        members = [f for f in fields if f is not disc]
        if set(named.raw["symbols"]) != {f["name"] for f in members}:
            return None
        return members

    # -- defaults -----------------------------------------------------------------------------------------------
    def default(self, t: Any, value: Any, namespace: str, *, in_field: bool = False) -> Any:
        """An Avro JSON default value in Pegasus JSON form (None: no default / absent)."""
        if isinstance(t, list):
            if not t or t[0] == "null":
                return None
            first = t[0]
            inner = self.default(first, value, namespace)
            non_null = [b for b in t if b != "null"]
            if in_field and "null" in t and len(non_null) == 1:
                return inner  # optional field
            return {self.member_key(first, namespace): inner}
        if isinstance(t, str) and t in PRIMITIVES:
            return value
        if isinstance(t, dict):
            kind = t.get("type")
            if kind in PRIMITIVES:
                return value
            if kind == "array":
                return [self.default(t["items"], v, namespace) for v in value]
            if kind == "map":
                return {k: self.default(t["values"], v, namespace) for k, v in value.items()}
        named = self._named(t, namespace)
        if named is None:
            return value
        if named.raw["type"] in ("record", "error") and isinstance(value, dict):
            members = self._aliased_union_members(named.raw, named.namespace)
            if members is not None:
                alias = value.get(_DISCRIMINATOR)
                member = next((f for f in members if f["name"] == alias), None)
                if member is None:
                    return None
                return {alias: self.default(_non_null(member["type"]), value.get(alias), named.namespace)}
            out: dict[str, Any] = {}
            for f in named.raw.get("fields", ()):
                if f["name"] in value:
                    v = self.default(f["type"], value[f["name"]], named.namespace, in_field=True)
                    if v is not None:
                        out[f["name"]] = v
            return out
        return value


def _non_null(t: Any) -> Any:
    if isinstance(t, list):
        non_null = [b for b in t if b != "null"]
        return non_null[0] if len(non_null) == 1 else non_null
    return t


def _single_key_object(key: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {key: schema},
        "required": [key],
        "additionalProperties": False,
        "minProperties": 1,
        "maxProperties": 1,
    }


def _describe(schema: dict[str, Any], doc: Any, raw: Mapping[str, Any]) -> None:
    parts = [doc] if isinstance(doc, str) and doc else []
    deprecated = raw.get("deprecated", raw.get("Deprecated"))
    if deprecated:
        schema["deprecated"] = True
        if isinstance(deprecated, str):
            parts.append(f"Deprecated: {deprecated}")
    if parts:
        schema["description"] = "\n\n".join(parts)


# --------------------------------------------------------------------------------------------------------------
# Registry -> components
# --------------------------------------------------------------------------------------------------------------


@dataclass
class RegistryModel:
    components: dict[str, dict[str, Any]]  # converted Avro types, sorted by name
    aspect_component: dict[str, str]  # aspect name -> component name of its record
    system_metadata: str  # component name of SystemMetadata
    entities: list[tuple[str, Any, list[str]]]  # (entity name, spec, sorted aspect names)


def _entity_aspects(registry: EntityRegistry) -> list[tuple[str, Any, list[str]]]:
    out = []
    for name in sorted(registry.entities):
        spec = registry.entities[name]
        aspects = set(spec.aspect_names)
        if getattr(spec, "key_aspect", None):
            aspects.add(spec.key_aspect)
        missing = sorted(a for a in aspects if a not in registry.aspects)
        if missing:
            raise ValueError(f"entity {name!r} lists aspects missing from the registry: {missing}")
        out.append((name, spec, sorted(aspects)))
    return out


def _synthesized_names(entities: list[tuple[str, Any, list[str]]]) -> list[str]:
    names = [
        ERROR_RESPONSE,
        ERROR_ISSUE,
        BATCH_GET_ASPECT_REQUEST,
        ASPECT_HEADERS,
        GENERIC_JSON_PATCH,
        ASPECT_PATCH_REQUEST,
        "JsonPatchOperation",
        "JsonPatch",
        "GenericJsonPatchDocument",
    ]
    for aspect in sorted({a for _, _, aspects in entities for a in aspects}):
        names += [f"{upper_first(aspect)}AspectRequest", f"{upper_first(aspect)}AspectResponse"]
    for entity, _, _ in entities:
        p = upper_first(entity)
        names += [
            f"{p}EntityRequest",
            f"{p}EntityPatchRequest",
            f"{p}EntityResponse",
            f"{p}EntityAspectRequest",
            f"{p}EntityAspectResponse",
            f"{p}BatchGetRequest",
            f"{p}AspectName",
        ]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"generated component names collide: {duplicates}")
    return names


def _system_metadata_schema() -> dict[str, Any]:
    """SystemMetadata's Avro schema, from the installed acryl-datahub package (the default model set)."""
    schemas = Path(str(metadata.distribution("acryl-datahub").locate_file("datahub/metadata/schemas")))
    path = schemas / "SystemMetadata.avsc"
    if path.is_file():
        return json.loads(path.read_text())
    pool = _Pool()
    pool.add_document("MetadataChangeProposal", json.loads((schemas / "MetadataChangeProposal.avsc").read_text()))
    return pool.definitions[SYSTEM_METADATA_RECORD][0].raw


def build_model(registry: EntityRegistry, extra_reserved: Iterable[str] = ()) -> RegistryModel:
    entities = _entity_aspects(registry)
    reserved = frozenset(_synthesized_names(entities)) | frozenset(extra_reserved)

    pool = _Pool()
    tops: dict[str, str] = {}
    for aspect_name in sorted(registry.aspects):
        top = pool.add_document(aspect_name, registry.aspects[aspect_name].schema)
        assert top is not None
        tops[aspect_name] = top
    if SYSTEM_METADATA_RECORD not in pool.definitions:
        pool.add_document("$systemMetadata", _system_metadata_schema())
    if pool.undefined():
        # User .avsc files may reference named types defined only in other documents of the registry's model
        # sources (DataHub's non-aspect files, or another aspect's file): add those documents as fallbacks.
        for source, raw in sorted(getattr(registry, "_documents", None) or (), key=lambda d: str(d[0])):
            pool.add_document(f"$document:{source}", raw, named=False)
        if missing := sorted(pool.undefined()):
            raise ValueError(f"Avro types referenced but defined nowhere in the registry: {missing}")
    own_source = {top: source for source, top in tops.items()}

    # One definition per type: the one from the type's own aspect document if any, else the first (sorted order).
    chosen: dict[str, _Definition] = {}
    for name, defs in pool.definitions.items():
        preferred = [d for d in defs if own_source.get(name) == d.source]
        chosen[name] = (preferred or defs)[0]

    names = _assign_names(chosen, reserved)
    converter = _Converter(chosen, names)
    components: dict[str, dict[str, Any]] = {}
    for name in sorted(chosen):
        schema = converter.definition_schema(chosen[name])
        variants = {json.dumps(converter.definition_schema(d), sort_keys=True) for d in pool.definitions[name]}
        if len(variants) > 1:
            log.warning(
                "Avro type %s is defined differently in %s; using the definition from %s",
                name,
                sorted({d.source for d in pool.definitions[name]}),
                chosen[name].source,
            )
        components[names[name]] = schema

    roots = [names[top] for top in tops.values()] + [names[SYSTEM_METADATA_RECORD]]
    reachable = _reachable(components, roots)
    return RegistryModel(
        components={k: components[k] for k in sorted(reachable)},
        aspect_component={aspect: names[top] for aspect, top in tops.items()},
        system_metadata=names[SYSTEM_METADATA_RECORD],
        entities=entities,
    )


def _refs(node: Any) -> Iterable[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(REF_PREFIX):
            yield ref[len(REF_PREFIX) :]
        for v in node.values():
            yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def _reachable(components: Mapping[str, Any], roots: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(r for r in _refs(components[name]) if r not in seen)
    return seen


def aspect_components(registry: EntityRegistry) -> dict[str, dict[str, Any]]:
    """Component name -> JSON Schema (Pegasus JSON) for every aspect of the registry, every named type nested in
    them, and ``SystemMetadata`` (with ``AuditStamp``). Sorted by component name; ``$ref``s point at
    ``#/components/schemas/<name>``. Raises ValueError for an inconsistent registry (an entity listing an unknown
    aspect, a reference to a type defined nowhere, generated names that collide)."""
    return detached(build_model(registry).components)


def detached(value: Any) -> Any:
    """A copy sharing no object with anything else (the builders reuse small dicts such as ``$ref``s)."""
    return json.loads(json.dumps(value))
