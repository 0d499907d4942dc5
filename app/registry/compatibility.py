"""The checks a runtime model set (app.registry.runtime) passes before it is stored: what can be told from the
schemas alone. The checks against stored data are app.modelset.service's.

Each rule is a small class with a `name` (what a refusal names) and a `check`:
- schema rules compare one node of an aspect's previous runtime schema with the node at the same path of the new one
  (`$.fields.owner.type.items`) and apply in the compatibility modes they list (BACKWARD: the new schema reads what
  the previous one wrote; FULL: both ways; NONE: none apply). metaledger's BACKWARD is stricter than Avro's on one
  point: a removed field is refused, since the stored values carry it and the validator refuses unknown fields;
- model rules look at the whole set against the base models (`model_rules`);
- shape rules look at the proposed set alone, before anything walks its schemas: names (`InvalidName`: one pattern,
  and lengths what a name reaches can hold) and nesting (`SchemaTooDeep`: METALEDGER_MAX_JSON_DEPTH);
- built rules look at the registry the set makes; they are the caller's (app.search.annotations: the fields'
  annotations the indexer reads, `InvalidAnnotation`, `ReservedSearchField`).
`check_models(registry, previous, proposed, max_depth=...)` runs them all and returns the refusals, each naming its
rule, the aspect and the path; the set's build (`build_registry`) problems are refusals too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from app.limits import clip, too_deep
from app.registry.errors import RegistryConfigError
from app.registry.registry import EntityRegistry
from app.registry.runtime import Compatibility, RuntimeAspect, RuntimeModelSet, build_registry

BACKWARD, FULL = Compatibility.BACKWARD, Compatibility.FULL
PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
# What a reader of the key type reads when the writer wrote the value type (Avro's promotions).
PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}


@dataclass(frozen=True, slots=True)
class Refusal:
    rule: str
    message: str
    aspect: str | None = None
    path: str = "$"
    expected: str | None = None  # what the rule accepts there
    found: str | None = None  # what was there (clipped: hostile input)

    def describe(self) -> str:
        where = f"aspect {self.aspect} at {self.path}" if self.aspect else self.path
        return f"{self.rule}: {where}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "aspect": self.aspect,
            "path": self.path,
            "message": self.message,
            **({"expected": self.expected} if self.expected is not None else {}),
            **({"found": self.found} if self.found is not None else {}),
        }


# ----------------------------------------------------------------------------------------------------------------
# Schema nodes
# ----------------------------------------------------------------------------------------------------------------
class Named:
    """The named types (records, enums, fixed) a schema document defines, to resolve references by name."""

    def __init__(self, schema: Any) -> None:
        self.types: dict[str, dict[str, Any]] = {}
        self._collect(schema, None)

    def _collect(self, node: Any, namespace: str | None) -> None:
        if isinstance(node, list):
            for member in node:
                self._collect(member, namespace)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in ("record", "error", "enum", "fixed") and isinstance(node.get("name"), str):
                namespace = node.get("namespace", namespace)
                self.types.setdefault(full_name(node, namespace), node)
                self.types.setdefault(node["name"].rsplit(".", 1)[-1], node)
            for f in node.get("fields") or ():
                self._collect(f.get("type"), namespace)
            for key in ("items", "values"):
                if key in node:
                    self._collect(node[key], namespace)
            if isinstance(kind, (dict, list)):
                self._collect(kind, namespace)

    def resolve(self, node: Any) -> Any:
        if isinstance(node, str) and node not in PRIMITIVES:
            return self.types.get(node, self.types.get(node.rsplit(".", 1)[-1], node))
        if (
            isinstance(node, dict)
            and isinstance(node.get("type"), (str, dict, list))
            and node["type"] not in ("record", "error", "enum", "fixed", "array", "map")
        ):
            return self.resolve(node["type"])  # {"type": "string"}, {"type": {...}}
        return node


def full_name(node: Mapping[str, Any], namespace: str | None = None) -> str:
    name = node["name"]
    ns = node.get("namespace", namespace)
    return name if "." in name or not ns else f"{ns}.{name}"


def kind_of(node: Any) -> str:
    """`record`, `enum`, `array`, `map`, `fixed`, `union`, a primitive, or `ref:<name>` (a type of another
    document, e.g. DataHub's com.linkedin.common.AuditStamp)."""
    if isinstance(node, list):
        return "union"
    if isinstance(node, dict):
        kind = node.get("type")
        return "record" if kind == "error" else str(kind)
    return node if node in PRIMITIVES else f"ref:{node}"


def _member_key(node: Any) -> str:
    kind = kind_of(node)
    return full_name(node) if kind in ("record", "enum", "fixed") else kind


def _reads(reader: Any, writer: Any) -> bool:
    """Whether a value written with `writer`'s type is read with `reader`'s (one level: the types of records'
    fields, items and values are compared by their own nodes)."""
    r, w = kind_of(reader), kind_of(writer)
    if w == "union":
        return all(_reads(reader, member) for member in writer)
    if r == "union":
        return any(_reads(member, writer) for member in reader)
    if r in ("record", "enum", "fixed") and w == r:
        return reader["name"].rsplit(".", 1)[-1] == writer["name"].rsplit(".", 1)[-1]
    return r == w or r in PROMOTIONS.get(w, ())


# ----------------------------------------------------------------------------------------------------------------
# Schema rules: one node of the previous schema and the node at the same path of the new one
# ----------------------------------------------------------------------------------------------------------------
class SchemaRule:
    name: ClassVar[str]
    modes: ClassVar[frozenset[Compatibility]]

    def check(self, path: str, old: Any, new: Any) -> Iterator[tuple[str, str]]:
        """(path, message) of each incompatibility at this node."""
        raise NotImplementedError  # pragma: no cover - interface


class RecordRenamed(SchemaRule):
    name = "RecordRenamed"
    modes = frozenset({BACKWARD, FULL})

    def check(self, path, old, new):
        if kind_of(old) == kind_of(new) == "record" and full_name(old) != full_name(new):
            yield f"{path}.name", f"the record {full_name(old)} is renamed {full_name(new)}"


class FieldRemoved(SchemaRule):
    name = "FieldRemoved"
    modes = frozenset({BACKWARD, FULL})

    def check(self, path, old, new):
        if kind_of(old) == kind_of(new) == "record":
            kept = {f["name"] for f in new.get("fields") or ()}
            for f in old.get("fields") or ():
                if f["name"] not in kept:
                    yield f"{path}.fields.{f['name']}", f"the field {f['name']} is removed (stored values carry it)"


class FieldAddedWithoutDefault(SchemaRule):
    name = "FieldAddedWithoutDefault"
    modes = frozenset({BACKWARD, FULL})

    def check(self, path, old, new):
        if kind_of(old) == kind_of(new) == "record":
            known = {f["name"] for f in old.get("fields") or ()}
            for f in new.get("fields") or ():
                if f["name"] not in known and "default" not in f:
                    yield (
                        f"{path}.fields.{f['name']}",
                        f"the new field {f['name']} has no default (stored values do not have it)",
                    )


class TypeChanged(SchemaRule):
    """BACKWARD: the new type must read the old (Avro's promotions: int → long → float → double, a type → a union
    holding it); FULL: each must read the other."""

    name = "TypeChanged"
    modes = frozenset({BACKWARD, FULL})
    both_ways: ClassVar[bool] = False

    def check(self, path, old, new):
        if kind_of(old) == kind_of(new) in ("record", "enum"):
            return  # the same kind: its name, fields and symbols are the other rules'
        if not _reads(new, old):
            yield path, f"{_describe(old)} cannot be read as {_describe(new)}"


class TypeChangedForward(TypeChanged):
    name = "TypeChangedForward"
    modes = frozenset({FULL})

    def check(self, path, old, new):
        if kind_of(old) != kind_of(new) and _reads(new, old) and not _reads(old, new):
            yield path, f"{_describe(new)} cannot be read as {_describe(old)} by the previous schema"


class EnumNarrowed(SchemaRule):
    name = "EnumNarrowed"
    modes = frozenset({BACKWARD, FULL})

    def check(self, path, old, new):
        if kind_of(old) == kind_of(new) == "enum":
            gone = [s for s in old.get("symbols") or () if s not in (new.get("symbols") or ())]
            if gone:
                yield f"{path}.symbols", f"the symbols {', '.join(gone)} are removed"


class EnumWidened(SchemaRule):
    name = "EnumWidened"
    modes = frozenset({FULL})

    def check(self, path, old, new):
        if kind_of(old) == kind_of(new) == "enum" and "default" not in old:
            added = [s for s in new.get("symbols") or () if s not in (old.get("symbols") or ())]
            if added:
                yield (
                    f"{path}.symbols",
                    f"the symbols {', '.join(added)} are added (the previous schema cannot read them)",
                )


SCHEMA_RULES: tuple[SchemaRule, ...] = (
    RecordRenamed(),
    FieldRemoved(),
    FieldAddedWithoutDefault(),
    TypeChanged(),
    TypeChangedForward(),
    EnumNarrowed(),
    EnumWidened(),
)


def _describe(node: Any) -> str:
    kind = kind_of(node)
    if kind == "union":
        return "[" + ", ".join(_describe(m) for m in node) + "]"
    if kind in ("record", "enum", "fixed"):
        return f"{kind} {full_name(node)}"
    if kind == "array":
        return "array"
    if kind == "map":
        return "map"
    return kind.removeprefix("ref:")


def schema_refusals(
    aspect: str,
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    mode: Compatibility,
    rules: tuple[SchemaRule, ...] = SCHEMA_RULES,
) -> list[Refusal]:
    """The refusals of changing `aspect`'s schema from `old` to `new` in `mode`."""
    active = [r for r in rules if mode in r.modes]
    old_named, new_named = Named(old), Named(new)
    refusals: list[Refusal] = []
    seen: set[tuple[str, str]] = set()

    def walk(path: str, old_node: Any, new_node: Any) -> None:
        old_node, new_node = old_named.resolve(old_node), new_named.resolve(new_node)
        found = [
            Refusal(rule.name, message, aspect, where)
            for rule in active
            for where, message in rule.check(path, old_node, new_node)
        ]
        refusals.extend(found)
        if any(r.path == path for r in found):
            return  # a retyped node: what is below it does not compare
        kind = kind_of(old_node)
        if kind != kind_of(new_node):
            if kind_of(new_node) == "union":  # a type made optional: compare with its member of the same kind
                match = [m for m in new_node if _member_key(new_named.resolve(m)) == _member_key(old_node)]
                if match:
                    walk(path, old_node, match[0])
            return
        if kind == "record":
            key = (full_name(old_node), full_name(new_node))
            if key in seen:
                return
            seen.add(key)
            new_fields = {f["name"]: f for f in new_node.get("fields") or ()}
            for f in old_node.get("fields") or ():
                if f["name"] in new_fields:
                    walk(f"{path}.fields.{f['name']}.type", f["type"], new_fields[f["name"]]["type"])
        elif kind in ("array", "map"):
            child = "items" if kind == "array" else "values"
            walk(f"{path}.{child}", old_node[child], new_node[child])
        elif kind == "union":
            new_members = {_member_key(new_named.resolve(m)): m for m in new_node}
            for member in old_node:
                member_key = _member_key(old_named.resolve(member))
                if member_key in new_members and member_key not in PRIMITIVES:
                    walk(f"{path}[{member_key}]", member, new_members[member_key])

    walk("$", old, new)
    return refusals


# ----------------------------------------------------------------------------------------------------------------
# Model rules: the whole proposed set against the base models and the set in force
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ModelChange:
    registry: EntityRegistry  # in force: the base models plus `previous`
    previous: RuntimeModelSet
    proposed: RuntimeModelSet
    max_depth: int  # METALEDGER_MAX_JSON_DEPTH: how deep a schema (and so a value of it) may nest

    def base_aspects(self) -> set[str]:
        return {name for name in self.registry.aspects if not self.registry.is_runtime(name)}

    def base_entities(self) -> set[str]:
        return {
            name.lower() for name, e in self.registry.entities.items() if not self.registry.is_runtime(e.key_aspect)
        }


class ModelRule:
    name: ClassVar[str]

    def check(self, change: ModelChange) -> Iterator[Refusal]:
        raise NotImplementedError  # pragma: no cover - interface


class RedefinesBaseAspect(ModelRule):
    name = "RedefinesBaseAspect"

    def check(self, change):
        base = change.base_aspects()
        for name in change.proposed.aspects:
            if name in base:
                yield Refusal(
                    self.name,
                    f"{name} is an aspect of the base models, which a runtime model cannot redefine",
                    name,
                    "$.schema.Aspect.name",
                )


class AspectKindChanged(ModelRule):
    name = "AspectKindChanged"

    def check(self, change):
        for name, new in change.proposed.aspects.items():
            old = change.previous.aspects.get(name)
            if old is not None and _aspect_kind(old) != _aspect_kind(new):
                yield Refusal(
                    self.name, f"a {_aspect_kind(old)} aspect cannot become {_aspect_kind(new)}", name, "$.Aspect.type"
                )


class NewEntityNeedsKey(ModelRule):
    name = "NewEntityNeedsKey"

    def check(self, change):
        base = change.base_entities()
        for i, entity in enumerate(change.proposed.entities):
            if entity.name.lower() not in base and not entity.key_aspect:
                yield Refusal(
                    self.name,
                    f"entity {entity.name} is not a base entity: a new entity needs a keyAspect",
                    None,
                    f"$.entities[{i}].keyAspect",
                )


class KeyAspectChanged(ModelRule):
    name = "KeyAspectChanged"

    def check(self, change):
        before = {e.name: e.key_aspect for e in change.previous.entities if e.key_aspect}
        for i, entity in enumerate(change.proposed.entities):
            old = before.get(entity.name)
            if old is not None and entity.key_aspect != old:
                yield Refusal(
                    self.name,
                    f"entity {entity.name}'s key aspect is {old}; it cannot change (its URNs are made of it)",
                    None,
                    f"$.entities[{i}].keyAspect",
                )


class SchemaCompatibility(ModelRule):
    """Each aspect of the previous set against its new schema, in the new schema's mode."""

    name = "SchemaCompatibility"

    def check(self, change):
        for name, new in change.proposed.aspects.items():
            old = change.previous.aspects.get(name)
            if old is not None and old.schema != new.schema:
                yield from schema_refusals(name, old.schema, new.schema, new.compatibility)


MODEL_RULES: tuple[ModelRule, ...] = (
    RedefinesBaseAspect(),
    AspectKindChanged(),
    NewEntityNeedsKey(),
    KeyAspectChanged(),
    SchemaCompatibility(),
)


# ----------------------------------------------------------------------------------------------------------------
# Shape rules: the proposed set alone, before anything walks its schemas (a schema nested too deep would overflow
# the walks of the other rules and of the build)
# ----------------------------------------------------------------------------------------------------------------
# The names of runtime entities and aspects (and of the search document fields and relationships their annotations
# declare): what DataHub's own are (lower camel case, `dataset`, `browsePathsV2`), and what every place a name reaches
# can hold: a GraphQL type name (`[_A-Za-z][_0-9A-Za-z]*`: an entity's name in PascalCase), an Avro name (the
# per-aspect events' records), an Elasticsearch index or field name (no leading `_`, `-` or `+`; `.` would make an
# object path), a Kafka topic name (`[A-Za-z0-9._-]`), a Postgres LIKE prefix.
NAME_PATTERN = "^[A-Za-z][A-Za-z0-9_]*$"
NAME = re.compile(NAME_PATTERN[1:-1])
# The longest names. DataHub's longest are 23 characters (dataHubExecutionRequest) and 37
# (editableERModelRelationshipProperties). An aspect's name is a key column (metadata_aspect_v2, change_log_outbox and
# the index failures hold 200 characters); an entity's starts each of its URNs (500 in all); both make a timeseries
# index's name (`{prefix}{entity}_{aspect}aspect_v1`: 255 bytes) and the per-aspect events' topic names
# (`FailedMetadataChangeEvent_v5.{entity}.{aspect}`: 249), which 64 + 100 leave room in.
MAX_ENTITY_NAME_CHARS = 64
MAX_ASPECT_NAME_CHARS = 100
MAX_FIELD_NAME_CHARS = 100  # a search document field's, a relationship's


def bad_name(
    name: Any, what: str, limit: int, path: str, aspect: str | None = None, rule: str = "InvalidName"
) -> Refusal | None:
    """The refusal of a name outside NAME_PATTERN or longer than `limit`, or None."""
    if isinstance(name, str) and len(name) <= limit and NAME.fullmatch(name):
        return None
    found = clip(name, 100) if isinstance(name, str) else clip(repr(name), 100)
    if not isinstance(name, str):
        reason = "is not a string"
    elif len(name) > limit:
        reason = f"is {len(name)} characters long; the limit is {limit}"
    else:
        reason = "is not a letter followed by letters, digits or _"
    return Refusal(
        rule,
        f"the {what} {found!r} {reason}",
        aspect,
        path,
        expected=f"{NAME_PATTERN}, at most {limit} characters",
        found=found,
    )


class InvalidName(ModelRule):
    """Runtime aspects' names, the entity a key aspect declares (`keyForEntity`) and the entities' names."""

    name = "InvalidName"

    def check(self, change):
        for i, (name, aspect) in enumerate(change.proposed.aspects.items()):
            where = f"$.aspects[{i}].schema.Aspect"
            refusal = bad_name(name, "aspect name", MAX_ASPECT_NAME_CHARS, f"{where}.name")
            if refusal is not None:
                yield refusal
                continue
            annotation = aspect.schema.get("Aspect")
            if isinstance(annotation, dict) and "keyForEntity" in annotation:
                refusal = bad_name(
                    annotation["keyForEntity"], "entity name", MAX_ENTITY_NAME_CHARS, f"{where}.keyForEntity"
                )
                if refusal is not None:
                    yield refusal
        for i, entity in enumerate(change.proposed.entities):
            refusal = bad_name(entity.name, "entity name", MAX_ENTITY_NAME_CHARS, f"$.entities[{i}].name")
            if refusal is not None:
                yield refusal


class SchemaTooDeep(ModelRule):
    """A schema nested deeper than METALEDGER_MAX_JSON_DEPTH (what a request body, and so a value, may nest): its
    walks would overflow, and its stored form (JSON text) could not be written."""

    name = "SchemaTooDeep"

    def check(self, change):
        limit = change.max_depth
        for name, aspect in change.proposed.aspects.items():
            where = too_deep(aspect.schema, limit)
            if where is not None:
                yield too_deep_refusal(self.name, name, where, limit)


def too_deep_refusal(rule: str, aspect: str, where: str, limit: int) -> Refusal:
    return Refusal(
        rule,
        f"the schema is nested more than {limit} levels deep (METALEDGER_MAX_JSON_DEPTH) at {clip(where)}",
        aspect,
        clip(where),
        expected=f"at most {limit} levels",
    )


def is_bool(value: Any) -> bool:  # DataHub's schemas write some as "true" (app.search.documents reads both)
    return isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in ("true", "false"))


def is_str(value: Any) -> bool:
    return isinstance(value, str)


def is_object(value: Any) -> bool:
    return isinstance(value, dict)


def is_strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


BOOLEAN = (is_bool, 'a boolean (true, false, "true" or "false")')
STRING = (is_str, "a string")
# The Aspect annotation's properties that the registry, GraphQL and the entity registry API read (its name and
# keyForEntity are InvalidName's).
ASPECT_PROPERTIES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "type": (lambda v: v in ("versioned", "timeseries"), "versioned or timeseries"),
    "entityAspects": (is_strings, "a list of strings"),
    "entityCategory": STRING,
    "entityDoc": STRING,
    "autoRender": BOOLEAN,
    "renderSpec": (is_object, "an object"),
}
RENDER_SPEC_PROPERTIES = ("displayType", "displayName", "key")  # GraphQL's RenderSpec: strings


class InvalidAspectAnnotation(ModelRule):
    """The Aspect annotation's properties that are read: their types (renderSpec: GraphQL's strings)."""

    name = "InvalidAnnotation"

    def check(self, change):
        for name, aspect in change.proposed.aspects.items():
            annotation = aspect.schema.get("Aspect")
            for key, (accepts, expected) in ASPECT_PROPERTIES.items():
                if isinstance(annotation, dict) and key in annotation and not accepts(annotation[key]):
                    yield invalid(self.name, name, f"$.Aspect.{key}", annotation[key], expected)
            spec = annotation.get("renderSpec") if isinstance(annotation, dict) else None
            for key in RENDER_SPEC_PROPERTIES if isinstance(spec, dict) else ():
                if spec.get(key) is not None and not isinstance(spec[key], str):
                    yield invalid(self.name, name, f"$.Aspect.renderSpec.{key}", spec[key], "a string")


def invalid(rule: str, aspect: str, path: str, value: Any, expected: str) -> Refusal:
    found = clip(repr(value), 100)
    return Refusal(rule, f"{found} is not {expected}", aspect, clip(path), expected=expected, found=found)


SHAPE_RULES: tuple[ModelRule, ...] = (InvalidName(), SchemaTooDeep(), InvalidAspectAnnotation())


def _aspect_kind(aspect: RuntimeAspect) -> str:
    return "timeseries" if (aspect.schema.get("Aspect") or {}).get("type") == "timeseries" else "versioned"


@dataclass(frozen=True, slots=True)
class CheckedModels:
    """The outcome of `check_models`: the refusals, or (none) the registry the set makes."""

    refusals: list[Refusal]
    built: EntityRegistry | None


# A rule on the registry a set makes (the set, the nesting limit): what the layers above the registry read of it,
# e.g. the indexer's annotations (app.search.annotations), given by the caller (app.modelset.service).
BuiltRule = Callable[[EntityRegistry, RuntimeModelSet, int], Iterable[Refusal]]


def check_models(
    registry: EntityRegistry,
    previous: RuntimeModelSet,
    proposed: RuntimeModelSet,
    rules: tuple[ModelRule, ...] = MODEL_RULES,
    *,
    max_depth: int,
    built_rules: Sequence[BuiltRule] = (),
) -> CheckedModels:
    """The shape rules (names, nesting past `max_depth`, METALEDGER_MAX_JSON_DEPTH), then (if none refused) every
    model rule, then the build of the base models plus `proposed`, which compiles every runtime schema with the
    registry's validator (its problems, or whatever it raises, are `DoesNotCompile` refusals), then `built_rules` on
    the registry it makes. Each stage runs only when the ones before refused nothing."""
    change = ModelChange(registry, previous, proposed, max_depth)
    for stage in (SHAPE_RULES, rules):
        refusals = [refusal for rule in stage for refusal in rule.check(change)]
        if refusals:
            return CheckedModels(refusals, None)
    try:
        built = build_registry(registry, proposed)
    except RegistryConfigError as error:
        return CheckedModels(
            [
                Refusal("DoesNotCompile", clip(problem, 1000), _named_aspect(problem, proposed))
                for problem in error.problems
            ],
            None,
        )
    except Exception as error:  # noqa: BLE001 - whatever a schema makes the build raise is a refusal, never a 500
        return CheckedModels(
            [Refusal("DoesNotCompile", clip(f"the model set does not build: {type(error).__name__}: {error}", 1000))],
            None,
        )
    refusals = [refusal for rule in built_rules for refusal in rule(built, proposed, max_depth)]
    return CheckedModels(refusals, None if refusals else built)


def _named_aspect(problem: str, proposed: RuntimeModelSet) -> str | None:
    return next(
        (
            name
            for name in proposed.aspects
            if name in problem.split() or f"{name}:" in problem or f"model {name}" in problem
        ),
        None,
    )
