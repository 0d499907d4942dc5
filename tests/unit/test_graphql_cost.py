"""The cost of a GraphQL operation (app.graphql.limits.query_cost): each field once per result it is resolved for,
a search's page size from its input (literal, variable, whole-input variable, default), aliases and fragments
counted as executed, facets as an aggregation unless skipped."""

from __future__ import annotations

from pathlib import Path

import datahub.cli
from graphql import parse

from app.graphql.limits import FACET_AGGREGATION_COST, FACET_FIELDS, query_cost
from app.graphql.resolvers import DEFAULT_AGG_VALUES, DEFAULT_COUNT


def cost(query: str, variables: dict | None = None, operation: str | None = None, max_count: int = 10_000) -> int:
    measured = query_cost(parse(query), operation, variables, max_count)
    assert measured is not None
    return measured[0]


SEARCH = 'searchAcrossEntities(input: {query: "*", count: %s}) { total searchResults { entity { urn } } }'


def test_results_are_paid_per_result_of_the_page():
    # searchAcrossEntities + total + searchResults × (itself + entity + urn)
    assert cost("query { " + SEARCH % 100 + " }") == 2 + 100 * 3
    assert (
        cost('query { searchAcrossEntities(input: {query: "*"}) { searchResults { entity { urn } } } }')
        == 1 + DEFAULT_COUNT * 3
    )
    assert cost("query { " + SEARCH % 100_000 + " }") == 2 + 10_000 * 3  # cut as the resolver cuts it
    assert cost("query { " + SEARCH % 100_000 + " }", max_count=50) == 2 + 50 * 3


def test_aliases_multiply():
    aliased = "query { " + " ".join(f"a{i}: " + SEARCH % 10_000 for i in range(50)) + " }"
    assert cost(aliased) == 50 * (2 + 10_000 * 3)


def test_count_from_variables_and_defaults():
    by_count = (
        'query($n: Int) { searchAcrossEntities(input: {query: "*", count: $n}) { searchResults { entity { urn } } } }'
    )
    assert cost(by_count, {"n": 500}) == 1 + 500 * 3
    assert cost(by_count.replace("$n: Int", "$n: Int = 40")) == 1 + 40 * 3
    assert cost(by_count, {"n": "x"}) == 1 + DEFAULT_COUNT * 3  # not a count: graphql-core refuses it anyway
    whole = (
        "query($i: ScrollAcrossEntitiesInput!) { scrollAcrossEntities(input: $i) { searchResults { entity { urn } } } }"
    )
    assert cost(whole, {"i": {"query": "*", "count": 7000}}) == 1 + 7000 * 3
    start = 'query { searchAcrossEntities(input: {query: "*", start: 9990, count: 100}) { searchResults { entity { urn } } } }'
    assert cost(start) == 1 + 10 * 3  # start + count is at most max_count


def test_nested_selections_and_fragments_count_as_executed():
    nested = (
        'query { scrollAcrossLineage(input: {urn: "u", direction: UPSTREAM, count: 10}) { searchResults { '
        "entity { urn ... on Dataset { name properties { name description } } } paths { path { urn } } } } }"
    )
    assert cost(nested) == 1 + 10 * (1 + 1 + 1 + 1 + 3 + 3)
    spread = (
        'query { ...Q } fragment Q on Query { a: searchAcrossEntities(input: {query: "*", count: 1000}) { ...R } } '
        "fragment R on SearchResults { searchResults { ...E } } fragment E on SearchResult { entity { urn } }"
    )
    assert cost(spread) == 1 + 1000 * 3  # the page multiplies through fragments too
    twice = spread.replace("{ ...R }", "{ ...R ...R }")
    assert cost(twice) == 1 + 2 * 1000 * 3


def test_facets_cost_an_aggregation_and_their_values():
    facets = 'query($f: SearchFlags) { searchAcrossEntities(input: {query: "*", count: 0, searchFlags: $f}) { facets { field aggregations { value entity { urn } } } } }'
    assert cost(facets) == 1 + FACET_AGGREGATION_COST + FACET_FIELDS * (1 + 1 + DEFAULT_AGG_VALUES * 4)
    assert cost(facets, {"f": {"maxAggValues": 5}}) == 1 + FACET_AGGREGATION_COST + FACET_FIELDS * (2 + 5 * 4)
    assert cost(facets, {"f": {"skipAggregates": True}}) == 1


def test_the_operation_run_is_the_one_measured():
    two = "query Small { __typename } query Big { " + SEARCH % 10_000 + " }"
    assert cost(two, operation="Small") == 1
    assert cost(two, operation="Big") == 2 + 10_000 * 3
    assert query_cost(parse(two), None, None, 10_000) is None  # graphql-core asks for an operation name


def test_datahub_search_bundled_query_is_far_below_the_default_limit():
    gql = Path(datahub.cli.__file__).with_name("gql")
    document = (gql / "search.gql").read_text() + (gql / "fragments.gql").read_text()
    assert cost(document, {"query": "*", "count": 50, "start": 0}) < 30_000  # the CLI asks for at most 50


def test_paged_lists_below_the_root_are_paid_per_result():
    """relationships, lineage, assertions, relatedDocuments, listQueries, listOwnershipTypes, a domain's entities: each
    topic declares its page (app.graphql.paging), and what the results select is paid once per result asked for."""
    import app.graphql.service  # noqa: F401 - imports every topic module, as the running service has
    from app.graphql.entities import DEFAULT_RELATIONSHIPS
    from app.graphql.lineage import DEFAULT_ASSERTIONS_COUNT

    related = 'query($n: Int) { entity(urn: "u") { urn relationships(input: {types: [], count: $n}) { total relationships { entity { urn } } } } }'
    # entity + urn + relationships + total + relationships × (itself + entity + urn)
    assert cost(related, {"n": 1}) == 4 + 1 * 3
    assert cost(related, {"n": 1000}) == 4 + 1000 * 3  # same document, another count: not the cached cost
    assert cost(related, {"n": 10**9}) == 4 + 10_000 * 3  # cut as the resolvers cut it
    assert cost(related.replace("count: $n", "")) == 4 + DEFAULT_RELATIONSHIPS * 3
    assertions = 'query { dataset(urn: "u") { assertions(count: 50) { total assertions { urn } } } }'
    assert cost(assertions) == 3 + 50 * 2
    assert cost(assertions.replace("(count: 50)", "")) == 3 + DEFAULT_ASSERTIONS_COUNT * 2
    queries = "query { listQueries(input: {count: 30}) { total queries { urn properties { name } } } }"
    assert cost(queries) == 2 + 30 * 4


def test_entities_by_urns_are_paid_per_urn():
    batch = "query($u: [String!]!) { entities(urns: $u) { urn type } }"
    assert cost(batch, {"u": ["a"]}) == 3
    assert cost(batch, {"u": [f"u{i}" for i in range(500)]}) == 500 * 3
    # a field named like a paged list that is not one where it is selected costs as written
    assert cost('query { dataProduct(urn: "p") { urn } }') == 2
