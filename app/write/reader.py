"""Reads of the aspect store for an answer, with the registry's checks of what is asked for (404 when absent), as the
caller may see them: the read rule (app.auth.reads) leaves out what it may not read, as if it did not exist. Values of
a soft-deleted structured property are left out of what they return, as DataHub's read hook does
(app.write.structured_properties.hide_soft_deleted). Handlers read here, never through the store's repository, which
the reader keeps to itself."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Any, Protocol

from app.db import SessionOrConnection
from app.errors import Issue, NotFound
from app.registry import EntityRegistry
from app.write.repository import AspectRepository, StoredAspect
from app.write.structured_properties import hide_soft_deleted, soft_deleted


class ReadRule(Protocol):
    """What one caller may read: the read rule of app.auth.reads, as the caller's principal (app.auth.model.Principal)
    answers it."""

    def may_read(self, entity_type: str, urn: str, aspect: str, value: Any) -> bool: ...

    async def unreadable(
        self,
        urns: Iterable[str],
        repo: Any,
        *,
        in_hand: Mapping[tuple[str, str], Any] | None = None,
        complete: Set[str] = frozenset(),
    ) -> set[str]: ...


class EntityReader:
    """The aspect store as `reader` (the caller's principal) may read it: every read path that answers with stored
    aspects reads here."""

    def __init__(self, session: SessionOrConnection, registry: EntityRegistry, reader: ReadRule) -> None:
        self._repo = AspectRepository(session)
        self.registry = registry
        self.reader = reader

    async def unreadable(self, urns: list[str]) -> set[str]:
        """The entities among `urns` the caller may not see at all (app.auth.reads.unreadable_entities)."""
        return await self.reader.unreadable(urns, self._repo)

    async def latest_of_many(self, wanted: list[tuple[str, list[str] | None]]) -> dict[str, list[StoredAspect]]:
        """The latest rows of several entities (each with its aspects, None: all) in one query, by URN; absent
        entities are left out, and so are those the caller may not see."""
        found = await self._repo.entities_latest(wanted)
        hidden = await self.reader.unreadable(
            [urn for urn, _ in wanted],
            self._repo,
            in_hand={(row.urn, row.aspect): row for rows in found.values() for row in rows},
            complete={urn for urn, aspects in wanted if aspects is None},
        )
        if hidden:
            found = {urn: rows for urn, rows in found.items() if urn not in hidden}
        rows = [row for urn_rows in found.values() for row in urn_rows]
        hidden_values = await hide_soft_deleted(self._repo, rows)
        if not hidden_values:
            return found
        shown = iter(hidden_values.get(i, row) for i, row in enumerate(rows))
        return {urn: [next(shown) for _ in urn_rows] for urn, urn_rows in found.items()}

    async def latest_of_type(self, entity_type: str, aspect: str) -> list[StoredAspect]:
        """The latest `aspect` of every entity of `entity_type` the caller may see, by URN (for entity types that hold
        few entities: AspectRepository.latest_of_type)."""
        self.registry.aspect(self.registry.entity(entity_type).name, aspect)
        rows = await self._repo.latest_of_type(entity_type, aspect)
        hidden = await self.reader.unreadable(
            [row.urn for row in rows], self._repo, in_hand={(row.urn, row.aspect): row for row in rows}
        )
        return [row for row in rows if row.urn not in hidden]

    async def latest_of(self, urn: str, aspects: list[str] | None) -> list[StoredAspect]:
        """The latest rows of one entity (its `aspects`, None: all), with no check of what is asked for: [] when the
        entity is absent, has none of `aspects`, or the caller may not see it (where `entity` answers 404)."""
        rows = await self._repo.entity_latest(urn, aspects)
        if not rows or await self._hidden(urn, aspects, rows):
            return []
        shown = await hide_soft_deleted(self._repo, rows)
        return [shown.get(i, row) for i, row in enumerate(rows)]

    async def deleted_properties(self, property_urns: Iterable[str]) -> set[str]:
        """The structured properties among `property_urns` whose definition is soft-deleted, whoever the caller is:
        what a search may not filter or aggregate on (app.search.structured_properties) is the same for everyone, as
        DataHub's validateFilter decides it."""
        return await soft_deleted(self._repo, property_urns)

    async def exists(self, urn: str) -> bool:
        return await self._repo.entity_exists(urn) and not await self.unreadable([urn])

    async def has_aspect(self, entity_type: str, urn: str, aspect: str) -> bool:
        self.registry.aspect(self.registry.entity(entity_type).name, aspect)
        return bool(await self._repo.latest([(urn, aspect)])) and not await self.unreadable([urn])

    async def entity(self, entity_type: str, urn: str, aspects: list[str] | None) -> list[StoredAspect]:
        spec = self.registry.entity(entity_type)
        for aspect in aspects or []:
            self.registry.aspect(spec.name, aspect)
        rows = await self._repo.entity_latest(urn, aspects)
        if await self._hidden(urn, aspects, rows) or (not rows and not await self._repo.entity_exists(urn)):
            raise NotFound(f"entity {urn} does not exist", [Issue("not found", urn=urn)])
        shown = await hide_soft_deleted(self._repo, rows)
        return [shown.get(i, row) for i, row in enumerate(rows)]

    async def _hidden(self, urn: str, aspects: list[str] | None, rows: list[StoredAspect]) -> bool:
        """Whether the caller may not see `urn`, its latest `aspects` (None: all) read as `rows`."""
        return bool(
            await self.reader.unreadable(
                [urn],
                self._repo,
                in_hand={(r.urn, r.aspect): r for r in rows},
                complete={urn} if aspects is None else frozenset(),
            )
        )

    async def aspect(self, entity_type: str, urn: str, aspect: str, version: int = 0) -> StoredAspect:
        spec = self.registry.entity(entity_type)
        self.registry.aspect(spec.name, aspect)
        if version == 0:
            rows = await self._repo.latest([(urn, aspect)])
            row = rows.get((urn, aspect))
        else:
            row = await self._repo.versioned(urn, aspect, version)
        if (
            row is None
            or not self.reader.may_read(spec.name, urn, aspect, row.value)
            or await self.reader.unreadable([urn], self._repo, in_hand={(urn, aspect): row} if not version else None)
        ):
            what = f"version {version} of aspect" if version else "aspect"
            raise NotFound(f"{what} {aspect!r} of {urn} does not exist", [Issue("not found", urn=urn, aspect=aspect)])
        return (await hide_soft_deleted(self._repo, [row])).get(0, row)
