"""The GraphQL document limits (app.graphql.limits): depth, aliases and fields as executed, fragments expanded and
measured once, cycles left to validation."""

from __future__ import annotations

from graphql import parse

from app.graphql.limits import Limits, check_limits

LIMITS = Limits(max_depth=3, max_aliases=2, max_fields=10)


def messages(query: str, limits: Limits = LIMITS) -> list[str]:
    return [error.message for error in check_limits(parse(query), limits)]


def test_within_limits():
    assert messages("query { a { b { c } } x: d y: e }") == []


def test_depth_counts_fragments_and_inline_fragments():
    assert "nested 4 fields deep" in messages("query { a { ...F } } fragment F on T { b { ... on U { c { d } } } }")[0]


def test_aliases_and_fields_count_each_spread():
    found = messages("query Q { ...F ...F } fragment F on T { x: a y: b }")
    assert any("operation 'Q' has 4 aliased fields" in m for m in found)
    bomb = "query { ...F20 } fragment F0 on T { a } " + " ".join(
        f"fragment F{i} on T {{ ...F{i - 1} ...F{i - 1} }}" for i in range(1, 21)
    )
    assert any("selects 1048576 fields" in m for m in messages(bomb, Limits(100, 100, 1_000)))


def test_cycles_and_unknown_fragments_are_left_to_validation():
    assert messages("query { ...A ...Missing } fragment A on T { ...B } fragment B on T { ...A }") == []
