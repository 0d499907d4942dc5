"""Reads of the aspect store and the translation of v3 request bodies into drafts."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.errors import Issue, NotFound, ValidationFailed
from app.registry import EntityRegistry
from app.write.proposal import ChangeType
from app.write.repository import AspectRepository, StoredAspect
from app.write.service import Draft, ItemResult

ENVELOPE_KEYS = frozenset({"value", "systemMetadata", "headers"})


def aspect_envelope(value: Any, system_metadata: dict[str, Any] | None, with_system_metadata: bool = True) -> dict[str, Any]:
    envelope: dict[str, Any] = {"value": value}
    if with_system_metadata and system_metadata is not None:
        envelope["systemMetadata"] = system_metadata
    return envelope


def stored_envelope(row: StoredAspect, with_system_metadata: bool) -> dict[str, Any]:
    return aspect_envelope(row.value, row.system_metadata, with_system_metadata)


def drafts_from_entity_batch(entity_type: str, body: Any, change_type: ChangeType) -> list[Draft]:
    """`[{"urn": ..., "<aspect>": {"value": {...}, "systemMetadata"?, "headers"?}}, ...]` → one draft per aspect."""
    if not isinstance(body, list):
        raise ValidationFailed("the body must be a JSON array of entities", [Issue("expected an array", path="$")])
    drafts: list[Draft] = []
    issues: list[Issue] = []
    for position, item in enumerate(body):
        path = f"$[{position}]"
        if not isinstance(item, dict):
            issues.append(Issue("each entity must be an object with a `urn` field", position, path=path))
            continue
        urn = item.get("urn")
        if not isinstance(urn, str):
            issues.append(Issue("Missing `urn` field", position, path=f"{path}.urn"))
            continue
        for aspect_name, envelope in item.items():
            if aspect_name == "urn":
                continue
            if not isinstance(envelope, dict) or "value" not in envelope:
                issues.append(Issue('an aspect must be {"value": {...}, "systemMetadata"?, "headers"?}', position, urn, aspect_name, f"{path}.{aspect_name}"))
                continue
            unknown = set(envelope) - ENVELOPE_KEYS
            if unknown:
                issues.append(Issue(f"unknown aspect envelope field(s) {sorted(unknown)}", position, urn, aspect_name, f"{path}.{aspect_name}"))
                continue
            drafts.append(
                Draft(
                    index=len(drafts),
                    entity_type=entity_type,
                    aspect_name=aspect_name,
                    change_type=change_type.value,
                    urn=urn,
                    value=envelope["value"],
                    system_metadata=envelope.get("systemMetadata"),
                    headers=envelope.get("headers"),
                )
            )
    if issues:
        raise ValidationFailed(f"{len(issues)} entities of the batch are malformed; nothing was written", issues)
    return drafts


def entities_from_results(results: list[ItemResult], with_system_metadata: bool = True) -> list[dict[str, Any]]:
    """Group written aspects back into the v3 entity shape, in request order."""
    entities: dict[str, dict[str, Any]] = {}
    for result in results:
        entity = entities.setdefault(result.urn, {"urn": result.urn})
        envelope = aspect_envelope(result.value, result.system_metadata, with_system_metadata)
        envelope["status"] = result.status.value
        if result.message:
            envelope["message"] = result.message
        entity[result.aspect] = envelope
    return list(entities.values())


class EntityReader:
    def __init__(self, session: AsyncSession, registry: EntityRegistry) -> None:
        self.repo = AspectRepository(session)
        self.registry = registry

    async def entity(self, entity_type: str, urn: str, aspects: list[str] | None) -> list[StoredAspect]:
        spec = self.registry.entity(entity_type)
        for aspect in aspects or []:
            self.registry.aspect(spec.name, aspect)
        rows = await self.repo.entity_latest(urn, aspects)
        if not rows and not await self.repo.entity_exists(urn):
            raise NotFound(f"entity {urn} does not exist", [Issue("not found", urn=urn)])
        return rows

    async def aspect(self, entity_type: str, urn: str, aspect: str, version: int = 0) -> StoredAspect:
        spec = self.registry.entity(entity_type)
        self.registry.aspect(spec.name, aspect)
        if version == 0:
            rows = await self.repo.latest([(urn, aspect)])
            row = rows.get((urn, aspect))
        else:
            row = await self.repo.versioned(urn, aspect, version)
        if row is None:
            what = f"version {version} of aspect" if version else "aspect"
            raise NotFound(f"{what} {aspect!r} of {urn} does not exist", [Issue("not found", urn=urn, aspect=aspect)])
        return row

    async def history(self, urn: str, aspect: str) -> list[StoredAspect]:
        rows = await self.repo.history(urn, aspect)
        if not rows:
            raise NotFound(f"aspect {aspect!r} of {urn} does not exist", [Issue("not found", urn=urn, aspect=aspect)])
        return rows


def delete_drafts(entity_type: str, urn: str, aspects: list[str]) -> list[Draft]:
    return [Draft(i, entity_type, aspect, ChangeType.DELETE.value, urn=urn) for i, aspect in enumerate(aspects)]


def status_counts(results: list[ItemResult]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status.value] = counts.get(result.status.value, 0) + 1
    return counts

