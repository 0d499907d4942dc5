"""app.search.filters: DataHub's filter forms and criteria as the backends' criteria, and every refusal naming its
place in the filter given."""

from __future__ import annotations

import pytest

from app.search.filters import (
    CONDITION_NAMES,
    InvalidFilter,
    both,
    criterion,
    filter_groups,
    placed_filter_groups,
    placed_or_filters,
    single_clause,
    stored_filter_groups,
)
from app.search.model import CONDITIONS, MAX_FILTER_VALUES, MAX_PATTERN_CHARS, Criterion


def refusal(call, *args) -> InvalidFilter:
    with pytest.raises(InvalidFilter) as caught:
        call(*args)
    return caught.value


@pytest.mark.parametrize("condition", sorted(CONDITIONS - {"IN"}))
def test_every_condition_is_kept(condition):
    assert criterion({"field": "name", "values": ["x"], "condition": condition}) == Criterion(
        "name", ("x",), False, condition
    )


@pytest.mark.parametrize(
    ("given", "kept"), [("IN", "EQUAL"), ("STARTS_WITH", "START_WITH"), ("ENDS_WITH", "END_WITH"), (None, "EQUAL")]
)
def test_in_is_equal_and_the_v3_spellings_are_read(given, kept):
    assert criterion({"field": "name", "values": ["x"], "condition": given}).condition == kept


def test_condition_names_are_every_condition_and_alias():
    assert set(CONDITION_NAMES) == CONDITIONS | {"STARTS_WITH", "ENDS_WITH"}


def test_keyword_suffix_negation_and_values():
    assert criterion({"field": "platform.keyword", "values": ["a", "b"], "negated": True}) == Criterion(
        "platform", ("a", "b"), True, "EQUAL"
    )
    assert criterion({"field": "origin", "value": "PROD"}).values == ("PROD",)  # the deprecated single value
    assert criterion({"field": "origin", "values": ["DEV"], "value": "PROD"}).values == ("DEV",)
    assert criterion({"field": "origin", "condition": "EXISTS"}) == Criterion("origin", (), False, "EXISTS")
    assert criterion({"field": "origin", "values": ["x"], "negated": None}).negated is False


@pytest.mark.parametrize(
    ("raw", "loc", "words"),
    [
        ({"field": "c", "values": ["x"], "condition": "DESCENDANTS_INCL"}, ("condition",), "hierarchy"),
        ({"field": "c", "values": ["x"], "condition": "ANCESTORS_INCL"}, ("condition",), "hierarchy"),
        ({"field": "c", "values": ["x"], "condition": "RELATED_INCL"}, ("condition",), "hierarchy"),
        ({"field": "c", "values": ["x"], "condition": "LIKE"}, ("condition",), "unknown condition"),
        ({"field": "c", "values": ["x"], "condition": 3}, ("condition",), "a string"),
        (
            {"field": "id", "values": ["a", "x" * (MAX_PATTERN_CHARS + 1)], "condition": "CONTAIN"},
            ("values", 1),
            "257 characters",
        ),
        ({"field": "a b", "values": ["x"]}, ("field",), "field name"),
        ({"field": "", "values": ["x"]}, ("field",), "field name"),
        ({"field": "*", "values": ["x"]}, ("field",), "field name"),
        ({"values": ["x"]}, ("field",), "field name"),
        ({"field": "a", "values": ["x", "y\x00"]}, ("values", 1), "NUL"),
        ({"field": "a", "values": "x"}, ("values",), "array of strings"),
        ({"field": "a", "values": [1]}, ("values",), "array of strings"),
        ({"field": "a", "values": ["x"], "negated": "yes"}, ("negated",), "true or false"),
        ("a", (), "a criterion is"),
    ],
)
def test_refused_criteria_name_their_place(raw, loc, words):
    error = refusal(criterion, raw, ("criteria", 2))
    assert error.loc == ("criteria", 2, *loc) and words in str(error)


def test_a_long_pattern_is_fine_for_equality():
    assert criterion({"field": "id", "values": ["x" * 1000]}).values == ("x" * 1000,)


def test_the_three_filter_forms():
    a, b = {"field": "a", "values": ["1"]}, {"field": "b", "values": ["2"]}
    ca, cb = Criterion("a", ("1",)), Criterion("b", ("2",))
    assert filter_groups({"and": [{"criteria": [a, b]}, {"criteria": [b]}]}) == ((ca, cb), (cb,))  # v3: OR of clauses
    assert filter_groups({"or": [{"and": [a]}, {"and": [b]}]}) == ((ca,), (cb,))
    assert filter_groups({"criteria": [a, b]}) == ((ca, cb),)
    assert filter_groups({"and": [{"criteria": []}]}) == ((),)  # one empty AND: everything
    for nothing in [None, {}, {"and": None}, {"and": []}, {"or": None, "criteria": None}]:
        assert filter_groups(nothing) == ()


def test_places_follow_the_form():
    placed = placed_filter_groups({"and": [{"criteria": []}, {"criteria": [{"field": "a", "values": ["1"]}]}]})
    assert [[p.loc for p in group] for group in placed] == [[], [("and", 1, "criteria", 0)]]
    placed = placed_or_filters([{"and": [{"field": "a", "values": ["1"]}, {"field": "b", "values": ["1"]}]}])
    assert [p.loc for p in placed[0]] == [(0, "and", 0), (0, "and", 1)]
    assert placed_or_filters([{"and": None}, {}]) == [[], []]  # GraphQL's AndFilterInput.and is nullable


@pytest.mark.parametrize(
    ("filter_", "loc"),
    [
        ({"and": [], "or": []}, ()),
        ({"and": [{"criteria": []}], "criteria": []}, ()),
        ({"nor": []}, ()),
        ([], ()),
        ({"and": {"criteria": []}}, ("and",)),
        ({"and": [{"and": []}]}, ("and", 0)),  # a v3 clause holds `criteria`
        ({"or": [{"criteria": []}]}, ("or", 0)),  # a Rest.li clause holds `and`
        ({"criteria": {}}, ("criteria",)),
        ({"or": [{"and": [{"field": "a", "values": ["x"], "condition": "LIKE"}]}]}, ("or", 0, "and", 0, "condition")),
    ],
)
def test_refused_filters_name_their_place(filter_, loc):
    assert refusal(filter_groups, filter_).loc == loc


def test_the_values_limit():
    many = {"criteria": [{"field": "urn", "values": ["v"] * (MAX_FILTER_VALUES + 1)}]}
    error = refusal(filter_groups, many)
    assert error.loc == () and f"limit is {MAX_FILTER_VALUES}" in str(error)
    half = [{"and": [{"field": "urn", "values": ["v"] * (MAX_FILTER_VALUES // 2 + 1)}]}] * 2
    assert f"limit is {MAX_FILTER_VALUES}" in str(refusal(placed_or_filters, half))
    assert (
        len(filter_groups({"criteria": [{"field": "urn", "values": ["v"] * MAX_FILTER_VALUES}]})[0][0].values)
        == MAX_FILTER_VALUES
    )


def test_single_clause():
    one = single_clause({"and": [{"criteria": [{"field": "urn", "values": ["u"]}]}]})
    assert [(p.loc, p.criterion) for p in one] == [(("and", 0, "criteria", 0), Criterion("urn", ("u",)))]
    assert single_clause(None) == [] and single_clause({}) == []
    assert refusal(single_clause, {"and": [{"criteria": []}, {"criteria": []}]}).loc == ("and", 1)


def test_stored_filters_read_or_before_criteria():
    a, b = {"field": "a", "values": ["1"]}, {"field": "b", "values": ["2"]}
    assert stored_filter_groups({"or": [{"and": [a]}], "criteria": [b]}) == ((Criterion("a", ("1",)),),)
    assert stored_filter_groups({"or": [], "criteria": [b]}) == ((Criterion("b", ("2",)),),)
    assert stored_filter_groups(None) == () and stored_filter_groups({}) == ()


def test_both_ands_every_group_of_one_with_every_group_of_the_other():
    a, b, c = Criterion("a", ("1",)), Criterion("b", ("2",)), Criterion("c", ("3",))
    assert both(((a,), (b,)), ((c,),)) == ((a, c), (b, c))
    assert both(((a,),), ()) == ((a,),) and both((), ((c,),)) == ((c,),)
    wide = Criterion("urn", ("v",) * (MAX_FILTER_VALUES // 2))
    assert both(((wide,),), ((wide,),)) == ((wide, wide),)
    with pytest.raises(InvalidFilter, match="limit is"):
        both(((wide,), (wide,)), ((wide,),))


def test_the_400_is_at_the_callers_path():
    error = refusal(
        filter_groups,
        {
            "and": [
                {"criteria": []},
                {
                    "criteria": [
                        {"field": "container", "values": ["urn:li:container:x"], "condition": "DESCENDANTS_INCL"}
                    ]
                },
            ]
        },
    )
    issue = error.at("$.filter").to_json()["issues"][0]
    assert issue["path"] == "$.filter.and[1].criteria[0].condition" and issue["found"] == "DESCENDANTS_INCL"
    assert (
        refusal(placed_or_filters, [{"and": [{"field": "a b"}]}]).at("$input.orFilters").issues[0].path
        == "$input.orFilters[0].and[0].field"
    )
