"""Every process keeps its registry at the stored runtime model set (`ModelWatcher`: one cheap query every
METALEDGER_MODEL_REFRESH_S). The composition roots (app.main, app.background, app.cli) make one per process and hand
it to the workers that need the set taken up at once (the relay, the embedded indexer: app.registry.runtime's
`ModelFollower`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db import session_connection
from app.modelset.store import StoredModels, stored_models, stored_version
from app.registry import EntityRegistry
from app.registry.runtime import EMPTY, build_registry
from app.settings import Settings
from app.urns import InvalidUrnError, entity_type_of
from app.workers import pause

log = logging.getLogger("metaledger.models")


class Worker(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


class ModelWatcher:
    """Keeps a process's registry at the stored runtime model set: one indexed single-row query every
    `model_refresh_s`; a new version is read, built and swapped into the registry in place (listeners follow).
    A stored set that does not build (written around the checks) is logged once and the registry left as it is.
    Several watchers may keep one registry (a relay built without the process's has its own): a set is swapped in
    only if no other swap came while it was built, so the registry never goes back to a version older than it held.
    A worker that meets a change log of an entity type or aspect its registry lacks takes the set up at once
    (`refresh_for`)."""

    def __init__(
        self, settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], registry: EntityRegistry
    ) -> None:
        self.settings = settings
        self.sessionmaker = sessionmaker
        self.registry = registry
        self._failed_version: int | None = None

    async def refresh(self) -> bool:
        """Take up the stored set if its version is not the registry's; True when it did."""
        while True:
            generation = self.registry.generation
            async with self.sessionmaker() as session:
                version = await stored_version(await session_connection(session))
                if version in (self.registry.runtime_version, self._failed_version):
                    return False
                stored = await stored_models(session) if version else StoredModels(EMPTY, 0)
            try:  # built in a thread (a few hundred ms), swapped on the event loop
                built = await asyncio.to_thread(build_registry, self.registry, stored.models)
            except Exception:
                self._failed_version = stored.version
                log.exception(
                    "the stored runtime model set does not build; the models in force are kept",
                    extra={"version": stored.version, "in_force": self.registry.runtime_version},
                )
                return False
            if self.registry.generation == generation:
                break
            # another watcher swapped a set in meanwhile (maybe a newer one): look at the stored version again
        self.registry.replace_with(built, stored.version)
        log.info(
            "runtime models taken up",
            extra={
                "version": stored.version,
                "aspects": sorted(stored.models.aspects),
                "entities": [e.name for e in stored.models.entities],
                "generation": self.registry.generation,
            },
        )
        return True

    async def refresh_for(self, pairs: Iterable[tuple[str, str]]) -> bool:
        """Take up the stored set if the registry lacks the entity type or the aspect of one of the (urn, aspect)
        `pairs`: change logs written under a set this process has not taken up yet (within `model_refresh_s` of an
        apply). True when it did."""
        if any(self._lacks(urn, aspect) for urn, aspect in pairs):
            return await self.refresh()
        return False

    def _lacks(self, urn: str, aspect: str) -> bool:
        try:
            entity_type = entity_type_of(urn)
        except InvalidUrnError:
            return False  # no model set makes it an entity's
        registry = self.registry
        return not registry.has_entity(entity_type) or aspect not in registry.entity(entity_type).aspect_names

    async def run(self, stop: asyncio.Event) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - a database outage: the next poll tries again
                log.warning("runtime models not checked", exc_info=True)
            if await pause(stop, self.settings.model_refresh_s):
                return


class WithModelWatcher:
    """A standalone worker (`metaledger relay`, `metaledger consume-*`) with a ModelWatcher of the registry it
    validates and publishes with, so that it takes up the runtime model set as the service's processes do: the set
    in force before its first record, then every new version within METALEDGER_MODEL_REFRESH_S."""

    def __init__(self, worker: Worker, watcher: ModelWatcher) -> None:
        self.worker = worker
        self.watcher = watcher

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self.watcher.refresh()
        except Exception:  # noqa: BLE001 - a database outage: the watcher's polls try again, the worker waits on it
            log.warning("runtime models not checked at start", exc_info=True)
        watching = asyncio.create_task(self.watcher.run(stop), name="ModelWatcher")
        try:
            await self.worker.run(stop)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
