"""The runtime model set (app.registry.runtime) in the database: stored as the aspect MODELS_ASPECT of MODELS_URN,
metaledger's own entity, through the ordinary write path (ADMIN only, versioned, with its change log), after the
checks of app.registry.compatibility and the checks against stored data here; and taken up by every process
(`ModelWatcher`: one cheap query every METALEDGER_MODEL_REFRESH_S).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth.model import Principal
from app.db import session_connection
from app.errors import ExistenceConflict, Issue, PreconditionFailed, ServiceUnavailable, ValidationFailed
from app.limits import clip
from app.registry import AspectValidationError, EntityRegistry, RegistryError
from app.registry.compatibility import Refusal, check_models
from app.registry.runtime import EMPTY, MODELS_ASPECT, RuntimeModelSet, build_registry
from app.settings import Settings
from app.urns import InvalidUrnError, entity_type_of
from app.workers import pause
from app.write.processors import PIPELINE_ENTITY
from app.write.decision import ItemResult, ItemStatus
from app.write.proposal import IF_VERSION_MATCH, Draft
from app.write.repository import AspectRepository
from app.write.rules import MODELS_URN, system_service_write

if TYPE_CHECKING:  # the write path imports this module (refuse_writes_past_the_models)
    from app.ingest.gateway import IngestGateway

log = logging.getLogger("metaledger.models")

STORED_FAILURES_REPORTED = 10  # a changed schema that stored values break: the first ones, with their URN
STORED_PAGE_ROWS = 500

_VERSION_OF_LATEST = """SELECT systemmetadata::jsonb ->> 'version' FROM metadata_aspect_v2
                        WHERE urn = $1 AND aspect = $2 AND version = 0"""


@dataclass(frozen=True, slots=True)
class StoredModels:
    models: RuntimeModelSet
    version: int  # 0: none stored yet
    created_on: datetime | None = None
    created_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"urn": MODELS_URN, "aspectName": MODELS_ASPECT, "version": self.version,
                "createdOn": int(self.created_on.timestamp() * 1000) if self.created_on else None,
                "createdBy": self.created_by, **self.models.to_stored()}


async def stored_models(session: AsyncSession, version: int | None = None) -> StoredModels:
    """The stored set (its latest version, or `version`)."""
    conn = await session_connection(session)
    rows = await conn.fetch(
        """SELECT metadata, systemmetadata, createdon, createdby FROM metadata_aspect_v2
           WHERE urn = $1 AND aspect = $2 ORDER BY version = 0 DESC, version DESC""", MODELS_URN, MODELS_ASPECT)
    for row in rows:
        stored = _stored(row)
        if version is None or stored.version == version:
            return stored
    return StoredModels(EMPTY, 0)


async def stored_version(conn) -> int:
    """The stored set's latest version (0: none stored yet): one indexed single-row query."""
    raw = await conn.fetchval(_VERSION_OF_LATEST, MODELS_URN, MODELS_ASPECT)
    return int(raw) if raw else 0


async def model_history(session: AsyncSession) -> list[dict[str, Any]]:
    """Every stored version, newest first: when, by whom, which aspects and entities."""
    conn = await session_connection(session)
    rows = await conn.fetch(
        """SELECT metadata, systemmetadata, createdon, createdby FROM metadata_aspect_v2
           WHERE urn = $1 AND aspect = $2""", MODELS_URN, MODELS_ASPECT)
    versions = sorted((_stored(row) for row in rows), key=lambda s: s.version, reverse=True)
    return [{"version": s.version, "createdOn": int(s.created_on.timestamp() * 1000), "createdBy": s.created_by,
             "aspects": {name: a.compatibility.value for name, a in sorted(s.models.aspects.items())},
             "entities": [e.name for e in s.models.entities]} for s in versions if s.created_on is not None]


def _stored(row) -> StoredModels:
    system_metadata = orjson.loads(row["systemmetadata"] or "{}")
    return StoredModels(RuntimeModelSet.from_json(orjson.loads(row["metadata"])),
                        int(system_metadata.get("version") or 1), row["createdon"], row["createdby"])


def model_diff(previous: RuntimeModelSet, proposed: RuntimeModelSet) -> dict[str, Any]:
    """What an apply of `proposed` changes: aspects and entities added, changed (schema, mode or definition),
    removed."""
    def changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, list[str]]:
        return {"added": sorted(new.keys() - old.keys()), "removed": sorted(old.keys() - new.keys()),
                "changed": sorted(k for k in old.keys() & new.keys() if old[k] != new[k])}

    return {"aspects": changes(dict(previous.aspects), dict(proposed.aspects)),
            "entities": changes({e.name: e for e in previous.entities}, {e.name: e for e in proposed.entities})}


# ----------------------------------------------------------------------------------------------------------------
# Checks against stored data
# ----------------------------------------------------------------------------------------------------------------
# Where the values of an aspect are stored, each source paged by its own key: (SQL taking the aspect, the key after
# which a page starts and the page size; the key it starts from). A versioned aspect: its latest rows. A timeseries
# aspect: its points, as the embedded search backend keeps them (timeseries_point) and as the change-log outbox does
# (a point not indexed yet is there only; with Elasticsearch, the outbox holds those it retains).
_VERSIONED_VALUES = (("""SELECT urn AS key, urn, metadata FROM metadata_aspect_v2
                         WHERE version = 0 AND aspect = $1 AND urn > $2 ORDER BY urn LIMIT $3""", ""),)
_TIMESERIES_VALUES = (
    ("""SELECT doc_id AS key, urn, value::text AS metadata FROM timeseries_point
        WHERE aspect = $1 AND doc_id > $2 ORDER BY doc_id LIMIT $3""", ""),
    ("""SELECT id AS key, urn, payload::jsonb -> 'aspect' ->> 'value' AS metadata FROM change_log_outbox
        WHERE aspect = $1 AND id > $2 AND change_type = 'UPSERT' ORDER BY id LIMIT $3""", 0),
)
_VERSIONED_HOLDERS = "SELECT urn FROM metadata_aspect_v2 WHERE version = 0 AND aspect = $1 AND urn LIKE $2"
_TIMESERIES_HOLDERS = """SELECT urn FROM timeseries_point WHERE aspect = $1 AND urn LIKE $2
                         UNION SELECT urn FROM change_log_outbox WHERE aspect = $1 AND urn LIKE $2"""


async def stored_data_refusals(session: AsyncSession, in_force: EntityRegistry, built: EntityRegistry,
                               previous: RuntimeModelSet, proposed: RuntimeModelSet) -> list[Refusal]:
    """An aspect or entity removed while it has stored values (`RemovedAspectHasValues`, `RemovedEntityHasValues`,
    with the count); a changed aspect schema that stored values do not pass (`StoredValueInvalid`, the first ones
    with their URN, paging through every stored value: the latest ones of a versioned aspect, every point of a
    timeseries one)."""
    conn = await session_connection(session)
    refusals: list[Refusal] = []
    for entity, spec in sorted(in_force.entities.items()):
        if built.has_entity(entity):
            kept = built.entity(entity).aspect_names
            for aspect in sorted(spec.aspect_names - kept):
                holders = _TIMESERIES_HOLDERS if in_force.aspects[aspect].is_timeseries else _VERSIONED_HOLDERS
                count = await conn.fetchval(f"SELECT count(*) FROM ({holders}) holders", aspect, _urn_prefix(entity))
                if count:
                    refusals.append(Refusal("RemovedAspectHasValues", f"aspect {aspect} of entity {entity} is removed "
                                            f"but {count} {entity} entities have a stored value of it", aspect))
        else:
            count = await conn.fetchval(
                "SELECT count(DISTINCT urn) FROM metadata_aspect_v2 WHERE version = 0 AND urn LIKE $1",
                _urn_prefix(entity))
            if count:
                refusals.append(Refusal("RemovedEntityHasValues",
                                        f"entity {entity} is removed but {count} of its entities are stored"))
    for name, aspect in sorted(proposed.aspects.items()):
        old = previous.aspects.get(name)
        if old is None or old.schema == aspect.schema:
            continue
        refusals.extend(await _invalid_stored_values(conn, built, name))
    return refusals


def _urn_prefix(entity: str) -> str:
    escaped = entity.replace("%", "\\%").replace("_", "\\_")
    return f"urn:li:{escaped}:%"


async def _invalid_stored_values(conn, built: EntityRegistry, aspect: str) -> list[Refusal]:
    spec = built.aspects[aspect]
    validator = spec.validator()
    refusals: list[Refusal] = []
    for sql, start in _TIMESERIES_VALUES if spec.is_timeseries else _VERSIONED_VALUES:
        after = start
        while len(refusals) < STORED_FAILURES_REPORTED:
            rows = await conn.fetch(sql, aspect, after, STORED_PAGE_ROWS)
            for row in rows:
                try:
                    validator(orjson.loads(row["metadata"]))
                except AspectValidationError as error:
                    issue = error.issues[0] if error.issues else None
                    refusals.append(Refusal(
                        "StoredValueInvalid", f"the stored value of {row['urn']} does not pass the new schema: "
                        f"{issue.message if issue else error}", aspect, issue.path if issue else "$"))
                    if len(refusals) == STORED_FAILURES_REPORTED:
                        return refusals
            if len(rows) < STORED_PAGE_ROWS:
                break
            after = rows[-1]["key"]
    return refusals


async def refuse_writes_past_the_models(repo: AspectRepository, registry: EntityRegistry,
                                        items: Iterable[ItemResult]) -> None:
    """Inside a write transaction, after its verdicts: the values it writes of runtime models (an aspect or entity
    that is not a base one, or no longer in the registry) are written under a share lock of the stored set's row, so
    an apply (which locks it for update through its checks against stored data and its commit) sees them, or they
    see the set it stored. This process's registry must hold the set stored (one that has not taken a newer set up
    yet: a 503, retried once its watcher has) and the values must pass it (a value checked against the set before
    it changed: refused naming it). A registry that never took a set up (generation 0) holds the base models only,
    as it did when the write was checked: the write holds no value of a runtime model, nothing to look up."""
    if not registry.generation:
        return
    runtime = [item for item in _written(items) if _of_runtime_models(registry, item)]
    if not runtime:
        return
    locked = (await repo.latest([(MODELS_URN, MODELS_ASPECT)], for_share=True)).get((MODELS_URN, MODELS_ASPECT))
    stored = locked.version if locked is not None else 0
    if stored != registry.runtime_version:
        raise ServiceUnavailable(
            f"the runtime model set changed (version {stored} is stored, this process holds version "
            f"{registry.runtime_version}); nothing was written, retry")
    issues = []
    for item in runtime:
        try:
            registry.aspect(item.entity_type, item.aspect).validate(item.value)
        except RegistryError as error:
            issues.append(Issue(f"{error} (the runtime model set changed)", item.index, item.urn, item.aspect))
        except AspectValidationError as error:
            issues.extend(Issue(f"{i.message} (the runtime model set changed)", item.index, item.urn, item.aspect,
                                i.path) for i in error.issues)
    if issues:
        raise ValidationFailed(f"{len(issues)} values do not pass the runtime model set stored since they were "
                               "checked; nothing was written", issues)


_WRITTEN = frozenset({ItemStatus.CREATED, ItemStatus.UPDATED, ItemStatus.APPENDED})


def _written(items: Iterable[ItemResult]) -> Iterator[ItemResult]:
    for item in items:
        if item.status in _WRITTEN:
            yield item
        yield from _written(item.emitted or ())


def _of_runtime_models(registry: EntityRegistry, item: ItemResult) -> bool:
    entity = registry.entities.get(item.entity_type)
    return (entity is None or registry.is_runtime(entity.key_aspect) or item.aspect not in registry.aspects
            or registry.is_runtime(item.aspect))


# ----------------------------------------------------------------------------------------------------------------
# Apply
# ----------------------------------------------------------------------------------------------------------------
def refused(refusals: Sequence[Refusal]) -> ValidationFailed:
    return ValidationFailed(
        f"the model set is refused ({len(refusals)} problems); nothing was stored: "
        + "; ".join(r.describe() for r in refusals[:5]),
        [Issue(f"{r.rule}: {r.message}", aspect=r.aspect, path=r.path, expected=r.expected, found=r.found)
         for r in refusals])


async def apply_models(gateway: IngestGateway, session: AsyncSession, caller: Principal, proposed: RuntimeModelSet,
                       *, dry_run: bool = False, if_version: int | None = None) -> dict[str, Any]:
    """Check `proposed` (against the set in force, the base models and the stored data), then store it as the next
    version, conditional on the version it was checked against (a concurrent apply: 409), and take it up in this
    process at once (the others within METALEDGER_MODEL_REFRESH_S). `dry_run`: the checks and the diff only: the
    very same checks (`_checked`), so a dry run that passes is an apply that passes, unless the stored set or the
    stored data change meanwhile.

    An apply runs in one transaction that first locks the stored set's row for update: writes of runtime models
    share-lock it (`refuse_writes_past_the_models`), so none lands between the checks against stored data and the
    commit, and none that follows is checked against the set this one replaces."""
    if dry_run:
        return (await _checked(gateway, session, caller, proposed, if_version)).answer
    repo = AspectRepository(session)
    async with repo.transaction():
        await repo.latest([(MODELS_URN, MODELS_ASPECT)], for_update=True)
        checked = await _checked(gateway, session, caller, proposed, if_version)
        current = checked.current
        try:
            result = await gateway.apply(session, checked.proposals, caller.audit_stamp(), [checked.draft])
        except PreconditionFailed as error:
            raise ExistenceConflict(f"another apply stored a model set since version {current.version} was read; "
                                    "nothing was stored, apply again", error.issues) from None
    item = result.items[0]
    version = int(item.version or current.version)
    if version != gateway.registry.runtime_version:
        gateway.registry.replace_with(checked.built, version)
    return {**checked.answer, "dryRun": False, "version": version, "status": item.status.value}


@dataclass(frozen=True, slots=True)
class CheckedApply:
    answer: dict[str, Any]  # the dry run's
    current: StoredModels  # the stored set the proposed one replaces
    built: EntityRegistry  # the registry it makes
    draft: Draft  # its write: the stored form, conditional on `current`'s version
    proposals: list[Any]  # that write prepared (validated, through the proposal rules)


async def _checked(gateway: IngestGateway, session: AsyncSession, caller: Principal, proposed: RuntimeModelSet,
                   if_version: int | None) -> CheckedApply:
    """Everything an apply checks before it writes, for the dry run and the apply alike: the 409 (`if_version` is
    not the stored version); the 400 naming every refusal (app.registry.compatibility's rules, nesting within
    METALEDGER_MAX_JSON_DEPTH; the GraphQL schema the set makes; the stored data); the write's own refusals (the
    caller's permission, the stored form, the write path's validation of it)."""
    registry = gateway.registry
    current = await stored_models(session)
    if if_version is not None and if_version != current.version:
        raise ExistenceConflict(f"the stored model set is at version {current.version}, not {if_version}; "
                                "another apply came first", [Issue("version mismatch", urn=MODELS_URN,
                                                                   aspect=MODELS_ASPECT, path="$ifVersion")])
    checked = check_models(registry, current.models, proposed, max_depth=gateway.settings.max_json_depth)
    refusals = checked.refusals
    if not refusals:
        assert checked.built is not None
        refusals = graphql_refusals(checked.built, proposed)
    if not refusals:
        assert checked.built is not None
        refusals = await stored_data_refusals(session, registry, checked.built, current.models, proposed)
    if refusals:
        raise refused(refusals)
    assert checked.built is not None
    draft = Draft(0, PIPELINE_ENTITY, MODELS_ASPECT, urn=MODELS_URN, value=proposed.to_stored(),
                  headers={IF_VERSION_MATCH: str(current.version) if current.version else "-1"})
    await gateway.authorize(caller, [draft])
    with system_service_write(MODELS_URN, MODELS_ASPECT):  # the rule refusing any other write lets it pass
        proposals = await gateway.prepare_in_turns([draft])
    answer = {"previousVersion": current.version, "diff": model_diff(current.models, proposed),
              "dryRun": True, "version": current.version}
    return CheckedApply(answer, current, checked.built, draft, list(proposals))


GRAPHQL_BLAMED = 10  # a GraphQL schema that does not build: the runtime entity types tried alone, to name them


def graphql_refusals(built: EntityRegistry, proposed: RuntimeModelSet) -> list[Refusal]:
    """`GraphQLSchemaDoesNotBuild` when the GraphQL schema of `built` (each runtime entity type an object type,
    app.graphql.service) does not build: the processes would serve GraphQL on their last schema, without the set's
    types. The refusals name the entity types whose type does not build alone (of the first GRAPHQL_BLAMED)."""
    from app.graphql import service as graphql  # imported already where models are applied (the API's process)
    from app.graphql.entities import runtime_entity_sdl, runtime_entity_types

    def fails(types: dict[str, str]) -> str | None:
        try:
            graphql.build(runtime_entity_sdl(built, types), types)
        except Exception as error:  # noqa: BLE001 - whatever it raises refuses the set
            return clip(str(error).split("\n", 1)[0], 300)
        return None

    types = runtime_entity_types(built, graphql.BASE.schema.type_map)
    error = fails(types) if types else None
    if error is None:
        return []
    positions = {e.name: f"$.entities[{i}]" for i, e in enumerate(proposed.entities)}
    refusals = [Refusal("GraphQLSchemaDoesNotBuild", f"the GraphQL type of entity {clip(name, 100)} does not build: "
                        f"{alone}", None, positions.get(name, "$.entities"))
                for name, type_name in list(types.items())[:GRAPHQL_BLAMED]
                if (alone := fails({name: type_name})) is not None]
    return refusals or [Refusal("GraphQLSchemaDoesNotBuild", f"the GraphQL schema of the model set does not build: "
                                f"{error}", None, "$.entities")]


# ----------------------------------------------------------------------------------------------------------------
# Take-up in every process
# ----------------------------------------------------------------------------------------------------------------
class ModelWatcher:
    """Keeps a process's registry at the stored runtime model set: one indexed single-row query every
    `model_refresh_s`; a new version is read, built and swapped into the registry in place (listeners follow).
    A stored set that does not build (written around the checks) is logged once and the registry left as it is.
    Several watchers may keep one registry (a relay built without the process's has its own): a set is swapped in
    only if no other swap came while it was built, so the registry never goes back to a version older than it held.
    A worker that meets a change log of an entity type or aspect its registry lacks takes the set up at once
    (`refresh_for`)."""

    def __init__(self, settings: Settings, sessionmaker: async_sessionmaker[AsyncSession],
                 registry: EntityRegistry) -> None:
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
                log.exception("the stored runtime model set does not build; the models in force are kept",
                              extra={"version": stored.version, "in_force": self.registry.runtime_version})
                return False
            if self.registry.generation == generation:
                break
            # another watcher swapped a set in meanwhile (maybe a newer one): look at the stored version again
        self.registry.replace_with(built, stored.version)
        log.info("runtime models taken up", extra={
            "version": stored.version, "aspects": sorted(stored.models.aspects),
            "entities": [e.name for e in stored.models.entities], "generation": self.registry.generation})
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

    def __init__(self, worker, watcher: ModelWatcher) -> None:
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
