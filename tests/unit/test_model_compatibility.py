"""The rules of app.registry.compatibility, each alone: where it fires (naming the rule and the path) and where it must
not."""

from __future__ import annotations

import pytest

from app.registry.compatibility import (
    EnumNarrowed,
    EnumWidened,
    FieldAddedWithoutDefault,
    FieldRemoved,
    RecordRenamed,
    TypeChanged,
    TypeChangedForward,
    schema_refusals,
)
from app.registry.runtime import Compatibility

BACKWARD, FULL, NONE = Compatibility.BACKWARD, Compatibility.FULL, Compatibility.NONE


def aspect(*fields: dict, name: str = "Rating") -> dict:
    return {
        "type": "record",
        "name": name,
        "namespace": "com.acme",
        "Aspect": {"name": "acmeRating"},
        "fields": list(fields),
    }


def field(name: str, type_, **extra) -> dict:
    return {"name": name, "type": type_, **extra}


def refusals(old: dict, new: dict, mode: Compatibility, rule) -> list[tuple[str, str]]:
    return [(r.rule, r.path) for r in schema_refusals("acmeRating", old, new, mode, rules=(rule,))]


STARS = field("stars", "int")
COLOR = field("color", {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]})


@pytest.mark.parametrize(
    ("rule", "old", "new", "mode", "expected"),
    [
        # fires
        (
            TypeChanged(),
            aspect(STARS),
            aspect(field("stars", "string")),
            BACKWARD,
            [("TypeChanged", "$.fields.stars.type")],
        ),
        (
            TypeChanged(),
            aspect(field("n", ["null", "int"])),
            aspect(field("n", "int")),
            BACKWARD,
            [("TypeChanged", "$.fields.n.type")],
        ),
        (
            TypeChanged(),
            aspect(field("l", {"type": "array", "items": "long"})),
            aspect(field("l", {"type": "array", "items": "int"})),
            BACKWARD,
            [("TypeChanged", "$.fields.l.type.items")],
        ),
        (
            TypeChangedForward(),
            aspect(STARS),
            aspect(field("stars", "long")),
            FULL,
            [("TypeChangedForward", "$.fields.stars.type")],
        ),
        (FieldRemoved(), aspect(STARS, COLOR), aspect(STARS), BACKWARD, [("FieldRemoved", "$.fields.color")]),
        (
            FieldAddedWithoutDefault(),
            aspect(STARS),
            aspect(STARS, field("x", "string")),
            FULL,
            [("FieldAddedWithoutDefault", "$.fields.x")],
        ),
        (RecordRenamed(), aspect(STARS), aspect(STARS, name="Score"), BACKWARD, [("RecordRenamed", "$.name")]),
        (
            EnumNarrowed(),
            aspect(COLOR),
            aspect(field("color", {"type": "enum", "name": "Color", "symbols": ["RED"]})),
            BACKWARD,
            [("EnumNarrowed", "$.fields.color.type.symbols")],
        ),
        (
            EnumWidened(),
            aspect(COLOR),
            aspect(field("color", {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]})),
            FULL,
            [("EnumWidened", "$.fields.color.type.symbols")],
        ),
        # must not fire
        (TypeChanged(), aspect(STARS), aspect(field("stars", "long")), BACKWARD, []),  # a promotion
        (
            TypeChanged(),
            aspect(STARS),
            aspect(field("stars", ["null", "int"], default=None)),
            BACKWARD,
            [],
        ),  # made optional
        (TypeChanged(), aspect(STARS), aspect(field("stars", "string")), NONE, []),
        (TypeChangedForward(), aspect(STARS), aspect(field("stars", "long")), BACKWARD, []),
        (FieldRemoved(), aspect(STARS, COLOR), aspect(STARS), NONE, []),
        (FieldAddedWithoutDefault(), aspect(STARS), aspect(STARS, field("x", "string", default="")), BACKWARD, []),
        (
            FieldAddedWithoutDefault(),
            aspect(STARS),
            aspect(STARS, field("x", ["null", "string"], default=None)),
            FULL,
            [],
        ),
        (RecordRenamed(), aspect(STARS), aspect(STARS, field("x", "string", default="")), FULL, []),
        (
            EnumNarrowed(),
            aspect(COLOR),
            aspect(field("color", {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]})),
            BACKWARD,
            [],
        ),
        (
            EnumWidened(),
            aspect(COLOR),
            aspect(field("color", {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]})),
            BACKWARD,
            [],
        ),
    ],
)
def test_rule(rule, old, new, mode, expected):
    assert refusals(old, new, mode, rule) == expected


def test_nested_records_are_compared_field_by_field_through_named_references():
    inner = {"type": "record", "name": "Owner", "fields": [field("id", "string")]}
    old = aspect(field("owner", inner), field("previous", ["null", "Owner"], default=None))
    new_inner = {"type": "record", "name": "Owner", "fields": [field("id", "long")]}
    new = aspect(field("owner", new_inner), field("previous", ["null", "Owner"], default=None))
    found = [(r.rule, r.path) for r in schema_refusals("acmeRating", old, new, BACKWARD)]
    assert found == [("TypeChanged", "$.fields.owner.type.fields.id.type")]
    assert schema_refusals("acmeRating", old, old, FULL) == []
