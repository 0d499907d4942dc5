"""From DataHub's generated Avro (.avsc) back to the Pegasus data model the wire format follows.

DataHub's .avsc files are generated from PDL, so a few Avro shapes encode Pegasus concepts:

* a record field typed ``["null", T]`` (or ``[T, "null"]`` with a default) is a Pegasus *optional* field: on the
  wire the plain value, or absent (JSON null is treated as absent);
* any other union is a Pegasus union: on the wire an object with exactly one member key. Member keys are the
  full name of named members with ``pegasus2avro.`` removed (``com.linkedin.schema.StringType``) and the type
  name of the others (``string``, ``double``, ``array``, ``map``). An optional field whose type has several
  non-null branches (``["null", A, B]``) is an optional union: absent, or ``{"<member>": value}``;
* a record with a ``fieldDiscriminator`` enum field is a Pegasus *union with aliases* (``union[costId: double,
  costCode: string]``): on the wire ``{"costCode": "x"}``.

This module parses one .avsc document into a small type graph (named types resolved; recursion allowed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
# Field-level keys that are Avro structure; every other key on a field is an annotation (Searchable, Urn, ...).
FIELD_STRUCTURE_KEYS = frozenset({"name", "type", "doc", "default", "aliases", "order"})

MISSING: Any = type("_Missing", (), {"__repr__": lambda self: "MISSING"})()


def canonical_name(fullname: str) -> str:
    """``com.linkedin.pegasus2avro.schema.SchemaField`` → ``com.linkedin.schema.SchemaField``."""
    return fullname.replace("pegasus2avro.", "", 1)


class SchemaError(ValueError):
    """An .avsc document that cannot be interpreted."""


@dataclass(eq=False)
class Type:
    kind: str  # primitive name | "enum" | "fixed" | "array" | "map" | "record" | "union" | "aliased_union"

    def describe(self) -> str:
        return self.kind


@dataclass(eq=False)
class Primitive(Type):
    def describe(self) -> str:
        return self.kind


@dataclass(eq=False)
class Enum(Type):
    name: str = ""  # canonical full name
    symbols: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"enum {self.name}"


@dataclass(eq=False)
class Fixed(Type):
    name: str = ""
    size: int = 0

    def describe(self) -> str:
        return f"fixed {self.name} ({self.size} bytes)"


@dataclass(eq=False)
class Array(Type):
    items: Type

    def describe(self) -> str:
        return "array"


@dataclass(eq=False)
class Map(Type):
    values: Type

    def describe(self) -> str:
        return "object (map)"


@dataclass(eq=False)
class Field:
    name: str
    type: Type
    optional: bool  # Pegasus optional: may be absent; JSON null means absent
    default: Any  # Pegasus-form default, or MISSING
    annotations: dict[str, Any]
    doc: str | None = None
    urn_entity: str | None = None  # set for URN-typed fields: "" = any entity type, else e.g. "dataset"
    urn_is_array: bool = False  # the URN annotation applies to the items of an array-typed field


@dataclass(eq=False)
class Record(Type):
    name: str = ""  # canonical full name
    avro_name: str = ""
    fields: list[Field] = field(default_factory=list)
    doc: str | None = None
    raw: dict[str, Any] | None = None

    def describe(self) -> str:
        return f"object (record {self.name})"


@dataclass(eq=False)
class Union(Type):
    members: list[tuple[str, Type]] = field(default_factory=list)  # (member key, type); never "null"
    has_null: bool = False  # a Pegasus union with a null member (not an optional field): JSON null allowed

    def describe(self) -> str:
        return "union"


@dataclass(eq=False)
class AliasedUnion(Type):
    name: str = ""  # canonical full name of the generated Avro record
    members: list[tuple[str, Type]] = field(default_factory=list)  # (alias, type)

    def describe(self) -> str:
        return f"union {self.name}"


def member_key(t: Type) -> str:
    """The Pegasus union member key of a type."""
    if isinstance(t, (Record, Enum, Fixed, AliasedUnion)):
        return t.name
    return t.kind


def urn_entity_for(annotation: Any, java_class: str | None) -> str | None:
    """Entity type a URN-typed field requires: "" for any URN, e.g. "dataset" for DatasetUrn, None if not a URN."""
    cls = annotation if isinstance(annotation, str) else None
    if cls is None and java_class and java_class.endswith("Urn"):
        cls = java_class.rsplit(".", 1)[-1]
    if cls is None:
        return None
    cls = cls.rsplit(".", 1)[-1]
    if cls == "Urn" or not cls.endswith("Urn"):
        return ""
    base = cls[: -len("Urn")]
    # DatasetUrn -> dataset, CorpGroupUrn -> corpGroup, MLFeatureUrn -> mlFeature (a leading acronym is lowered)
    run = len(base) - len(base.lstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    cut = run - 1 if 1 < run < len(base) else max(run, 1)
    return base[:cut].lower() + base[cut:]


# name -> (raw schema, namespace it was defined in) or None
Resolver = Callable[[str], "tuple[dict[str, Any], str | None] | None"]


class SchemaParser:
    """Parses one self-contained .avsc document. ``fallback`` resolves names the document does not define
    (used for user .avsc files that reference DataHub's shared types such as ``com.linkedin.common.AuditStamp``)."""

    def __init__(self, fallback: Resolver | None = None) -> None:
        self.named: dict[str, Type] = {}
        self.fallback = fallback
        self._defaults: list[tuple[Field, Any]] = []

    # -- names --------------------------------------------------------------------------------------------
    def _full(self, name: str, namespace: str | None) -> str:
        if "." in name or not namespace:
            return name
        return f"{namespace}.{name}"

    def _register(self, fullname: str, t: Type) -> None:
        self.named[fullname] = t
        self.named[canonical_name(fullname)] = t

    def _lookup(self, ref: str, namespace: str | None) -> Type:
        for cand in (ref, self._full(ref, namespace), canonical_name(ref)):
            if cand in self.named:
                return self.named[cand]
        if self.fallback is not None:
            for cand in (self._full(ref, namespace), ref):
                found = self.fallback(cand)
                if found is not None:
                    return self._parse(found[0], found[1])
        raise SchemaError(f"unknown type {ref!r}")

    # -- parsing ------------------------------------------------------------------------------------------
    def parse(self, raw: Any) -> Type:
        t = self._parse(raw, None)
        # Defaults are converted once every named type is known (a default may use a type defined later).
        pending, self._defaults = self._defaults, []
        for f, avro_default in pending:
            f.default = avro_default_to_pegasus(f.type, avro_default, f.optional)
        return t

    def _parse(self, raw: Any, namespace: str | None) -> Type:
        if isinstance(raw, str):
            if raw in PRIMITIVES:
                return Primitive(raw)
            return self._lookup(raw, namespace)
        if isinstance(raw, list):
            return self._union(raw, namespace, in_field=False)[0]
        if not isinstance(raw, dict) or "type" not in raw:
            raise SchemaError(f"not an Avro schema: {raw!r:.80}")
        kind = raw["type"]
        if kind in ("record", "error"):
            return self._record(raw, namespace)
        if kind == "enum":
            fullname = self._full(raw["name"], raw.get("namespace", namespace))
            if fullname in self.named:
                return self.named[fullname]
            enum = Enum("enum", canonical_name(fullname), tuple(raw["symbols"]))
            self._register(fullname, enum)
            return enum
        if kind == "fixed":
            fullname = self._full(raw["name"], raw.get("namespace", namespace))
            if fullname in self.named:
                return self.named[fullname]
            fixed = Fixed("fixed", canonical_name(fullname), int(raw["size"]))
            self._register(fullname, fixed)
            return fixed
        if kind == "array":
            return Array("array", self._parse(raw["items"], namespace))
        if kind == "map":
            return Map("map", self._parse(raw["values"], namespace))
        if isinstance(kind, (dict, list)) or kind in PRIMITIVES:
            # {"type": "string", "logicalType": ...} or a nested schema in "type"
            return self._parse(kind, namespace)
        return self._lookup(kind, namespace)

    def _union(self, raw: list[Any], namespace: str | None, *, in_field: bool) -> tuple[Type, bool]:
        """Returns (type, optional). In a field, a null branch makes the field optional."""
        has_null = "null" in raw
        members = [self._parse(b, namespace) for b in raw if b != "null"]
        if in_field and has_null:
            if len(members) == 1:
                return members[0], True
            if not members:
                return Primitive("null"), True
            return Union("union", [(member_key(m), m) for m in members], False), True
        return Union("union", [(member_key(m), m) for m in members], has_null), False

    def _record(self, raw: dict[str, Any], namespace: str | None) -> Type:
        ns = raw.get("namespace", namespace)
        avro_full = self._full(raw["name"], ns)
        if avro_full in self.named:
            return self.named[avro_full]
        ns = avro_full.rpartition(".")[0] or None
        rec = Record("record", canonical_name(avro_full), avro_full, [], raw.get("doc"), raw)
        self._register(avro_full, rec)
        for rf in raw.get("fields", []):
            rec.fields.append(self._field(rf, ns))
        disc = next((f for f in rec.fields if f.name == "fieldDiscriminator"), None)
        if disc is not None and isinstance(disc.type, Enum):
            # Pegasus union with aliases, generated as a record of optional fields + a discriminator enum.
            alias = AliasedUnion(
                "aliased_union",
                rec.name,
                [(f.name, f.type) for f in rec.fields if f is not disc and f.name in disc.type.symbols],
            )
            self._register(avro_full, alias)
            return alias
        return rec

    def _field(self, rf: dict[str, Any], namespace: str | None) -> Field:
        rtype = rf["type"]
        if isinstance(rtype, list):
            t, optional = self._union(rtype, namespace, in_field=True)
        else:
            t, optional = self._parse(rtype, namespace), False
        annotations = {k: v for k, v in rf.items() if k not in FIELD_STRUCTURE_KEYS}
        java = rf.get("java")
        java_class = java.get("class") if isinstance(java, dict) else None
        f = Field(
            name=rf["name"],
            type=t,
            optional=optional,
            default=MISSING,
            annotations=annotations,
            doc=rf.get("doc"),
            urn_entity=urn_entity_for(rf.get("Urn"), java_class),
            urn_is_array=bool(rf.get("urn_is_array")),
        )
        if "default" in rf:
            self._defaults.append((f, rf["default"]))
        return f


def avro_default_to_pegasus(t: Type, value: Any, optional: bool = False) -> Any:
    """Convert an Avro-JSON default (union values unwrapped, first branch) to the Pegasus wire form.

    Returns MISSING for "no default" (an optional field defaulting to null)."""
    if value is None and (optional or t.kind == "null" or (isinstance(t, Union) and t.has_null)):
        return MISSING if optional else None
    if isinstance(t, Record):
        out: dict[str, Any] = {}
        if not isinstance(value, dict):
            raise SchemaError(f"default for record {t.name} is not an object: {value!r:.80}")
        for f in t.fields:
            if f.name in value:
                v = avro_default_to_pegasus(f.type, value[f.name], f.optional)
            else:
                v = f.default
            if v is not MISSING:
                out[f.name] = v
        return out
    if isinstance(t, AliasedUnion):
        if isinstance(value, dict) and "fieldDiscriminator" in value:
            key = value["fieldDiscriminator"]
            member = dict(t.members)[key]
            return {key: avro_default_to_pegasus(member, value.get(key))}
        raise SchemaError(f"default for union {t.name} has no fieldDiscriminator")
    if isinstance(t, Union):
        # Avro: a union default is a value of the first branch.
        key, member = t.members[0]
        return {key: avro_default_to_pegasus(member, value)}
    if isinstance(t, Array):
        return [avro_default_to_pegasus(t.items, v) for v in value]
    if isinstance(t, Map):
        return {k: avro_default_to_pegasus(t.values, v) for k, v in value.items()}
    if t.kind in ("float", "double") and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def iter_named_schemas(raw: Any, namespace: str | None = None):
    """Yield (avro full name, raw schema, enclosing namespace) of every named type defined in a raw .avsc document."""
    if isinstance(raw, list):
        for b in raw:
            yield from iter_named_schemas(b, namespace)
        return
    if not isinstance(raw, dict):
        return
    kind = raw.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        full = raw["name"] if "." in raw["name"] else f"{raw.get('namespace', namespace)}.{raw['name']}"
        yield full, raw, namespace
        ns = full.rpartition(".")[0]
        for f in raw.get("fields", []) if kind != "enum" else []:
            yield from iter_named_schemas(f.get("type"), ns)
    elif kind == "array":
        yield from iter_named_schemas(raw.get("items"), namespace)
    elif kind == "map":
        yield from iter_named_schemas(raw.get("values"), namespace)
    elif isinstance(kind, (dict, list)):
        yield from iter_named_schemas(kind, namespace)
