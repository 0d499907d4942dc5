"""Applying a runtime model set (`metaledger model apply`, `POST /openapi/v1/models`): the checks of
app.registry.compatibility and of the search documents' annotations (app.search.annotations), the GraphQL schema the
set makes, the checks against stored data here; then the set written as the next version through the ingest gateway,
and taken up by this process at once (the others' watchers within METALEDGER_MODEL_REFRESH_S)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.model import Principal
from app.db import session_connection
from app.errors import ExistenceConflict, Issue, PreconditionFailed, ValidationFailed
from app.ingest.gateway import IngestGateway
from app.limits import clip
from app.modelset.store import StoredModels, stored_models
from app.registry import AspectValidationError, EntityRegistry
from app.registry.compatibility import CheckedModels, Refusal, check_models
from app.registry.runtime import MODELS_ASPECT, RuntimeModelSet
from app.search.annotations import annotation_refusals
from app.write.processors import PIPELINE_ENTITY
from app.write.proposal import IF_VERSION_MATCH, Draft
from app.write.repository import AspectRepository
from app.write.rules import MODELS_URN, system_service_write

log = logging.getLogger("metaledger.models")

STORED_FAILURES_REPORTED = 10  # a changed schema that stored values break: the first ones, with their URN
STORED_PAGE_ROWS = 500


def check_model_set(
    registry: EntityRegistry, previous: RuntimeModelSet, proposed: RuntimeModelSet, *, max_depth: int
) -> CheckedModels:
    """app.registry.compatibility's rules, then the annotations of the registry the set makes that the indexer
    reads (app.search.annotations)."""
    return check_models(registry, previous, proposed, max_depth=max_depth, built_rules=(annotation_refusals,))


def model_diff(previous: RuntimeModelSet, proposed: RuntimeModelSet) -> dict[str, Any]:
    """What an apply of `proposed` changes: aspects and entities added, changed (schema, mode or definition),
    removed."""

    def changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, list[str]]:
        return {
            "added": sorted(new.keys() - old.keys()),
            "removed": sorted(old.keys() - new.keys()),
            "changed": sorted(k for k in old.keys() & new.keys() if old[k] != new[k]),
        }

    return {
        "aspects": changes(dict(previous.aspects), dict(proposed.aspects)),
        "entities": changes({e.name: e for e in previous.entities}, {e.name: e for e in proposed.entities}),
    }


# ----------------------------------------------------------------------------------------------------------------
# Checks against stored data
# ----------------------------------------------------------------------------------------------------------------
# Where the values of an aspect are stored, each source paged by its own key: (SQL taking the aspect, the key after
# which a page starts and the page size; the key it starts from). A versioned aspect: its latest rows. A timeseries
# aspect: its points, as the embedded search backend keeps them (timeseries_point) and as the change-log outbox does
# (a point not indexed yet is there only; with Elasticsearch, the outbox holds those it retains).
_VERSIONED_VALUES = (
    (
        """SELECT urn AS key, urn, metadata FROM metadata_aspect_v2
                         WHERE version = 0 AND aspect = $1 AND urn > $2 ORDER BY urn LIMIT $3""",
        "",
    ),
)
_TIMESERIES_VALUES = (
    (
        """SELECT doc_id AS key, urn, value::text AS metadata FROM timeseries_point
        WHERE aspect = $1 AND doc_id > $2 ORDER BY doc_id LIMIT $3""",
        "",
    ),
    (
        """SELECT id AS key, urn, payload::jsonb -> 'aspect' ->> 'value' AS metadata FROM change_log_outbox
        WHERE aspect = $1 AND id > $2 AND change_type = 'UPSERT' ORDER BY id LIMIT $3""",
        0,
    ),
)
_VERSIONED_HOLDERS = "SELECT urn FROM metadata_aspect_v2 WHERE version = 0 AND aspect = $1 AND urn LIKE $2"
_TIMESERIES_HOLDERS = """SELECT urn FROM timeseries_point WHERE aspect = $1 AND urn LIKE $2
                         UNION SELECT urn FROM change_log_outbox WHERE aspect = $1 AND urn LIKE $2"""


async def stored_data_refusals(
    session: AsyncSession,
    in_force: EntityRegistry,
    built: EntityRegistry,
    previous: RuntimeModelSet,
    proposed: RuntimeModelSet,
) -> list[Refusal]:
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
                    refusals.append(
                        Refusal(
                            "RemovedAspectHasValues",
                            f"aspect {aspect} of entity {entity} is removed "
                            f"but {count} {entity} entities have a stored value of it",
                            aspect,
                        )
                    )
        else:
            count = await conn.fetchval(
                "SELECT count(DISTINCT urn) FROM metadata_aspect_v2 WHERE version = 0 AND urn LIKE $1",
                _urn_prefix(entity),
            )
            if count:
                refusals.append(
                    Refusal(
                        "RemovedEntityHasValues", f"entity {entity} is removed but {count} of its entities are stored"
                    )
                )
    for name, proposed_aspect in sorted(proposed.aspects.items()):
        old = previous.aspects.get(name)
        if old is None or old.schema == proposed_aspect.schema:
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
                    refusals.append(
                        Refusal(
                            "StoredValueInvalid",
                            f"the stored value of {row['urn']} does not pass the new schema: "
                            f"{issue.message if issue else error}",
                            aspect,
                            issue.path if issue else "$",
                        )
                    )
                    if len(refusals) == STORED_FAILURES_REPORTED:
                        return refusals
            if len(rows) < STORED_PAGE_ROWS:
                break
            after = rows[-1]["key"]
    return refusals


# ----------------------------------------------------------------------------------------------------------------
# Apply
# ----------------------------------------------------------------------------------------------------------------
def refused(refusals: Sequence[Refusal]) -> ValidationFailed:
    return ValidationFailed(
        f"the model set is refused ({len(refusals)} problems); nothing was stored: "
        + "; ".join(r.describe() for r in refusals[:5]),
        [
            Issue(f"{r.rule}: {r.message}", aspect=r.aspect, path=r.path, expected=r.expected, found=r.found)
            for r in refusals
        ],
    )


async def apply_models(
    gateway: IngestGateway,
    session: AsyncSession,
    caller: Principal,
    proposed: RuntimeModelSet,
    *,
    dry_run: bool = False,
    if_version: int | None = None,
) -> dict[str, Any]:
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
            result = await gateway.commit(session, checked.proposals, caller.audit_stamp(), [checked.draft])
        except PreconditionFailed as error:
            raise ExistenceConflict(
                f"another apply stored a model set since version {current.version} was read; "
                "nothing was stored, apply again",
                error.issues,
            ) from None
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


async def _checked(
    gateway: IngestGateway, session: AsyncSession, caller: Principal, proposed: RuntimeModelSet, if_version: int | None
) -> CheckedApply:
    """Everything an apply checks before it writes, for the dry run and the apply alike: the 409 (`if_version` is
    not the stored version); the 400 naming every refusal (app.registry.compatibility's rules, nesting within
    METALEDGER_MAX_JSON_DEPTH; the GraphQL schema the set makes; the stored data); the write's own refusals (the
    caller's permission, the stored form, the write path's validation of it)."""
    registry = gateway.registry
    current = await stored_models(session)
    if if_version is not None and if_version != current.version:
        raise ExistenceConflict(
            f"the stored model set is at version {current.version}, not {if_version}; another apply came first",
            [Issue("version mismatch", urn=MODELS_URN, aspect=MODELS_ASPECT, path="$ifVersion")],
        )
    checked = check_model_set(registry, current.models, proposed, max_depth=gateway.settings.max_json_depth)
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
    draft = Draft(
        0,
        PIPELINE_ENTITY,
        MODELS_ASPECT,
        urn=MODELS_URN,
        value=proposed.to_stored(),
        headers={IF_VERSION_MATCH: str(current.version) if current.version else "-1"},
    )
    await gateway.authorize(caller, [draft])
    with system_service_write(MODELS_URN, MODELS_ASPECT):  # the rule refusing any other write lets it pass
        proposals = await gateway.prepare_in_turns([draft])
    answer = {
        "previousVersion": current.version,
        "diff": model_diff(current.models, proposed),
        "dryRun": True,
        "version": current.version,
    }
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
    refusals = [
        Refusal(
            "GraphQLSchemaDoesNotBuild",
            f"the GraphQL type of entity {clip(name, 100)} does not build: {alone}",
            None,
            positions.get(name, "$.entities"),
        )
        for name, type_name in list(types.items())[:GRAPHQL_BLAMED]
        if (alone := fails({name: type_name})) is not None
    ]
    return refusals or [
        Refusal(
            "GraphQLSchemaDoesNotBuild",
            f"the GraphQL schema of the model set does not build: {error}",
            None,
            "$.entities",
        )
    ]
