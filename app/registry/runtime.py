"""Models registered at run time: aspect schemas and entity definitions added to the base models (the model sources
and entity_registry.yml) while the service runs, without a restart.

The runtime model set is declarative: an apply sends the whole set, which replaces the previous one; the base models
are never changed by it. It is stored as the aspect `runtimeModels` of `urn:li:metaledgerSystem:models`
(app.write.runtime_models: versioned, audited and published as any write), checked first (app.registry.compatibility),
and taken up by every process holding an EntityRegistry (`EntityRegistry.replace_with`).

The stored form (system_models/RuntimeModels.avsc) and `metaledger model apply <dir>`'s directory hold the same
things: the .avsc schemas (each with its compatibility mode: BACKWARD, FULL or NONE) and `entities:` entries in
entity_registry.yml's format (new entities with a keyAspect, or extra aspects for known entities).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
import yaml

from app.limits import clip
from app.registry.errors import RegistryConfigError
from app.registry.registry import EntityRegistry, _build

MODELS_ASPECT = "runtimeModels"  # the aspect of metaledger's own entity that holds the set (app.write.runtime_models)
MODELS_FILE = "models.yml"  # in a `metaledger model apply <dir>` directory, beside the .avsc files


class Compatibility(str, enum.Enum):
    """How a runtime aspect's schema may change from one apply to the next (as a schema registry's modes):
    BACKWARD: the new schema reads the stored values; FULL: that, and the previous schema reads the new values too;
    NONE: anything (the stored values are still checked against it)."""

    BACKWARD = "BACKWARD"
    FULL = "FULL"
    NONE = "NONE"


@dataclass(frozen=True, slots=True)
class RuntimeAspect:
    name: str  # the schema's Aspect annotation's name
    schema: dict[str, Any]  # the .avsc document
    compatibility: Compatibility = Compatibility.BACKWARD

    def to_stored(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "schema": orjson.dumps(self.schema, option=orjson.OPT_SORT_KEYS).decode(),
            "compatibility": self.compatibility.value,
        }


@dataclass(frozen=True, slots=True)
class RuntimeEntity:
    """One `entities:` entry of entity_registry.yml's format."""

    name: str
    aspects: tuple[str, ...] = ()
    key_aspect: str | None = None  # required for a new entity
    category: str | None = None
    doc: str | None = None

    def to_stored(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "keyAspect": self.key_aspect,
            "aspects": list(self.aspects),
            "category": self.category,
            "doc": self.doc,
        }

    def to_yml(self) -> dict[str, Any]:
        return {k: v for k, v in self.to_stored().items() if v is not None}


class ModelFollower(Protocol):
    """What a worker asks of its process's watcher of the stored runtime model set (app.modelset.watcher.ModelWatcher),
    which the composition root (app.main, app.background, app.cli) makes and hands to it: to take the stored set up
    now, or when the registry lacks the entity type or the aspect of one of the (urn, aspect) `pairs` it met."""

    async def refresh(self) -> bool: ...

    async def refresh_for(self, pairs: Iterable[tuple[str, str]]) -> bool: ...


class ModelSetError(ValueError):
    """A runtime model set that cannot even be read: `path` says where (`$.aspects[2].schema`)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.reason = message


def _unread(path: Path, folder: Path) -> bool:
    """A file of a model directory that `from_directory` would not read (hidden files and folders aside: an editor's
    or git's)."""
    parts = path.relative_to(folder).parts
    if any(part.startswith(".") for part in parts):
        return False
    return path.suffix != ".avsc" and parts != (MODELS_FILE,)


@dataclass(frozen=True, slots=True)
class RuntimeModelSet:
    aspects: Mapping[str, RuntimeAspect] = field(default_factory=dict)
    entities: tuple[RuntimeEntity, ...] = ()

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RuntimeModelSet:
        """The stored aspect's value, or an apply's body: `schema` is the .avsc as JSON text or as an object."""
        aspects: dict[str, RuntimeAspect] = {}
        for i, item in enumerate(raw.get("aspects") or []):
            where = f"$.aspects[{i}]"
            schema = item.get("schema")
            if isinstance(schema, str):
                try:
                    schema = orjson.loads(schema)
                except orjson.JSONDecodeError as error:
                    raise ModelSetError(f"not valid JSON: {error}", f"{where}.schema") from None
            if not isinstance(schema, dict):
                raise ModelSetError("an .avsc record schema (a JSON object) is required", f"{where}.schema")
            annotation = schema.get("Aspect")
            name = annotation.get("name") if isinstance(annotation, dict) else None
            if not isinstance(name, str) or not name:
                raise ModelSetError(
                    'an aspect schema needs an "Aspect": {"name": ...} annotation', f"{where}.schema.Aspect.name"
                )
            if item.get("name") not in (None, name):
                raise ModelSetError(
                    f"the name {item['name']!r} is not the schema's aspect name {name!r}", f"{where}.name"
                )
            if name in aspects:
                raise ModelSetError(f"aspect {name} is given twice", f"{where}.schema.Aspect.name")
            try:
                mode = Compatibility(item.get("compatibility") or Compatibility.BACKWARD)
            except ValueError:
                raise ModelSetError(
                    f"{item.get('compatibility')!r} is not one of BACKWARD, FULL, NONE", f"{where}.compatibility"
                ) from None
            aspects[name] = RuntimeAspect(name, schema, mode)
        entities = []
        for i, item in enumerate(raw.get("entities") or []):
            if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
                raise ModelSetError("an entity needs a name", f"$.entities[{i}].name")
            entities.append(
                RuntimeEntity(
                    item["name"],
                    tuple(item.get("aspects") or ()),
                    item.get("keyAspect"),
                    item.get("category"),
                    item.get("doc"),
                )
            )
        return cls(aspects, tuple(entities))

    @classmethod
    def from_directory(cls, folder: Path) -> RuntimeModelSet:
        """`metaledger model apply <dir>`: every .avsc with an Aspect annotation, and `models.yml` (optional):
        `entities:` as in entity_registry.yml, `compatibility: {aspectName: FULL}`."""
        unread = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and _unread(p, folder))
        if unread:
            raise ModelSetError(
                f"{', '.join(clip(name, 100) for name in unread[:10])}: not read by `model apply`, which reads the .avsc "
                f"schemas and {MODELS_FILE} (entities: in entity_registry.yml's format, and compatibility:); "
                f"move the entities of an entity_registry.yml into {MODELS_FILE}",
                str(folder),
            )
        config: dict[str, Any] = {}
        if (folder / MODELS_FILE).is_file():
            config = yaml.safe_load((folder / MODELS_FILE).read_text(encoding="utf-8")) or {}
            if not isinstance(config, dict):
                raise ModelSetError(
                    "a mapping with entities: and compatibility: is required", str(folder / MODELS_FILE)
                )
        modes = config.get("compatibility") or {}
        aspects = []
        for path in sorted(folder.rglob("*.avsc")):
            try:
                schema = orjson.loads(path.read_bytes())
            except orjson.JSONDecodeError as error:
                raise ModelSetError(f"not valid JSON: {error}", str(path)) from None
            name = (schema.get("Aspect") or {}).get("name") if isinstance(schema, dict) else None
            aspects.append({"schema": schema, "compatibility": modes.get(name)})
        return cls.from_json({"aspects": aspects, "entities": config.get("entities") or []})

    def to_stored(self) -> dict[str, Any]:
        return {
            "aspects": [a.to_stored() for _, a in sorted(self.aspects.items())],
            "entities": [e.to_stored() for e in self.entities],
        }


EMPTY = RuntimeModelSet()


def build_registry(base: EntityRegistry, models: RuntimeModelSet) -> EntityRegistry:
    """A new registry: `base`'s configuration (its yml and model sources, its validation modes) plus `models`.
    Raises RegistryConfigError naming every problem (a schema that does not parse, an unknown aspect, ...)."""
    assert base.path is not None, "a registry loaded from a file"
    loaded = _build(
        base.path,
        trim_unknown_fields=base.trim_unknown_fields,
        strict_urns=base.strict_urns,
        runtime_documents=[(a.name, a.schema) for a in models.aspects.values()],
        runtime_entities=[e.to_yml() for e in models.entities],
    )
    if loaded.problems:
        raise RegistryConfigError(loaded.problems)
    assert loaded.registry is not None
    for name in models.aspects:  # compiled now: a schema the validator cannot compile is refused before it is stored
        try:
            loaded.registry.aspects[name].validator()
        except Exception as error:  # noqa: BLE001 - any compile error names the aspect
            raise RegistryConfigError([f"aspect {name} does not compile: {error}"]) from None
    return loaded.registry
