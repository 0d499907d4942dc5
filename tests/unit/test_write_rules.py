"""The built-in write rules (app/write/rules.py), each alone, through a factory of proposals and pending changes with
overrides: when each must fire, and the neighbouring cases where it must not."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from app.write.proposal import ChangeType, Proposal
from app.write.repository import StoredAspect
from app.write.rules import (
    CreateIfNotExists,
    IfModifiedSince,
    IfUnmodifiedSince,
    IfVersionMatch,
    KeyAspectIsNotPatched,
    KeyAspectMatchesUrn,
    PendingChange,
    RuleChain,
    TimeseriesUpsertOnly,
    UpdateRequiresExisting,
    VerdictKind,
)

URN = "urn:li:dataset:(urn:li:dataPlatform:hive,db.table,PROD)"
LAST_MODIFIED = datetime(2024, 3, 1, 12, 0, 0)  # `createdon` of the stored row: naive UTC, as the column holds it


def make_proposal(**overrides: Any) -> Proposal:
    fields: dict[str, Any] = {
        "index": 0,
        "entity_type": "dataset",
        "urn": URN,
        "aspect_name": "datasetProperties",
        "change_type": ChangeType.UPSERT,
        "value": {"name": "table"},
    }
    return Proposal(**{**fields, **overrides})


def make_row(version: int = 3, created_on: datetime = LAST_MODIFIED, **overrides: Any) -> StoredAspect:
    fields: dict[str, Any] = {
        "urn": URN,
        "aspect": "datasetProperties",
        "metadata": '{"name": "table"}',
        "_system_metadata": {"version": str(version)},
        "created_on": created_on,
        "created_by": "urn:li:corpuser:alice",
    }
    return StoredAspect(**{**fields, **overrides})


def make_change(
    *,
    previous: StoredAspect | None = None,
    entity_exists: bool | None = None,
    headers: dict[str, str] | None = None,
    **proposal_overrides: Any,
) -> PendingChange:
    """A pending change of `make_proposal(**proposal_overrides)`; the entity exists when the aspect does, unless told."""
    proposal = make_proposal(headers=headers or {}, **proposal_overrides)
    return PendingChange(proposal, previous, previous is not None if entity_exists is None else entity_exists)


def check(rule: Any, change: PendingChange):
    """The rule's verdict as the chain would ask for it: None when it does not govern the change."""
    return rule.check(change) if rule.governs(change.proposal) else None


# --- IfVersionMatch ------------------------------------------------------------------------------------------------
def test_if_version_match_holds_on_the_exact_version():
    assert check(IfVersionMatch(), make_change(previous=make_row(3), headers={"If-Version-Match": " 3 "})) is None


def test_if_version_match_fails_on_another_version():
    verdict = check(IfVersionMatch(), make_change(previous=make_row(3), headers={"If-Version-Match": "2"}))
    assert verdict.kind is VerdictKind.PRECONDITION and verdict.rule == "IfVersionMatch"
    assert verdict.message == "Expected version 2, actual version 3"


def test_if_version_match_minus_one_means_absent():
    assert check(IfVersionMatch(), make_change(headers={"if-version-match": "-1"})) is None
    verdict = check(IfVersionMatch(), make_change(previous=make_row(1), headers={"if-version-match": "-1"}))
    assert verdict.kind is VerdictKind.PRECONDITION and verdict.message == "Expected version -1, actual version 1"


def test_if_version_match_on_an_absent_aspect_fails_for_a_version():
    verdict = check(IfVersionMatch(), make_change(headers={"If-Version-Match": "1"}))
    assert verdict.message == "Expected version 1, actual version -1"


def test_if_version_match_without_the_header_does_not_fire():
    assert check(IfVersionMatch(), make_change(previous=make_row(3))) is None
    assert check(IfVersionMatch(), make_change(previous=make_row(3), headers={"If-None-Match": "*"})) is None


def test_if_version_match_governs_deletes_and_patches_too():
    for change_type in (ChangeType.DELETE, ChangeType.PATCH, ChangeType.CREATE):
        change = make_change(previous=make_row(3), headers={"If-Version-Match": "9"}, change_type=change_type)
        assert check(IfVersionMatch(), change).kind is VerdictKind.PRECONDITION


# --- IfModifiedSince / IfUnmodifiedSince ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "since, fires",
    [
        ("2024-03-01T11:59:59Z", False),  # modified after it
        ("2024-03-01T12:00:00Z", True),  # not after: equal
        ("2024-03-02T00:00:00+00:00", True),
        ("2024-03-01T13:00:00+02:00", False),  # 11:00 UTC: an offset is honoured
        ("2024-03-01T11:00:00", False),  # no offset: UTC
    ],
)
def test_if_modified_since_compares_with_the_last_value_change(since, fires):
    verdict = check(IfModifiedSince(), make_change(previous=make_row(), headers={"If-Modified-Since": since}))
    assert (verdict is not None) is fires
    if fires:
        assert verdict.kind is VerdictKind.PRECONDITION and "not after" in verdict.message


def test_if_modified_since_fails_on_an_absent_aspect():
    verdict = check(IfModifiedSince(), make_change(headers={"If-Modified-Since": "2024-01-01T00:00:00Z"}))
    assert verdict.kind is VerdictKind.PRECONDITION and verdict.message.startswith("Item last modified never")


@pytest.mark.parametrize(
    "since, fires",
    [
        ("2024-03-01T12:00:00Z", False),  # equal: unmodified since
        ("2024-03-02T00:00:00Z", False),
        ("2024-03-01T11:59:59Z", True),
    ],
)
def test_if_unmodified_since_compares_with_the_last_value_change(since, fires):
    verdict = check(IfUnmodifiedSince(), make_change(previous=make_row(), headers={"If-Unmodified-Since": since}))
    assert (verdict is not None) is fires
    if fires:
        assert verdict.kind is VerdictKind.PRECONDITION and verdict.rule == "IfUnmodifiedSince"


def test_if_unmodified_since_holds_on_an_absent_aspect():
    assert check(IfUnmodifiedSince(), make_change(headers={"If-Unmodified-Since": "2000-01-01T00:00:00Z"})) is None


@pytest.mark.parametrize("rule", [IfModifiedSince(), IfUnmodifiedSince()])
def test_a_since_header_that_is_not_an_instant_is_a_validation_error(rule):
    verdict = check(rule, make_change(previous=make_row(), headers={rule.header_name: "yesterday"}))
    assert verdict.kind is VerdictKind.VALIDATION and "'yesterday'" in verdict.message


@pytest.mark.parametrize("rule", [IfModifiedSince(), IfUnmodifiedSince()])
def test_the_since_rules_without_their_header_do_not_fire(rule):
    assert check(rule, make_change(previous=make_row(), headers={"If-Version-Match": "1"})) is None


# --- CreateIfNotExists ----------------------------------------------------------------------------------------------
def test_create_conflicts_with_an_existing_aspect():
    verdict = check(CreateIfNotExists(), make_change(previous=make_row(), change_type=ChangeType.CREATE))
    assert verdict.kind is VerdictKind.CONFLICT and "CREATE since the aspect already exists" in verdict.message


def test_create_of_an_absent_aspect_of_an_existing_entity_passes():
    assert check(CreateIfNotExists(), make_change(entity_exists=True, change_type=ChangeType.CREATE)) is None


def test_create_entity_conflicts_with_an_existing_entity_only():
    verdict = check(CreateIfNotExists(), make_change(entity_exists=True, change_type=ChangeType.CREATE_ENTITY))
    assert verdict.kind is VerdictKind.CONFLICT and "CREATE_ENTITY since the entity already exists" in verdict.message
    assert check(CreateIfNotExists(), make_change(entity_exists=False, change_type=ChangeType.CREATE_ENTITY)) is None


def test_if_none_match_star_turns_the_conflict_into_a_filter():
    change = make_change(previous=make_row(), change_type=ChangeType.CREATE, headers={"If-None-Match": " * "})
    verdict = check(CreateIfNotExists(), change)
    assert verdict.kind is VerdictKind.FILTER and not verdict.is_fatal
    assert verdict.message.startswith("Dropped per precondition header If-None-Match: *")


def test_if_none_match_with_an_etag_is_still_a_conflict():
    change = make_change(previous=make_row(), change_type=ChangeType.CREATE, headers={"If-None-Match": '"abc"'})
    assert check(CreateIfNotExists(), change).kind is VerdictKind.CONFLICT


def test_create_rules_do_not_govern_upserts():
    assert check(CreateIfNotExists(), make_change(previous=make_row(), change_type=ChangeType.UPSERT)) is None


# --- UpdateRequiresExisting -----------------------------------------------------------------------------------------
def test_update_of_an_absent_aspect_conflicts():
    verdict = check(UpdateRequiresExisting(), make_change(entity_exists=True, change_type=ChangeType.UPDATE))
    assert verdict.kind is VerdictKind.CONFLICT and verdict.rule == "UpdateRequiresExisting"


def test_update_of_an_existing_aspect_passes_and_upsert_is_not_governed():
    assert check(UpdateRequiresExisting(), make_change(previous=make_row(), change_type=ChangeType.UPDATE)) is None
    assert check(UpdateRequiresExisting(), make_change(change_type=ChangeType.UPSERT)) is None


# --- the proposal rules --------------------------------------------------------------------------------------------
def test_a_timeseries_aspect_accepts_upsert_only():
    rule = TimeseriesUpsertOnly()
    create = make_proposal(aspect_name="datasetProfile", is_timeseries=True, change_type=ChangeType.CREATE)
    verdict = rule.apply(create) if rule.governs(create) else None
    assert verdict.kind is VerdictKind.VALIDATION and verdict.path == "$.changeType"
    assert not rule.governs(make_proposal(aspect_name="datasetProfile", is_timeseries=True))  # UPSERT
    versioned_create = make_proposal(change_type=ChangeType.CREATE)
    assert rule.governs(versioned_create) and rule.apply(versioned_create) is None


def test_a_key_aspect_is_not_patched():
    rule = KeyAspectIsNotPatched()
    patch = make_proposal(aspect_name="datasetKey", is_key=True, change_type=ChangeType.PATCH, value=None)
    assert rule.governs(patch) and rule.apply(patch).kind is VerdictKind.VALIDATION
    assert rule.apply(make_proposal(change_type=ChangeType.PATCH, value=None)) is None  # not a key aspect
    assert not rule.governs(make_proposal(aspect_name="datasetKey", is_key=True))  # UPSERT


def test_a_written_key_aspect_must_match_the_urn(registry):
    rule = KeyAspectMatchesUrn(registry.urn_to_key)
    key = registry.urn_to_key("dataset", URN)
    assert rule.apply(make_proposal(aspect_name="datasetKey", is_key=True, value=key)) is None
    other = make_proposal(aspect_name="datasetKey", is_key=True, value={**key, "name": "db.other"})
    verdict = rule.apply(other)
    assert verdict.kind is VerdictKind.VALIDATION and verdict.path == "$.aspect.value"
    assert rule.apply(make_proposal(value={"name": "not a key"})) is None  # not a key aspect
    assert not rule.governs(
        make_proposal(aspect_name="datasetKey", is_key=True, change_type=ChangeType.DELETE, value=None)
    )


# --- the chain ------------------------------------------------------------------------------------------------------
def test_a_failed_precondition_is_reported_before_an_existence_conflict():
    change = make_change(change_type=ChangeType.UPDATE, headers={"If-Version-Match": "2"})
    assert RuleChain().run_pre_commit_rules(change).rule == "IfVersionMatch"
    assert RuleChain().run_pre_commit_rules(make_change(change_type=ChangeType.UPDATE)).rule == "UpdateRequiresExisting"
    assert RuleChain().run_pre_commit_rules(make_change(previous=make_row(), change_type=ChangeType.UPDATE)) is None


def test_a_rule_governs_only_its_entity_aspect_pairs():
    rule = UpdateRequiresExisting()
    rule.entity_aspects = (("dataset", "*"),)
    assert rule.governs(make_proposal(change_type=ChangeType.UPDATE))
    assert not rule.governs(
        make_proposal(change_type=ChangeType.UPDATE, entity_type="chart", urn="urn:li:chart:(looker,c)")
    )
