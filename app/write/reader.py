"""Reads of the aspect store, with the registry's checks of what is asked for (404 when absent). Values of a
soft-deleted structured property are left out of what they return, as DataHub's read hook does
(app.write.structured_properties.hide_soft_deleted)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.errors import Issue, NotFound
from app.registry import EntityRegistry
from app.write.repository import AspectRepository, StoredAspect
from app.write.structured_properties import hide_soft_deleted


class EntityReader:
    def __init__(self, session: AsyncSession, registry: EntityRegistry) -> None:
        self.repo = AspectRepository(session)
        self.registry = registry

    async def latest_of_many(self, wanted: list[tuple[str, list[str] | None]]) -> dict[str, list[StoredAspect]]:
        """The latest rows of several entities (each with its aspects, None: all) in one query, by URN; absent
        entities are left out."""
        found = await self.repo.entities_latest(wanted)
        rows = [row for urn_rows in found.values() for row in urn_rows]
        hidden = await hide_soft_deleted(self.repo, rows)
        if not hidden:
            return found
        shown = iter(hidden.get(i, row) for i, row in enumerate(rows))
        return {urn: [next(shown) for _ in urn_rows] for urn, urn_rows in found.items()}

    async def exists(self, urn: str) -> bool:
        return await self.repo.entity_exists(urn)

    async def has_aspect(self, entity_type: str, urn: str, aspect: str) -> bool:
        self.registry.aspect(self.registry.entity(entity_type).name, aspect)
        return bool(await self.repo.latest([(urn, aspect)]))

    async def entity(self, entity_type: str, urn: str, aspects: list[str] | None) -> list[StoredAspect]:
        spec = self.registry.entity(entity_type)
        for aspect in aspects or []:
            self.registry.aspect(spec.name, aspect)
        rows = await self.repo.entity_latest(urn, aspects)
        if not rows and not await self.repo.entity_exists(urn):
            raise NotFound(f"entity {urn} does not exist", [Issue("not found", urn=urn)])
        hidden = await hide_soft_deleted(self.repo, rows)
        return [hidden.get(i, row) for i, row in enumerate(rows)]

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
        return (await hide_soft_deleted(self.repo, [row])).get(0, row)
