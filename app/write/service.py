"""The write pipeline, top to bottom:

    parse (endpoint) → resolve registry → validate → proposal rules (plugins) → [transaction: lock latest rows →
    apply patches → pre-commit rules (conditional writes) → compute rows + change logs → write rows + outbox] →
    commit → publish

`prepare` runs the stages before the transaction and reports every bad item of a batch at once; `apply` runs the
transaction (retried whole on a lost first-insert race, a deadlock or a serialization failure); `apply_group` runs
several independent writes in one transaction (app.write.combiner).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from app.errors import (
    ExistenceConflict,
    Issue,
    MetaledgerError,
    PayloadTooLarge,
    PreconditionFailed,
    ServiceUnavailable,
    ValidationFailed,
)
from app.ops.metrics import TRANSACTION_RETRIES, first_write_fields
from app.registry import EntityRegistry
from app.registry.errors import AspectValidationError, RegistryError
from app.settings import Settings
from app.limits import MAX_LONG, MIN_LONG, clip, too_deep
from app.urns import URN_MAX_STORED_CHARS, InvalidUrnError, entity_type_of, shown, validate_urn
from app.changelog.outbox import OutboxRow
from app.write.mcl import build_change_log
from app.changelog.entity_change_events import entity_change_events, platform_event, platform_event_key
from app.write.patch import PatchDocument, PatchError, apply_patch, parse_patch
from app.write.proposal import (
    DEFAULT_RUN_ID,
    JSON_PATCH_CONTENT_TYPE,
    PROPOSABLE_CHANGE_TYPES,
    SYSTEM_ACTOR,
    AuditStamp,
    ChangeType,
    Draft,
    Proposal,
)
from app.write.repository import RETRYABLE_DB_ERRORS, AspectRepository, StoredAspect
from app.write.processors import (
    MAX_CAUSE_DEPTH,
    PIPELINE_ASPECT,
    PIPELINE_URN,
    Change,
    EmittedProposal,
    Phase,
    Pipeline,
    PipelineResult,
    StepReport,
    cause_depth,
    cause_properties,
)
from app.write.rules import PendingChange, RuleChain, Verdict, VerdictKind, builtin_proposal_rules

log = logging.getLogger("metaledger.write")

MAX_REPORTED_ISSUES = 100


class ItemStatus(str, enum.Enum):
    CREATED = "CREATED"
    UPDATED = "UPDATED"
    UNCHANGED = "UNCHANGED"  # a no-op: same value; only lastObserved/runId were refreshed
    DELETED = "DELETED"
    ABSENT = "ABSENT"  # a DELETE of something that was not there
    FILTERED = "FILTERED"  # dropped by If-None-Match: *
    IGNORED = "IGNORED"  # dropped by a change processor (app.write.processors): nothing written, no change log
    APPENDED = "APPENDED"  # a timeseries point, appended to the change log


@dataclass(slots=True)
class ItemResult:
    index: int
    urn: str
    entity_type: str
    aspect: str
    status: ItemStatus
    value: dict[str, Any] | None = None
    system_metadata: dict[str, Any] | None = None
    message: str | None = None
    processors: list[StepReport] | None = None  # what the change processors' before phase did to it
    emitted: list[ItemResult] | None = None  # the proposals they emitted because of it, applied with it

    @property
    def version(self) -> str | None:
        return (self.system_metadata or {}).get("version")

    def processing(self) -> dict[str, Any]:
        """What change processors did, for a write's answer: `changeProcessors` (each that ran, its outcome) and
        `emitted` (the proposals they emitted because of this item); empty when no processor looked at it."""
        shown: dict[str, Any] = {}
        if self.processors:
            shown["changeProcessors"] = [report.to_json() for report in self.processors]
        if self.emitted:
            shown["emitted"] = [{"urn": r.urn, "aspectName": r.aspect, "status": r.status.value, "version": r.version,
                                 **r.processing()} for r in self.emitted]
        return shown


@dataclass(slots=True)
class WriteResult:
    items: list[ItemResult]
    change_logs: int = 0
    attempts: int = 1
    outbox: list[OutboxRow] = field(default_factory=list)  # the committed change logs (sync index update)


@dataclass(slots=True)
class _Transaction:
    """The in-memory state of one write transaction: the locked rows as they evolve, and what to flush."""

    state: dict[tuple[str, str], StoredAspect | None]
    existed_before: set[str]
    inserted_keys: set[tuple[str, str]] = field(default_factory=set)  # row 0 absent from the DB: INSERT
    dirty: dict[tuple[str, str], StoredAspect] = field(default_factory=dict)  # final row 0 to write
    history: dict[tuple[str, str], list[StoredAspect]] = field(default_factory=dict)
    deleted_keys: set[tuple[str, str]] = field(default_factory=set)
    deleted_urns: set[str] = field(default_factory=set)
    # Version floors: the highest version each aspect reached before a delete. `floors` as read (keys without row 0)
    # and raised by this batch's deletes (a first insert continues from it); `raised_floors` to write.
    floors: dict[tuple[str, str], int] = field(default_factory=dict)
    raised_floors: dict[tuple[str, str], int] = field(default_factory=dict)
    outbox: list[OutboxRow] = field(default_factory=list)
    results: list[ItemResult] = field(default_factory=list)
    verdicts: list[tuple[Proposal, Verdict]] = field(default_factory=list)
    emitted: list[_Emitted] = field(default_factory=list)  # by the before phase, applied at the end of the write


@dataclass(slots=True)
class _Emitted:
    """A proposal a change processor emitted in the before phase, with what caused it."""

    processor: str
    proposal: EmittedProposal
    cause: Proposal
    cause_result: ItemResult | None


def _now_naive_utc(millis: int) -> datetime:
    return datetime.fromtimestamp(millis / 1000, tz=timezone.utc).replace(tzinfo=None)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


class WriteService:
    def __init__(self, registry: EntityRegistry, rules: RuleChain, settings: Settings,
                 processors: Pipeline | None = None) -> None:
        self.registry = registry
        self.rules = rules.with_validators_first(builtin_proposal_rules(registry.urn_to_key))
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
            log.info("change-processor pipeline in force", extra={
                "version": self.processors.version, "steps": [s.step.name for s in self.processors.steps]})
        return self.processors

    async def current_processors(self, session: AsyncSession) -> Pipeline:
        """The pipeline in force now (read from the database, not from this process's copy)."""
        return await self.refresh_processors(AspectRepository(session), force=True)

    # --- before the transaction --------------------------------------------------------------------------------
    def prepare(self, drafts: Sequence[Draft]) -> list[Proposal]:
        """Resolve, validate and run the proposal rules on every draft; one error listing every bad item."""
        proposals: list[Proposal] = []
        issues: list[Issue] = []
        for draft in drafts:
            try:
                proposal = self._resolve(draft)
                touched, verdict = self.rules.run_mutators(proposal)
                if touched and proposal.value is not None:
                    aspect = self.registry.aspect(proposal.entity_type, proposal.aspect_name)
                    proposal.value = self._validate_value(aspect, proposal.value, draft.index, proposal.urn)
                verdict = verdict or self.rules.run_validators(proposal)
                if verdict is not None:
                    issue = Issue(f"{verdict.rule}: {verdict.message}", draft.index, proposal.urn, proposal.aspect_name, verdict.path)
                    raise ValidationFailed(verdict.message, [issue])
                proposals.append(proposal)
            except MetaledgerError as error:
                if isinstance(error, PayloadTooLarge):
                    raise
                issues.extend(error.issues or [Issue(error.message, draft.index, draft.urn, draft.aspect_name)])
            if len(issues) >= MAX_REPORTED_ISSUES:
                break
        if issues:
            bad = len({i.index for i in issues})
            raise ValidationFailed(f"{bad} of {len(drafts)} aspects are invalid; nothing was written", issues)
        return proposals

    def _resolve(self, draft: Draft) -> Proposal:
        def fail(message: str, path: str | None = None, **kw: Any) -> ValidationFailed:
            return ValidationFailed(message, [Issue(message, draft.index, draft.urn, draft.aspect_name, path, **kw)])

        try:
            change_type = ChangeType(str(draft.change_type).upper())
        except ValueError:
            change_type = None
        if change_type is None or change_type not in PROPOSABLE_CHANGE_TYPES:
            allowed = ", ".join(sorted(c.value for c in PROPOSABLE_CHANGE_TYPES))
            raise fail(f"changeType {draft.change_type!r} is not one of {allowed}", "$.changeType")
        try:
            entity = self.registry.entity(draft.entity_type)
            aspect = self.registry.aspect(entity.name, draft.aspect_name)
        except RegistryError as error:
            raise fail(str(error), "$.aspectName") from None

        if (draft.urn is None) == (draft.entity_key_aspect is None):
            raise fail("exactly one of entityUrn and entityKeyAspect must be given", "$.entityUrn")
        self._check_shapes(draft, change_type, fail)
        try:
            if draft.urn is not None:
                urn = draft.urn
                parsed = validate_urn(urn, self.settings.strict_urn_validation)
                if parsed.entity_type != entity.name:
                    raise fail(f"URN {urn!r} is of entity type {parsed.entity_type!r}, not {entity.name!r}", "$.entityUrn")
                self.registry.urn_to_key(entity.name, urn)  # the URN's parts must make a valid key aspect
            else:
                urn = self.registry.key_to_urn(entity.name, draft.entity_key_aspect)
                validate_urn(urn, self.settings.strict_urn_validation)
            if len(urn) > URN_MAX_STORED_CHARS:  # schemaField URNs are exempt from the 512 bytes, not from the column
                raise InvalidUrnError(f"URN is {len(urn)} characters; an entity URN is at most {URN_MAX_STORED_CHARS}: {shown(urn)}")
        except InvalidUrnError as error:
            raise fail(str(error), "$.entityUrn") from None
        except AspectValidationError as error:
            where = "$.entityUrn" if draft.urn is not None else "$.entityKeyAspect"
            raise ValidationFailed(
                f"the entity key is invalid: {error}",
                [Issue(f"key field {i.path}: {i.message}", draft.index, draft.urn, draft.aspect_name, where, i.expected, i.found) for i in error.issues],
            ) from None
        except RegistryError as error:
            raise fail(str(error), "$.entityUrn" if draft.urn is not None else "$.entityKeyAspect") from None

        proposal = Proposal(
            index=draft.index,
            entity_type=entity.name,
            urn=urn,
            aspect_name=aspect.name,
            change_type=change_type,
            system_metadata=dict(draft.system_metadata or {}),
            headers=dict(draft.headers or {}),
            entity_key_aspect=draft.entity_key_aspect,
            is_timeseries=aspect.is_timeseries,
            is_key=aspect.is_key,
        )
        if change_type is ChangeType.DELETE:
            return proposal
        if change_type is ChangeType.PATCH or draft.content_type == JSON_PATCH_CONTENT_TYPE:
            proposal.change_type = ChangeType.PATCH
            proposal.patch = self._parse_patch(draft, fail)
            return proposal
        if not isinstance(draft.value, dict):
            raise fail(
                f"aspect value must be a JSON object, found {type(draft.value).__name__}",
                "$.aspect.value",
                expected=aspect.record_name,
            )
        proposal.value = self._validate_value(aspect, draft.value, draft.index, urn)
        return proposal

    def _check_shapes(self, draft: Draft, change_type: ChangeType, fail: Any) -> None:
        """What the schema validators do not see: system metadata and headers are objects, and no JSON that is walked
        recursively before validation (system metadata, a key aspect, a patch, a value whose unknown fields are
        trimmed) nests deeper than METALEDGER_MAX_JSON_DEPTH. A validated aspect value is bounded by its schema."""
        if draft.system_metadata is not None and not isinstance(draft.system_metadata, dict):
            raise fail("systemMetadata must be an object", "$.systemMetadata")
        if draft.system_metadata and b"\\u0000" in orjson.dumps(draft.system_metadata):
            # Stored as JSON text that Postgres reads as jsonb (deletes, versioned reads): jsonb refuses \u0000.
            raise fail("systemMetadata contains a NUL character (\\u0000)", "$.systemMetadata")
        last_observed = (draft.system_metadata or {}).get("lastObserved")
        if last_observed is not None and (type(last_observed) is not int or not MIN_LONG <= last_observed <= MAX_LONG):
            raise fail("lastObserved must be epoch milliseconds (a 64-bit integer)", "$.systemMetadata.lastObserved",
                       expected="long", found=clip(repr(last_observed), 40))
        if draft.headers is not None and not (
            isinstance(draft.headers, dict) and all(isinstance(v, str) for v in draft.headers.values())
        ):
            raise fail("headers must be an object of strings", "$.headers")
        limit = self.settings.max_json_depth
        nested = [("$.systemMetadata", draft.system_metadata), ("$.entityKeyAspect", draft.entity_key_aspect)]
        if change_type is ChangeType.PATCH or draft.content_type == JSON_PATCH_CONTENT_TYPE or self.settings.trim_unknown_fields:
            nested.append(("$.aspect.value", draft.value))
        for path, value in nested:
            where = too_deep(value, limit) if value is not None else None
            if where is not None:
                raise fail(f"nested more than {limit} levels deep (METALEDGER_MAX_JSON_DEPTH)", path + where[1:][:200])

    def _validate_value(self, aspect: Any, value: dict[str, Any], index: int, urn: str) -> dict[str, Any]:
        try:
            return aspect.validate(value)
        except AspectValidationError as error:
            raise ValidationFailed(
                f"aspect {aspect.name!r} does not match its schema {aspect.record_name}",
                [
                    Issue(i.message, index, urn, aspect.name, "$.aspect.value" + i.path.removeprefix("$"), i.expected, i.found)
                    for i in error.issues
                ],
            ) from None

    @staticmethod
    def _parse_patch(draft: Draft, fail: Any) -> PatchDocument:
        try:
            return parse_patch(draft.value)
        except PatchError as error:
            raise fail(str(error), "$.aspect.value") from None

    # --- the transaction ---------------------------------------------------------------------------------------
    async def apply(self, session: AsyncSession, proposals: Sequence[Proposal], audit: AuditStamp) -> WriteResult:
        return (await self.apply_group(session, [(proposals, audit)]))[0]

    async def apply_group(
        self, session: AsyncSession, writes: Sequence[tuple[Sequence[Proposal], AuditStamp]]
    ) -> list[WriteResult]:
        """Several independent writes (each a batch of proposals and its caller's audit stamp) in one transaction,
        in order: each sees the rows as the writes before it left them, as if they had been committed one after the
        other. A refusal of any of them refuses the group (app.write.combiner then applies them one by one)."""
        repo = AspectRepository(session)
        attempts = 0
        while True:
            attempts += 1
            try:
                async with repo.transaction():
                    await self.refresh_processors(repo)
                    txn, spans = await self._run_transaction(repo, writes)
                break
            except RETRYABLE_DB_ERRORS as error:
                if attempts > self.settings.transaction_retries:
                    raise ServiceUnavailable(
                        f"the write could not be committed after {attempts} attempts ({type(error).__name__}); retry"
                    ) from error
                TRANSACTION_RETRIES.labels(type(error).__name__).inc()
                log.info("write transaction retried", extra={"attempt": attempts, "reason": type(error).__name__, "detail": getattr(error, "detail", None) or str(error), "items": sum(len(w[0]) for w in writes), **first_write_fields(writes[0][0])})
        if log.isEnabledFor(logging.DEBUG):  # not on the hot path unless asked for
            log.debug("write committed", extra={"writes": len(writes), "items": sum(len(w[0]) for w in writes), "change_logs": len(txn.outbox), **first_write_fields(writes[0][0])})
        self.processors.publish_metrics()
        if any(p.urn == PIPELINE_URN for proposals, _ in writes for p in proposals):
            self._processors_checked_at = float("-inf")  # this process's next write uses the new pipeline
        results = []
        for (results_from, results_to), (outbox_from, outbox_to) in spans:
            outbox = txn.outbox[outbox_from:outbox_to]
            results.append(WriteResult(sorted(txn.results[results_from:results_to], key=lambda r: r.index), len(outbox), attempts, outbox))
        return results

    async def _run_transaction(
        self, repo: AspectRepository, writes: Sequence[tuple[Sequence[Proposal], AuditStamp]]
    ) -> tuple[_Transaction, list[tuple[tuple[int, int], tuple[int, int]]]]:
        """Lock, apply every write's proposals in order, flush. Returns the transaction and, per write, the span of
        its results and of its change logs in the transaction's lists."""
        keys: set[tuple[str, str]] = set()
        deleted_entities: set[str] = set()
        for proposals, _ in writes:
            for p in proposals:
                key_aspect = self.registry.entity(p.entity_type).key_aspect
                keys.add((p.urn, key_aspect))
                if not p.is_timeseries:
                    keys.add((p.urn, p.aspect_name))
                # An entity delete locks (and logs the delete of) every aspect of the entity, not only the key aspect.
                if p.change_type is ChangeType.DELETE and p.aspect_name == key_aspect:
                    deleted_entities.add(p.urn)
        locked, floors = await repo.lock_latest(keys, deleted_entities)
        txn = _Transaction(state={key: locked.get(key) for key in keys | locked.keys()}, existed_before=set(), floors=floors)
        spans = []
        for proposals, audit in writes:
            # CREATE_ENTITY asks whether the entity existed before this write (not before its own earlier proposals)
            txn.existed_before = {
                p.urn for p in proposals if txn.state.get((p.urn, self.registry.entity(p.entity_type).key_aspect)) is not None
            }
            results_from, outbox_from = len(txn.results), len(txn.outbox)
            for proposal in proposals:
                self._apply_one(txn, proposal, audit)
                if txn.emitted:  # right after their cause: the batch's next proposals see (and may override) them
                    await self._apply_emitted(repo, txn, audit)
            spans.append(((results_from, len(txn.results)), (outbox_from, len(txn.outbox))))
        # a group's refusal is not logged: the combiner applies its writes again one by one, and the culprit's is
        self._raise_on_fatal_verdicts(txn, log_refusals=len(writes) == 1)
        await self._flush(repo, txn)
        return txn, spans

    def _apply_one(self, txn: _Transaction, p: Proposal, audit: AuditStamp) -> None:
        entity = self.registry.entity(p.entity_type)
        key = (p.urn, p.aspect_name)
        previous = None if p.is_timeseries else txn.state.get(key)
        entity_exists = txn.state.get((p.urn, entity.key_aspect)) is not None
        if p.change_type is ChangeType.CREATE_ENTITY:
            entity_exists = p.urn in txn.existed_before

        if p.change_type is ChangeType.PATCH:
            if not self._apply_patch(txn, p, previous, audit):
                return
        verdict = self.rules.run_pre_commit_rules(PendingChange(p, previous, entity_exists))
        if verdict is not None:
            txn.verdicts.append((p, verdict))
            if not verdict.is_fatal:
                txn.results.append(ItemResult(p.index, p.urn, p.entity_type, p.aspect_name, ItemStatus.FILTERED, message=verdict.message))
            return
        before: PipelineResult | None = None
        if self.processors.steps and self.processors.governs(Phase.BEFORE, p.entity_type, p.aspect_name, p.change_type.value):
            before = self._run_before_processors(txn, p, previous, audit)
            if before is None:
                return
        if txn.verdicts and any(v.is_fatal for _, v in txn.verdicts):
            return  # the batch will fail; keep checking the rest only to report every violation
        written_from = len(txn.results)
        self._write(txn, p, previous, entity.key_aspect, audit)
        if before is not None:
            result = next((r for r in txn.results[written_from:] if r.index == p.index), None)
            if result is not None:
                result.processors = before.reports
            txn.emitted.extend(_Emitted(name, e, p, result) for name, e in before.emitted)

    def _write(self, txn: _Transaction, p: Proposal, previous: StoredAspect | None, key_aspect: str, audit: AuditStamp) -> None:
        if p.change_type is ChangeType.DELETE:
            self._delete(txn, p, previous, key_aspect, audit)
            return
        if txn.state.get((p.urn, key_aspect)) is None and p.aspect_name != key_aspect:
            key_proposal = Proposal(
                p.index, p.entity_type, p.urn, key_aspect, ChangeType.UPSERT,
                value=self.registry.urn_to_key(p.entity_type, p.urn), system_metadata=p.system_metadata,
            )
            self._upsert(txn, key_proposal, None, audit, report=False)
        if p.is_timeseries:
            self._append_timeseries(txn, p, audit)
        else:
            self._upsert(txn, p, previous, audit)

    def _run_before_processors(
        self, txn: _Transaction, p: Proposal, previous: StoredAspect | None, audit: AuditStamp
    ) -> PipelineResult | None:
        """The change processors' before phase, with the locked previous value. None when the proposal goes no
        further: rejected (a fatal verdict naming the processor) or ignored (an IGNORED item, nothing written). A
        mutation is validated against the schema again."""
        change = Change(
            p.urn, p.entity_type, p.aspect_name, p.change_type.value, p.value,
            previous.value if previous is not None else None,
            previous.system_metadata if previous is not None else None,
            p.system_metadata, audit.actor,
        )
        result = self.processors.run(Phase.BEFORE, change)
        if result.rejected is not None:
            name, reason = result.rejected
            txn.verdicts.append((p, Verdict(VerdictKind.VALIDATION, reason, f"change processor {name}", "$.aspect.value")))
            return None
        if result.ignored is not None:
            reason = next((r.reason for r in result.reports if r.processor == result.ignored), None)
            txn.results.append(ItemResult(p.index, p.urn, p.entity_type, p.aspect_name, ItemStatus.IGNORED,
                                          message=f"ignored by change processor {result.ignored}: {reason}",
                                          processors=result.reports))
            return None
        if result.value is not p.value and result.value is not None:
            aspect = self.registry.aspect(p.entity_type, p.aspect_name)
            try:
                p.value = self._validate_value(aspect, result.value, p.index, p.urn)
            except ValidationFailed as error:
                name = next(r.processor for r in reversed(result.reports) if r.outcome == "mutated")
                messages = "; ".join(f"{i.path}: {i.message}" for i in error.issues)
                txn.verdicts.append((p, Verdict(VerdictKind.VALIDATION, f"its mutation does not match the schema: {messages}",
                                                f"change processor {name}", "$.aspect.value")))
                return None
        return result

    async def _apply_emitted(self, repo: AspectRepository, txn: _Transaction, audit: AuditStamp) -> None:
        """The proposals the before phase emitted, in the same transaction: resolved and validated like a caller's,
        their rows locked now (a lock taken late may deadlock with another writer: Postgres then aborts one of the
        two, and the transaction is retried whole), applied right after the proposal that caused them. Their results are
        reported on the item that caused them."""
        while txn.emitted and not any(v.is_fatal for _, v in txn.verdicts):
            emitted, txn.emitted = txn.emitted, []
            ready = [(e, p) for e in emitted if (p := self._emitted_proposal(txn, e)) is not None]
            if any(v.is_fatal for _, v in txn.verdicts):
                return
            keys: set[tuple[str, str]] = set()
            deleted_entities: set[str] = set()
            for _, p in ready:
                key_aspect = self.registry.entity(p.entity_type).key_aspect
                keys.update({(p.urn, key_aspect)} | (set() if p.is_timeseries else {(p.urn, p.aspect_name)}))
                if p.change_type is ChangeType.DELETE and p.aspect_name == key_aspect:
                    deleted_entities.add(p.urn)
            keys -= txn.state.keys()
            if keys or deleted_entities:
                locked, floors = await repo.lock_latest(keys, deleted_entities)
                for key in keys | locked.keys():
                    txn.state.setdefault(key, locked.get(key))
                for key, floor in floors.items():
                    txn.floors.setdefault(key, floor)
            for e, p in ready:
                if txn.state.get((p.urn, self.registry.entity(p.entity_type).key_aspect)) is not None:
                    txn.existed_before.add(p.urn)
                results_from = len(txn.results)
                self._apply_one(txn, p, audit)
                if e.cause_result is not None:
                    e.cause_result.emitted = (e.cause_result.emitted or []) + txn.results[results_from:]
                del txn.results[results_from:]

    def _emitted_proposal(self, txn: _Transaction, e: _Emitted) -> Proposal | None:
        """An emitted proposal resolved and validated (a fatal verdict naming its processor when it is not valid, or
        when processors keep emitting because of each other's emissions)."""
        def refuse(message: str) -> None:
            txn.verdicts.append((e.cause, Verdict(VerdictKind.VALIDATION, message, f"change processor {e.processor}", "$.aspect.value")))

        if cause_depth(e.cause.system_metadata) >= MAX_CAUSE_DEPTH:
            refuse(f"emitted a proposal {MAX_CAUSE_DEPTH} emissions deep (processors emitting because of each other)")
            return None
        version = e.cause_result.version if e.cause_result is not None else None
        system_metadata = {"properties": cause_properties(e.processor, e.cause.urn, e.cause.aspect_name, version,
                                                          e.cause.system_metadata)}
        if "runId" in e.cause.system_metadata:
            system_metadata["runId"] = e.cause.system_metadata["runId"]
        draft = Draft(e.cause.index, e.proposal.entity_type, e.proposal.aspect, e.proposal.change_type, urn=e.proposal.urn,
                      value=e.proposal.value, system_metadata=system_metadata)
        try:
            return self.prepare([draft])[0]
        except MetaledgerError as error:
            details = "; ".join(f"{i.path or ''} {i.message}".strip() for i in error.issues or [])
            refuse(f"emitted an invalid proposal for {e.proposal.aspect} of {e.proposal.urn}: {details or error.message}")
            return None

    def _apply_patch(self, txn: _Transaction, p: Proposal, previous: StoredAspect | None, audit: AuditStamp) -> bool:
        """DataHub's patch semantics (templates, keyed arrays, RFC 6902) against the locked latest value; the result
        is validated like an UPSERT."""
        try:
            patched = apply_patch(
                p.aspect_name, previous.value if previous is not None else None, p.patch,
                schema=self.registry.aspect_spec(p.aspect_name).type, now_ms=audit.time,
            )
        except PatchError as error:
            txn.verdicts.append((p, Verdict(VerdictKind.VALIDATION, f"the patch does not apply: {error}", "Patch")))
            return False
        aspect = self.registry.aspect(p.entity_type, p.aspect_name)
        try:
            p.value = self._validate_value(aspect, patched, p.index, p.urn)
        except ValidationFailed as error:
            messages = "; ".join(f"{i.path}: {i.message}" for i in error.issues)
            txn.verdicts.append((p, Verdict(VerdictKind.VALIDATION, f"the patched aspect is invalid: {messages}", "Patch")))
            return False
        return True

    def _system_metadata(self, p: Proposal, previous: StoredAspect | None, audit: AuditStamp) -> dict[str, Any]:
        sm = dict(p.system_metadata)
        if not sm.get("lastObserved"):
            sm["lastObserved"] = audit.time
        sm.setdefault("runId", DEFAULT_RUN_ID)
        sm["lastRunId"] = previous.system_metadata.get("runId", DEFAULT_RUN_ID) if previous else DEFAULT_RUN_ID
        return sm

    def _upsert(
        self, txn: _Transaction, p: Proposal, previous: StoredAspect | None, audit: AuditStamp, *, report: bool = True
    ) -> None:
        key = (p.urn, p.aspect_name)
        value_json = _dumps(p.value)
        if len(value_json) > self.settings.max_aspect_bytes:
            raise PayloadTooLarge(
                f"aspect {p.aspect_name!r} of {p.urn} is {len(value_json)} bytes; the limit is {self.settings.max_aspect_bytes}",
                [Issue("aspect too large", p.index, p.urn, p.aspect_name, "$.aspect.value")],
            )
        sm = self._system_metadata(p, previous, audit)
        unchanged = previous is not None and (previous.metadata == value_json or previous.value == p.value)
        if unchanged:
            assert previous is not None
            kept = previous.system_metadata
            for carried in ("version", "aspectCreated", "aspectModified"):
                if carried in kept:
                    sm[carried] = kept[carried]
            row = StoredAspect(
                p.urn, p.aspect_name, previous.metadata, sm, previous.created_on, previous.created_by, previous.created_for,
                _value=previous.value,
            )
            status = ItemStatus.UNCHANGED
        else:
            # after a delete, versions continue from the deleted one: an old change log never looks new
            version = previous.version + 1 if previous is not None else txn.floors.get(key, 0) + 1
            sm["version"] = str(version)
            first = previous.system_metadata.get("aspectCreated") if previous is not None else None
            sm["aspectCreated"] = first or audit.to_json()
            if audit.actor != SYSTEM_ACTOR:
                sm["aspectModified"] = audit.to_json()
            row = StoredAspect(p.urn, p.aspect_name, value_json, sm, _now_naive_utc(audit.time), audit.actor, _value=p.value)
            status = ItemStatus.CREATED if previous is None else ItemStatus.UPDATED
            if previous is not None and self._history_kept(p.entity_type, p.aspect_name) > 0:
                previous.row_version = previous.version
                txn.history.setdefault(key, []).append(previous)
        if previous is None:
            txn.inserted_keys.add(key)
        txn.state[key] = row
        txn.dirty[key] = row
        if status is not ItemStatus.UNCHANGED or self.settings.always_emit_change_log:
            change_type = ChangeType.RESTATE if status is ItemStatus.UNCHANGED else (
                ChangeType.CREATE if p.change_type in (ChangeType.CREATE, ChangeType.CREATE_ENTITY) else ChangeType.UPSERT
            )
            self._log_change(txn, p, change_type, row, previous, audit)
        if report:
            txn.results.append(ItemResult(p.index, p.urn, p.entity_type, p.aspect_name, status, row.value, sm))

    def _append_timeseries(self, txn: _Transaction, p: Proposal, audit: AuditStamp) -> None:
        sm = self._system_metadata(p, None, audit)
        assert p.value is not None
        payload = build_change_log(
            p, change_type=ChangeType.UPSERT, aspect_name=p.aspect_name, aspect_json=_dumps(p.value),
            system_metadata=sm, previous_json=None, previous_system_metadata=None, created=audit,
        )
        timestamp = int(p.value.get("timestampMillis", audit.time))
        txn.outbox.append(OutboxRow(self.settings.topic_mcl_timeseries, p.urn, p.urn, p.aspect_name, timestamp, ChangeType.UPSERT.value, payload))
        self._log_platform_events(txn, p, ChangeType.UPSERT, None, p.value, audit, timestamp)
        txn.results.append(ItemResult(p.index, p.urn, p.entity_type, p.aspect_name, ItemStatus.APPENDED, p.value, sm))

    def _delete(
        self, txn: _Transaction, p: Proposal, previous: StoredAspect | None, key_aspect: str, audit: AuditStamp
    ) -> None:
        if previous is None:
            txn.results.append(ItemResult(p.index, p.urn, p.entity_type, p.aspect_name, ItemStatus.ABSENT))
            return
        if p.aspect_name == key_aspect:
            # Deleting the key aspect deletes the entity: every aspect and every version. Each other aspect gets its
            # own DELETE change log (before the key aspect's), so consumers know the version every aspect was
            # deleted at (the search index keeps them in its tombstone: an older change log cannot revive it).
            txn.deleted_urns.add(p.urn)
            for state_key in sorted(k for k in txn.state if k[0] == p.urn):
                row = txn.state[state_key]
                if row is None:
                    continue
                self._raise_floor(txn, state_key, row.version)
                if state_key[1] != key_aspect:
                    cascaded = dataclasses.replace(p, aspect_name=state_key[1], system_metadata=dict(p.system_metadata))
                    sm = dict(row.system_metadata)
                    sm.update(self._system_metadata(cascaded, row, audit))
                    self._log_change(txn, cascaded, ChangeType.DELETE, None, row, audit, system_metadata=sm, platform_events=False)
                txn.state[state_key] = None
            for pending in (txn.dirty, txn.history):
                for state_key in [k for k in pending if k[0] == p.urn]:
                    del pending[state_key]
            txn.inserted_keys = {k for k in txn.inserted_keys if k[0] != p.urn}
        else:
            key = (p.urn, p.aspect_name)
            txn.deleted_keys.add(key)
            self._raise_floor(txn, key, previous.version)
            txn.state[key] = None
            txn.dirty.pop(key, None)
            txn.history.pop(key, None)
            txn.inserted_keys.discard(key)
        sm = dict(previous.system_metadata)
        sm.update(self._system_metadata(p, previous, audit))
        self._log_change(txn, p, ChangeType.DELETE, None, previous, audit, system_metadata=sm)
        txn.results.append(ItemResult(p.index, p.urn, p.entity_type, p.aspect_name, ItemStatus.DELETED, system_metadata=sm))

    @staticmethod
    def _raise_floor(txn: _Transaction, key: tuple[str, str], version: int) -> None:
        floor = max(txn.floors.get(key, 0), version)
        txn.floors[key] = txn.raised_floors[key] = floor

    def _log_change(
        self,
        txn: _Transaction,
        p: Proposal,
        change_type: ChangeType,
        row: StoredAspect | None,
        previous: StoredAspect | None,
        audit: AuditStamp,
        *,
        system_metadata: dict[str, Any] | None = None,
        platform_events: bool = True,
    ) -> None:
        sm = system_metadata if system_metadata is not None else (row.system_metadata if row else {})
        payload = build_change_log(
            p,
            change_type=change_type,
            aspect_name=p.aspect_name,
            aspect_json=row.metadata if row is not None else None,
            system_metadata=sm,
            previous_json=previous.metadata if previous is not None else None,
            previous_system_metadata=previous.system_metadata if previous is not None else None,
            created=audit,
        )
        version = int(sm.get("version", "0"))
        txn.outbox.append(OutboxRow(self.settings.topic_mcl_versioned, p.urn, p.urn, p.aspect_name, version, change_type.value, payload))
        if not platform_events:
            return  # an aspect deleted with its entity: the key aspect's delete carries the entity's event
        self._log_platform_events(
            txn, p, change_type, previous.value if previous is not None else None, row.value if row is not None else None, audit, version
        )

    def _log_platform_events(
        self, txn: _Transaction, p: Proposal, change_type: ChangeType, previous: dict[str, Any] | None,
        current: dict[str, Any] | None, audit: AuditStamp, version: int,
    ) -> None:
        """Entity Change Events from the previous and new value, both in hand inside the transaction; they commit
        with the change (DataHub derives them later from the MCL stream, and loses them with it)."""
        if not self.settings.platform_events_enabled:
            return
        events = entity_change_events(
            entity_type=p.entity_type, urn=p.urn, aspect_name=p.aspect_name, change_type=change_type.value,
            previous=previous, current=current, audit=audit.to_json(),
        )
        for event in events:
            txn.outbox.append(
                OutboxRow(self.settings.topic_platform_event, platform_event_key(event), p.urn, p.aspect_name, version,
                          change_type.value, _dumps(platform_event(event)))
            )

    def _raise_on_fatal_verdicts(self, txn: _Transaction, *, log_refusals: bool = True) -> None:
        fatal = [(p, v) for p, v in txn.verdicts if v.is_fatal]
        if not fatal:
            return
        issues = [Issue(f"{v.rule}: {v.message}", p.index, p.urn, p.aspect_name) for p, v in fatal]
        kinds = {v.kind for _, v in fatal}
        summary = f"{len(fatal)} of the batch's proposals failed their checks; nothing was written"
        for p, v in fatal if log_refusals else ():
            log.info(
                "write rejected",
                extra={"urn": p.urn, "aspect": p.aspect_name, "run_id": p.run_id, "rule": v.rule, "reason": v.message},
            )
        if VerdictKind.PRECONDITION in kinds:
            raise PreconditionFailed(summary, issues)
        if VerdictKind.CONFLICT in kinds:
            raise ExistenceConflict(summary, issues)
        raise ValidationFailed(summary, issues)

    def _history_kept(self, entity: str, aspect: str) -> int:
        overrides = self.settings.retention_overrides
        for candidate in (f"{entity}/{aspect}", f"{entity}/*", f"*/{aspect}"):
            if candidate in overrides:
                return overrides[candidate]
        return self.settings.retention_max_versions

    async def _flush(self, repo: AspectRepository, txn: _Transaction) -> None:
        # Deletes go first and alone: a batch may delete an aspect and write it again.
        await repo.delete_entities(sorted(txn.deleted_urns))
        await repo.delete_aspects(sorted(txn.deleted_keys))
        history = [row for rows in txn.history.values() for row in rows]
        inserts = [txn.dirty[k] for k in sorted(txn.dirty) if k in txn.inserted_keys]
        updates = [txn.dirty[k] for k in sorted(txn.dirty) if k not in txn.inserted_keys]
        prune = []
        for (urn, aspect) in txn.history:
            kept = self._history_kept(entity_type_of(urn), aspect)
            cutoff = txn.dirty[(urn, aspect)].version - 1 - kept
            if cutoff >= 1:
                prune.append((urn, aspect, cutoff))
        floors = [(urn, aspect, v) for (urn, aspect), v in sorted(txn.raised_floors.items())]
        await repo.write_changes(history + inserts, updates, prune, txn.outbox, floors)
