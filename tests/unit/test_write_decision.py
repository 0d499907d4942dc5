"""The write decision without a database (app/write/decision.py): locked rows in, rows to write, version floors,
outbox records and results out. `decide` is driven here against a dict standing for the locked rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
import pytest

from app import turns
from app.settings import Settings
from app.write.decision import Decision, ItemStatus, Key, Locked, LockRequest, Turn, WriteCore
from app.write.processors import Accept, ChangeProcessor, EmittedProposal, Pipeline, PipelineStep, ProposedChange
from app.write.proposal import AuditStamp, Draft
from app.write.repository import StoredAspect
from app.write.rules import RuleChain, VerdictKind

URN = "urn:li:dataset:(urn:li:dataPlatform:hive,db.table,PROD)"
OTHER = "urn:li:dataset:(urn:li:dataPlatform:hive,db.other,PROD)"
PROPS = (URN, "datasetProperties")
KEY = (URN, "datasetKey")
AUDIT = AuditStamp(1_700_000_000_000, "urn:li:corpuser:alice")
SETTINGS = Settings(platform_events_enabled=False)  # platform events have tests of their own
NO_PROCESSORS = Pipeline([])


@pytest.fixture(scope="module")
def core(registry) -> WriteCore:
    return WriteCore(registry, RuleChain(), SETTINGS)


def make_draft(change_type: str = "UPSERT", **overrides: Any) -> Draft:
    fields: dict[str, Any] = {
        "index": 0,
        "entity_type": "dataset",
        "aspect_name": "datasetProperties",
        "urn": URN,
        "value": {"name": "table"},
    }
    return Draft(change_type=change_type, **{**fields, **overrides})


def normalized(properties: dict[str, Any]) -> dict[str, Any]:
    """A datasetProperties value as validation leaves it (its defaults filled in)."""
    return {"customProperties": {}, "tags": [], **properties}


def make_row(
    key: Key = PROPS, value: dict[str, Any] | None = None, version: int = 3, **system_metadata: Any
) -> StoredAspect:
    value = normalized({"name": "table"}) if value is None else value
    return StoredAspect(
        key[0],
        key[1],
        orjson.dumps(value).decode(),
        {"version": str(version), "runId": "r0", **system_metadata},
        datetime(2024, 1, 1),
        "urn:li:corpuser:bob",
    )


def key_row(urn: str = URN) -> StoredAspect:
    return make_row(
        (urn, "datasetKey"), {"platform": "urn:li:dataPlatform:hive", "name": urn.split(",")[1], "origin": "PROD"}, 1
    )


def decide(
    core: WriteCore,
    *writes: list[Draft],
    rows: dict[Key, StoredAspect] | None = None,
    floors: dict[Key, int] | None = None,
    processors: Pipeline = NO_PROCESSORS,
) -> tuple[Decision, list[LockRequest]]:
    """Each write's drafts prepared and decided against `rows` (row 0 by key) and `floors`; the decision and every
    lock request it made."""
    rows, floors = rows or {}, floors or {}
    deciding = core.decide([(core.prepare(drafts), AUDIT) for drafts in writes], processors)
    requests: list[LockRequest] = []
    locked = None
    try:
        while True:
            request = deciding.send(locked)
            if isinstance(request, Turn):
                locked = None
                continue
            requests.append(request)
            wanted = {k for k in rows if k in request.keys or k[0] in request.entity_urns}
            locked = Locked(
                {k: rows[k] for k in wanted}, {k: v for k, v in floors.items() if k in request.keys and k not in rows}
            )
    except StopIteration as done:
        return done.value, requests


def versioned(decision: Decision) -> list[tuple[str, str, int, str]]:
    return [
        (o.urn, o.aspect, o.version, o.change_type) for o in decision.outbox if o.topic == SETTINGS.topic_mcl_versioned
    ]


def the_item(decision: Decision, write: int = 0):
    (item,) = decision.writes[write].items
    return item


# --- versions -------------------------------------------------------------------------------------------------------
def test_a_first_upsert_inserts_the_aspect_and_the_entity_key_at_version_1(core):
    decision, requests = decide(core, [make_draft()])
    assert requests == [LockRequest(frozenset({PROPS, KEY}), frozenset())]
    assert [(r.urn, r.aspect, r.version, r.row_version) for r in decision.inserts] == [
        (URN, "datasetKey", 1, 0),
        (URN, "datasetProperties", 1, 0),
    ]
    assert decision.updates == () and decision.prune == () and decision.floors == ()
    item = the_item(decision)
    assert item.status is ItemStatus.CREATED and item.version == "1" and item.value == normalized({"name": "table"})
    assert item.system_metadata["aspectCreated"] == AUDIT.to_json() == item.system_metadata["aspectModified"]
    assert versioned(decision) == [(URN, "datasetKey", 1, "UPSERT"), (URN, "datasetProperties", 1, "UPSERT")]


def test_a_changed_value_is_the_next_version_and_keeps_the_previous_as_history(core):
    previous = make_row(version=3, aspectCreated={"time": 1, "actor": "urn:li:corpuser:bob"})
    decision, _ = decide(core, [make_draft(value={"name": "renamed"})], rows={PROPS: previous, KEY: key_row()})
    (row,) = decision.updates
    assert row.version == 4 and row.value == normalized({"name": "renamed"}) and row.created_by == AUDIT.actor
    assert row.system_metadata["aspectCreated"] == {"time": 1, "actor": "urn:li:corpuser:bob"}
    assert row.system_metadata["lastRunId"] == "r0"
    (history,) = decision.inserts
    assert (history.row_version, history.value) == (3, normalized({"name": "table"}))
    assert previous.row_version == 0  # the locked row itself is left as read
    assert the_item(decision).status is ItemStatus.UPDATED
    assert versioned(decision) == [(URN, "datasetProperties", 4, "UPSERT")]
    (log,) = decision.outbox
    assert orjson.loads(log.payload)["previousAspectValue"]["value"] == previous.metadata


def test_the_same_value_is_unchanged_keeps_its_version_and_logs_nothing(core):
    decision, _ = decide(
        core, [make_draft(system_metadata={"runId": "r1"})], rows={PROPS: make_row(version=3), KEY: key_row()}
    )
    item = the_item(decision)
    assert item.status is ItemStatus.UNCHANGED and item.version == "3"
    (row,) = decision.updates  # lastObserved and runId refreshed, nothing else
    assert row.system_metadata["runId"] == "r1" and row.created_on == datetime(2024, 1, 1)
    assert decision.inserts == () and decision.outbox == []


def test_an_unchanged_value_is_restated_when_every_write_must_log(registry):
    core = WriteCore(registry, RuleChain(), Settings(platform_events_enabled=False, always_emit_change_log=True))
    decision, _ = decide(core, [make_draft()], rows={PROPS: make_row(version=3), KEY: key_row()})
    assert versioned(decision) == [(URN, "datasetProperties", 3, "RESTATE")]


def test_history_beyond_retention_is_pruned(registry):
    core = WriteCore(registry, RuleChain(), Settings(platform_events_enabled=False, retention_max_versions=2))
    decision, _ = decide(core, [make_draft(value={"name": "v6"})], rows={PROPS: make_row(version=5), KEY: key_row()})
    assert decision.prune == ((URN, "datasetProperties", 3),)  # versions 4 and 5 stay as history
    no_history = WriteCore(registry, RuleChain(), Settings(platform_events_enabled=False, retention_max_versions=0))
    decision, _ = decide(
        no_history, [make_draft(value={"name": "v6"})], rows={PROPS: make_row(version=5), KEY: key_row()}
    )
    assert decision.inserts == () and decision.prune == () and decision.updates[0].version == 6


# --- version floors -------------------------------------------------------------------------------------------------
def test_a_first_insert_continues_from_the_version_floor(core):
    decision, _ = decide(core, [make_draft()], rows={KEY: key_row()}, floors={PROPS: 7})
    (row,) = decision.inserts
    assert row.version == 8 and the_item(decision).status is ItemStatus.CREATED
    assert decision.floors == ()  # read, not raised


def test_an_aspect_delete_raises_its_floor_and_logs_the_deleted_version(core):
    decision, _ = decide(core, [make_draft("DELETE", value=None)], rows={PROPS: make_row(version=3), KEY: key_row()})
    assert decision.deleted_keys == (PROPS,) and decision.deleted_urns == ()
    assert decision.floors == ((URN, "datasetProperties", 3),)
    assert decision.inserts == decision.updates == ()
    item = the_item(decision)
    assert item.status is ItemStatus.DELETED and item.version == "3"
    assert versioned(decision) == [(URN, "datasetProperties", 3, "DELETE")]


def test_a_delete_then_a_write_in_one_batch_continues_after_the_deleted_version(core):
    decision, _ = decide(
        core,
        [make_draft("DELETE", value=None), make_draft(index=1, value={"name": "again"})],
        rows={PROPS: make_row(version=3), KEY: key_row()},
    )
    assert decision.deleted_keys == (PROPS,)
    (row,) = decision.inserts
    assert row.version == 4 and row.value == normalized({"name": "again"})
    assert [i.status for i in decision.writes[0].items] == [ItemStatus.DELETED, ItemStatus.CREATED]
    assert versioned(decision) == [(URN, "datasetProperties", 3, "DELETE"), (URN, "datasetProperties", 4, "UPSERT")]


def test_deleting_the_key_aspect_deletes_the_entity_and_logs_every_aspect(core):
    ownership = make_row((URN, "ownership"), {"owners": []}, 2)
    rows = {
        PROPS: make_row(version=3),
        KEY: key_row(),
        (URN, "ownership"): ownership,
        (OTHER, "datasetKey"): key_row(OTHER),
    }
    decision, requests = decide(core, [make_draft("DELETE", aspect_name="datasetKey", value=None)], rows=rows)
    assert requests[0].entity_urns == frozenset({URN})
    assert decision.deleted_urns == (URN,) and decision.deleted_keys == ()
    assert decision.floors == ((URN, "datasetKey", 1), (URN, "datasetProperties", 3), (URN, "ownership", 2))
    # every other aspect first (the search index tombstones each at its version), then the key aspect's
    assert versioned(decision) == [
        (URN, "datasetProperties", 3, "DELETE"),
        (URN, "ownership", 2, "DELETE"),
        (URN, "datasetKey", 1, "DELETE"),
    ]


def test_a_delete_of_an_absent_aspect_writes_nothing(core):
    decision, _ = decide(core, [make_draft("DELETE", value=None)], rows={KEY: key_row()})
    assert the_item(decision).status is ItemStatus.ABSENT
    assert decision.deleted_keys == () and decision.floors == () and decision.outbox == []


# --- change types ---------------------------------------------------------------------------------------------------
def test_create_of_an_existing_aspect_refuses_the_batch(core):
    decision, _ = decide(
        core,
        [
            make_draft("CREATE", value={"name": "x"}),
            make_draft(index=1, aspect_name="status", value={"removed": False}),
        ],
        rows={PROPS: make_row(), KEY: key_row()},
    )
    ((proposal, verdict),) = decision.refused
    assert (proposal.index, verdict.kind, verdict.rule) == (0, VerdictKind.CONFLICT, "CreateIfNotExists")
    assert decision.inserts == decision.updates == () and decision.outbox == []


def test_create_with_if_none_match_star_is_filtered_and_the_rest_is_written(core):
    decision, _ = decide(
        core,
        [
            make_draft("CREATE", value={"name": "x"}, headers={"If-None-Match": "*"}),
            make_draft(index=1, aspect_name="status", value={"removed": False}),
        ],
        rows={PROPS: make_row(), KEY: key_row()},
    )
    assert decision.refused == ()
    assert [i.status for i in decision.writes[0].items] == [ItemStatus.FILTERED, ItemStatus.CREATED]
    assert [(r.aspect, r.version) for r in decision.inserts] == [("status", 1)]
    assert versioned(decision) == [(URN, "status", 1, "UPSERT")]


def test_a_create_is_logged_as_create(core):
    decision, _ = decide(core, [make_draft("CREATE")], rows={KEY: key_row()})
    assert versioned(decision) == [(URN, "datasetProperties", 1, "CREATE")]


def test_create_entity_asks_whether_the_entity_existed_before_the_write(core):
    batch = [make_draft(aspect_name="status", value={"removed": False}), make_draft("CREATE_ENTITY", index=1)]
    decision, _ = decide(core, batch)  # its own write's earlier proposal created the key aspect: still new
    assert decision.refused == () and [i.status for i in decision.writes[0].items] == [ItemStatus.CREATED] * 2
    decision, _ = decide(core, [make_draft("CREATE_ENTITY")], rows={KEY: key_row()})
    assert decision.refused[0][1].kind is VerdictKind.CONFLICT


def test_update_needs_an_existing_aspect(core):
    decision, _ = decide(core, [make_draft("UPDATE")], rows={KEY: key_row()})
    assert decision.refused[0][1].rule == "UpdateRequiresExisting"
    decision, _ = decide(core, [make_draft("UPDATE", value={"name": "u"})], rows={PROPS: make_row(), KEY: key_row()})
    assert the_item(decision).status is ItemStatus.UPDATED


def test_a_patch_applies_to_the_locked_value(core):
    patch = [{"op": "add", "path": "/description", "value": "described"}]
    decision, _ = decide(core, [make_draft("PATCH", value=patch)], rows={PROPS: make_row(version=2), KEY: key_row()})
    (row,) = decision.updates
    assert row.value == normalized({"name": "table", "description": "described"}) and row.version == 3
    assert versioned(decision) == [(URN, "datasetProperties", 3, "UPSERT")]


def test_a_patch_that_does_not_apply_refuses_the_batch(core):
    patch = [{"op": "test", "path": "/name", "value": "another"}]
    decision, _ = decide(core, [make_draft("PATCH", value=patch)], rows={PROPS: make_row(), KEY: key_row()})
    ((_, verdict),) = decision.refused
    assert verdict.kind is VerdictKind.VALIDATION and verdict.message.startswith("the patch does not apply")


def test_failed_preconditions_are_all_reported_and_nothing_is_written(core):
    batch = [
        make_draft(headers={"If-Version-Match": "2"}),
        make_draft(index=1, aspect_name="status", value={"removed": True}),
        make_draft(index=2, aspect_name="ownership", value={"owners": []}, headers={"If-Version-Match": "1"}),
    ]
    decision, _ = decide(core, batch, rows={PROPS: make_row(version=3), KEY: key_row()})
    assert [(p.index, v.kind) for p, v in decision.refused] == [
        (0, VerdictKind.PRECONDITION),
        (2, VerdictKind.PRECONDITION),
    ]
    assert decision.inserts == decision.updates == () and decision.outbox == []


def test_a_matching_version_precondition_writes(core):
    decision, _ = decide(
        core,
        [make_draft(value={"name": "n"}, headers={"If-Version-Match": "3"})],
        rows={PROPS: make_row(version=3), KEY: key_row()},
    )
    assert decision.refused == () and decision.updates[0].version == 4


def test_a_timeseries_point_is_appended_to_the_change_log_only(core):
    point = {"timestampMillis": 1_650_000_000_000, "rowCount": 7}
    decision, requests = decide(core, [make_draft(aspect_name="datasetProfile", value=point)], rows={KEY: key_row()})
    assert requests[0].keys == frozenset({KEY})  # a point is never read
    assert decision.inserts == decision.updates == ()
    assert the_item(decision).status is ItemStatus.APPENDED
    ((topic, version, change_type),) = [(o.topic, o.version, o.change_type) for o in decision.outbox]
    assert (topic, version, change_type) == (SETTINGS.topic_mcl_timeseries, 1_650_000_000_000, "UPSERT")


# --- groups ---------------------------------------------------------------------------------------------------------
def test_each_write_of_a_group_sees_the_rows_the_writes_before_it_left(core):
    decision, requests = decide(
        core,
        [make_draft(value={"name": "one"})],
        [make_draft(value={"name": "two"})],
        [make_draft("CREATE_ENTITY", aspect_name="status", value={"removed": False}, headers={"If-None-Match": "*"})],
    )
    assert len(requests) == 1  # the group's rows are locked at once
    assert [the_item(decision, w).version for w in range(2)] == ["1", "2"]
    assert the_item(decision, 2).status is ItemStatus.FILTERED  # the entity existed before its write
    assert [(o.aspect, o.version) for o in decision.writes[1].outbox] == [("datasetProperties", 2)]
    (row,) = [r for r in decision.inserts if r.aspect == "datasetProperties" and r.row_version == 0]
    assert row.version == 2 and row.value == normalized({"name": "two"})  # version 1 is history: one row 0 is written


def test_a_write_of_a_group_is_refused_with_the_group(core):
    decision, _ = decide(core, [make_draft()], [make_draft("CREATE", index=0, value={"name": "again"})])
    assert [p.index for p, _ in decision.refused] == [0] and decision.inserts == ()


# --- change processors ----------------------------------------------------------------------------------------------
class TagEveryDataset(ChangeProcessor):
    """Emits a status of another dataset for each properties change (its rows are locked only then)."""

    def process(self, change: ProposedChange):
        return Accept(emit=[EmittedProposal(OTHER, "dataset", "status", {"removed": False})])


def test_an_emitted_proposal_is_locked_then_applied_and_reported_on_its_cause(core):
    pipeline = Pipeline([PipelineStep(f"{__name__}.TagEveryDataset", scope={"aspects": ["datasetProperties"]})])
    decision, requests = decide(core, [make_draft()], rows={KEY: key_row()}, processors=pipeline)
    assert requests[1] == LockRequest(frozenset({(OTHER, "datasetKey"), (OTHER, "status")}), frozenset())
    item = the_item(decision)
    assert [(r.processor, r.outcome, r.emitted) for r in item.processors] == [
        (f"{__name__}.TagEveryDataset", "accepted", 1)
    ]
    assert [(e.urn, e.aspect, e.status) for e in item.emitted] == [(OTHER, "status", ItemStatus.CREATED)]
    assert {(r.urn, r.aspect) for r in decision.inserts} == {PROPS, (OTHER, "datasetKey"), (OTHER, "status")}
    assert (OTHER, "status", 1, "UPSERT") in versioned(decision)


# --- turns ------------------------------------------------------------------------------------------------------------
def drive(deciding) -> tuple[Decision, int, int]:
    """Run a decision to its end: the decision, the turns it offered and the lock requests it made."""
    turns, locks, locked = 0, 0, None
    try:
        while True:
            request = deciding.send(locked)
            if isinstance(request, Turn):
                turns, locked = turns + 1, None
            else:
                locks, locked = locks + 1, Locked({}, {})
    except StopIteration as done:
        return done.value, turns, locks


def test_a_batch_offers_a_turn_whenever_its_time_slice_is_over_and_decides_the_same(core, monkeypatch):
    drafts = [make_draft(index=i, urn=f"urn:li:dataset:(urn:li:dataPlatform:hive,db.t{i},PROD)") for i in range(250)]
    monkeypatch.setattr(turns, "SLICE_S", 3600.0)  # never over
    unsliced, no_turns, _ = drive(core.decide([(core.prepare(drafts), AUDIT)], NO_PROCESSORS))
    monkeypatch.setattr(turns, "SLICE_S", 0.0)  # always over
    sliced, every_proposal, locks = drive(core.decide([(core.prepare(drafts), AUDIT)], NO_PROCESSORS))
    assert (no_turns, every_proposal) == (0, len(drafts))
    assert locks == 1  # the rows are locked once, before the first proposal is decided
    assert len(sliced.inserts) == len(drafts) * 2  # each dataset's properties and its key aspect
    assert [(r.urn, r.aspect, r.row_version) for r in sliced.inserts] == [
        (r.urn, r.aspect, r.row_version) for r in unsliced.inserts
    ]
    assert sliced.refused == ()


def test_a_small_batch_never_pauses(core):
    deciding = core.decide([(core.prepare([make_draft()]), AUDIT)], NO_PROCESSORS)
    assert isinstance(deciding.send(None), LockRequest)
    with pytest.raises(StopIteration):
        deciding.send(Locked({KEY: key_row()}, {}))
