"""Rest.li's deletes, as DataHub's clients ask for them (`/entities?action=delete|deleteReferences`): what they read
and write, behind the gateway like every other write. The protocol module parses and checks the request; this
module owns the rows and the timeseries points.

* :func:`delete_entity`: a hard delete of an entity (every aspect, every version, its timeseries points), of one
  versioned aspect's versions, or of a timeseries aspect's points in a time range; one transaction for the rows and
  the timeseries change logs not yet indexed, then the points already in the timeseries index.
* :func:`delete_references`: the references other entities hold to a URN (app.ingest.references), removed through
  the write path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.model import Principal
from app.changelog.outbox import OutboxRepository
from app.errors import MetaledgerError
from app.ingest.gateway import IngestGateway
from app.ingest.references import Reference, find_references, relationship_paths, removal_drafts
from app.registry.registry import AspectSpec, EntitySpec
from app.search.service import SearchRuntime
from app.write.proposal import ChangeType, Draft
from app.write.repository import AspectRepository


@dataclass(frozen=True, slots=True)
class Deleted:
    rows: int
    timeseries_rows: int


async def delete_entity(
    session: AsyncSession,
    gateway: IngestGateway,
    caller: Principal,
    entity: EntitySpec,
    aspect: AspectSpec | None,
    urn: str,
    start_ms: int | None,
    end_ms: int | None,
    *,
    search: SearchRuntime | None,
    caught_up: Callable[[], Awaitable[bool]],
) -> Deleted:
    """Delete `urn` (`aspect` None), one versioned aspect's versions, or a timeseries aspect's points in
    [start_ms, end_ms] (bounds inclusive, optional; timeseries only: the caller checked)."""
    registry = gateway.registry
    aspects, outbox = AspectRepository(session), OutboxRepository(session)
    timeseries_topic = gateway.settings.topic_mcl_timeseries
    timeseries = aspect is None or aspect.is_timeseries
    series = (
        [aspect.name]
        if aspect is not None
        else sorted(a for a in entity.aspect_names if registry.aspects[a].is_timeseries)
    )
    rows = timeseries_rows = 0
    # One transaction: the counts, the timeseries points and the rows (the write path's transaction nests as a
    # savepoint on the same connection).
    async with aspects.transaction():
        if aspect is not None and aspect.is_timeseries:
            timeseries_rows = await outbox.delete_timeseries(timeseries_topic, urn, series, start_ms, end_ms)
        else:
            target = aspect.name if aspect is not None else entity.key_aspect
            rows = await aspects.count_rows(urn, None if target == entity.key_aspect else target)
            if rows:
                await gateway.submit(session, [Draft(0, entity.name, target, ChangeType.DELETE.value, urn=urn)], caller)
            if aspect is None:  # the whole entity: its timeseries points too
                timeseries_rows = await outbox.delete_timeseries(timeseries_topic, urn, series, None, None)
    if timeseries and search is not None:
        # The points' change logs may still sit in the outbox: let the embedded worker apply what was committed
        # before this delete (so it cannot index a deleted point afterwards), then delete them from the index too.
        # Counted once: a point is in the outbox, the index, or both.
        await caught_up()
        backend = await search.ready_backend()
        timeseries_rows = max(
            timeseries_rows, await backend.delete_timeseries(urn, series, start_ms=start_ms, end_ms=end_ms)
        )
    return Deleted(rows, timeseries_rows)


async def delete_references(
    session: AsyncSession,
    gateway: IngestGateway,
    caller: Principal,
    urn: str,
    *,
    dry_run: bool,
) -> list[Reference]:
    """The references to `urn` (one per aspect that holds any), removed unless `dry_run`."""
    registry = gateway.registry
    needle = orjson.dumps(urn).decode()[1:-1]  # the URN as it appears inside stored JSON text
    candidates = await AspectRepository(session).rows_mentioning(needle, urn, sorted(relationship_paths(registry)))
    references = find_references(registry, candidates, urn)
    if not dry_run and references:
        try:
            await gateway.submit(session, removal_drafts(references), caller)
        except MetaledgerError as error:
            error.message = f"removing the references to {urn} failed (retry): {error.message}"
            raise
    return references
