"""`POST /entities?action=deleteReferences`: find and remove the references other entities hold to an URN.

A reference is what DataHub's graph records: a value at a field annotated `@Relationship` in an aspect schema
(`/owners/*/owner`, `/tags/*/tag`, `/terms/*/urn`, `/domains/*`, `/container`, `/upstreams/*/dataset`,
`/editableSchemaFieldInfo/*/globalTags/tags/*/tag`, ... — every such path of every aspect in the registry, read from
the schemas' annotations). Candidates are found by scanning the latest rows for the URN's JSON text; the removal
then follows the annotated paths only, so a mere mention (an audit stamp's actor, a description) is kept.

Removing a reference removes the innermost array element that holds it (an owner, a tag association, an upstream);
a reference outside any array (`/container`) removes the field. If the aspect is then no longer valid (a required
field is gone) the aspect is deleted, as DataHub does. Each change goes through the write path as an UPSERT (or a
DELETE) conditional on the version that was read (`If-Version-Match`), so a concurrent write is never overwritten.
metaledger's own entity (metaledgerSystem) is never touched: only its own services write it (app.write.rules).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.registry import EntityRegistry
from app.registry.errors import AspectValidationError
from app.urns import entity_type_of
from app.write.processors import PIPELINE_ENTITY
from app.write.proposal import IF_VERSION_MATCH, ChangeType, Draft

ARRAY = "*"


@dataclass(slots=True)
class Reference:
    urn: str  # the entity holding the reference
    entity_type: str
    aspect: str
    relationship_types: list[str]
    version: str | None
    new_value: dict[str, Any] | None  # None: delete the aspect
    paths: list[str] = field(default_factory=list)


def relationship_paths(registry: EntityRegistry) -> dict[str, list[tuple[list[str], str]]]:
    """aspect name → [(path segments, relationship name)] for every `@Relationship` field."""
    cached = getattr(registry, "_restli_relationship_paths", None)
    if cached is not None:
        return cached
    out: dict[str, list[tuple[list[str], str]]] = {}
    for name, spec in registry.aspects.items():
        if spec.is_timeseries or spec.is_key:
            continue
        for path, annotated in spec.annotations_by_path.items():
            relationship = annotated.get("Relationship")
            if isinstance(relationship, dict) and "name" in relationship:
                out.setdefault(name, []).append(([s for s in path.split("/") if s], relationship["name"]))
    # kept on the registry it was computed from, so a new registry (a model set applied) computes its own
    registry._restli_relationship_paths = out  # type: ignore[attr-defined]
    return out


def _strip(node: Any, segments: list[str], urn: str) -> tuple[Any, bool, bool]:
    """(new node, changed, remove me): walks `segments` and removes what references `urn`. `remove me` asks the
    nearest enclosing array (or the aspect's top level) to drop this node."""
    if not segments:
        return node, False, node == urn
    head, rest = segments[0], segments[1:]
    if head == ARRAY:
        if isinstance(node, list):
            kept, changed = [], False
            for item in node:
                new, item_changed, drop = _strip(item, rest, urn)
                if drop:
                    changed = True
                    continue
                changed |= item_changed
                kept.append(new)
            return kept, changed, False
        if isinstance(node, dict):  # a map's values
            kept_map, changed = {}, False
            for key, item in node.items():
                new, item_changed, drop = _strip(item, rest, urn)
                if drop:
                    changed = True
                    continue
                changed |= item_changed
                kept_map[key] = new
            return kept_map, changed, False
        return node, False, False
    if not isinstance(node, dict) or head not in node:
        return node, False, False
    new, changed, drop = _strip(node[head], rest, urn)
    if drop:
        return node, True, True
    if changed:
        node = dict(node)
        node[head] = new
    return node, changed, False


def remove_references(
    value: dict[str, Any], paths: list[tuple[list[str], str]], urn: str
) -> tuple[dict[str, Any], list[str]]:
    """The aspect without its references to `urn`, and the relationship types removed."""
    types: list[str] = []
    current = copy.deepcopy(value)
    for segments, relationship in paths:
        if not segments:
            continue
        new, changed, drop = _strip(current, segments, urn)
        if drop:  # no array on the way: drop the top-level field holding it
            new = dict(current)
            new.pop(segments[0], None)
            changed = True
        if changed:
            current = new
            if relationship not in types:
                types.append(relationship)
    return current, types


def find_references(registry: EntityRegistry, rows: list[Any], urn: str) -> list[Reference]:
    """From candidate rows (urn, aspect, metadata, systemmetadata), the aspects that really reference `urn`."""
    paths_by_aspect = relationship_paths(registry)
    out: list[Reference] = []
    for row in rows:
        paths = paths_by_aspect.get(row["aspect"])
        if not paths:
            continue
        value = orjson.loads(row["metadata"])
        new_value, types = remove_references(value, paths, urn)
        if not types:
            continue
        entity_type = entity_type_of(row["urn"])
        if entity_type == PIPELINE_ENTITY:
            continue  # metaledger's own configuration: written by its own services only (app.write.rules)
        spec = registry.aspects[row["aspect"]]
        try:
            validated: dict[str, Any] | None = spec.validate(new_value)
        except AspectValidationError:
            validated = None
        sm = orjson.loads(row["systemmetadata"]) if row["systemmetadata"] else {}
        out.append(Reference(row["urn"], entity_type, row["aspect"], types, sm.get("version"), validated))
    return out


def removal_drafts(references: list[Reference]) -> list[Draft]:
    """The writes that remove the references, each conditional on the version that was read."""
    drafts = []
    for i, ref in enumerate(references):
        headers = {IF_VERSION_MATCH: ref.version} if ref.version is not None else None
        if ref.new_value is None:
            drafts.append(Draft(i, ref.entity_type, ref.aspect, ChangeType.DELETE.value, urn=ref.urn, headers=headers))
        else:
            drafts.append(
                Draft(
                    i,
                    ref.entity_type,
                    ref.aspect,
                    ChangeType.UPSERT.value,
                    urn=ref.urn,
                    value=ref.new_value,
                    headers=headers,
                )
            )
    return drafts
