"""The entity registry: entities, their aspects and the aspect schemas, loaded from ``entity_registry.yml``.

See the package docstring (``app/registry/__init__.py``) for the file format and the public API.
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from app.registry.errors import (
    AspectNotAllowedError,
    AspectValidationError,
    KeyValidationError,
    RegistryConfigError,
    UnknownAspectError,
    UnknownEntityError,
    UrnKeyError,
)
from app.registry.schema import (
    AliasedUnion,
    Array,
    Map,
    Record,
    SchemaParser,
    Type,
    Union,
    canonical_name,
    iter_named_schemas,
)
from app.registry.validator import CompiledValidator

try:  # orjson is a project dependency; fall back to json for robustness
    import orjson as _orjson

    def _json_loads(data: bytes) -> Any:
        return _orjson.loads(data)

except ImportError:  # pragma: no cover
    import json as _json

    def _json_loads(data: bytes) -> Any:
        return _json.loads(data)


DEFAULT_PACKAGE = "acryl-datahub"
# metaledger's own entity (metaledgerSystem: its configuration kept as versioned aspects, e.g. the change-processor
# pipeline). Always loaded, after the configured sources, whatever entity_registry.yml lists.
SYSTEM_MODELS = Path(__file__).parent / "system_models"
DEFAULT_PACKAGE_SCHEMAS = "datahub/metadata/schemas"
# The `source` of an aspect registered at run time (app.registry.runtime): "runtime model <name>".
RUNTIME_SOURCE = "runtime model"
VALID_KEYS_KEPT = 16_384  # (entity, URN) pairs check_urn_key remembers: a few MB with their URNs at most
log = logging.getLogger("metaledger.registry")
# Key aspects carry the entity definition in their @Aspect annotation; these keys are not aspect properties.
_ENTITY_ANNOTATION_KEYS = ("keyForEntity", "entityCategory", "entityAspects", "entityDoc")


@dataclass(frozen=True, slots=True)
class FieldAnnotation:
    """The annotations of one field, reachable at ``path`` inside the aspect.

    ``path`` uses DataHub's PathSpec form: ``/fields/*/globalTags/tags/*/tag`` (``*`` for array items and map
    values, the member key for union members). ``annotations`` holds the raw field properties that are not Avro
    structure: ``Searchable``, ``Relationship``, ``TimeseriesField``, ``Urn``, ``UrnValidation``, ``java``, ..."""

    path: str
    field: str
    record: str
    annotations: dict[str, Any]


@dataclass(eq=False)
class AspectSpec:
    """One aspect: its name, its schema and a compiled validator (built on first use)."""

    name: str
    record_name: str  # Pegasus full name, e.g. "com.linkedin.common.GlobalTags"
    is_timeseries: bool
    schema: dict[str, Any]  # the raw .avsc document (do not mutate)
    annotation: dict[str, Any]  # the raw @Aspect annotation (name, type, schemaVersion, keyForEntity, ...)
    source: str  # file the schema came from
    is_key: bool = False
    key_for: str | None = None  # entity name, for key aspects
    _registry: EntityRegistry | None = field(default=None, repr=False)
    _type: Record | None = field(default=None, repr=False)
    _validators: dict[tuple[bool, bool], CompiledValidator] = field(default_factory=dict, repr=False)
    _field_annotations: tuple[FieldAnnotation, ...] | None = field(default=None, repr=False)
    _effective: dict[str, dict[str, Any]] | None = field(default=None, repr=False)
    _default_validator: CompiledValidator | None = field(default=None, repr=False)

    @property
    def schema_version(self) -> int:
        v = self.annotation.get("schemaVersion", 1)
        return int(v) if isinstance(v, (int, str)) and str(v).isdigit() else 1

    @property
    def type(self) -> Record:
        """The parsed schema (a :class:`app.registry.schema.Record`)."""
        if self._type is None:
            fallback = self._registry._resolve_named if self._registry is not None else None
            t = SchemaParser(fallback).parse(self.schema)
            if not isinstance(t, Record):
                raise RegistryConfigError([f"aspect {self.name} ({self.source}) is not a record schema"])
            self._type = t
        return self._type

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.type.fields)

    def validator(
        self, *, trim_unknown_fields: bool | None = None, strict_urns: bool | None = None
    ) -> CompiledValidator:
        """The compiled validator (compiled once per mode, thread-safe)."""
        reg = self._registry
        trim = trim_unknown_fields if trim_unknown_fields is not None else (reg.trim_unknown_fields if reg else False)
        strict = strict_urns if strict_urns is not None else (reg.strict_urns if reg else True)
        mode = (trim, strict)
        v = self._validators.get(mode)
        if v is None:
            with _COMPILE_LOCK:
                v = self._validators.get(mode)
                if v is None:
                    v = CompiledValidator(self.type, label=self.name, trim_unknown=trim, strict_urns=strict)
                    self._validators[mode] = v
        return v

    def validate(self, value: object) -> dict:
        """Validate a Pegasus-JSON aspect value; returns a new normalized dict or raises AspectValidationError."""
        v = self._default_validator
        if v is None:
            v = self._default_validator = self.validator()
        return v(value)

    @property
    def field_annotations(self) -> tuple[FieldAnnotation, ...]:
        """Raw annotations of every field, as written in the schema, with the field's path."""
        if self._field_annotations is None:
            self._field_annotations = tuple(_walk_annotations(self.type, "", set()))
        return self._field_annotations

    @property
    def annotations_by_path(self) -> dict[str, dict[str, Any]]:
        """Annotations with Pegasus path overrides applied: an annotation written on an array field as
        ``{"Searchable": {"/*/tag": {...}}}`` (path keys) is moved to the path it targets (``/tags/*/tag``).
        Paths without annotations are absent."""
        if self._effective is None:
            eff: dict[str, dict[str, Any]] = {}
            for fa in self.field_annotations:
                for name, value in fa.annotations.items():
                    if (
                        isinstance(value, dict)
                        and value
                        and all(isinstance(k, str) and k.startswith("/") for k in value)
                    ):
                        for sub, v in value.items():
                            eff.setdefault(fa.path + sub, {})[name] = v
                    else:
                        eff.setdefault(fa.path, {})[name] = value
            self._effective = eff
        return self._effective


def _walk_annotations(t: Type, prefix: str, stack: set[int]) -> Iterator[FieldAnnotation]:
    if isinstance(t, Record):
        if id(t) in stack:
            return
        stack.add(id(t))
        for f in t.fields:
            path = f"{prefix}/{f.name}"
            if f.annotations:
                yield FieldAnnotation(path, f.name, t.name, f.annotations)
            yield from _walk_annotations(f.type, path, stack)
        stack.discard(id(t))
    elif isinstance(t, Array):
        yield from _walk_annotations(t.items, prefix + "/*", stack)
    elif isinstance(t, Map):
        yield from _walk_annotations(t.values, prefix + "/*", stack)
    elif isinstance(t, (Union, AliasedUnion)):
        for key, m in t.members:
            yield from _walk_annotations(m, f"{prefix}/{key}", stack)


_COMPILE_LOCK = threading.RLock()


@dataclass(frozen=True, eq=False)
class EntitySpec:
    name: str
    key_aspect: str
    aspect_names: frozenset[str]  # includes the key aspect
    category: str | None = None
    doc: str | None = None
    aspects_in_order: tuple[str, ...] = ()  # key aspect first, then in definition order
    extra: dict[str, Any] = field(default_factory=dict)  # other yml properties (e.g. searchGroup)


@dataclass(eq=False)
class EntityRegistry:
    entities: dict[str, EntitySpec]
    aspects: dict[str, AspectSpec]
    trim_unknown_fields: bool = False
    strict_urns: bool = True
    path: Path | None = None
    config: dict[str, Any] = field(default_factory=dict)  # the raw yml (events, plugins, ...)
    warnings: list[str] = field(default_factory=list)
    load_seconds: float = 0.0
    _by_lower: dict[str, EntitySpec] = field(default_factory=dict, repr=False)
    _documents: list[tuple[str, Any]] = field(default_factory=list, repr=False)
    _named_index: dict[str, tuple[dict[str, Any], str | None]] | None = field(default=None, repr=False)
    # Models registered at run time (app.registry.runtime): the stored version in force (0: none), and a counter
    # bumped by every `replace_with`, for holders of state derived from the registry.
    runtime_version: int = 0
    generation: int = 0
    _listeners: list[Callable[[EntityRegistry], None]] = field(default_factory=list, repr=False)
    _valid_keys: set[tuple[str, str]] = field(default_factory=set, init=False, repr=False)  # check_urn_key's memo

    def __post_init__(self) -> None:
        self._by_lower = {name.lower(): spec for name, spec in self.entities.items()}
        for a in self.aspects.values():
            a._registry = self

    # -- models registered at run time ------------------------------------------------------------------------
    def on_change(self, listener: Callable[[EntityRegistry], None]) -> Callable[[], None]:
        """Call `listener(registry)` after every `replace_with` (state derived from the entities and aspects:
        routes, documents, mappings). A listener that raises is logged; the others still run. Returns the function
        that removes it (for holders that live shorter than the registry)."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def replace_with(self, other: EntityRegistry, runtime_version: int) -> None:
        """Take `other`'s entities and aspects (this registry's base models plus a runtime model set) in place, so
        every holder of this object sees them. Called on the event loop: no coroutine sees half of the swap."""
        for a in other.aspects.values():
            a._registry = self
        self.entities, self.aspects, self._by_lower = other.entities, other.aspects, other._by_lower
        self._documents, self._named_index, self.warnings = other._documents, other._named_index, other.warnings
        self.runtime_version = runtime_version
        self.generation += 1
        self._valid_keys = set()
        for listener in list(self._listeners):
            try:
                listener(self)
            except Exception:
                log.exception("a registry listener failed", extra={"generation": self.generation})

    def is_runtime(self, aspect: str) -> bool:
        """Whether `aspect` was registered at run time (not by the base models)."""
        spec = self.aspects.get(aspect)
        return spec is not None and spec.source.startswith(RUNTIME_SOURCE)

    # -- lookups ------------------------------------------------------------------------------------------
    def entity(self, name: str) -> EntitySpec:
        """Entity by name, case-insensitively (as DataHub). Raises UnknownEntityError."""
        spec = self.entities.get(name)
        if spec is None:
            spec = self._by_lower.get(name.lower()) if isinstance(name, str) else None
            if spec is None:
                raise UnknownEntityError(name)
        return spec

    def has_entity(self, name: str) -> bool:
        return name in self.entities or (isinstance(name, str) and name.lower() in self._by_lower)

    def aspect(self, entity: str, aspect: str) -> AspectSpec:
        """Aspect of an entity. Raises UnknownEntityError, UnknownAspectError or AspectNotAllowedError."""
        spec = self.entity(entity)
        if aspect in spec.aspect_names:
            return self.aspects[aspect]
        if aspect in self.aspects:
            raise AspectNotAllowedError(spec.name, aspect)
        raise UnknownAspectError(spec.name, aspect)

    def aspect_spec(self, aspect: str) -> AspectSpec:
        """Aspect by name alone. Raises UnknownAspectError."""
        spec = self.aspects.get(aspect)
        if spec is None:
            raise UnknownAspectError("*", aspect, f"Unknown aspect {aspect}")
        return spec

    def key_aspect(self, entity: str) -> AspectSpec:
        return self.aspects[self.entity(entity).key_aspect]

    def validate(self, entity: str, aspect: str, value: object) -> dict:
        """Shortcut: ``registry.aspect(entity, aspect).validate(value)``."""
        return self.aspect(entity, aspect).validate(value)

    @property
    def timeseries_aspects(self) -> frozenset[str]:
        return frozenset(name for name, a in self.aspects.items() if a.is_timeseries)

    def counts(self) -> dict[str, int]:
        return {
            "entities": len(self.entities),
            "aspects": len(self.aspects),
            "timeseries": sum(1 for a in self.aspects.values() if a.is_timeseries),
            "key_aspects": sum(1 for a in self.aspects.values() if a.is_key),
            "entity_aspect_pairs": sum(len(e.aspect_names) for e in self.entities.values()),
        }

    def compile_all(self) -> float:
        """Compile every aspect validator now (they are compiled lazily otherwise). Returns the seconds taken."""
        t0 = time.perf_counter()
        for a in self.aspects.values():
            a.validator()
        return time.perf_counter() - t0

    # -- URN <-> key ------------------------------------------------------------------------------------------
    def urn_to_key(self, entity: str, urn: str) -> dict:
        """The key aspect value of ``urn``: its parts by position onto the key fields, validated."""
        from app.urns import InvalidUrnError, parse_urn

        spec = self.entity(entity)
        key = self.aspects[spec.key_aspect]
        try:
            parsed = parse_urn(urn)
        except InvalidUrnError as e:
            raise UrnKeyError(f"invalid urn {urn!r}: {e}") from None
        if parsed.entity_type.lower() != spec.name.lower():
            raise UrnKeyError(
                f"URN entity type does not match the entity: {parsed.entity_type} != {spec.name} (urn {urn})"
            )
        fields = key.type.fields
        if len(parsed.parts) != len(fields):
            raise UrnKeyError(
                "urn parts and key fields do not have the same length: "
                f"{urn} has {len(parsed.parts)} part(s), key aspect {key.name} has {len(fields)} field(s) "
                f"({', '.join(f.name for f in fields)})"
            )
        value = {f.name: _part_to_value(part, f.type) for f, part in zip(fields, parsed.parts, strict=True)}
        try:
            return key.validator(trim_unknown_fields=False)(value)
        except AspectValidationError as e:
            raise KeyValidationError(f"urn {urn} does not make a valid {key.name}", key.name, e.issues) from None

    def check_urn_key(self, entity: str, urn: str) -> None:
        """That `urn`'s parts make a valid key aspect of `entity` (:meth:`urn_to_key`'s errors otherwise). The last
        VALID_KEYS_KEPT valid pairs are remembered until the models change: an ingestion writes an entity's aspects
        one proposal at a time, and every run writes the same entities again."""
        pair = (entity, urn)
        if pair in self._valid_keys:
            return
        self.urn_to_key(entity, urn)
        if len(self._valid_keys) >= VALID_KEYS_KEPT:
            self._valid_keys.clear()
        self._valid_keys.add(pair)

    def key_to_urn(self, entity: str, key: dict) -> str:
        """The URN of a key aspect value (inverse of :meth:`urn_to_key`)."""
        from app.urns import InvalidUrnError, make_urn, parse_urn

        spec = self.entity(entity)
        key_spec = self.aspects[spec.key_aspect]
        try:
            value = key_spec.validator(trim_unknown_fields=False)(key)
        except AspectValidationError as e:
            raise KeyValidationError(f"invalid {key_spec.name} value", key_spec.name, e.issues) from None
        parts = []
        for f in key_spec.type.fields:
            if f.name not in value:
                raise UrnKeyError(f"key field {f.name!r} of {key_spec.name} is absent; every key field is a urn part")
            parts.append(_value_to_part(value[f.name]))
        urn = make_urn(spec.name, parts)
        try:
            round_trip = parse_urn(urn).parts
        except InvalidUrnError as e:
            round_trip, reason = None, str(e)
        else:
            reason = "its parts do not split back into the key fields"
        if round_trip != tuple(parts):
            raise UrnKeyError(
                f"the {key_spec.name} value does not make a valid urn ({reason}): {urn!r}; "
                "percent-encode ',' '(' ')' inside key values (%2C %28 %29)"
            )
        return urn

    # -- named types shared across files --------------------------------------------------------------------
    def _resolve_named(self, name: str) -> tuple[dict[str, Any], str | None] | None:
        if self._named_index is None:
            index: dict[str, tuple[dict[str, Any], str | None]] = {}
            for _, doc in self._documents:
                for full, raw, ns in iter_named_schemas(doc):
                    index.setdefault(full, (raw, ns))
                    index.setdefault(canonical_name(full), (raw, ns))
            self._named_index = index
        return self._named_index.get(name) or self._named_index.get(canonical_name(name))


def _part_to_value(part: str, t: Type) -> Any:
    kind = t.kind
    if kind in ("int", "long"):
        try:
            return int(part)
        except ValueError:
            return part  # reported by the validator as "expected long, found string"
    if kind in ("float", "double"):
        try:
            return float(part)
        except ValueError:
            return part
    if kind == "boolean":
        return {"true": True, "false": False}.get(part, part)
    return part


def _value_to_part(v: Any) -> str:
    if v is True or v is False:
        return "true" if v else "false"
    return str(v)


# ----------------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class _Loaded:
    registry: EntityRegistry | None
    problems: list[str]
    warnings: list[str]


def _source_files(source: Any, base: Path, problems: list[str]) -> tuple[str, list[Path]]:
    if not isinstance(source, dict) or not ({"package", "path"} & source.keys()):
        problems.append(f"modelSources entry {source!r} needs 'package: <distribution>' or 'path: <folder>'")
        return "?", []
    if "package" in source:
        pkg = str(source["package"])
        sub = str(source.get("schemas", DEFAULT_PACKAGE_SCHEMAS))
        try:
            dist = importlib.metadata.distribution(pkg)
        except importlib.metadata.PackageNotFoundError:
            problems.append(
                f"model source package {pkg!r} is not installed (pip install --no-deps {pkg}); "
                "its .avsc schemas are read from the installed files, its code is never imported"
            )
            return pkg, []
        folder = Path(str(dist.locate_file(sub)))
        label = f"{pkg}=={dist.version}"
    else:
        folder = Path(str(source["path"]))
        if not folder.is_absolute():
            folder = base / folder
        label = str(folder)
    if not folder.is_dir():
        problems.append(f"model source folder {folder} does not exist")
        return label, []
    files = sorted(folder.rglob("*.avsc"))
    if not files:
        problems.append(f"model source {label} has no .avsc files ({folder})")
    return label, files


def _build(
    path: Path | str,
    *,
    trim_unknown_fields: bool = False,
    strict_urns: bool = True,
    runtime_documents: Sequence[tuple[str, Any]] = (),
    runtime_entities: Sequence[dict[str, Any]] = (),
) -> _Loaded:
    """The registry of `path`, plus (app.registry.runtime) `runtime_documents` ((aspect name, .avsc document)) and
    `runtime_entities` (entries in the yml's `entities:` format), after the yml's."""
    t0 = time.perf_counter()
    path = Path(path)
    problems: list[str] = []
    warnings: list[str] = []
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        return _Loaded(None, [f"registry file {path} does not exist"], [])
    except yaml.YAMLError as error:
        return _Loaded(None, [f"registry file {path} is not valid YAML: {error}"], [])
    if not isinstance(config, dict):
        return _Loaded(None, [f"registry file {path} must be a mapping with 'entities:'"], [])

    sources = config.get("modelSources")
    if sources is None:
        sources = [{"package": DEFAULT_PACKAGE}]
    if not isinstance(sources, list):
        problems.append("modelSources must be a list")
        sources = []
    sources = [*sources, {"path": str(SYSTEM_MODELS)}]

    aspects: dict[str, AspectSpec] = {}
    documents: list[tuple[str, Any]] = []
    key_defs: list[tuple[AspectSpec, dict[str, Any], bool]] = []  # (spec, annotation, from package)

    def add_document(source_name: str, doc: Any, from_package: bool) -> None:
        documents.append((source_name, doc))
        if not isinstance(doc, dict) or not isinstance(doc.get("Aspect"), dict):
            return  # shared named types (or an event schema): usable by reference only
        ann = doc["Aspect"]
        name = ann.get("name")
        if not isinstance(name, str) or doc.get("type") != "record" or not isinstance(doc.get("name"), str):
            problems.append(f"{source_name}: the Aspect annotation needs a name, on a named record schema")
            return
        if name in aspects:
            problems.append(f"aspect {name} is defined twice: {aspects[name].source} and {source_name}")
            return
        ns = doc.get("namespace")
        full = doc["name"] if "." in doc["name"] or not ns else f"{ns}.{doc['name']}"
        spec = AspectSpec(
            name=name,
            record_name=canonical_name(full),
            is_timeseries=ann.get("type") == "timeseries",
            schema=doc,
            annotation=ann,
            source=source_name,
        )
        aspects[name] = spec
        if "keyForEntity" in ann:
            key_defs.append((spec, ann, from_package))

    for source in sources:
        label, files = _source_files(source, path.parent, problems)
        from_package = isinstance(source, dict) and "package" in source
        for f in files:
            try:
                doc = _json_loads(f.read_bytes())
            except Exception as error:  # noqa: BLE001 - report any unreadable file as a problem
                problems.append(f"{f}: not valid JSON: {error}")
                continue
            add_document(str(f), doc, from_package)
    for name, doc in runtime_documents:
        add_document(f"{RUNTIME_SOURCE} {name}", doc, False)

    # Entities from key aspects (DataHub's generated @Aspect carries keyForEntity / entityAspects).
    entities: dict[str, dict[str, Any]] = {}
    lower: dict[str, str] = {}
    for spec, ann, from_package in key_defs:
        ename = ann["keyForEntity"]
        if ename.lower() in lower:
            problems.append(
                f"entity {ename} has two key aspects: {entities[lower[ename.lower()]]['key']} and {spec.name}"
            )
            continue
        names = []
        for a in ann.get("entityAspects") or []:
            if a in aspects:
                names.append(a)
            else:
                msg = f"entity {ename}: aspect {a} (listed by key aspect {spec.name}) is not defined"
                (warnings if from_package else problems).append(msg)
        category = ann.get("entityCategory")
        entities[ename] = {
            "key": spec.name,
            "aspects": names,
            "category": None if category in (None, "_unset_") else category,
            "doc": ann.get("entityDoc"),
            "extra": {},
        }
        lower[ename.lower()] = ename

    # Entities from the yml: new entities, or extra aspects for known ones.
    yml_entities = config.get("entities") or []
    if not isinstance(yml_entities, list):
        problems.append("entities must be a list")
        yml_entities = []
    yml_entities = [*yml_entities, *runtime_entities]
    for i, ent in enumerate(yml_entities):
        if not isinstance(ent, dict) or not isinstance(ent.get("name"), str):
            problems.append(f"entities[{i}] needs a name")
            continue
        ename = ent["name"]
        listed = ent.get("aspects") or []
        if not isinstance(listed, list):
            problems.append(f"entity {ename}: aspects must be a list")
            listed = []
        key = ent.get("keyAspect")
        existing_name = lower.get(ename.lower())
        if existing_name is not None:
            e = entities[existing_name]
            if key is not None and key != e["key"]:
                problems.append(f"entity {existing_name}: keyAspect {key} in the yml, but its key aspect is {e['key']}")
        else:
            if not key:
                problems.append(f"entity {ename}: a new entity needs a keyAspect")
                continue
            if key not in aspects:
                problems.append(f"entity {ename}: keyAspect {key} is not a defined aspect")
                continue
            if aspects[key].is_key or any(x["key"] == key for x in entities.values()):
                problems.append(f"entity {ename}: keyAspect {key} is already the key of another entity")
                continue
            e = {"key": key, "aspects": [], "category": None, "doc": None, "extra": {}}
            entities[ename] = e
            lower[ename.lower()] = ename
        for a in listed:
            if a not in aspects:
                problems.append(f"entity {ename}: aspect {a} is not defined in any model source")
            elif a != e["key"] and a not in e["aspects"]:
                e["aspects"].append(a)
        if ent.get("category") is not None:
            e["category"] = ent["category"]
        if ent.get("doc") is not None:
            e["doc"] = ent["doc"]
        e["extra"].update(
            {k: v for k, v in ent.items() if k not in ("name", "keyAspect", "aspects", "category", "doc")}
        )

    specs: dict[str, EntitySpec] = {}
    for ename, e in entities.items():
        key_spec = aspects[e["key"]]
        key_spec.is_key = True
        key_spec.key_for = ename
        order = (e["key"], *e["aspects"])
        specs[ename] = EntitySpec(
            name=ename,
            key_aspect=e["key"],
            aspect_names=frozenset(order),
            category=e["category"],
            doc=e["doc"],
            aspects_in_order=order,
            extra=e["extra"],
        )

    registry = EntityRegistry(
        entities=specs,
        aspects=aspects,
        trim_unknown_fields=trim_unknown_fields,
        strict_urns=strict_urns,
        path=path,
        config=config,
        warnings=warnings,
    )
    registry._documents = documents
    # Parse every aspect schema now (about 30 ms for the default set) so broken schemas fail at start-up;
    # the validators themselves are compiled lazily.
    for spec in aspects.values():
        try:
            _ = spec.type
        except RegistryConfigError as e:
            problems.extend(e.problems)
        except Exception as e:  # noqa: BLE001 - any malformed schema is a registry problem
            problems.append(f"aspect {spec.name} ({spec.source}): invalid schema: {e}")
    registry.load_seconds = time.perf_counter() - t0
    return _Loaded(registry, problems, warnings)


def load_registry(path: Path | str, *, trim_unknown_fields: bool = False, strict_urns: bool = True) -> EntityRegistry:
    """Load ``entity_registry.yml`` and its model sources. Raises RegistryConfigError listing every problem.

    Validators are compiled lazily, on first use of an aspect (``registry.compile_all()`` compiles them all).
    ``trim_unknown_fields``: drop unknown record fields silently (DataHub's behaviour) instead of reporting them.
    ``strict_urns``: URN-typed fields are checked with ``app.urns.validate_urn(strict=True)`` (reserved
    characters inside parts are errors); with False, only the URN syntax and non-strict rules are checked.
    """
    loaded = _build(path, trim_unknown_fields=trim_unknown_fields, strict_urns=strict_urns)
    if loaded.problems:
        raise RegistryConfigError(loaded.problems)
    assert loaded.registry is not None
    return loaded.registry


class RegistryCheck(NamedTuple):
    """Result of :func:`check_registry`: ``ok, report = check_registry(path)``; ``str()`` gives the report."""

    ok: bool
    report: str

    def __str__(self) -> str:
        return self.report


def check_registry(path: Path | str) -> RegistryCheck:
    """Check the registry at ``path``: load it, compile every aspect validator, and summarize counts, load and
    compile times, problems and warnings. Returns ``RegistryCheck(ok, report)``; the report's first line starts
    with ``OK`` or ``FAILED``. Registry problems never raise."""
    loaded = _build(path)
    problems = list(loaded.problems)
    lines: list[str] = []
    reg = loaded.registry
    compile_s = 0.0
    if reg is not None:
        t0 = time.perf_counter()
        for a in reg.aspects.values():
            try:
                a.validator()
                if a.is_key and not a.type.fields:
                    problems.append(f"key aspect {a.name} has no fields")
            except Exception as e:  # noqa: BLE001 - report, do not crash the check
                problems.append(f"aspect {a.name} ({a.source}) does not compile: {e}")
        compile_s = time.perf_counter() - t0
        used = set().union(*(e.aspect_names for e in reg.entities.values())) if reg.entities else set()
        unused = sorted(set(reg.aspects) - used)
    status = "OK" if not problems else f"FAILED ({len(problems)} problem{'s' if len(problems) != 1 else ''})"
    lines.append(f"{status}: entity registry {Path(path)}")
    if reg is not None:
        c = reg.counts()
        sources = reg.config.get("modelSources") or [{"package": DEFAULT_PACKAGE}]
        lines.append(
            f"  {c['entities']} entities, {c['aspects']} aspects ({c['timeseries']} timeseries, "
            f"{c['key_aspects']} key aspects), {c['entity_aspect_pairs']} entity/aspect pairs"
        )
        lines.append(f"  model sources: {', '.join(_describe_source(s) for s in sources)}, metaledger system models")
        lines.append(
            f"  loaded in {reg.load_seconds * 1000:.0f} ms; all validators compiled in {compile_s * 1000:.0f} ms"
        )
        if unused:
            lines.append(f"  aspects not attached to any entity: {', '.join(unused)}")
    for p in problems:
        lines.append(f"  problem: {p}")
    for w in loaded.warnings:
        lines.append(f"  warning: {w}")
    return RegistryCheck(not problems, "\n".join(lines))


def _describe_source(s: Any) -> str:
    if isinstance(s, dict) and "package" in s:
        try:
            return f"package {s['package']}=={importlib.metadata.version(str(s['package']))}"
        except importlib.metadata.PackageNotFoundError:
            return f"package {s['package']} (not installed)"
    if isinstance(s, dict) and "path" in s:
        return f"path {s['path']}"
    return repr(s)


__all__ = [
    "AspectSpec",
    "EntityRegistry",
    "EntitySpec",
    "FieldAnnotation",
    "RegistryCheck",
    "check_registry",
    "load_registry",
]
