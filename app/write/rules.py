"""The ordered rule chain around a write, modelled on Prefect's orchestration rules.

Two stages:
- proposal rules run before the transaction, on each parsed and schema-validated proposal: they may reject it
  or mutate it (user validators and mutators plug in here);
- pre-commit rules run inside the transaction after the row locks, with the locked previous value in hand, so a
  check and the write that depends on it cannot be separated by a concurrent writer (compare-and-set).

A rule declares which change types and which entity/aspect pairs it governs ("*" matches any) and returns a
`Verdict` or None. The built-in conditional-write checks come first, as DataHub's validators do.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from app.registry.runtime import MODELS_ASPECT
from app.write.processors import PIPELINE_ASPECT, PIPELINE_ENTITY, PIPELINE_URN
from app.write.proposal import (
    IF_NONE_MATCH,
    IF_VERSION_MATCH,
    PROPOSABLE_CHANGE_TYPES,
    ChangeType,
    Proposal,
)
from app.write.repository import StoredAspect

ANY = "*"
WRITE_CHANGE_TYPES = frozenset(
    {
        ChangeType.UPSERT,
        ChangeType.CREATE,
        ChangeType.CREATE_ENTITY,
        ChangeType.UPDATE,
        ChangeType.PATCH,
        ChangeType.DELETE,
    }
)
ABSENT_VERSION = "-1"
EVERY_ENTITY_ASPECT: Sequence[tuple[str, str]] = ((ANY, ANY),)


class VerdictKind(str, enum.Enum):
    VALIDATION = "VALIDATION"  # 400
    CONFLICT = "CONFLICT"  # 409: existence conflicts of CREATE / CREATE_ENTITY / UPDATE
    PRECONDITION = "PRECONDITION"  # 412: a failed If-* header
    FILTER = "FILTER"  # not an error: the item is dropped and reported, the rest of the batch commits


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: VerdictKind
    message: str
    rule: str
    path: str | None = None  # the MCP field at fault (`$.changeType`, `$.aspect.value`), when one is

    @property
    def is_fatal(self) -> bool:
        return self.kind is not VerdictKind.FILTER


@dataclass(frozen=True, slots=True)
class PendingChange:
    """What a pre-commit rule sees: the proposal and the locked state it would change."""

    proposal: Proposal
    previous: StoredAspect | None
    entity_exists: bool
    # every row the transaction read, as the proposals before this one left them (definitions read FOR SHARE)
    rows: Mapping[tuple[str, str], StoredAspect | None] = field(default_factory=dict)


class Rule:
    name: ClassVar[str]
    # class defaults a plugin's configuration may set per instance (app.write.plugins: supportedOperations, ...)
    change_types: frozenset[ChangeType] = WRITE_CHANGE_TYPES
    entity_aspects: Sequence[tuple[str, str]] = EVERY_ENTITY_ASPECT

    def governs(self, proposal: Proposal) -> bool:
        if proposal.change_type not in self.change_types:
            return False
        if self.entity_aspects is EVERY_ENTITY_ASPECT:  # the common case, on the hot path of every proposal
            return True
        return any(
            (entity == ANY or entity == proposal.entity_type) and (aspect == ANY or aspect == proposal.aspect_name)
            for entity, aspect in self.entity_aspects
        )

    def verdict(self, kind: VerdictKind, message: str, path: str | None = None) -> Verdict:
        return Verdict(kind, message, self.name, path)


class ProposalRule(Rule):
    """Runs before the transaction. May mutate `proposal` in place (a mutator) or return a Verdict (a validator)."""

    def apply(self, proposal: Proposal) -> Verdict | None:  # pragma: no cover - interface
        raise NotImplementedError


class PreCommitRule(Rule):
    """Runs inside the transaction, after the row locks."""

    def check(self, change: PendingChange) -> Verdict | None:  # pragma: no cover - interface
        raise NotImplementedError


class TimeseriesUpsertOnly(ProposalRule):
    """A timeseries point is appended, never created, updated, patched or deleted one by one."""

    name = "TimeseriesUpsertOnly"
    change_types = WRITE_CHANGE_TYPES - {ChangeType.UPSERT}

    def apply(self, proposal: Proposal) -> Verdict | None:
        if not proposal.is_timeseries:
            return None
        return self.verdict(
            VerdictKind.VALIDATION,
            f"timeseries aspect {proposal.aspect_name!r} accepts UPSERT only, not {proposal.change_type.value}",
            "$.changeType",
        )


class KeyAspectIsNotPatched(ProposalRule):
    """A key aspect is the URN's parts: there is nothing to patch."""

    name = "KeyAspectIsNotPatched"
    change_types = frozenset({ChangeType.PATCH})

    def apply(self, proposal: Proposal) -> Verdict | None:
        if not proposal.is_key:
            return None
        return self.verdict(
            VerdictKind.VALIDATION, f"key aspect {proposal.aspect_name!r} cannot be patched", "$.changeType"
        )


class KeyAspectMatchesUrn(ProposalRule):
    """A written key aspect must be the one the URN stands for."""

    name = "KeyAspectMatchesUrn"
    change_types = WRITE_CHANGE_TYPES - {ChangeType.PATCH, ChangeType.DELETE}

    def __init__(self, urn_to_key: Callable[[str, str], dict[str, Any]]) -> None:
        self.urn_to_key = urn_to_key

    def apply(self, proposal: Proposal) -> Verdict | None:
        if not proposal.is_key or proposal.value == self.urn_to_key(proposal.entity_type, proposal.urn):
            return None
        return self.verdict(
            VerdictKind.VALIDATION,
            f"key aspect {proposal.aspect_name!r} does not match the URN {proposal.urn!r}",
            "$.aspect.value",
        )


# metaledger's own entity (PIPELINE_ENTITY, metaledgerSystem) is written by its own services only, each after its
# own checks: the runtime model set by the models API, the change-processor pipeline by the processors API. Each
# service's write names the (urn, aspect) it writes, in its task only (`system_service_write`): no caller can set it.
SYSTEM_SERVICE_WRITE: ContextVar[tuple[str, str] | None] = ContextVar("metaledger_system_service_write", default=None)
MODELS_URN = f"urn:li:{PIPELINE_ENTITY}:models"
# urn -> (its aspect, the service that writes it)
SYSTEM_SERVICES: Mapping[str, tuple[str, str]] = {
    MODELS_URN: (MODELS_ASPECT, "POST /openapi/v1/models (metaledger model apply)"),
    PIPELINE_URN: (PIPELINE_ASPECT, "PUT /openapi/v1/change-processors"),
}


@contextmanager
def system_service_write(urn: str, aspect: str) -> Iterator[None]:
    """The block's writes of `aspect` of `urn` are the service's own (app.modelset.service.apply_models,
    app.api.processors): `SystemEntityThroughItsServices` lets them pass, and nothing else of metaledgerSystem."""
    token = SYSTEM_SERVICE_WRITE.set((urn, aspect))
    try:
        yield
    finally:
        SYSTEM_SERVICE_WRITE.reset(token)


def system_entity_refusal(urn: str | None, what: str) -> str:
    """Why `what` (a write, a DELETE, ...) of metaledgerSystem is refused, naming the service to use instead."""
    services = {urn: SYSTEM_SERVICES[urn]} if urn is not None and urn in SYSTEM_SERVICES else SYSTEM_SERVICES
    where = "; ".join(f"{aspect} of {u} through {route}" for u, (aspect, route) in services.items())
    return (
        f"{PIPELINE_ENTITY} is metaledger's own configuration, written only by its own services, never by "
        f"{what} through a general write path: {where}"
    )


class SystemEntityThroughItsServices(ProposalRule):
    """metaledger's own entity is written only by its own services (the models API, the processors API), after their
    checks: any other write or delete of any of its aspects (its key aspect: the whole entity, the model set and its
    history with it) through any general write path (v1, v3, Rest.li, OpenLineage, the MCP and MCE topics, GraphQL,
    and the proposals of rollback, deleteReferences and change processors) is refused here, where every proposal
    passes before the transaction."""

    name = "SystemEntityThroughItsServices"
    change_types = PROPOSABLE_CHANGE_TYPES
    entity_aspects = ((PIPELINE_ENTITY, ANY),)

    def apply(self, proposal: Proposal) -> Verdict | None:
        if SYSTEM_SERVICE_WRITE.get() == (proposal.urn, proposal.aspect_name):
            return None
        what = f"a {proposal.change_type.value} of {proposal.aspect_name} of {proposal.urn}"
        return self.verdict(VerdictKind.VALIDATION, system_entity_refusal(proposal.urn, what), "$.entityType")


def builtin_proposal_rules(urn_to_key: Callable[[str, str], dict[str, Any]]) -> list[ProposalRule]:
    """The checks every proposal passes before user validators; `urn_to_key` is the registry's."""
    return [
        SystemEntityThroughItsServices(),
        TimeseriesUpsertOnly(),
        KeyAspectIsNotPatched(),
        KeyAspectMatchesUrn(urn_to_key),
    ]


def _actual_version(change: PendingChange) -> str:
    return str(change.previous.version) if change.previous is not None else ABSENT_VERSION


def _parse_instant(header: str, raw: str) -> datetime | str:
    try:
        parsed = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        return f"{header} must be an ISO-8601 instant such as 2024-01-01T00:00:00Z, got {raw!r}"
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _last_modified(previous: StoredAspect) -> datetime:
    # `createdon` is the time of the last value change (a no-op write does not touch it).
    return previous.created_on.replace(tzinfo=UTC)


class IfVersionMatch(PreCommitRule):
    """`If-Version-Match: <v>`: the aspect's logical version must be exactly v; `-1` means it must not exist."""

    name = "IfVersionMatch"

    def check(self, change: PendingChange) -> Verdict | None:
        expected = change.proposal.header(IF_VERSION_MATCH)
        if expected is None:
            return None
        actual = _actual_version(change)
        if expected.strip() != actual:
            return self.verdict(
                VerdictKind.PRECONDITION, f"Expected version {expected.strip()}, actual version {actual}"
            )
        return None


class _LastModifiedCondition(PreCommitRule):
    """If-Modified-Since / If-Unmodified-Since: an ISO-8601 instant compared with the last value change."""

    header_name: ClassVar[str]
    modified_must_be_after: ClassVar[bool]

    def check(self, change: PendingChange) -> Verdict | None:
        raw = change.proposal.header(self.header_name.lower())
        if raw is None:
            return None
        since = _parse_instant(self.header_name, raw)
        if isinstance(since, str):
            return self.verdict(VerdictKind.VALIDATION, since)
        modified = _last_modified(change.previous) if change.previous is not None else None
        if self.modified_must_be_after:
            holds = modified is not None and modified > since
        else:
            holds = modified is None or modified <= since
        if holds:
            return None
        when = modified.isoformat() if modified is not None else "never"
        relation = "not after" if self.modified_must_be_after else "after"
        return self.verdict(VerdictKind.PRECONDITION, f"Item last modified {when}, {relation} {since.isoformat()}")


class IfModifiedSince(_LastModifiedCondition):
    name = "IfModifiedSince"
    header_name = "If-Modified-Since"
    modified_must_be_after = True


class IfUnmodifiedSince(_LastModifiedCondition):
    name = "IfUnmodifiedSince"
    header_name = "If-Unmodified-Since"
    modified_must_be_after = False


def _conflict_or_filter(rule: PreCommitRule, change: PendingChange, message: str) -> Verdict:
    # `If-None-Match: *` turns the conflict into a silent, reported drop (DataHub's FILTER).
    if (change.proposal.header(IF_NONE_MATCH) or "").strip() == "*":
        return rule.verdict(VerdictKind.FILTER, f"Dropped per precondition header If-None-Match: *: {message}")
    return rule.verdict(VerdictKind.CONFLICT, message)


class CreateIfNotExists(PreCommitRule):
    name = "CreateIfNotExists"
    change_types = frozenset({ChangeType.CREATE, ChangeType.CREATE_ENTITY})

    def check(self, change: PendingChange) -> Verdict | None:
        if change.proposal.change_type is ChangeType.CREATE and change.previous is not None:
            return _conflict_or_filter(self, change, "Cannot perform CREATE since the aspect already exists.")
        if change.proposal.change_type is ChangeType.CREATE_ENTITY and change.entity_exists:
            return _conflict_or_filter(self, change, "Cannot perform CREATE_ENTITY since the entity already exists.")
        return None


class UpdateRequiresExisting(PreCommitRule):
    """UPDATE changes an existing aspect only (DataHub documents it but never enforced it)."""

    name = "UpdateRequiresExisting"
    change_types = frozenset({ChangeType.UPDATE})

    def check(self, change: PendingChange) -> Verdict | None:
        if change.previous is None:
            return self.verdict(VerdictKind.CONFLICT, "Cannot perform UPDATE since the aspect does not exist.")
        return None


def builtin_pre_commit_rules() -> list[PreCommitRule]:
    return [IfVersionMatch(), IfModifiedSince(), IfUnmodifiedSince(), CreateIfNotExists(), UpdateRequiresExisting()]


@dataclass
class RuleChain:
    """mutators → (re-validation) → validators, before the transaction; pre-commit rules inside it. The built-in
    rules come first in each list (`builtin_proposal_rules` are added by the write service, which has the registry)."""

    mutators: list[ProposalRule] = field(default_factory=list)
    validators: list[ProposalRule] = field(default_factory=list)
    pre_commit_rules: list[PreCommitRule] = field(default_factory=builtin_pre_commit_rules)

    def with_validators_first(self, rules: Sequence[ProposalRule]) -> RuleChain:
        return RuleChain(self.mutators, [*rules, *self.validators], self.pre_commit_rules)

    def run_mutators(self, proposal: Proposal) -> tuple[bool, Verdict | None]:
        """(whether any mutator governed the proposal, the first fatal verdict)."""
        touched = False
        for rule in self.mutators:
            if rule.governs(proposal):
                touched = True
                verdict = rule.apply(proposal)
                if verdict is not None and verdict.is_fatal:
                    return touched, verdict
        return touched, None

    def run_validators(self, proposal: Proposal) -> Verdict | None:
        for rule in self.validators:
            if rule.governs(proposal):
                verdict = rule.apply(proposal)
                if verdict is not None and verdict.is_fatal:
                    return verdict
        return None

    def run_pre_commit_rules(self, change: PendingChange) -> Verdict | None:
        """The first verdict wins: a failed precondition is reported before an existence conflict."""
        for rule in self.pre_commit_rules:
            if rule.governs(change.proposal):
                verdict = rule.check(change)
                if verdict is not None:
                    return verdict
        return None
