"""The write core without I/O: drafts resolved into proposals, and the decision of what a transaction writes.

    drafts → WriteCore.prepare (registry, schema, URN, proposal rules) → proposals
    proposals + the rows they lock → WriteCore.decide → Decision (rows to write, version floors, outbox records,
                                                                  each write's results, or the refusals)

`decide` is a generator: it yields the `LockRequest` of the rows it needs and is sent back the `Locked` rows, first
for the group's proposals and then for the proposals change processors emit (known only once their cause is decided).
app.write.service drives it against Postgres; tests drive it against a dict.

Each proposal is decided alone (`decide_proposal`), from a read-only `View` of the rows as the proposals before it
left them, into a `Step`: its rows, the versions it supersedes, the floors it raises, its change logs, its result.
`decide` folds the steps into the `Decision`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

from app.audit.model import AuditedChange
from app.changelog.entity_change_events import entity_change_events, platform_event, platform_event_key
from app.changelog.outbox import OutboxRow
from app.errors import Issue, MetaledgerError, PayloadTooLarge, ValidationFailed
from app.limits import MAX_LONG, MIN_LONG, clip, too_deep
from app.registry import EntityRegistry
from app.registry.errors import AspectValidationError, RegistryError
from app.settings import Settings
from app.turns import TimeSlice
from app.urns import URN_MAX_STORED_CHARS, InvalidUrnError, entity_type_of, shown, validate_urn
from app.write.mcl import build_change_log
from app.write.patch import PatchDocument, PatchError, apply_patch, parse_patch
from app.write.processors import (
    MAX_CAUSE_DEPTH,
    EmittedProposal,
    Phase,
    Pipeline,
    ProposedChange,
    StepReport,
    cause_depth,
    cause_properties,
)
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
from app.write.repository import StoredAspect
from app.write.rules import PendingChange, RuleChain, Verdict, VerdictKind, builtin_proposal_rules
from app.write.structured_properties import (
    PropertyDefinitionChange,
    StoredValueCheck,
    StructuredPropertyValues,
    definition_keys,
    stored_value_check,
)

MAX_REPORTED_ISSUES = 100

Key = tuple[str, str]  # (urn, aspect name)


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
            shown["emitted"] = [
                {"urn": r.urn, "aspectName": r.aspect, "status": r.status.value, "version": r.version, **r.processing()}
                for r in self.emitted
            ]
        return shown


class LockRequest(NamedTuple):
    """Rows to lock: row 0 of each key (and its version floor when it has none), and of every aspect of each entity
    in `entity_urns` (entities deleted: their every aspect is logged as deleted); row 0 of each `shared` key is read
    FOR SHARE (the structured property definitions values are checked against: app.write.structured_properties)."""

    keys: frozenset[Key]
    entity_urns: frozenset[str]
    shared: frozenset[Key] = frozenset()


class Turn(NamedTuple):
    """A pause the decision offers between proposals once its time slice is over (app.turns): a large batch is CPU
    work in one stretch (~0.2 ms a proposal), and the caller lets other requests of its event loop run before
    sending None back."""


TURN = Turn()


class Locked(NamedTuple):
    """What the lock step read (AspectRepository.lock_latest): the row 0 that exist, the floors of keys without one."""

    rows: Mapping[Key, StoredAspect]
    floors: Mapping[Key, int]


@dataclass(frozen=True, slots=True)
class View:
    """The transaction's rows as the proposals before this one left them: row 0 of every locked key (None: absent),
    the version floor of each key (raised by this transaction's deletes), the entities that existed when this
    proposal's write began (CREATE_ENTITY), and whether an earlier proposal was refused (this one is then only
    checked, to report every violation, and writes nothing)."""

    rows: Mapping[Key, StoredAspect | None]
    floors: Mapping[Key, int] = field(default_factory=dict)
    existed_before: Set[str] = frozenset()
    refused: bool = False


@dataclass(frozen=True, slots=True)
class Emitted:
    """A proposal a change processor emitted in the before phase, with what caused it."""

    processor: str
    proposal: EmittedProposal
    cause: Proposal
    cause_result: ItemResult | None


@dataclass(frozen=True, slots=True)
class Step:
    """What deciding one proposal yields: `rows` are row 0 of each key after it (None: deleted); `superseded` the
    previous row 0 kept as history (its `row_version` set); `floors` the version floors it raises."""

    result: ItemResult | None = None
    verdict: Verdict | None = None
    rows: tuple[tuple[Key, StoredAspect | None], ...] = ()
    superseded: tuple[StoredAspect, ...] = ()
    deleted_urn: str | None = None  # the entity, every aspect and version
    deleted_key: Key | None = None  # one aspect, every version
    floors: tuple[tuple[Key, int], ...] = ()
    outbox: tuple[OutboxRow, ...] = ()
    emitted: tuple[Emitted, ...] = ()
    stored_checks: tuple[StoredValueCheck, ...] = ()  # run once the transaction's rows are written

    def then(self, later: Step) -> Step:
        """Both steps as one (a key aspect created before the aspect that needs it); the later one's result."""
        return Step(
            later.result,
            later.verdict,
            self.rows + later.rows,
            self.superseded + later.superseded,
            later.deleted_urn,
            later.deleted_key,
            self.floors + later.floors,
            self.outbox + later.outbox,
            later.emitted,
            self.stored_checks + later.stored_checks,
        )


@dataclass(frozen=True, slots=True)
class DecidedWrite:
    """One write of a group: its results (by index) and its change logs."""

    items: tuple[ItemResult, ...]
    outbox: tuple[OutboxRow, ...]


@dataclass(frozen=True, slots=True)
class Decision:
    """What a transaction writes, as AspectRepository takes it: the deletes (first and alone: a batch may delete an
    aspect and write it again), then one statement with every other row, the prunes, the outbox and the floors.
    When `refused` holds the fatal verdicts, nothing is written."""

    writes: tuple[DecidedWrite, ...]
    refused: tuple[tuple[Proposal, Verdict], ...] = ()
    deleted_urns: tuple[str, ...] = ()
    deleted_keys: tuple[Key, ...] = ()
    inserts: tuple[StoredAspect, ...] = ()  # history rows, then first row 0s
    updates: tuple[StoredAspect, ...] = ()  # row 0s that exist
    prune: tuple[tuple[str, str, int], ...] = ()  # (urn, aspect, highest history version removed)
    floors: tuple[tuple[str, str, int], ...] = ()  # raised version floors
    stored_checks: tuple[
        StoredValueCheck, ...
    ] = ()  # definition changes checked against the stored values, once written

    @property
    def outbox(self) -> list[OutboxRow]:
        return [row for write in self.writes for row in write.outbox]


@functools.lru_cache(maxsize=64)
def _now_naive_utc(millis: int) -> datetime:
    # every row of a batch (of a combined group, of the writes of one millisecond) has the same audit time
    return datetime.fromtimestamp(millis / 1000, tz=UTC).replace(tzinfo=None)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


class _Fold:
    """The steps of one transaction folded together: the rows as they evolve and what the write statement takes."""

    def __init__(self) -> None:
        self.rows: dict[Key, StoredAspect | None] = {}
        self.floors: dict[Key, int] = {}  # as read (keys without row 0), raised by this transaction's deletes
        self.raised_floors: dict[Key, int] = {}
        self.inserted: set[Key] = set()  # row 0 absent from the database: INSERT
        self.dirty: dict[Key, StoredAspect] = {}  # final row 0 to write
        self.history: dict[Key, list[StoredAspect]] = {}
        self.deleted_keys: set[Key] = set()
        self.deleted_urns: set[str] = set()
        self.refused: list[tuple[Proposal, Verdict]] = []
        self.stored_checks: list[StoredValueCheck] = []
        # read-only views of the evolving rows, for `View`
        self.rows_view = MappingProxyType(self.rows)
        self.floors_view = MappingProxyType(self.floors)

    def view(self, existed_before: Set[str]) -> View:
        return View(self.rows_view, self.floors_view, existed_before, bool(self.refused))

    def lock(self, request: LockRequest, locked: Locked) -> None:
        for key in request.keys.union(request.shared, locked.rows):
            self.rows.setdefault(key, locked.rows.get(key))
        for key, floor in locked.floors.items():
            self.floors.setdefault(key, floor)

    def take(self, proposal: Proposal, step: Step) -> None:
        if step.verdict is not None and step.verdict.is_fatal:
            self.refused.append((proposal, step.verdict))
        if step.deleted_urn is not None:
            urn = step.deleted_urn
            self.deleted_urns.add(urn)
            for pending in (self.dirty, self.history):
                for key in [k for k in pending if k[0] == urn]:
                    del pending[key]
            self.inserted = {k for k in self.inserted if k[0] != urn}
        if step.deleted_key is not None:
            key = step.deleted_key
            self.deleted_keys.add(key)
            self.dirty.pop(key, None)
            self.history.pop(key, None)
            self.inserted.discard(key)
        self.stored_checks.extend(step.stored_checks)
        for key, floor in step.floors:
            self.floors[key] = self.raised_floors[key] = floor
        for row in step.superseded:
            self.history.setdefault((row.urn, row.aspect), []).append(row)
        for key, written in step.rows:
            if written is not None:
                if self.rows.get(key) is None:
                    self.inserted.add(key)
                self.dirty[key] = written
            self.rows[key] = written

    def decision(self, writes: list[DecidedWrite], history_kept: Callable[[str, str], int]) -> Decision:
        if self.refused:
            return Decision(tuple(writes), tuple(self.refused))
        prune = []
        for urn, aspect in self.history:
            cutoff = self.dirty[(urn, aspect)].version - 1 - history_kept(entity_type_of(urn), aspect)
            if cutoff >= 1:
                prune.append((urn, aspect, cutoff))
        return Decision(
            writes=tuple(writes),
            deleted_urns=tuple(sorted(self.deleted_urns)),
            deleted_keys=tuple(sorted(self.deleted_keys)),
            inserts=(
                *(row for rows in self.history.values() for row in rows),
                *(self.dirty[k] for k in sorted(self.dirty) if k in self.inserted),
            ),
            updates=tuple(self.dirty[k] for k in sorted(self.dirty) if k not in self.inserted),
            prune=tuple(prune),
            floors=tuple((urn, aspect, v) for (urn, aspect), v in sorted(self.raised_floors.items())),
            stored_checks=tuple(self.stored_checks),
        )


class WriteCore:
    """Resolution and decision, given the registry, the rule chain (with the built-in proposal rules first) and the
    settings; no I/O."""

    def __init__(self, registry: EntityRegistry, rules: RuleChain, settings: Settings) -> None:
        self.registry = registry
        chain = rules.with_validators_first(builtin_proposal_rules(registry.urn_to_key))
        self.rules = RuleChain(
            chain.mutators,
            chain.validators,
            [*chain.pre_commit_rules, StructuredPropertyValues(), PropertyDefinitionChange()],
        )
        self.settings = settings

    # --- before the transaction --------------------------------------------------------------------------------
    def prepare(self, drafts: Sequence[Draft]) -> list[Proposal]:
        """Resolve, validate and run the proposal rules on every draft; one error listing every bad item."""
        proposals: list[Proposal] = []
        issues: list[Issue] = []
        for draft in drafts:
            try:
                proposal = self.resolve(draft)
                touched, verdict = self.rules.run_mutators(proposal)
                if touched and proposal.value is not None:
                    aspect = self.registry.aspect(proposal.entity_type, proposal.aspect_name)
                    proposal.value = self._validate_value(aspect, proposal.value, draft.index, proposal.urn)
                verdict = verdict or self.rules.run_validators(proposal)
                if verdict is not None:
                    issue = Issue(
                        f"{verdict.rule}: {verdict.message}",
                        draft.index,
                        proposal.urn,
                        proposal.aspect_name,
                        verdict.path,
                    )
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

    def resolve(self, draft: Draft) -> Proposal:
        """One draft as a proposal: its change type, entity and aspect known to the registry, its URN valid, its
        value validated against the aspect's schema (its patch parsed); ValidationFailed naming the field at fault."""

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
                    raise fail(
                        f"URN {urn!r} is of entity type {parsed.entity_type!r}, not {entity.name!r}", "$.entityUrn"
                    )
                self.registry.check_urn_key(entity.name, urn)
            else:
                assert draft.entity_key_aspect is not None  # exactly one of the two is given, checked above
                urn = self.registry.key_to_urn(entity.name, draft.entity_key_aspect)
                validate_urn(urn, self.settings.strict_urn_validation)
            if len(urn) > URN_MAX_STORED_CHARS:  # schemaField URNs are exempt from the 512 bytes, not from the column
                raise InvalidUrnError(
                    f"URN is {len(urn)} characters; an entity URN is at most {URN_MAX_STORED_CHARS}: {shown(urn)}"
                )
        except InvalidUrnError as error:
            raise fail(str(error), "$.entityUrn") from None
        except AspectValidationError as error:
            where = "$.entityUrn" if draft.urn is not None else "$.entityKeyAspect"
            raise ValidationFailed(
                f"the entity key is invalid: {error}",
                [
                    Issue(
                        f"key field {i.path}: {i.message}",
                        draft.index,
                        draft.urn,
                        draft.aspect_name,
                        where,
                        i.expected,
                        i.found,
                    )
                    for i in error.issues
                ],
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
            raise fail(
                "lastObserved must be epoch milliseconds (a 64-bit integer)",
                "$.systemMetadata.lastObserved",
                expected="long",
                found=clip(repr(last_observed), 40),
            )
        if draft.headers is not None and not (
            isinstance(draft.headers, dict) and all(isinstance(v, str) for v in draft.headers.values())
        ):
            raise fail("headers must be an object of strings", "$.headers")
        limit = self.settings.max_json_depth
        nested = [("$.systemMetadata", draft.system_metadata), ("$.entityKeyAspect", draft.entity_key_aspect)]
        if (
            change_type is ChangeType.PATCH
            or draft.content_type == JSON_PATCH_CONTENT_TYPE
            or self.settings.trim_unknown_fields
        ):
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
                    Issue(
                        i.message,
                        index,
                        urn,
                        aspect.name,
                        "$.aspect.value" + i.path.removeprefix("$"),
                        i.expected,
                        i.found,
                    )
                    for i in error.issues
                ],
            ) from None

    @staticmethod
    def _parse_patch(draft: Draft, fail: Any) -> PatchDocument:
        try:
            return parse_patch(draft.value)
        except PatchError as error:
            raise fail(str(error), "$.aspect.value") from None

    # --- inside the transaction --------------------------------------------------------------------------------
    def lock_request(self, proposals: Iterable[Proposal], locked: Set[Key] = frozenset()) -> LockRequest:
        """The rows `proposals` need that are not in `locked`: each entity's key aspect (whether the entity exists),
        the aspect itself (not for a timeseries point: appended, never read), every aspect of an entity deleted; and,
        shared, the structured property definitions their values name."""
        proposals = list(proposals)
        keys: set[Key] = set()
        deleted_entities: set[str] = set()
        for p in proposals:
            key_aspect = self.registry.entity(p.entity_type).key_aspect
            keys.add((p.urn, key_aspect))
            if not p.is_timeseries:
                keys.add((p.urn, p.aspect_name))
            if p.change_type is ChangeType.DELETE and p.aspect_name == key_aspect:
                deleted_entities.add(p.urn)
        shared = definition_keys(proposals, {}).difference(keys, locked)
        return LockRequest(frozenset(keys.difference(locked)), frozenset(deleted_entities), frozenset(shared))

    def decide(
        self, writes: Sequence[tuple[Sequence[Proposal], AuditStamp]], processors: Pipeline
    ) -> Generator[LockRequest | Turn, Locked | None, Decision]:
        """Several independent writes (each a batch of proposals and its caller's audit stamp) decided in order, each
        seeing the rows as the writes before it left them. Yields what to lock, is sent what was locked; yields a
        `TURN` whenever its time slice is over (app.turns), is sent None."""
        fold = _Fold()
        cpu = TimeSlice()

        def lock(proposals: Iterable[Proposal]) -> Generator[LockRequest, Locked, None]:
            proposals = list(proposals)
            request = self.lock_request(proposals, fold.rows.keys())
            if request.keys or request.entity_urns or request.shared:
                fold.lock(request, (yield request))
            # the definitions of the structured property values these proposals replace, known once locked
            shared = frozenset(definition_keys(proposals, fold.rows).difference(fold.rows))
            if shared:
                fold.lock(
                    LockRequest(frozenset(), frozenset(), shared), (yield LockRequest(frozenset(), frozenset(), shared))
                )

        yield from lock(p for proposals, _ in writes for p in proposals)
        outcomes = []
        for proposals, audit in writes:
            # CREATE_ENTITY asks whether the entity existed before this write (not before its own earlier proposals)
            existed_before = frozenset(p.urn for p in proposals if fold.rows.get(self._key_of_entity(p)) is not None)
            items: list[ItemResult] = []
            outbox: list[OutboxRow] = []
            for proposal in proposals:
                if cpu.over():
                    yield TURN
                    cpu.restart()
                step = self.decide_proposal(fold.view(existed_before), proposal, audit, processors)
                fold.take(proposal, step)
                outbox.extend(step.outbox)
                if step.result is not None:
                    items.append(step.result)
                # Emitted proposals right after their cause: the batch's next proposals see (and may override) them.
                # Their rows are locked only now (a lock taken late may deadlock with another writer: Postgres then
                # aborts one of the two, and the transaction is retried whole); their results go on their cause's.
                emitted = step.emitted
                while emitted and not fold.refused:
                    ready = []
                    for e in emitted:
                        emitted_proposal = self._emitted_proposal(e)
                        if isinstance(emitted_proposal, Verdict):
                            fold.refused.append((e.cause, emitted_proposal))
                        else:
                            ready.append((e, emitted_proposal))
                    if fold.refused:
                        break
                    yield from lock(p for _, p in ready)
                    emitted = ()
                    for e, p in ready:
                        if fold.rows.get(self._key_of_entity(p)) is not None:
                            existed_before |= {p.urn}
                        step = self.decide_proposal(fold.view(existed_before), p, audit, processors)
                        fold.take(p, step)
                        outbox.extend(step.outbox)
                        if e.cause_result is not None and step.result is not None:
                            e.cause_result.emitted = [*(e.cause_result.emitted or []), step.result]
                        emitted += step.emitted
            items.sort(key=lambda r: r.index)
            outcomes.append(DecidedWrite(tuple(items), tuple(outbox)))
        return fold.decision(outcomes, self.history_kept)

    def _key_of_entity(self, p: Proposal) -> Key:
        return (p.urn, self.registry.entity(p.entity_type).key_aspect)

    def decide_proposal(self, view: View, p: Proposal, audit: AuditStamp, processors: Pipeline) -> Step:
        """One proposal: its patch applied to the locked value, the pre-commit rules, the change processors' before
        phase, then its rows and change logs (none when an earlier proposal was refused)."""
        entity = self.registry.entity(p.entity_type)
        previous = None if p.is_timeseries else view.rows.get((p.urn, p.aspect_name))
        if p.change_type is ChangeType.CREATE_ENTITY:
            entity_exists = p.urn in view.existed_before
        else:
            entity_exists = view.rows.get((p.urn, entity.key_aspect)) is not None

        if p.change_type is ChangeType.PATCH:
            patched = self._patched(p, previous, audit)
            if isinstance(patched, Verdict):
                return Step(verdict=patched)
            p = patched
        verdict = self.rules.run_pre_commit_rules(PendingChange(p, previous, entity_exists, view.rows))
        if verdict is not None:
            if verdict.is_fatal:
                return Step(verdict=verdict)
            return Step(
                ItemResult(p.index, p.urn, p.entity_type, p.aspect_name, ItemStatus.FILTERED, message=verdict.message),
                verdict,
            )
        reports: list[StepReport] | None = None
        if processors.steps and processors.governs(Phase.BEFORE, p.entity_type, p.aspect_name, p.change_type.value):
            before = self._run_before_processors(p, previous, audit, processors)
            if isinstance(before, Step):
                return before
            p, reports, emissions = before
        if view.refused:
            return Step()  # the batch will fail; this proposal was checked only to report every violation
        step = self._write(view, p, previous, entity.key_aspect, audit)
        if step.result is not None and step.result.status in (ItemStatus.CREATED, ItemStatus.UPDATED):
            check = stored_value_check(p, previous)
            if check is not None:
                step = dataclasses.replace(step, stored_checks=(check,))
        if reports is not None:
            assert step.result is not None
            step.result.processors = reports
            step = dataclasses.replace(step, emitted=tuple(Emitted(name, e, p, step.result) for name, e in emissions))
        return step

    def _write(
        self, view: View, p: Proposal, previous: StoredAspect | None, key_aspect: str, audit: AuditStamp
    ) -> Step:
        if p.change_type is ChangeType.DELETE:
            return self._delete(view, p, previous, key_aspect, audit)
        key_step = None
        if view.rows.get((p.urn, key_aspect)) is None and p.aspect_name != key_aspect:
            key_proposal = Proposal(
                p.index,
                p.entity_type,
                p.urn,
                key_aspect,
                ChangeType.UPSERT,
                value=self.registry.urn_to_key(p.entity_type, p.urn),
                system_metadata=p.system_metadata,
            )
            key_step = dataclasses.replace(self._upsert(view, key_proposal, None, audit), result=None)
        step = self._append_timeseries(p, audit) if p.is_timeseries else self._upsert(view, p, previous, audit)
        return step if key_step is None else key_step.then(step)

    def _run_before_processors(
        self, p: Proposal, previous: StoredAspect | None, audit: AuditStamp, processors: Pipeline
    ) -> Step | tuple[Proposal, list[StepReport], list[tuple[str, EmittedProposal]]]:
        """The change processors' before phase, with the locked previous value: the proposal (with the value they
        left, validated against the schema again), their reports and emissions; or the Step that ends the proposal
        here: rejected (a fatal verdict naming the processor) or ignored (an IGNORED item, nothing written)."""
        change = ProposedChange(
            p.urn,
            p.entity_type,
            p.aspect_name,
            p.change_type.value,
            p.value,
            previous.value if previous is not None else None,
            previous.system_metadata if previous is not None else None,
            p.system_metadata,
            audit.actor,
        )
        result = processors.run(Phase.BEFORE, change)
        if result.rejected is not None:
            name, reason = result.rejected
            return Step(verdict=Verdict(VerdictKind.VALIDATION, reason, f"change processor {name}", "$.aspect.value"))
        if result.ignored is not None:
            ignored_reason = next((r.reason for r in result.reports if r.processor == result.ignored), None)
            return Step(
                ItemResult(
                    p.index,
                    p.urn,
                    p.entity_type,
                    p.aspect_name,
                    ItemStatus.IGNORED,
                    message=f"ignored by change processor {result.ignored}: {ignored_reason}",
                    processors=result.reports,
                )
            )
        if result.value is not p.value and result.value is not None:
            aspect = self.registry.aspect(p.entity_type, p.aspect_name)
            try:
                p = dataclasses.replace(p, value=self._validate_value(aspect, result.value, p.index, p.urn))
            except ValidationFailed as error:
                name = next(r.processor for r in reversed(result.reports) if r.outcome == "mutated")
                messages = "; ".join(f"{i.path}: {i.message}" for i in error.issues)
                return Step(
                    verdict=Verdict(
                        VerdictKind.VALIDATION,
                        f"its mutation does not match the schema: {messages}",
                        f"change processor {name}",
                        "$.aspect.value",
                    )
                )
        return p, result.reports, result.emitted

    def _emitted_proposal(self, e: Emitted) -> Proposal | Verdict:
        """An emitted proposal resolved and validated; or a fatal verdict naming its processor when it is not valid,
        or when processors keep emitting because of each other's emissions."""

        def refusal(message: str) -> Verdict:
            return Verdict(VerdictKind.VALIDATION, message, f"change processor {e.processor}", "$.aspect.value")

        if cause_depth(e.cause.system_metadata) >= MAX_CAUSE_DEPTH:
            return refusal(
                f"emitted a proposal {MAX_CAUSE_DEPTH} emissions deep (processors emitting because of each other)"
            )
        version = e.cause_result.version if e.cause_result is not None else None
        system_metadata = {
            "properties": cause_properties(
                e.processor, e.cause.urn, e.cause.aspect_name, version, e.cause.system_metadata
            )
        }
        if "runId" in e.cause.system_metadata:
            system_metadata["runId"] = e.cause.system_metadata["runId"]
        draft = Draft(
            e.cause.index,
            e.proposal.entity_type,
            e.proposal.aspect,
            e.proposal.change_type,
            urn=e.proposal.urn,
            value=e.proposal.value,
            system_metadata=system_metadata,
        )
        try:
            return self.prepare([draft])[0]
        except MetaledgerError as error:
            details = "; ".join(f"{i.path or ''} {i.message}".strip() for i in error.issues or [])
            return refusal(
                f"emitted an invalid proposal for {e.proposal.aspect} of {e.proposal.urn}: {details or error.message}"
            )

    def _patched(self, p: Proposal, previous: StoredAspect | None, audit: AuditStamp) -> Proposal | Verdict:
        """DataHub's patch semantics (templates, keyed arrays, RFC 6902) against the locked latest value; the result
        is validated like an UPSERT."""
        try:
            patched = apply_patch(
                p.aspect_name,
                previous.value if previous is not None else None,
                p.patch,
                schema=self.registry.aspect_spec(p.aspect_name).type,
                now_ms=audit.time,
            )
        except PatchError as error:
            return Verdict(VerdictKind.VALIDATION, f"the patch does not apply: {error}", "Patch")
        aspect = self.registry.aspect(p.entity_type, p.aspect_name)
        try:
            return dataclasses.replace(p, value=self._validate_value(aspect, patched, p.index, p.urn))
        except ValidationFailed as error:
            messages = "; ".join(f"{i.path}: {i.message}" for i in error.issues)
            return Verdict(VerdictKind.VALIDATION, f"the patched aspect is invalid: {messages}", "Patch")

    def _system_metadata(self, p: Proposal, previous: StoredAspect | None, audit: AuditStamp) -> dict[str, Any]:
        sm = dict(p.system_metadata)
        if not sm.get("lastObserved"):
            sm["lastObserved"] = audit.time
        sm.setdefault("runId", DEFAULT_RUN_ID)
        sm["lastRunId"] = previous.system_metadata.get("runId", DEFAULT_RUN_ID) if previous else DEFAULT_RUN_ID
        return sm

    def _upsert(self, view: View, p: Proposal, previous: StoredAspect | None, audit: AuditStamp) -> Step:
        key = (p.urn, p.aspect_name)
        value_json = _dumps(p.value)
        if len(value_json) > self.settings.max_aspect_bytes:
            raise PayloadTooLarge(
                f"aspect {p.aspect_name!r} of {p.urn} is {len(value_json)} bytes; the limit is {self.settings.max_aspect_bytes}",
                [Issue("aspect too large", p.index, p.urn, p.aspect_name, "$.aspect.value")],
            )
        sm = self._system_metadata(p, previous, audit)
        superseded: tuple[StoredAspect, ...] = ()
        if previous is not None and (previous.metadata == value_json or previous.value == p.value):
            for carried in ("version", "aspectCreated", "aspectModified"):
                if carried in previous.system_metadata:
                    sm[carried] = previous.system_metadata[carried]
            row = StoredAspect(
                p.urn,
                p.aspect_name,
                previous.metadata,
                sm,
                previous.created_on,
                previous.created_by,
                previous.created_for,
                _value=previous.value,
            )
            status = ItemStatus.UNCHANGED
        else:
            # after a delete, versions continue from the deleted one: an old change log never looks new
            version = previous.version + 1 if previous is not None else view.floors.get(key, 0) + 1
            sm["version"] = str(version)
            first = previous.system_metadata.get("aspectCreated") if previous is not None else None
            sm["aspectCreated"] = first or audit.to_json()
            if audit.actor != SYSTEM_ACTOR:
                sm["aspectModified"] = audit.to_json()
            row = StoredAspect(
                p.urn, p.aspect_name, value_json, sm, _now_naive_utc(audit.time), audit.actor, _value=p.value
            )
            status = ItemStatus.CREATED if previous is None else ItemStatus.UPDATED
            if previous is not None and self.history_kept(p.entity_type, p.aspect_name) > 0:
                superseded = (previous.as_history(),)
        outbox: tuple[OutboxRow, ...] = ()
        if status is not ItemStatus.UNCHANGED or self.settings.always_emit_change_log:
            change_type = (
                ChangeType.RESTATE
                if status is ItemStatus.UNCHANGED
                else (
                    ChangeType.CREATE
                    if p.change_type in (ChangeType.CREATE, ChangeType.CREATE_ENTITY)
                    else ChangeType.UPSERT
                )
            )
            outbox = self._change_logs(p, change_type, row, previous, audit)
        result = ItemResult(p.index, p.urn, p.entity_type, p.aspect_name, status, row.value, sm)
        return Step(result, rows=((key, row),), superseded=superseded, outbox=outbox)

    def _append_timeseries(self, p: Proposal, audit: AuditStamp) -> Step:
        sm = self._system_metadata(p, None, audit)
        assert p.value is not None
        payload = build_change_log(
            p,
            change_type=ChangeType.UPSERT,
            aspect_name=p.aspect_name,
            aspect_json=_dumps(p.value),
            system_metadata=sm,
            previous_json=None,
            previous_system_metadata=None,
            created=audit,
        )
        timestamp = int(p.value.get("timestampMillis", audit.time))
        outbox = (
            OutboxRow(
                self.settings.topic_mcl_timeseries,
                p.urn,
                p.urn,
                p.aspect_name,
                timestamp,
                ChangeType.UPSERT.value,
                payload,
                AuditedChange(audit.caller, audit.actor, sm, None),
            ),
            *self._platform_events(p, ChangeType.UPSERT, None, p.value, audit, timestamp),
        )
        return Step(
            ItemResult(p.index, p.urn, p.entity_type, p.aspect_name, ItemStatus.APPENDED, p.value, sm), outbox=outbox
        )

    def _delete(
        self, view: View, p: Proposal, previous: StoredAspect | None, key_aspect: str, audit: AuditStamp
    ) -> Step:
        if previous is None:
            return Step(ItemResult(p.index, p.urn, p.entity_type, p.aspect_name, ItemStatus.ABSENT))
        rows: list[tuple[Key, StoredAspect | None]] = []
        floors: list[tuple[Key, int]] = []
        outbox: list[OutboxRow] = []
        if p.aspect_name == key_aspect:
            # Deleting the key aspect deletes the entity: every aspect and every version. Each other aspect gets its
            # own DELETE change log (before the key aspect's), so consumers know the version every aspect was
            # deleted at (the search index keeps them in its tombstone: an older change log cannot revive it).
            for state_key in sorted(k for k in view.rows if k[0] == p.urn):
                row = view.rows[state_key]
                if row is None:
                    continue
                floors.append((state_key, max(view.floors.get(state_key, 0), row.version)))
                if state_key[1] != key_aspect:
                    cascaded = dataclasses.replace(p, aspect_name=state_key[1], system_metadata=dict(p.system_metadata))
                    sm = dict(row.system_metadata)
                    sm.update(self._system_metadata(cascaded, row, audit))
                    outbox += self._change_logs(
                        cascaded, ChangeType.DELETE, None, row, audit, system_metadata=sm, platform_events=False
                    )
                rows.append((state_key, None))
            deleted_urn, deleted_key = p.urn, None
        else:
            key = (p.urn, p.aspect_name)
            floors.append((key, max(view.floors.get(key, 0), previous.version)))
            rows.append((key, None))
            deleted_urn, deleted_key = None, key
        sm = dict(previous.system_metadata)
        sm.update(self._system_metadata(p, previous, audit))
        outbox += self._change_logs(p, ChangeType.DELETE, None, previous, audit, system_metadata=sm)
        return Step(
            ItemResult(p.index, p.urn, p.entity_type, p.aspect_name, ItemStatus.DELETED, system_metadata=sm),
            rows=tuple(rows),
            deleted_urn=deleted_urn,
            deleted_key=deleted_key,
            floors=tuple(floors),
            outbox=tuple(outbox),
        )

    def _change_logs(
        self,
        p: Proposal,
        change_type: ChangeType,
        row: StoredAspect | None,
        previous: StoredAspect | None,
        audit: AuditStamp,
        *,
        system_metadata: dict[str, Any] | None = None,
        platform_events: bool = True,
    ) -> tuple[OutboxRow, ...]:
        """The versioned change log of a change, then (`platform_events`) its Entity Change Events."""
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
        change_log = OutboxRow(
            self.settings.topic_mcl_versioned,
            p.urn,
            p.urn,
            p.aspect_name,
            version,
            change_type.value,
            payload,
            AuditedChange(audit.caller, audit.actor, sm, previous.system_metadata if previous is not None else None),
        )
        if not platform_events:
            return (
                change_log,
            )  # an aspect deleted with its entity: the key aspect's delete carries the entity's event
        return (
            change_log,
            *self._platform_events(
                p,
                change_type,
                previous.value if previous is not None else None,
                row.value if row is not None else None,
                audit,
                version,
            ),
        )

    def _platform_events(
        self,
        p: Proposal,
        change_type: ChangeType,
        previous: dict[str, Any] | None,
        current: dict[str, Any] | None,
        audit: AuditStamp,
        version: int,
    ) -> list[OutboxRow]:
        """Entity Change Events from the previous and new value, both in hand inside the transaction; they commit
        with the change (DataHub derives them later from the MCL stream, and loses them with it)."""
        if not self.settings.platform_events_enabled:
            return []
        events = entity_change_events(
            entity_type=p.entity_type,
            urn=p.urn,
            aspect_name=p.aspect_name,
            change_type=change_type.value,
            previous=previous,
            current=current,
            audit=audit.to_json(),
        )
        return [
            OutboxRow(
                self.settings.topic_platform_event,
                platform_event_key(event),
                p.urn,
                p.aspect_name,
                version,
                change_type.value,
                _dumps(platform_event(event)),
            )
            for event in events
        ]

    def history_kept(self, entity: str, aspect: str) -> int:
        """How many versions before the latest are kept (METALEDGER_RETENTION_*)."""
        overrides = self.settings.retention_overrides
        for candidate in (f"{entity}/{aspect}", f"{entity}/*", f"*/{aspect}"):
            if candidate in overrides:
                return overrides[candidate]
        return self.settings.retention_max_versions
