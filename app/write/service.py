"""The write pipeline, top to bottom:

    parse (endpoint) → resolve registry → validate → proposal rules (plugins) → [transaction: lock latest rows →
    apply patches → pre-commit rules (conditional writes) → compute rows + change logs → write rows + outbox] →
    commit → publish

Everything but the transaction's I/O is app.write.decision (`WriteCore`): `prepare` runs the stages before the
transaction and reports every bad item of a batch at once; `commit` runs the transaction: lock the rows the decision
asks for, decide, write what it decided in one statement (after the deletes, when there are any); retried whole on a
lost first-insert race, a deadlock or a serialization failure. `commit_group` runs several independent writes in one
transaction (app.write.combiner).

A connection lost during COMMIT leaves the outcome open: the transaction may have committed. The service then asks the
database, once it is back (for at most COMMIT_CHECK_S), what became of the transaction's id and answers the truth:
the results if it committed, a 503 saying nothing was written if it did not, and `CommitOutcomeUnknown` (a 503 too)
if the database did not answer in time. Retrying is safe either way: an identical value is answered UNCHANGED,
with no new version and no change log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.changelog.outbox import OutboxRow
from app.db import CommitInterrupted, transaction_status
from app.errors import ExistenceConflict, Issue, PreconditionFailed, ServiceUnavailable, ValidationFailed
from app.idempotency.commit import mark_committed
from app.ops.metrics import TRANSACTION_RETRIES, first_write_fields
from app.registry import EntityRegistry
from app.settings import Settings
from app.turns import turn
from app.write.decision import Decision, ItemResult, Locked, Turn, WriteCore
from app.write.model_writes import refuse_writes_past_the_models
from app.write.processors import PIPELINE_ASPECT, PIPELINE_URN, Pipeline
from app.write.proposal import AuditStamp, Draft, Proposal
from app.write.repository import RETRYABLE_DB_ERRORS, AspectRepository
from app.write.rules import RuleChain, Verdict, VerdictKind
from app.write.structured_properties import (
    PROPERTY_DEFINITION,
    PropertyDefinitionChange,
    StoredValueCheck,
    refusals_before_queueing,
    stored_value_violations,
)

log = logging.getLogger("metaledger.write")

__all__ = ["CommitOutcomeUnknown", "ItemResult", "CommitResult", "WriteService"]  # ItemResult: app.write.decision's

COMMIT_CHECK_S = 5.0  # how long an interrupted COMMIT waits for the database to say whether it committed


class CommitOutcomeUnknown(ServiceUnavailable):
    """The connection was lost during COMMIT and the database did not come back in time to say whether it committed."""


@dataclass(slots=True)
class CommitResult:
    items: list[ItemResult]
    change_logs: int = 0
    attempts: int = 1
    outbox: list[OutboxRow] = field(default_factory=list)  # the committed change logs (sync index update)


class WriteService:
    def __init__(
        self, registry: EntityRegistry, rules: RuleChain, settings: Settings, processors: Pipeline | None = None
    ) -> None:
        self.core = WriteCore(registry, rules, settings)
        self.registry = registry
        self.settings = settings
        # The change-processor pipeline: entity_registry.yml's until one is stored (refresh_processors)
        self.initial_processors = processors if processors is not None else Pipeline([])
        self.processors = self.initial_processors
        self._processors_checked_at = float("-inf")

    async def refresh_processors(self, repo: AspectRepository, *, force: bool = False) -> Pipeline:
        """The stored pipeline (PIPELINE_ASPECT of PIPELINE_URN), looked at most every
        METALEDGER_CHANGE_PROCESSOR_REFRESH_S by each process and loaded again only when its version changed: a
        pipeline written through any process is in force in every process within that time, without a restart."""
        now = time.monotonic()
        if not force and now - self._processors_checked_at < self.settings.change_processor_refresh_s:
            return self.processors
        self._processors_checked_at = now
        row = (await repo.latest([(PIPELINE_URN, PIPELINE_ASPECT)])).get((PIPELINE_URN, PIPELINE_ASPECT))
        current = self.processors
        if row is None:
            self.processors = self.initial_processors
        elif row.version != current.version:
            self.processors = Pipeline.from_aspect(row.value, row.version)
        if self.processors is not current:
            log.info(
                "change-processor pipeline in force",
                extra={"version": self.processors.version, "steps": [s.step.name for s in self.processors.steps]},
            )
        return self.processors

    async def current_processors(self, session: AsyncSession) -> Pipeline:
        """The pipeline in force now (read from the database, not from this process's copy)."""
        return await self.refresh_processors(AspectRepository(session), force=True)

    def prepare(self, drafts: Sequence[Draft]) -> list[Proposal]:
        """Resolve, validate and run the proposal rules on every draft; one error listing every bad item."""
        return self.core.prepare(drafts)

    async def check_before_queueing(self, session: AsyncSession, proposals: Sequence[Proposal]) -> None:
        """What an asynchronous write's transaction will refuse that the stored rows tell now (structured property
        values against their definitions): the same error, before the write is queued."""
        _raise_on_fatal_verdicts(
            await refusals_before_queueing(AspectRepository(session), proposals), log_refusals=True
        )

    # --- the transaction ---------------------------------------------------------------------------------------
    async def commit(
        self,
        session: AsyncSession,
        proposals: Sequence[Proposal],
        audit: AuditStamp,
        contended: Callable[[], bool] | None = None,
    ) -> CommitResult:
        return (await self.commit_group(session, [(proposals, audit)], contended))[0]

    async def commit_group(
        self,
        session: AsyncSession,
        writes: Sequence[tuple[Sequence[Proposal], AuditStamp]],
        contended: Callable[[], bool] | None = None,
    ) -> list[CommitResult]:
        """Several independent writes (each a batch of proposals and its caller's audit stamp) in one transaction,
        in order: each sees the rows as the writes before it left them, as if they had been committed one after the
        other. A refusal of any of them refuses the group (app.write.combiner then applies them one by one).
        `contended`: whether other callers' writes are in flight, when the decision's turns give them time
        (app.turns)."""
        repo = AspectRepository(session)
        attempts = 0
        while True:
            attempts += 1
            txid = None
            try:
                async with repo.transaction():
                    await self.refresh_processors(repo)
                    decision, txid = await self._run_transaction(repo, writes, contended)
                    await mark_committed(session, writes)  # their Idempotency-Keys say so if their replies are lost
                break
            except CommitInterrupted as interrupted:
                if txid is None:  # nothing was written: the results hold either way
                    break
                await self._settle_interrupted_commit(session, txid, interrupted, writes)
                break
            except RETRYABLE_DB_ERRORS as error:
                if attempts > self.settings.transaction_retries:
                    raise ServiceUnavailable(
                        f"the write could not be committed after {attempts} attempts ({type(error).__name__}); retry"
                    ) from error
                TRANSACTION_RETRIES.labels(type(error).__name__).inc()
                log.info(
                    "write transaction retried",
                    extra={
                        "attempt": attempts,
                        "reason": type(error).__name__,
                        "detail": getattr(error, "detail", None) or str(error),
                        "items": sum(len(w[0]) for w in writes),
                        **first_write_fields(writes[0][0]),
                    },
                )
        if log.isEnabledFor(logging.DEBUG):  # not on the hot path unless asked for
            log.debug(
                "write committed",
                extra={
                    "writes": len(writes),
                    "items": sum(len(w[0]) for w in writes),
                    "change_logs": len(decision.outbox),
                    **first_write_fields(writes[0][0]),
                },
            )
        self.processors.publish_metrics()
        if any(p.urn == PIPELINE_URN for proposals, _ in writes for p in proposals):
            self._processors_checked_at = float("-inf")  # this process's next write uses the new pipeline
        return [CommitResult(list(w.items), len(w.outbox), attempts, list(w.outbox)) for w in decision.writes]

    async def _settle_interrupted_commit(
        self,
        session: AsyncSession,
        txid: str,
        interrupted: CommitInterrupted,
        writes: Sequence[tuple[Sequence[Proposal], AuditStamp]],
    ) -> None:
        """Returns if transaction `txid` committed; raises the 503 that tells what is known otherwise."""
        engine = session.bind
        assert isinstance(engine, AsyncEngine)  # write sessions come from app.db's sessionmaker, bound to the engine
        status = await transaction_status(engine, txid, COMMIT_CHECK_S)
        log.warning(
            "write commit interrupted",
            extra={
                "txid": txid,
                "outcome": status or "unknown",
                "error": str(interrupted),
                "items": sum(len(w[0]) for w in writes),
                **first_write_fields(writes[0][0]),
            },
        )
        if status == "committed":
            return
        if status == "aborted":
            raise ServiceUnavailable(
                "the connection to the database was lost during COMMIT and the write was not committed; retry"
            ) from interrupted
        raise CommitOutcomeUnknown(
            f"the connection to the database was lost during COMMIT and the database did not answer within "
            f"{COMMIT_CHECK_S:g} s: the write may or may not be stored; retrying it is safe (a write that landed is not "
            "applied twice: the same value is answered UNCHANGED)"
        ) from interrupted

    async def _run_transaction(
        self,
        repo: AspectRepository,
        writes: Sequence[tuple[Sequence[Proposal], AuditStamp]],
        contended: Callable[[], bool] | None = None,
    ) -> tuple[Decision, str | None]:
        """Lock what the decision asks for (the group's rows, then those of the proposals change processors emit),
        refuse the group on a fatal verdict, write the decision; the decision and the transaction's id (None: it
        wrote nothing)."""
        deciding = self.core.decide(writes, self.processors)
        locked = None
        try:
            while True:
                request = deciding.send(locked)
                if isinstance(request, Turn):
                    await turn(contended)  # a large batch lets the event loop's other requests run
                    locked = None
                else:
                    rows, floors = await repo.lock_latest(request.keys, request.entity_urns)
                    if request.shared:  # read FOR SHARE: value writes of one property do not queue on each other
                        rows = {**rows, **await repo.latest(request.shared, for_share=True)}
                    locked = Locked(rows, floors)
        except StopIteration as done:
            decision: Decision = done.value
        # a group's refusal is not logged: the combiner applies its writes again one by one, and the culprit's is
        _raise_on_fatal_verdicts(decision.refused, log_refusals=len(writes) == 1)
        await refuse_writes_past_the_models(repo, self.registry, (i for w in decision.writes for i in w.items))
        # Deletes go first and alone: a batch may delete an aspect and write it again.
        await repo.delete_entities(decision.deleted_urns)
        await repo.delete_aspects(decision.deleted_keys)
        txid = await repo.write_changes(
            decision.inserts, decision.updates, decision.prune, decision.outbox, decision.floors
        )
        # after the writes: the check sees this transaction's own values too; a refusal rolls it all back
        await _raise_on_invalidated_values(repo, decision.stored_checks)
        return decision, txid


async def _raise_on_invalidated_values(repo: AspectRepository, checks: Sequence[StoredValueCheck]) -> None:
    issues = []
    for check in checks:
        violations = await stored_value_violations(repo, check)
        if violations:
            message = (
                f"{PropertyDefinitionChange.name}: the change of {check.definition.urn} would invalidate stored "
                f"values: {'; '.join(violations)}"
            )
            issues.append(Issue(message, check.index, check.definition.urn, PROPERTY_DEFINITION, "$.aspect.value"))
    if issues:
        raise ValidationFailed(
            f"{len(issues)} structured property definition changes would invalidate stored values; nothing was written",
            issues,
        )


def _raise_on_fatal_verdicts(refused: Sequence[tuple[Proposal, Verdict]], *, log_refusals: bool) -> None:
    if not refused:
        return
    issues = [Issue(f"{v.rule}: {v.message}", p.index, p.urn, p.aspect_name, v.path) for p, v in refused]
    kinds = {v.kind for _, v in refused}
    summary = f"{len(refused)} of the batch's proposals failed their checks; nothing was written"
    for p, v in refused if log_refusals else ():
        log.info(
            "write rejected",
            extra={"urn": p.urn, "aspect": p.aspect_name, "run_id": p.run_id, "rule": v.rule, "reason": v.message},
        )
    if VerdictKind.PRECONDITION in kinds:
        raise PreconditionFailed(summary, issues)
    if VerdictKind.CONFLICT in kinds:
        raise ExistenceConflict(summary, issues)
    raise ValidationFailed(summary, issues)
