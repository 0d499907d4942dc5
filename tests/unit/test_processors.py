"""The change-processor pipeline on its own (app/write/processors.py): outcomes, order, scope, failures."""

from __future__ import annotations

import time

from app.write.processors import (
    Accept,
    ChangeProcessor,
    EmittedProposal,
    Ignore,
    Mutate,
    Phase,
    Pipeline,
    PipelineStep,
    ProposedChange,
    Reject,
    Scope,
)

HERE = __name__


class Lowercase(ChangeProcessor):
    name = "lowercase"
    scope = Scope(aspects=("globalTags",))

    def process(self, change: ProposedChange):
        return Mutate({"tags": [{"tag": t["tag"].lower()} for t in change.proposed["tags"]]})


class SeesValue(ChangeProcessor):
    name = "sees"
    seen: list = []

    def process(self, change: ProposedChange):
        SeesValue.seen.append((change.proposed, change.previous))
        return Accept()


class NoSecrets(ChangeProcessor):
    name = "no-secrets"

    def process(self, change: ProposedChange):
        # the RFC's example: ignore an update that introduces a disallowed string the previous value did not have
        text, before = str(change.proposed), str(change.previous)
        if self.config.get("word", "secret") in text and self.config.get("word", "secret") not in before:
            return Ignore("a disallowed word")
        return Accept()


class NeedsOwner(ChangeProcessor):
    name = "needs-owner"
    scope = Scope(entity_types=("dataset",), aspects=("datasetProperties",))

    def process(self, change: ProposedChange):
        return Reject("datasets in PROD need an owner") if "PROD" in change.urn else Accept()


class Boom(ChangeProcessor):
    name = "boom"

    def process(self, change: ProposedChange):
        raise RuntimeError("kaput")


class Slow(ChangeProcessor):
    name = "slow"
    budget_ms = 5

    def process(self, change: ProposedChange):
        time.sleep(0.02)  # past its 5 ms budget: the overrun is the behaviour under test
        return Accept()


class Emits(ChangeProcessor):
    name = "emits"

    def process(self, change: ProposedChange):
        return Accept(emit=[EmittedProposal(change.urn, change.entity_type, "globalTags", {"tags": []})])


class After(ChangeProcessor):
    name = "after"
    phase = Phase.AFTER

    def process(self, change: ProposedChange):
        return Reject("never in the before phase")


def step(cls: type, **kwargs) -> PipelineStep:
    return PipelineStep(f"{HERE}.{cls.__name__}", **kwargs)


def change(
    aspect: str = "globalTags", value=None, previous=None, urn="urn:li:dataset:(urn:li:dataPlatform:hive,t,PROD)"
):
    return ProposedChange(
        urn,
        "dataset",
        aspect,
        "UPSERT",
        value if value is not None else {"tags": [{"tag": "urn:li:tag:PII"}]},
        previous,
    )


def test_mutations_chain_in_order_and_the_next_processor_sees_the_new_value():
    SeesValue.seen.clear()
    result = Pipeline([step(Lowercase), step(SeesValue)]).run(Phase.BEFORE, change(previous={"tags": []}))
    assert result.value == {"tags": [{"tag": "urn:li:tag:pii"}]}
    assert SeesValue.seen == [({"tags": [{"tag": "urn:li:tag:pii"}]}, {"tags": []})]
    assert [(r.processor.rsplit(".", 1)[1], r.outcome) for r in result.reports] == [
        ("Lowercase", "mutated"),
        ("SeesValue", "accepted"),
    ]


def test_ignore_uses_the_previous_value_and_stops_the_pipeline():
    SeesValue.seen.clear()
    pipeline = Pipeline([step(NoSecrets, config={"word": "secret"}), step(SeesValue)])
    ignored = pipeline.run(Phase.BEFORE, change("datasetProperties", {"description": "a secret"}, {"description": "x"}))
    assert ignored.ignored.endswith("NoSecrets") and ignored.rejected is None and SeesValue.seen == []
    kept = pipeline.run(
        Phase.BEFORE, change("datasetProperties", {"description": "a secret"}, {"description": "secret"})
    )
    assert kept.ignored is None and len(SeesValue.seen) == 1


def test_reject_names_the_processor_and_scope_limits_it():
    pipeline = Pipeline([step(NeedsOwner)])
    rejected = pipeline.run(Phase.BEFORE, change("datasetProperties", {"name": "t"}))
    assert rejected.rejected == (f"{HERE}.NeedsOwner", "datasets in PROD need an owner")
    assert pipeline.run(Phase.BEFORE, change("globalTags")).rejected is None  # out of its scope
    widened = Pipeline([step(NeedsOwner, scope={"aspects": ["*"]})])  # the pipeline step's scope overrides the class's
    assert widened.run(Phase.BEFORE, change("globalTags")).rejected is not None


def test_a_processor_that_raises_or_runs_too_long_is_a_refusal_naming_it():
    failed = Pipeline([step(Boom), step(SeesValue)]).run(Phase.BEFORE, change())
    assert failed.rejected[0].endswith("Boom") and "kaput" in failed.rejected[1]
    slow = Pipeline([step(Slow)]).run(Phase.BEFORE, change())
    assert slow.rejected[0].endswith("Slow") and "budget" in slow.rejected[1]


def test_required_steps_that_cannot_load_refuse_the_changes_in_their_scope():
    missing = PipelineStep("no_such_module.Processor", required=True, scope={"aspects": ["globalTags"]})
    pipeline = Pipeline([missing, step(SeesValue)])
    refused = pipeline.run(Phase.BEFORE, change("globalTags"))
    assert refused.rejected[0] == "no_such_module.Processor" and "not available" in refused.rejected[1]
    assert pipeline.run(Phase.BEFORE, change("status", {"removed": False})).rejected is None
    optional = Pipeline([PipelineStep("no_such_module.Processor"), step(SeesValue)])
    assert optional.run(Phase.BEFORE, change()).rejected is None
    assert optional.describe()[0]["loaded"] is False and "no_such_module" in optional.describe()[0]["error"]


def test_emitted_proposals_are_collected_and_phases_are_kept_apart():
    result = Pipeline([step(Emits), step(After)]).run(Phase.BEFORE, change())
    assert result.rejected is None
    assert [(name.rsplit(".", 1)[1], e.aspect, e.value) for name, e in result.emitted] == [
        ("Emits", "globalTags", {"tags": []})
    ]
    assert result.reports[0].emitted == 1
    assert Pipeline([step(After)]).run(Phase.AFTER, change()).rejected[0].endswith("After")


def test_disabled_steps_are_not_loaded():
    assert Pipeline([step(Boom, enabled=False)]).run(Phase.BEFORE, change()).rejected is None
