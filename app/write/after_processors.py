"""The change processors' after phase: side effects of committed changes, which must not slow or fail the write.

A reader of the change feed (app.changelog.cursor, reader CHANGE_PROCESSORS) in the background work of the service
(`Background`, or `serve --workers N`'s background process). Each batch, in one transaction:

    lock the position → read the next change logs → run the pipeline's `after` steps on those in their scope →
    apply the proposals they emit (WriteService: validated, the before phase run on them, each with its cause in
    systemMetadata.properties) → move the position past the batch → commit

so a change log's side effects are committed exactly when the position passes it: exactly once, even when the
process dies mid-batch (the batch is read again) or two processes run the reader (they serialise on the position).

- Emitted proposals are applied together; if that write is refused (a rule, a before processor, a precondition),
  they are applied one by one and only the refused ones are dropped, each logged with its processor and cause.
- A processor that raises, runs past its budget or returns Reject has nothing to refuse (the change is committed):
  it is logged with its cause and counted (metaledger_change_processor_calls_total, outcome "failed"/"rejected"),
  and the reader goes on.
- A required step that is missing holds the reader (nothing is skipped) until the pipeline or the installation is
  fixed; the position stops, and pruning keeps the change logs past it.
- The pipeline in force when a change log is read applies to it. Without `after` steps the reader only moves its
  position (no payload read), so adding one takes effect from about the moment it is stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.changelog.cursor import CHANGE_PROCESSORS, FeedCursor
from app.db import close_quietly, connect_dedicated, session_connection
from app.errors import MetaledgerError
from app.settings import Settings
from app.workers import pause
from app.write.processors import (
    MAX_CAUSE_DEPTH,
    EmittedProposal,
    Phase,
    Pipeline,
    ProposedChange,
    cause_depth,
    cause_properties,
)
from app.write.proposal import SYSTEM_ACTOR, AuditStamp, Draft, Proposal
from app.write.repository import AspectRepository
from app.write.service import WriteService

log = logging.getLogger("metaledger.processors.after")

MAX_BACKOFF_S = 5.0


class RequiredProcessorMissing(RuntimeError):
    """A required after step is not available: the reader holds its position."""


@dataclass(slots=True)
class _Emission:
    cause: ProposedChange
    processor: str
    proposal: EmittedProposal


class AfterProcessorWorker:
    reader = CHANGE_PROCESSORS  # the feed position it moves

    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        sessionmaker: async_sessionmaker[AsyncSession],
        writer: WriteService,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.sessionmaker = sessionmaker
        self.writer = writer
        self.batch = settings.after_processor_batch_size
        self.poll_s = settings.after_processor_poll_ms / 1000
        self.topics = [settings.topic_mcl_versioned, settings.topic_mcl_timeseries]
        self.processed = 0  # change logs the after steps ran on (for tests and logs)
        self.applied = 0  # emitted proposals written

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            poll: asyncpg.Connection | None = None
            try:
                # the idle poll on a connection of its own; a batch takes a pooled session (the writer needs one)
                poll = await connect_dedicated(self.engine, "metaledger-change-processors")
                cursor = FeedCursor(poll, self.reader)
                await cursor.register(start=await cursor.feed_end())  # a new reader starts at the feed's end
                while not stop.is_set():
                    count = 0
                    if (await cursor.poll())[1]:
                        count = await self.step()
                    failures = 0
                    if count < self.batch:
                        await pause(stop, self.poll_s)
            except Exception as error:  # noqa: BLE001 - the reader outlives database outages and missing processors
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning(
                        "change processors' after phase: error; retrying",
                        extra={
                            "reader": self.reader,
                            "attempts": failures,
                            "error": f"{type(error).__name__}: {error}",
                        },
                    )
                await pause(stop, min(MAX_BACKOFF_S, 0.1 * 2**failures))
            finally:
                if poll is not None:
                    await close_quietly(poll)

    async def step(self) -> int:
        """One batch, in one transaction; returns the change logs consumed (0 when caught up)."""
        async with self.sessionmaker() as session:
            conn = await session_connection(session)
            cursor = FeedCursor(conn, self.reader)
            async with conn.transaction(isolation="read_committed"):
                pipeline = await self.writer.refresh_processors(AspectRepository(session))
                active = Phase.AFTER in pipeline.phases or any(
                    s.processor is None and s.step.required for s in pipeline.steps
                )
                if not active:  # nothing runs after commit: the rows are passed over unread
                    await cursor.skip_to_end()
                    return 0
                _, rows = await cursor.read_locked(self.batch, self.topics)
                if not rows:
                    return 0
                emissions = self._run(pipeline, rows)
                pipeline.publish_metrics()
                if emissions:
                    await self._commit(session, emissions)
                await cursor.advance(rows[-1]["feed_offset"])
        return len(rows)

    def _run(self, pipeline: Pipeline, rows: Sequence[asyncpg.Record]) -> list[_Emission]:
        emissions: list[_Emission] = []
        for row in rows:
            if row["payload"] is None:
                continue
            change = ProposedChange.from_change_log(orjson.loads(row["payload"]))
            if not pipeline.governs(Phase.AFTER, change.entity_type, change.aspect, change.change_type):
                continue
            result = pipeline.run(Phase.AFTER, change)
            self.processed += 1
            context = {
                "urn": change.urn,
                "aspect": change.aspect,
                "version": change.version,
                "run_id": (change.system_metadata or {}).get("runId"),
            }
            if result.unavailable:
                raise RequiredProcessorMissing(
                    result.rejected[1] if result.rejected else "a required processor is missing"
                )
            if result.rejected is not None:
                log.error(
                    "change processor refused in the after phase: its side effects are skipped",
                    extra={"processor": result.rejected[0], "reason": result.rejected[1], **context},
                )
            if result.emitted and cause_depth(change.system_metadata) >= MAX_CAUSE_DEPTH:
                log.error(
                    "change processors keep emitting because of each other's emissions: dropped",
                    extra={"processors": [name for name, _ in result.emitted], **context},
                )
                continue
            emissions.extend(_Emission(change, name, proposal) for name, proposal in result.emitted)
        return emissions

    async def _commit(self, session: AsyncSession, emissions: list[_Emission]) -> None:
        """Write the emitted proposals: together, or one by one when that is refused (only the refused are lost)."""
        prepared: list[tuple[_Emission, Proposal]] = []
        for index, emission in enumerate(emissions):
            try:
                prepared.append((emission, self.writer.prepare([self._draft(index, emission)])[0]))
            except MetaledgerError as error:
                self._refused(emission, error)
        if not prepared:
            return
        audit = AuditStamp.now(SYSTEM_ACTOR)
        try:
            await self.writer.commit(session, [p for _, p in prepared], audit)
            self.applied += len(prepared)
            return
        except MetaledgerError as error:
            if error.status_code >= 500:
                raise
        for emission, proposal in prepared:
            try:
                await self.writer.commit(session, [proposal], audit)
                self.applied += 1
            except MetaledgerError as error:
                if error.status_code >= 500:
                    raise
                self._refused(emission, error)

    @staticmethod
    def _draft(index: int, emission: _Emission) -> Draft:
        cause, proposal = emission.cause, emission.proposal
        system_metadata = {
            "properties": cause_properties(
                emission.processor, cause.urn, cause.aspect, cause.version, cause.system_metadata
            )
        }
        run_id = (cause.system_metadata or {}).get("runId")
        if run_id:
            system_metadata["runId"] = run_id
        return Draft(
            index,
            proposal.entity_type,
            proposal.aspect,
            proposal.change_type,
            urn=proposal.urn,
            value=proposal.value,
            system_metadata=system_metadata,
        )

    @staticmethod
    def _refused(emission: _Emission, error: MetaledgerError) -> None:
        log.error(
            "a proposal emitted in the after phase was refused: dropped",
            extra={
                "processor": emission.processor,
                "urn": emission.proposal.urn,
                "aspect": emission.proposal.aspect,
                "cause_urn": emission.cause.urn,
                "cause_aspect": emission.cause.aspect,
                "cause_version": emission.cause.version,
                "error": error.message,
                "issues": [i.message for i in (error.issues or [])][:5],
            },
        )
