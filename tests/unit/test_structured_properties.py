"""Structured property rules (app/write/structured_properties.py), each alone, through a factory of definitions,
assignments and pending changes: when each must fire, and the neighbouring cases where it must not."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
import pytest

from app.write.proposal import ChangeType, Proposal
from app.write.repository import StoredAspect
from app.write.rules import PendingChange, VerdictKind
from app.write.structured_properties import (
    Definition,
    PropertyDefinitionChange,
    StructuredPropertyValues,
    definition_keys,
    stored_value_check,
)

DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,db.table,PROD)"
TIER = "urn:li:structuredProperty:io.acryl.tier"
OWNER = "urn:li:structuredProperty:io.acryl.owner"


def make_definition(**overrides: Any) -> dict[str, Any]:
    """A propertyDefinition value as validation leaves it: a SINGLE string on datasets, unless told."""
    fields: dict[str, Any] = {
        "qualifiedName": "io.acryl.tier",
        "valueType": "urn:li:dataType:datahub.string",
        "cardinality": "SINGLE",
        "entityTypes": ["urn:li:entityType:datahub.dataset"],
        "immutable": False,
    }
    return {**fields, **overrides}


def row(urn: str, aspect: str, value: dict[str, Any]) -> StoredAspect:
    return StoredAspect(
        urn, aspect, orjson.dumps(value).decode(), {"version": "1"}, datetime(2024, 1, 1), "urn:li:corpuser:bob"
    )


def definitions(*, removed: bool = False, **by_urn: dict[str, Any]) -> dict[tuple[str, str], StoredAspect]:
    """The rows a write reads: `{TIER: make_definition()}` style (keys are URNs given as `tier`/`owner`)."""
    urns = {"tier": TIER, "owner": OWNER}
    rows = {(urns[k], "propertyDefinition"): row(urns[k], "propertyDefinition", v) for k, v in by_urn.items()}
    if removed:
        rows.update({(urns[k], "status"): row(urns[k], "status", {"removed": True}) for k in by_urn})
    return rows


def assignment(urn: str = TIER, *values: dict[str, Any]) -> dict[str, Any]:
    return {"propertyUrn": urn, "values": list(values) or [{"string": "gold"}]}


def values_change(
    *assignments: dict[str, Any],
    rows: dict | None = None,
    previous: list[dict[str, Any]] | None = None,
    entity_type: str = "dataset",
    urn: str = DATASET,
    change_type: ChangeType = ChangeType.UPSERT,
) -> PendingChange:
    value = None if change_type is ChangeType.DELETE else {"properties": list(assignments)}
    proposal = Proposal(0, entity_type, urn, "structuredProperties", change_type, value=value)
    stored = row(urn, "structuredProperties", {"properties": previous}) if previous is not None else None
    return PendingChange(proposal, stored, True, rows if rows is not None else definitions(tier=make_definition()))


def definition_change(
    new: dict[str, Any], previous: dict[str, Any] | None = None, *, removed: bool = False, urn: str = TIER
) -> PendingChange:
    proposal = Proposal(0, "structuredProperty", urn, "propertyDefinition", ChangeType.UPSERT, value=new)
    rows = {(urn, "status"): row(urn, "status", {"removed": True})} if removed else {}
    return PendingChange(proposal, row(urn, "propertyDefinition", previous) if previous else None, True, rows)


def check(rule: Any, change: PendingChange):
    return rule.check(change) if rule.governs(change.proposal) else None


def refusal(rule: Any, change: PendingChange) -> tuple[str, str | None]:
    verdict = check(rule, change)
    assert verdict is not None and verdict.kind is VerdictKind.VALIDATION
    return verdict.message, verdict.path


# --- values ----------------------------------------------------------------------------------------------------------
VALUES = StructuredPropertyValues()


def test_a_valid_string_value_passes():
    assert check(VALUES, values_change(assignment())) is None


def test_the_rule_governs_structured_properties_only():
    change = values_change(assignment())
    other = Proposal(0, "dataset", DATASET, "datasetProperties", ChangeType.UPSERT, value={"name": "x"})
    assert not VALUES.governs(other) and VALUES.governs(change.proposal)


def test_a_value_without_a_definition_is_refused_naming_the_property():
    assert refusal(VALUES, values_change(assignment(), rows={})) == (
        f"Unexpected null value found for {TIER} Structured Property Definition.",
        "$.aspect.value.properties[0].propertyUrn",
    )


def test_a_value_of_a_soft_deleted_definition_is_refused():
    message, _ = refusal(VALUES, values_change(assignment(), rows=definitions(removed=True, tier=make_definition())))
    assert message == f"Cannot apply a soft deleted Structured Property value: {TIER}"


def test_a_patch_answers_for_what_it_adds_not_for_the_values_it_leaves_as_they_were():
    soft_deleted = definitions(removed=True, owner=make_definition(qualifiedName="io.acryl.owner"))
    rows = {**definitions(tier=make_definition()), **soft_deleted}
    kept = assignment(OWNER, {"string": "bob"})
    # OWNER's soft-deleted value stays untouched: the patch (which removed another) passes; an UPSERT of the same
    # value does not, nor a patch that changes OWNER's value
    assert (
        check(VALUES, values_change(kept, rows=rows, previous=[assignment(), kept], change_type=ChangeType.PATCH))
        is None
    )
    assert refusal(VALUES, values_change(kept, rows=rows, previous=[assignment(), kept]))[0].startswith(
        "Cannot apply a soft"
    )
    changed = assignment(OWNER, {"string": "alice"})
    assert (
        refusal(VALUES, values_change(changed, rows=rows, previous=[kept], change_type=ChangeType.PATCH))[1]
        == "$.aspect.value.properties[0].propertyUrn"
    )
    # a value whose definition is gone (being deleted) left as it was does not stop the patch either
    assert (
        check(VALUES, values_change(kept, rows={}, previous=[kept, assignment()], change_type=ChangeType.PATCH)) is None
    )


@pytest.mark.parametrize(
    ("value_type", "value", "reason"),
    [
        ("string", {"double": 1.0}, "should be a string"),
        ("rich_text", {"double": 1.0}, "should be a string"),
        ("date", {"string": "2024-13-01"}, "should be a date with format YYYY-MM-DD"),
        ("date", {"string": "2024-1-01"}, "should be a date with format YYYY-MM-DD"),
        ("date", {"string": "0999-12-31"}, "should be a date with format YYYY-MM-DD"),
        ("number", {"string": "many"}, "should be a number"),
        ("urn", {"string": "not an urn"}, "should be an urn"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_at_its_field(value_type, value, reason):
    rows = definitions(tier=make_definition(valueType=f"urn:li:dataType:datahub.{value_type}"))
    message, path = refusal(VALUES, values_change(assignment(TIER, value), rows=rows))
    assert message == f"Property: {TIER}, value: {orjson.dumps(value).decode()} {reason}"
    assert path == "$.aspect.value.properties[0].values[0]"


@pytest.mark.parametrize(
    ("value_type", "value"),
    [
        ("string", {"string": "x"}),
        ("rich_text", {"string": "**x**"}),
        ("date", {"string": "2024-02-29"}),
        ("number", {"double": 2.5}),
        ("number", {"string": " 1e3 "}),
        ("urn", {"string": DATASET}),
    ],
)
def test_a_value_of_the_right_type_passes(value_type, value):
    rows = definitions(tier=make_definition(valueType=f"urn:li:dataType:datahub.{value_type}"))
    assert check(VALUES, values_change(assignment(TIER, value), rows=rows)) is None


def test_an_urn_value_must_be_of_an_allowed_entity_type():
    rows = definitions(
        tier=make_definition(
            valueType="urn:li:dataType:datahub.urn",
            typeQualifier={"allowedTypes": ["urn:li:entityType:datahub.corpuser"]},
        )
    )
    message, _ = refusal(VALUES, values_change(assignment(TIER, {"string": DATASET}), rows=rows))
    assert message.endswith("is not of any supported urn types: corpuser")
    assert check(VALUES, values_change(assignment(TIER, {"string": "urn:li:corpuser:jdoe"}), rows=rows)) is None


def test_a_value_outside_allowed_values_is_refused_and_one_inside_passes():
    rows = definitions(
        tier=make_definition(allowedValues=[{"value": {"string": "gold"}}, {"value": {"string": "silver"}}])
    )
    assert check(VALUES, values_change(assignment(TIER, {"string": "silver"}), rows=rows)) is None
    message, path = refusal(VALUES, values_change(assignment(TIER, {"string": "bronze"}), rows=rows))
    assert (
        message
        == f'Property: {TIER}, value: {{"string":"bronze"}} should be one of [{{"string":"gold"}}, {{"string":"silver"}}]'
    )
    assert path == "$.aspect.value.properties[0].values[0]"


def test_two_values_of_a_single_property_are_refused_but_not_of_a_multiple_one():
    two = assignment(TIER, {"string": "a"}, {"string": "b"})
    message, path = refusal(VALUES, values_change(two))
    assert message.startswith(f"Property: {TIER} has cardinality 1, but multiple values were assigned")
    assert path == "$.aspect.value.properties[0].values"
    assert check(VALUES, values_change(two, rows=definitions(tier=make_definition(cardinality="MULTIPLE")))) is None


def test_a_value_on_an_entity_type_the_definition_does_not_name_is_refused():
    chart = "urn:li:chart:(looker,c1)"
    message, path = refusal(VALUES, values_change(assignment(), entity_type="chart", urn=chart))
    assert message == f"Property: {TIER} cannot be applied to entity type chart (its definition allows: dataset)"
    assert path == "$.aspect.value.properties[0]"


def test_the_second_assignment_is_named_by_its_index():
    rows = definitions(
        tier=make_definition(),
        owner=make_definition(qualifiedName="io.acryl.owner", valueType="urn:li:dataType:datahub.number"),
    )
    _, path = refusal(VALUES, values_change(assignment(), assignment(OWNER, {"string": "x"}), rows=rows))
    assert path == "$.aspect.value.properties[1].values[0]"


def test_a_property_assigned_twice_is_refused():
    message, _ = refusal(VALUES, values_change(assignment(), assignment()))
    assert message == f"Property: {TIER} has multiple entries"


def test_an_immutable_value_cannot_change_or_go_but_can_stay_or_be_set_first():
    rows = definitions(tier=make_definition(immutable=True))
    previous = [assignment(TIER, {"string": "gold"})]
    message, _ = refusal(VALUES, values_change(assignment(TIER, {"string": "silver"}), rows=rows, previous=previous))
    assert message == f"Cannot mutate an immutable property: {TIER}"
    message, _ = refusal(VALUES, values_change(rows=rows, previous=previous, change_type=ChangeType.DELETE))
    assert message == f"Cannot delete an immutable property {TIER}"
    assert check(VALUES, values_change(assignment(TIER, {"string": "gold"}), rows=rows, previous=previous)) is None
    assert check(VALUES, values_change(assignment(TIER, {"string": "gold"}), rows=rows)) is None


def test_a_mutable_value_can_be_deleted():
    assert check(VALUES, values_change(previous=[assignment()], change_type=ChangeType.DELETE)) is None


def test_the_definitions_read_are_those_of_new_and_replaced_values():
    proposal = Proposal(
        0, "dataset", DATASET, "structuredProperties", ChangeType.UPSERT, value={"properties": [assignment()]}
    )
    stored = {
        (DATASET, "structuredProperties"): row(DATASET, "structuredProperties", {"properties": [assignment(OWNER)]})
    }
    assert definition_keys([proposal], stored) == {
        (TIER, "propertyDefinition"),
        (TIER, "status"),
        (OWNER, "propertyDefinition"),
        (OWNER, "status"),
    }
    other = Proposal(0, "dataset", DATASET, "datasetProperties", ChangeType.UPSERT, value={"name": "x"})
    assert definition_keys([other], {}) == set()


# --- definitions -----------------------------------------------------------------------------------------------------
CHANGE = PropertyDefinitionChange()


def test_a_new_definition_passes():
    assert check(CHANGE, definition_change(make_definition())) is None


@pytest.mark.parametrize(
    ("new", "message"),
    [
        (
            {"valueType": "urn:li:dataType:datahub.number"},
            "Value type cannot be changed as this is a backwards incompatible change",
        ),
        ({"qualifiedName": "io.acryl.other"}, "Cannot change the fully qualified name of a Structured Property"),
        ({"allowedValues": [{"value": {"string": "gold"}}]}, "Cannot restrict values that were previously allowed"),
    ],
)
def test_an_incompatible_change_is_refused(new, message):
    assert refusal(CHANGE, definition_change(make_definition(**new), make_definition()))[0] == message


def test_multiple_cannot_become_single_but_single_can_become_multiple():
    multiple = make_definition(cardinality="MULTIPLE")
    assert refusal(CHANGE, definition_change(make_definition(), multiple))[0] == (
        "Property definition cardinality cannot be changed from MULTI to SINGLE"
    )
    assert check(CHANGE, definition_change(multiple, make_definition())) is None


def test_allowed_values_may_widen_but_not_narrow():
    gold = make_definition(allowedValues=[{"value": {"string": "gold"}}])
    both = make_definition(allowedValues=[{"value": {"string": "gold"}}, {"value": {"string": "silver"}}])
    assert check(CHANGE, definition_change(both, gold)) is None
    assert refusal(CHANGE, definition_change(gold, both))[0] == "Cannot restrict values that were previously allowed"


def test_a_version_bump_allows_a_breaking_change_but_not_a_new_name():
    old = make_definition(version="20240101000000")
    assert (
        check(
            CHANGE,
            definition_change(
                make_definition(valueType="urn:li:dataType:datahub.number", version="20250101000000"), old
            ),
        )
        is None
    )
    assert refusal(
        CHANGE,
        definition_change(make_definition(valueType="urn:li:dataType:datahub.number", version="20230101000000"), old),
    )[0].startswith("Value type")
    assert refusal(CHANGE, definition_change(make_definition(qualifiedName="x", version="20250101000000"), old))[0] == (
        "Cannot change the fully qualified name of a Structured Property"
    )


def test_a_malformed_version_or_name_is_refused():
    assert (
        refusal(CHANGE, definition_change(make_definition(version="v1")))[0]
        == "Invalid version specified. Must match [0-9]{14}"
    )
    assert (
        refusal(CHANGE, definition_change(make_definition(qualifiedName="a b")))[0]
        == "Qualified names cannot have spaces"
    )


def test_a_soft_deleted_definition_cannot_change():
    assert refusal(CHANGE, definition_change(make_definition(), make_definition(), removed=True))[0] == (
        "Cannot mutate a soft deleted Structured Property Definition"
    )


def test_allowed_types_must_be_entity_types():
    message, path = refusal(
        CHANGE,
        definition_change(
            make_definition(
                valueType="urn:li:dataType:datahub.urn",
                typeQualifier={"allowedTypes": ["urn:li:dataType:datahub.string"]},
            )
        ),
    )
    assert message.startswith("Provided allowedType that is not an entityType entity") and path.endswith("allowedTypes")


# --- which changes are checked against stored values -----------------------------------------------------------------
def stored_check(new: dict[str, Any], previous: dict[str, Any] | None):
    proposal = Proposal(3, "structuredProperty", TIER, "propertyDefinition", ChangeType.UPSERT, value=new)
    return stored_value_check(proposal, row(TIER, "propertyDefinition", previous) if previous else None)


@pytest.mark.parametrize(
    "new",
    [
        make_definition(allowedValues=[{"value": {"string": "gold"}}]),
        make_definition(entityTypes=["urn:li:entityType:datahub.chart"]),
        make_definition(valueType="urn:li:dataType:datahub.number", version="20250101000000"),
    ],
)
def test_a_narrowing_change_is_checked_against_stored_values(new):
    check_ = stored_check(new, make_definition())
    assert check_ is not None and check_.index == 3 and check_.definition == Definition.of(TIER, new)


@pytest.mark.parametrize(
    "new",
    [
        make_definition(description="what tier"),
        make_definition(cardinality="MULTIPLE"),
        make_definition(entityTypes=["urn:li:entityType:datahub.dataset", "urn:li:entityType:datahub.chart"]),
    ],
)
def test_a_widening_change_reads_no_stored_value(new):
    assert stored_check(new, make_definition()) is None


def test_a_definition_written_where_there_was_none_is_checked():
    new = make_definition()
    check_ = stored_check(new, None)  # values may be stored already (of a definition hard-deleted since)
    assert check_ is not None and check_.index == 3 and check_.definition == Definition.of(TIER, new)


# --- search documents and filter names (app/search/structured_properties.py) ------------------------------------------
def test_a_structured_properties_change_log_indexes_a_field_per_property_named_as_datahub_names_it():
    from app.search.structured_properties import document_fields

    value = {
        "properties": [
            {"propertyUrn": TIER, "values": [{"string": "gold"}]},
            {"propertyUrn": "urn:li:structuredProperty:retention", "values": [{"double": 30.0}, {"double": 90.0}]},
            {"propertyUrn": "urn:li:structuredProperty:empty", "values": [{"string": ""}]},
        ]
    }
    assert document_fields(value) == {
        "structuredProperties.io_acryl_tier": ["gold"],
        "structuredProperties.retention": [30.0, 90.0],
        "structuredProperties.empty": [],
    }


@pytest.mark.parametrize(
    ("given", "field", "urn"),
    [
        ("structuredProperties.io.acryl.tier", "structuredProperties.io_acryl_tier", TIER),
        ("structuredProperties.io.acryl.tier.keyword", "structuredProperties.io_acryl_tier", TIER),
        ("structuredProperties.retention", "structuredProperties.retention", "urn:li:structuredProperty:retention"),
    ],
)
def test_a_filter_on_a_property_is_answered_on_its_document_field(given: str, field: str, urn: str):
    from app.search.structured_properties import document_field, property_urns_filtered

    assert document_field(given) == field
    assert property_urns_filtered([given, "platform", "structuredProperties."]) == {urn}
    assert (
        document_field("platform") == "platform" and document_field("structuredProperties.") == "structuredProperties."
    )


def test_the_change_log_of_a_dataset_s_values_gives_its_document_fields_and_the_index_maps_them(registry):
    from app.search.documents import changes_from_mcl, indexed_aspects
    from app.search.elastic_mappings import entity_index_body

    value = {"properties": [{"propertyUrn": TIER, "values": [{"string": "gold"}]}]}
    mcl = {
        "entityType": "dataset",
        "entityUrn": DATASET,
        "aspectName": "structuredProperties",
        "changeType": "UPSERT",
        "aspect": {"value": orjson.dumps(value).decode(), "contentType": "application/json"},
        "systemMetadata": {"version": "3"},
    }
    (change,) = changes_from_mcl(mcl, registry)
    assert change.aspect == "structuredProperties" and change.version == 3
    assert change.fields["structuredProperties.io_acryl_tier"] == ["gold"]
    (deleted,) = changes_from_mcl({**mcl, "changeType": "DELETE", "previousSystemMetadata": {"version": "3"}}, registry)
    assert deleted.deleted and deleted.fields == {}
    assert "structuredProperties" in indexed_aspects(registry, "dataset")[0]

    mapping, _ = entity_index_body(registry, "dataset")
    assert mapping["properties"]["structuredProperties"] == {"type": "object", "dynamic": True}
    kinds = {
        next(iter(t.values()))["match_mapping_type"]: next(iter(t.values()))["mapping"]["type"]
        for t in mapping["dynamic_templates"]
    }
    assert kinds == {"string": "keyword", "date": "keyword", "long": "double", "double": "double"}
