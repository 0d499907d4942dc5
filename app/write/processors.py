"""Change processors (issue 15, the "Change processing" RFC): user code that accepts, mutates, ignores, rejects a
change or emits more, installed as an ordinary Python package and ordered by a pipeline stored in the database.

The contract
------------
A processor is a class with a `name`, a `scope` (entity/aspect patterns and change types) and a `phase`:

- `before`: inside the write transaction, after the row locks, with the previous value and system metadata and the
  proposed value in hand (the RFC's `updateLambda`);
- `after`: after commit, from the change log (side effects that must not slow or fail the write).

`process(change) -> ProcessorOutcome`, where an outcome is one of `Accept()`, `Mutate(value)`, `Ignore(reason)`,
`Reject(reason)`, each optionally carrying `emit=[EmittedProposal, ...]`. A processor that raises, or runs past its
time budget, is a refusal naming it (fail closed).

Loading and ordering
--------------------
Processors are found through the entry-point group `metaledger.change_processors` (name -> class) or a dotted path.
The pipeline is an ordered list of `PipelineStep {name, enabled, required, scope overrides, config}`; a required
step that is missing or fails to load refuses the writes in its scope.

Where it runs
-------------
- `before`: app.write.service.WriteService, for every entry (OpenAPI, Rest.li, MCE, the MCP consumer): a rejection is
  a refusal of the whole batch naming the processor (on the MCP topic: a failed proposal, FMCP, with that reason), an
  ignored change an item with status IGNORED. Emitted proposals are applied in the same transaction (their rows
  locked then), each carrying its cause in `systemMetadata.properties` (`cause_properties`).
- `after`: app.write.after_processors, a reader of the change feed in the background work: the proposals a processor
  emits are applied in the transaction that moves its position past the change log, so exactly once per change log.
- Never on metaledger's own entity (PIPELINE_ENTITY): a processor cannot lock the admins out of the pipeline.

The pipeline is the aspect PIPELINE_ASPECT of PIPELINE_URN, written only through its own route (PUT
/openapi/v1/change-processors, ADMIN; the general write paths refuse it: app.write.rules) and then the ordinary write
pipeline; until it is first written, entity_registry.yml's `changeProcessors:` list is the pipeline (version 0).
"""

from __future__ import annotations

import enum
import fnmatch
import importlib
import importlib.metadata
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import orjson

from app.ops.metrics import PROCESSOR_CALLS, PROCESSOR_SECONDS

ENTRY_POINT_GROUP = "metaledger.change_processors"
DEFAULT_BUDGET_MS = 50.0
PIPELINE_ENTITY = "metaledgerSystem"
PIPELINE_ASPECT = "changeProcessorPipeline"
PIPELINE_URN = "urn:li:metaledgerSystem:changeProcessors"
MAX_CAUSE_DEPTH = 4  # a proposal emitted by one emitted by one ... : past this, refused (a loop of processors)

# What an emitted proposal carries in systemMetadata.properties (DataHub's map<string, string>): what caused it.
CAUSE_URN = "metaledger.cause.urn"
CAUSE_ASPECT = "metaledger.cause.aspect"
CAUSE_VERSION = "metaledger.cause.version"
CAUSE_PROCESSOR = "metaledger.cause.processor"
CAUSE_DEPTH = "metaledger.cause.depth"

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
        return any(fnmatch.fnmatchcase(entity_type, p) for p in self.entity_types) and any(
            fnmatch.fnmatchcase(aspect, p) for p in self.aspects
        )

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
class ProposedChange:
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

    @classmethod
    def from_change_log(cls, mcl: Mapping[str, Any]) -> ProposedChange:
        """The after phase's view of a committed change log (DataHub's MCL, JSON form): `proposed` is the value
        written (None for a DELETE), `previous` the value it replaced, `change_type` the change log's (UPSERT,
        CREATE, DELETE or RESTATE: a PATCH is logged as the UPSERT it became)."""
        system_metadata = mcl.get("systemMetadata") or {}
        version = system_metadata.get("version")
        return cls(
            mcl["entityUrn"],
            mcl["entityType"],
            mcl["aspectName"],
            mcl.get("changeType") or "UPSERT",
            _generic_value(mcl.get("aspect")),
            _generic_value(mcl.get("previousAspectValue")),
            mcl.get("previousSystemMetadata"),
            system_metadata,
            (mcl.get("created") or {}).get("actor"),
            int(version) if isinstance(version, str) and version.isdigit() else None,
        )


def _generic_value(aspect: Mapping[str, Any] | None) -> Any:
    """A GenericAspect's value: JSON text (DataHub's form) or, already decoded, an object."""
    if not aspect or aspect.get("value") is None:
        return None
    value = aspect["value"]
    return orjson.loads(value) if isinstance(value, (str, bytes)) else value


@dataclass(frozen=True, slots=True)
class EmittedProposal:
    """One more change, applied with the one that caused it (before: same transaction; after: through the outbox)."""

    urn: str
    entity_type: str
    aspect: str
    value: Any
    change_type: str = "UPSERT"


class ProcessorOutcomeKind(str, enum.Enum):
    ACCEPTED = "accepted"
    MUTATED = "mutated"
    IGNORED = "ignored"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class ProcessorOutcome:
    """What `process` returns: made by `Accept`, `Mutate`, `Ignore` or `Reject`."""

    kind: ProcessorOutcomeKind
    value: Any = None  # Mutate's new value
    reason: str | None = None
    emit: tuple[EmittedProposal, ...] = ()


_ACCEPTED = ProcessorOutcome(ProcessorOutcomeKind.ACCEPTED)  # outcomes are immutable: the common one is made once


def cause_properties(
    processor: str, urn: str, aspect: str, version: int | str | None, cause_system_metadata: Mapping[str, Any] | None
) -> dict[str, str]:
    """The `systemMetadata.properties` of a proposal emitted by `processor` because of the change of `aspect` of
    `urn` written at `version`."""
    return {
        CAUSE_URN: urn,
        CAUSE_ASPECT: aspect,
        CAUSE_VERSION: str(version if version is not None else ""),
        CAUSE_PROCESSOR: processor,
        CAUSE_DEPTH: str(cause_depth(cause_system_metadata) + 1),
    }


def cause_depth(system_metadata: Mapping[str, Any] | None) -> int:
    """How many emissions led to a change (0: a caller proposed it)."""
    raw = ((system_metadata or {}).get("properties") or {}).get(CAUSE_DEPTH)
    try:
        return int(raw) if raw is not None else 0
    except (TypeError, ValueError):
        return 0


def Accept(*, emit: Sequence[EmittedProposal] = ()) -> ProcessorOutcome:  # noqa: N802 - reads as a constructor
    return ProcessorOutcome(ProcessorOutcomeKind.ACCEPTED, emit=tuple(emit)) if emit else _ACCEPTED


def Mutate(value: Any, *, emit: Sequence[EmittedProposal] = ()) -> ProcessorOutcome:  # noqa: N802
    return ProcessorOutcome(ProcessorOutcomeKind.MUTATED, value=value, emit=tuple(emit))


def Ignore(reason: str, *, emit: Sequence[EmittedProposal] = ()) -> ProcessorOutcome:  # noqa: N802
    return ProcessorOutcome(ProcessorOutcomeKind.IGNORED, reason=reason, emit=tuple(emit))


def Reject(reason: str) -> ProcessorOutcome:  # noqa: N802
    return ProcessorOutcome(ProcessorOutcomeKind.REJECTED, reason=reason)


class ChangeProcessor:
    """Subclass, set `name`, `phase` and `scope`, implement `process`. `config` is the pipeline step's."""

    name: ClassVar[str]
    phase: ClassVar[Phase] = Phase.BEFORE
    scope: ClassVar[Scope] = Scope()
    budget_ms: ClassVar[float] = DEFAULT_BUDGET_MS

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})

    def process(self, change: ProposedChange) -> ProcessorOutcome:  # pragma: no cover - interface
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
                raise ProcessorLoadError(
                    f"change processor {name!r} ({entry.value}) cannot be loaded: {error}"
                ) from error
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
    raise ProcessorLoadError(
        f"no change processor {name!r}: not an entry point of {ENTRY_POINT_GROUP} nor a dotted path"
    )


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
        """A step as stored (PIPELINE_ASPECT) or as entity_registry.yml lists it. `config` is a map of strings, as
        the stored aspect's schema has it: other YAML values are given as JSON text."""
        config = {
            str(k): v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in (raw.get("config") or {}).items()
        }
        return cls(
            str(raw["name"]), bool(raw.get("enabled", True)), bool(raw.get("required", False)), raw.get("scope"), config
        )


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
    outcome: str  # a ProcessorOutcomeKind value, or "failed"
    reason: str | None = None
    emitted: int = 0
    elapsed_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "processor": self.processor,
            "outcome": self.outcome,
            **({"reason": self.reason} if self.reason else {}),
            **({"emitted": self.emitted} if self.emitted else {}),
            "ms": round(self.elapsed_ms, 3),
        }


@dataclass(slots=True)
class PipelineResult:
    value: Any
    ignored: str | None = None  # the processor that ignored the change, if one did
    rejected: tuple[str, str] | None = None  # (processor, reason)
    unavailable: bool = False  # rejected because a required step is missing or failed to load
    emitted: list[tuple[str, EmittedProposal]] = field(default_factory=list)  # (processor, proposal)
    reports: list[StepReport] = field(default_factory=list)


class Pipeline:
    """Ordered steps, loaded once per pipeline version. `run` applies the steps of one phase to one change."""

    def __init__(self, steps: Sequence[PipelineStep], version: int = 0) -> None:
        self.version = version
        self.steps = [self._load(s) for s in steps if s.enabled]
        self.phases = frozenset(s.phase for s in self.steps)
        # The steps that look at a kind of change, by (phase, entity type, aspect, change type): the scopes are
        # matched once per kind, not per change. Bounded by the registry's entity/aspect pairs.
        self._plans: dict[tuple[Phase, str, str, str], tuple[LoadedStep, ...]] = {}
        self._tally: dict[tuple[str, Phase, str], list] = {}  # (processor, phase, outcome) -> [calls, ms]

    @classmethod
    def from_aspect(cls, value: Mapping[str, Any], version: int) -> Pipeline:
        """The pipeline stored as PIPELINE_ASPECT (validated against its schema when it was written)."""
        return cls([PipelineStep.from_json(step) for step in value.get("steps") or []], version)

    def governs(self, phase: Phase, entity_type: str, aspect: str, change_type: str) -> bool:
        """Whether any step (or a required one that failed to load) would look at such a change in `phase`."""
        return bool(self._plan(phase, entity_type, aspect, change_type))

    def _plan(self, phase: Phase, entity_type: str, aspect: str, change_type: str) -> tuple[LoadedStep, ...]:
        key = (phase, entity_type, aspect, change_type)
        plan = self._plans.get(key)
        if plan is None:
            plan = (
                ()
                if entity_type == PIPELINE_ENTITY
                else tuple(
                    s
                    for s in self.steps
                    if ((s.processor is not None and s.phase is phase) or (s.processor is None and s.step.required))
                    and s.scope.governs(entity_type, aspect, change_type)
                )
            )
            self._plans[key] = plan
        return plan

    @staticmethod
    def _load(step: PipelineStep) -> LoadedStep:
        try:
            cls, origin = find_processor_class(step.name)
            processor = cls(step.config)
        except Exception as error:  # noqa: BLE001 - reported on every change in its scope when required
            log.error("change processor not loaded", extra={"processor": step.name, "error": str(error)})
            return LoadedStep(step, None, Scope.from_json(step.scope, Scope()), Phase.BEFORE, error=str(error))
        return LoadedStep(step, processor, Scope.from_json(step.scope, cls.scope), cls.phase, origin)

    def run(self, phase: Phase, change: ProposedChange) -> PipelineResult:
        result = self._run(phase, change)
        for report in result.reports:  # tallied here, published once per write (publish_metrics)
            tally = self._tally.get((report.processor, phase, report.outcome))
            if tally is None:
                tally = self._tally[(report.processor, phase, report.outcome)] = [0, 0.0]
            tally[0] += 1
            tally[1] += report.elapsed_ms
        return result

    def publish_metrics(self) -> None:
        """Add what `run` tallied to the Prometheus series (metaledger_change_processor_calls_total and _seconds_total).
        Once per write, not per change: a series update is a locked write to a shared file under `serve --workers`."""
        for (processor, phase, outcome), (calls, elapsed_ms) in self._tally.items():
            PROCESSOR_CALLS.labels(processor, phase.value, outcome).inc(calls)
            PROCESSOR_SECONDS.labels(processor, phase.value).inc(elapsed_ms / 1000)
        self._tally.clear()

    def _run(self, phase: Phase, change: ProposedChange) -> PipelineResult:
        result = PipelineResult(change.proposed)
        current = change
        for loaded in self._plan(phase, change.entity_type, change.aspect, change.change_type):
            if loaded.processor is None:  # a required step: "the lack of a step terminates processing"
                result.rejected = (loaded.step.name, f"required change processor is not available: {loaded.error}")
                result.unavailable = True
                result.reports.append(StepReport(loaded.step.name, "failed", loaded.error))
                return result
            started = time.perf_counter()
            try:
                outcome = loaded.processor.process(current)
            except Exception as error:  # noqa: BLE001 - fail closed: a refusal naming the processor
                log.exception(
                    "change processor failed",
                    extra={"processor": loaded.step.name, "urn": change.urn, "aspect": change.aspect},
                )
                result.rejected = (loaded.step.name, f"change processor failed: {type(error).__name__}: {error}")
                result.reports.append(
                    StepReport(
                        loaded.step.name, "failed", str(error), elapsed_ms=(time.perf_counter() - started) * 1000
                    )
                )
                return result
            elapsed_ms = (time.perf_counter() - started) * 1000
            budget = loaded.processor.budget_ms
            if elapsed_ms > budget:
                result.rejected = (
                    loaded.step.name,
                    f"change processor ran {elapsed_ms:.0f} ms, past its {budget:.0f} ms budget",
                )
                result.reports.append(StepReport(loaded.step.name, "failed", "over budget", elapsed_ms=elapsed_ms))
                return result
            if not isinstance(outcome, ProcessorOutcome):
                result.rejected = (
                    loaded.step.name,
                    f"change processor returned {type(outcome).__name__}, not a ProcessorOutcome",
                )
                result.reports.append(
                    StepReport(loaded.step.name, "failed", "not a ProcessorOutcome", elapsed_ms=elapsed_ms)
                )
                return result
            result.emitted.extend((loaded.step.name, e) for e in outcome.emit)
            result.reports.append(
                StepReport(loaded.step.name, outcome.kind.value, outcome.reason, len(outcome.emit), elapsed_ms)
            )
            if outcome.kind is ProcessorOutcomeKind.REJECTED:
                result.rejected = (loaded.step.name, outcome.reason or "rejected")
                return result
            if outcome.kind is ProcessorOutcomeKind.IGNORED:
                result.ignored = loaded.step.name
                return result
            if outcome.kind is ProcessorOutcomeKind.MUTATED:
                result.value = outcome.value
                current = replace(current, proposed=outcome.value)
        return result

    def describe(self) -> list[dict[str, Any]]:
        """For GET of the pipeline: each step, in order, what is loaded and from where."""
        return [
            {
                "name": s.step.name,
                "enabled": s.step.enabled,
                "required": s.step.required,
                "phase": s.phase.value,
                "loaded": s.processor is not None,
                "origin": s.origin,
                "error": s.error,
                "scope": {
                    "entityTypes": list(s.scope.entity_types),
                    "aspects": list(s.scope.aspects),
                    "changeTypes": list(s.scope.change_types),
                },
            }
            for s in self.steps
        ]
