"""Change processors (issue 15, the "Change processing" RFC): user code that accepts, mutates, ignores, rejects a
change or emits more, installed as an ordinary Python package and ordered by a pipeline stored in the database.

WORK IN PROGRESS (branch wip/issue-15-change-processors): this module is the contract and the pipeline runner;
the write path does not call it yet. What is left is listed in NEXT below.

The contract
------------
A processor is a class with a `name`, a `scope` (entity/aspect patterns and change types) and a `phase`:

- `before`: inside the write transaction, after the row locks, with the previous value and system metadata and the
  proposed value in hand (the RFC's `updateLambda`);
- `after`: after commit, from the change log (side effects that must not slow or fail the write).

`process(change) -> Outcome`, where an outcome is one of `Accept()`, `Mutate(value)`, `Ignore(reason)`,
`Reject(reason)`, each optionally carrying `emit=[EmittedProposal, ...]`. A processor that raises, or runs past its
time budget, is a refusal naming it (fail closed).

Loading and ordering
--------------------
Processors are found through the entry-point group `metaledger.change_processors` (name -> class) or a dotted path.
The pipeline is an ordered list of `PipelineStep {name, enabled, required, scope overrides, config}`; a required
step that is missing or fails to load refuses the writes in its scope.

NEXT (not done yet)
-------------------
1. The pipeline as an aspect of a metaledger system entity (an .avsc in the repo's model source), initial value
   from entity_registry.yml, read by every process and refreshed within seconds (poll its version).
2. WriteService._apply_one: run `Pipeline.run_before` after the pre-commit rules; Mutate -> validate against the
   schema again; Ignore -> an item status IGNORED (no row, no MCL, counted); Reject -> a fatal verdict naming the
   processor (the batch refused); emitted proposals locked and applied in the same transaction, each with its cause
   in systemMetadata.properties.
3. The after phase: a feed reader (FeedCursor, as app/search/worker.py) applying emitted proposals in the transaction
   that advances its cursor (exactly once per change log).
4. Response: per proposal the processors that ran and their outcomes. (Done: GET /openapi/v1/change-processors;
   metrics metaledger_change_processor_calls_total / _seconds.)
5. examples/change_processors package (entry points, installed with pip in the tests); README; bench/ingest.py cost;
   the MCP consumer path (a rejection to FMCP with the processor's reason).
"""

from __future__ import annotations

import enum
import fnmatch
import importlib
import importlib.metadata
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from app.ops.metrics import PROCESSOR_CALLS, PROCESSOR_SECONDS

ENTRY_POINT_GROUP = "metaledger.change_processors"
DEFAULT_BUDGET_MS = 50.0

log = logging.getLogger("metaledger.processors")


class Phase(str, enum.Enum):
    BEFORE = "before"
    AFTER = "after"


@dataclass(frozen=True, slots=True)
class Scope:
    """Which changes a processor governs: fnmatch patterns of entity types and aspect names, and change types
    (empty: every one)."""

    entity_types: tuple[str, ...] = ("*",)
    aspects: tuple[str, ...] = ("*",)
    change_types: tuple[str, ...] = ()

    def governs(self, entity_type: str, aspect: str, change_type: str) -> bool:
        if self.change_types and change_type not in self.change_types:
            return False
        return (any(fnmatch.fnmatchcase(entity_type, p) for p in self.entity_types)
                and any(fnmatch.fnmatchcase(aspect, p) for p in self.aspects))

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None, default: Scope) -> Scope:
        if not raw:
            return default
        return cls(
            tuple(raw.get("entityTypes") or default.entity_types),
            tuple(raw.get("aspects") or default.aspects),
            tuple(raw.get("changeTypes") or default.change_types),
        )


@dataclass(frozen=True, slots=True)
class Change:
    """What a processor sees. `previous_*` are None for a first write; in the after phase `proposed` is the value
    that was committed."""

    urn: str
    entity_type: str
    aspect: str
    change_type: str
    proposed: Any
    previous: Any = None
    previous_system_metadata: Mapping[str, Any] | None = None
    system_metadata: Mapping[str, Any] | None = None
    actor: str | None = None
    version: int | None = None  # the version written (after phase)


@dataclass(frozen=True, slots=True)
class EmittedProposal:
    """One more change, applied with the one that caused it (before: same transaction; after: through the outbox)."""

    urn: str
    entity_type: str
    aspect: str
    value: Any
    change_type: str = "UPSERT"


class OutcomeKind(str, enum.Enum):
    ACCEPTED = "accepted"
    MUTATED = "mutated"
    IGNORED = "ignored"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeKind
    value: Any = None  # Mutate's new value
    reason: str | None = None
    emit: tuple[EmittedProposal, ...] = ()


def Accept(*, emit: Sequence[EmittedProposal] = ()) -> Outcome:  # noqa: N802 - reads as a constructor
    return Outcome(OutcomeKind.ACCEPTED, emit=tuple(emit))


def Mutate(value: Any, *, emit: Sequence[EmittedProposal] = ()) -> Outcome:  # noqa: N802
    return Outcome(OutcomeKind.MUTATED, value=value, emit=tuple(emit))


def Ignore(reason: str, *, emit: Sequence[EmittedProposal] = ()) -> Outcome:  # noqa: N802
    return Outcome(OutcomeKind.IGNORED, reason=reason, emit=tuple(emit))


def Reject(reason: str) -> Outcome:  # noqa: N802
    return Outcome(OutcomeKind.REJECTED, reason=reason)


class ChangeProcessor:
    """Subclass, set `name`, `phase` and `scope`, implement `process`. `config` is the pipeline step's."""

    name: ClassVar[str]
    phase: ClassVar[Phase] = Phase.BEFORE
    scope: ClassVar[Scope] = Scope()
    budget_ms: ClassVar[float] = DEFAULT_BUDGET_MS

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})

    def process(self, change: Change) -> Outcome:  # pragma: no cover - interface
        raise NotImplementedError


class ProcessorLoadError(ValueError):
    pass


def find_processor_class(name: str) -> tuple[type[ChangeProcessor], str]:
    """The class named `name`: an entry point of `metaledger.change_processors`, or a dotted path. Returns it with
    where it came from ("package==version" or "module")."""
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name == name:
            try:
                cls = entry.load()
            except Exception as error:  # noqa: BLE001 - a broken package: reported, never raised past the loader
                raise ProcessorLoadError(f"change processor {name!r} ({entry.value}) cannot be loaded: {error}") from error
            dist = getattr(entry, "dist", None)
            origin = f"{dist.name}=={dist.version}" if dist is not None else entry.value
            return _checked(cls, name), origin
    if "." in name:
        module_name, _, attr = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as error:
            raise ProcessorLoadError(f"change processor {name!r} cannot be loaded: {error}") from error
        return _checked(cls, name), module_name
    raise ProcessorLoadError(f"no change processor {name!r}: not an entry point of {ENTRY_POINT_GROUP} nor a dotted path")


def _checked(cls: Any, name: str) -> type[ChangeProcessor]:
    if not (isinstance(cls, type) and issubclass(cls, ChangeProcessor)):
        raise ProcessorLoadError(f"change processor {name!r} is not a ChangeProcessor subclass")
    return cls


@dataclass(frozen=True, slots=True)
class PipelineStep:
    name: str
    enabled: bool = True
    required: bool = False
    scope: Mapping[str, Any] | None = None  # overrides the class's
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PipelineStep:
        return cls(str(raw["name"]), bool(raw.get("enabled", True)), bool(raw.get("required", False)),
                   raw.get("scope"), dict(raw.get("config") or {}))


@dataclass(slots=True)
class LoadedStep:
    step: PipelineStep
    processor: ChangeProcessor | None  # None: it failed to load (`error`)
    scope: Scope
    phase: Phase
    origin: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one processor did to one change (the write response lists these per proposal)."""

    processor: str
    outcome: str  # an OutcomeKind value, or "failed"
    reason: str | None = None
    emitted: int = 0
    elapsed_ms: float = 0.0


@dataclass(slots=True)
class PipelineResult:
    value: Any
    ignored: str | None = None  # the processor that ignored the change, if one did
    rejected: tuple[str, str] | None = None  # (processor, reason)
    emitted: list[EmittedProposal] = field(default_factory=list)
    reports: list[StepReport] = field(default_factory=list)


class Pipeline:
    """Ordered steps, loaded once per pipeline version. `run` applies the steps of one phase to one change."""

    def __init__(self, steps: Sequence[PipelineStep], version: int = 0) -> None:
        self.version = version
        self.steps = [self._load(s) for s in steps if s.enabled]

    @staticmethod
    def _load(step: PipelineStep) -> LoadedStep:
        try:
            cls, origin = find_processor_class(step.name)
            processor = cls(step.config)
        except Exception as error:  # noqa: BLE001 - reported on every change in its scope when required
            log.error("change processor not loaded", extra={"processor": step.name, "error": str(error)})
            return LoadedStep(step, None, Scope.from_json(step.scope, Scope()), Phase.BEFORE, error=str(error))
        return LoadedStep(step, processor, Scope.from_json(step.scope, cls.scope), cls.phase, origin)

    def run(self, phase: Phase, change: Change) -> PipelineResult:
        result = self._run(phase, change)
        for report in result.reports:  # per processor: calls by outcome, and time
            PROCESSOR_CALLS.labels(report.processor, phase.value, report.outcome).inc()
            PROCESSOR_SECONDS.labels(report.processor, phase.value).observe(report.elapsed_ms / 1000)
        return result

    def _run(self, phase: Phase, change: Change) -> PipelineResult:
        result = PipelineResult(change.proposed)
        current = change
        for loaded in self.steps:
            if not loaded.scope.governs(change.entity_type, change.aspect, change.change_type):
                continue
            if loaded.processor is None:
                if loaded.step.required:  # "the lack of a step terminates processing"
                    result.rejected = (loaded.step.name, f"required change processor is not available: {loaded.error}")
                    result.reports.append(StepReport(loaded.step.name, "failed", loaded.error))
                    return result
                continue
            if loaded.phase is not phase:
                continue
            started = time.perf_counter()
            try:
                outcome = loaded.processor.process(current)
            except Exception as error:  # noqa: BLE001 - fail closed: a refusal naming the processor
                log.exception("change processor failed", extra={"processor": loaded.step.name, "urn": change.urn,
                                                                "aspect": change.aspect})
                result.rejected = (loaded.step.name, f"change processor failed: {type(error).__name__}: {error}")
                result.reports.append(StepReport(loaded.step.name, "failed", str(error),
                                                 elapsed_ms=(time.perf_counter() - started) * 1000))
                return result
            elapsed_ms = (time.perf_counter() - started) * 1000
            budget = loaded.processor.budget_ms
            if elapsed_ms > budget:
                result.rejected = (loaded.step.name, f"change processor ran {elapsed_ms:.0f} ms, past its {budget:.0f} ms budget")
                result.reports.append(StepReport(loaded.step.name, "failed", "over budget", elapsed_ms=elapsed_ms))
                return result
            if not isinstance(outcome, Outcome):
                result.rejected = (loaded.step.name, f"change processor returned {type(outcome).__name__}, not an Outcome")
                result.reports.append(StepReport(loaded.step.name, "failed", "not an Outcome", elapsed_ms=elapsed_ms))
                return result
            result.emitted.extend(outcome.emit)
            result.reports.append(StepReport(loaded.step.name, outcome.kind.value, outcome.reason, len(outcome.emit), elapsed_ms))
            if outcome.kind is OutcomeKind.REJECTED:
                result.rejected = (loaded.step.name, outcome.reason or "rejected")
                return result
            if outcome.kind is OutcomeKind.IGNORED:
                result.ignored = loaded.step.name
                return result
            if outcome.kind is OutcomeKind.MUTATED:
                result.value = outcome.value
                current = Change(**{**{f: getattr(current, f) for f in Change.__slots__}, "proposed": outcome.value})
        return result

    def describe(self) -> list[dict[str, Any]]:
        """For GET of the pipeline: each step, in order, what is loaded and from where."""
        return [
            {"name": s.step.name, "enabled": s.step.enabled, "required": s.step.required, "phase": s.phase.value,
             "loaded": s.processor is not None, "origin": s.origin, "error": s.error,
             "scope": {"entityTypes": list(s.scope.entity_types), "aspects": list(s.scope.aspects),
                       "changeTypes": list(s.scope.change_types)}}
            for s in self.steps
        ]
