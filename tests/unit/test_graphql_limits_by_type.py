"""The GraphQL limits measure what the request runs (app.graphql.limits.measure, check_limits, query_cost):

* the operation that runs: the one `operationName` names, or the only one (every operation when neither picks one);
* fragments as executed: an inline fragment or a fragment spread counts only for the object types its type condition
  applies to, and a field of an interface or union type costs what its dearest possible type selects, not the sum.

Each rule alone, where it fires and where it must not; and what stays refused (depth, aliases, counts, bombs)."""

from __future__ import annotations

from graphql import build_schema, parse

from app.graphql import service
from app.graphql.limits import Limits, Shape, check_limits, measure, query_cost
from app.graphql.service import BASE, ValidatedDocuments, _checked
from app.settings import Settings

SCHEMA = build_schema(
    """
    interface Entity { urn: String! }
    interface Named { name: String }
    type A implements Entity & Named { urn: String! name: String a1: String a2: String a3: String child: Entity }
    type B implements Entity & Named { urn: String! name: String b1: String }
    type C implements Entity { urn: String! }
    union AB = A | B
    input SearchInput { query: String count: Int }
    type SearchResult { entity: Entity }
    type SearchResults { total: Int searchResults: [SearchResult!]! }
    type Query {
      entity(urn: String!): Entity
      a: A
      ab: AB
      searchAcrossEntities(input: SearchInput): SearchResults
    }
    """
)


def shape(query: str, operation: str | None = None, schema=SCHEMA) -> Shape:
    shapes = list(measure(parse(query), schema, operation).values())
    assert len(shapes) == 1
    return shapes[0]


def fields(query: str, schema=SCHEMA) -> int:
    return shape(query, schema=schema).fields


def cost(query: str, schema=SCHEMA, operation: str | None = None) -> int:
    measured = query_cost(parse(query), operation, None, 10_000, schema)
    assert measured is not None
    return measured[0]


# --- the operation that runs ------------------------------------------------------------------------------------

LIMITS = Limits(max_depth=5, max_aliases=3, max_fields=10)
TWO = "query Small { a { urn } } query Big { a { " + " ".join(f"x{i}: urn" for i in range(20)) + " } }"


def messages(query: str, operation: str | None, limits: Limits = LIMITS) -> list[str]:
    return [error.message for error in check_limits(parse(query), limits, SCHEMA, operation)]


def test_only_the_operation_named_is_measured():
    assert messages(TWO, "Small") == []  # Big's 20 aliases are not what runs
    assert messages(TWO, "Big") == [
        "operation 'Big' has 20 aliased fields; the limit is 3",
        "operation 'Big' selects 21 fields (fragments expanded, for the dearest type where a value may be of "
        "several); the limit is 10",
    ]


def test_the_only_operation_is_measured_without_a_name():
    assert messages("query { a { urn } }", None) == []
    assert "operation 'Big' has 20 aliased" in messages(TWO.replace("query Small { a { urn } } ", ""), None)[0]


def test_every_operation_is_measured_when_none_is_picked():
    # graphql-core refuses such a request (no name among several, a name none has): the document is measured whole
    for operation in (None, "Missing"):
        found = messages(TWO, operation)
        assert found and all("'Big'" in m for m in found)
    assert messages("query Small { a { urn } } query Other { a { name } }", None) == []


def test_a_document_checked_for_one_operation_is_not_taken_for_another(monkeypatch):
    # The checked documents are kept by text and operation: Small's check does not let Big through.
    monkeypatch.setattr(service, "VALIDATED", ValidatedDocuments(8))
    text = "query Small { __typename } query Big { " + " ".join(f"x{i}: __typename" for i in range(60)) + " }"
    settings = Settings()
    assert not isinstance(_checked(text, settings, BASE.schema, "Small"), dict)
    refused = _checked(text, settings, BASE.schema, "Big")
    assert isinstance(refused, dict) and "operation 'Big' has 60 aliased fields" in refused["errors"][0]["message"]
    assert not isinstance(_checked(text, settings, BASE.schema, "Small"), dict)


def test_the_cost_is_the_operation_run():
    two = (
        "query Small { a { urn } } "
        "query Big { searchAcrossEntities(input: {count: 1000}) { searchResults { entity { urn } } } }"
    )
    assert cost(two, operation="Small") == 2
    assert cost(two, operation="Big") == 1 + 1000 * 3
    assert query_cost(parse(two), None, None, 10_000, SCHEMA) is None


# --- fragments as executed ----------------------------------------------------------------------------------------

BY_TYPE = 'query { entity(urn: "u") { urn ... on A { a1 a2 a3 } ... on B { b1 } } }'


def test_an_abstract_field_costs_its_dearest_type_not_the_sum():
    assert fields(BY_TYPE) == 1 + 1 + 3  # entity, urn, and A's three (B's one is the other possible type)
    assert fields(BY_TYPE, schema=None) == 1 + 1 + 3 + 1  # without a schema: every fragment, as before


def test_a_fragment_counts_for_every_type_it_applies_to():
    # an interface's fragment applies to each of its types, and adds to what their own fragments select
    assert fields('query { entity(urn: "u") { ... on Named { name } ... on A { a1 a2 } ... on B { b1 } } }') == 1 + 3
    # fragments on the same type all run: summed, however many
    many = 'query { entity(urn: "u") { ' + " ".join("... on B { b1 }" for _ in range(30)) + " } }"
    assert fields(many) == 1 + 30


def test_a_fragment_on_a_concrete_field_counts_only_if_its_type_is_that_type():
    assert fields("query { a { urn ... on Entity { urn } ... on A { a1 } ... on AB { ... on B { b1 } } } }") == 4
    # nested conditions: A within B never runs
    assert fields('query { entity(urn: "u") { ... on B { ... on Named { ... on A { a1 a2 a3 } } b1 } } }') == 2


def test_fragment_spreads_are_measured_as_inline_fragments():
    spread = (
        'query { entity(urn: "u") { ...FA ...FB } ab { ...FA ...FB } } '
        "fragment FA on A { a1 a2 a3 } fragment FB on B { b1 }"
    )
    assert fields(spread) == (1 + 3) + (1 + 3)
    assert fields(spread, schema=None) == (1 + 4) + (1 + 4)


def test_unknown_names_count_as_applying_everywhere():
    # validation refuses these documents; the measure stays an upper bound of what they select
    assert fields('query { entity(urn: "u") { ... on Missing { x y } ... on A { a1 } } }') == 1 + 2 + 1
    # a field the schema does not know may be of any type: its dearest
    assert fields('query { entity(urn: "u") { missing { ... on A { a1 a2 } ... on B { b1 } } } }') == 1 + 1 + 2


def test_depth_and_aliases_are_the_dearest_types():
    deep = 'query { entity(urn: "u") { ... on A { child { ... on A { child { urn } } } } ... on B { b1 } } }'
    assert shape(deep) == Shape(depth=4, aliases=0, fields=4)
    aliased = 'query { entity(urn: "u") { ... on A { x: a1 y: a2 } ... on B { z: b1 } } }'
    assert shape(aliased) == Shape(depth=2, aliases=2, fields=3)


def test_results_cost_their_dearest_type_per_result():
    search = (
        "query { searchAcrossEntities(input: {count: 100}) { searchResults { entity "
        "{ urn ... on A { a1 a2 a3 } ... on B { b1 } } } } }"
    )
    assert cost(search) == 1 + 100 * (1 + 1 + 1 + 3)  # searchResults, entity, urn, A's three
    assert cost(search, schema=None) == 1 + 100 * (1 + 1 + 1 + 4)


# --- still refused ------------------------------------------------------------------------------------------------


def test_hostile_operations_are_still_refused_in_the_served_schema():
    schema = BASE.schema
    limits = Limits(max_depth=20, max_aliases=50, max_fields=5_000)

    def refused(query: str) -> list[str]:
        return [error.message for error in check_limits(parse(query), limits, schema)]

    nested = "query { __schema { types { " + "fields { type { " * 12 + "name" + " } }" * 12 + " } } }"
    assert "is nested 27 fields deep" in refused(nested)[0]
    aliases = "query { " + " ".join(f"a{i}: __typename" for i in range(60)) + " }"
    assert "has 60 aliased fields" in refused(aliases)[0]
    bomb = "query { ...F20 } fragment F0 on Query { __typename } " + " ".join(
        f"fragment F{i} on Query {{ ...F{i - 1} ...F{i - 1} }}" for i in range(1, 21)
    )
    assert "selects 1048576 fields" in refused(bomb)[0]
    # the dearest type of an abstract field: every fragment that applies to it counts, repeated or spread
    wide = (
        'query { entity(urn: "u") { ...D ...D ...D } } '
        "fragment D on Dataset { " + " ".join(f"f{i}: urn" for i in range(20)) + " name }"
    )
    assert "has 60 aliased fields" in refused(wide)[0]
    # wide counts: 50 aliased searches of 10,000 results
    searches = (
        "query { "
        + " ".join(
            f'a{i}: searchAcrossEntities(input: {{query: "*", count: 10000}}) {{ searchResults {{ entity {{ urn }} }} }}'
            for i in range(50)
        )
        + " }"
    )
    measured = query_cost(parse(searches), None, None, 10_000, schema)
    assert measured is not None and measured[0] == 1_500_050  # as without types: no fragment here


def test_a_cost_is_kept_by_document_and_pages_and_follows_the_variables():
    # the same document sent again: its cost is kept per page its variables make, never another page's
    document = parse(
        "query($n: Int, $u: String!) { a { urn } searchAcrossEntities(input: {query: $u, count: $n}) "
        "{ searchResults { entity { urn ... on A { a1 a2 a3 } ... on B { b1 } } } } }"
    )
    for count, urn in ((10, "x"), (100, "x"), (10, "y"), (100, "z"), (10, "x")):
        measured = query_cost(document, None, {"n": count, "u": urn}, 10_000, SCHEMA)
        assert measured is not None and measured[0] == 2 + 1 + count * (1 + 1 + 1 + 3)
    cut = query_cost(document, None, {"n": 100, "u": "x"}, 50, SCHEMA)  # another page size limit: another page
    assert cut is not None and cut[0] == 3 + 50 * 6
    assert query_cost(document, None, {"n": 100, "u": "x"}, 10_000, None) == (3 + 100 * 7, document.definitions[0])
