"""Filter conditions beyond EQUAL/IN (`Criterion.condition`: DataHub's IEQUAL, CONTAIN, START_WITH, END_WITH, EXISTS
and the comparisons), negated or not, on both search backends: the embedded Postgres backend and the Elasticsearch
backend on the OpenSearch-API test server. The same documents and the same expectations for both; a backend that
cannot start fails its parametrization (never a skip)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
import pytest_asyncio

from app.db import create_engine
from app.search.across import TypeSearch, scroll_across
from app.search.cursors import InvalidCursor
from app.search.elastic import ElasticBackend
from app.search.model import AspectFields, Criterion, criterion_problem
from app.search.postgres import PostgresBackend
from app.settings import Settings
from tests.helpers import ds

pytestmark = pytest.mark.asyncio

D1, D2, D3, D4, D5 = (ds(f"cond.d{i}") for i in range(1, 6))
# name: a text field (keyword subfield in Elasticsearch); customProperties: an array; columnCount: a number;
# createdAt: a datetime (epoch ms); externalUrl: a keyword holding digits (compared as text)
DOCUMENTS = {
    D1: {
        "name": "Orders_2024%x",
        "customProperties": ["team=sales", "tier=Gold"],
        "columnCount": 5,
        "createdAt": 1_700_000_000_000,
        "externalUrl": "10",
    },
    D2: {
        "name": "orders archive",
        "customProperties": ["team=ops"],
        "columnCount": 50,
        "createdAt": 1_600_000_000_000,
        "externalUrl": "9",
    },
    D3: {"name": "Cust*mers?", "columnCount": 9, "externalUrl": "abc"},
    D4: {"name": "orders-2024x", "customProperties": []},
    D5: {},
}


@pytest.fixture(params=["postgres", "opensearch"])
def backend_name(request) -> str:
    return request.param


@pytest_asyncio.fixture
async def backend(backend_name, request, registry):
    if backend_name == "postgres":
        database_url = request.getfixturevalue("database_url")
        engine = create_engine(database_url)
        started = PostgresBackend(Settings(database_url=database_url), registry, engine)
        await started.start()
    else:
        server = request.getfixturevalue("search_server")
        settings = SimpleNamespace(
            search_url=server.url, search_flavor="opensearch", search_index_prefix=f"t{uuid.uuid4().hex[:10]}_"
        )
        started = ElasticBackend(settings, registry)
        await started.start()
    await started.apply(
        [AspectFields("dataset", urn, "datasetProperties", 1, fields) for urn, fields in DOCUMENTS.items()]
    )
    yield started
    if backend_name == "postgres":
        await started.close()
        await engine.dispose()
    else:
        await started.client.indices.delete(index=f"{started.prefix}*", ignore_unavailable=True)
        await started.close()


async def found(backend, *criteria: Criterion) -> set[str]:
    page = await backend.search("dataset", "*", count=100, any_of=[criteria], facets=False)
    return {hit.urn for hit in page.hits}


def c(field: str, condition: str, *values: str, negated: bool = False) -> Criterion:
    return Criterion(field, values, negated, condition)


EVERY = set(DOCUMENTS)


async def test_patterns_are_case_insensitive_and_escape_like_and_wildcard_characters(backend):
    assert await found(backend, c("name", "START_WITH", "ORDERS")) == {D1, D2, D4}
    assert await found(backend, c("name", "END_WITH", "X")) == {D1, D4}
    assert await found(backend, c("name", "CONTAIN", "2024")) == {D1, D4}
    assert await found(backend, c("name", "CONTAIN", " rs_2 ")) == {D1}  # trimmed; `_` is no wildcard
    for literal, where in (("_", D1), ("%", D1), ("*", D3), ("?", D3), ("s_2024%", D1), ("t*m", D3)):
        assert await found(backend, c("name", "CONTAIN", literal)) == {where}, literal
    assert await found(backend, c("name", "START_WITH", "Cust?")) == set()  # `?` is a character, not any one
    assert await found(backend, c("name", "CONTAIN", "zzz", "archive")) == {D2}  # any of the values
    # negated: every document that does not match, those without the field too
    assert await found(backend, c("name", "START_WITH", "orders", negated=True)) == {D3, D5}


async def test_iequal_and_equal(backend):
    assert await found(backend, c("name", "IEQUAL", "ORDERS ARCHIVE")) == {D2}
    assert await found(backend, c("name", "EQUAL", "ORDERS ARCHIVE")) == set()
    assert await found(backend, c("name", "IN", "orders archive", "Cust*mers?")) == {D2, D3}
    assert await found(backend, c("columnCount", "IEQUAL", "9")) == {D3}  # numbers: as EQUAL
    assert await found(backend, c("urn", "IEQUAL", D1.upper())) == {D1}
    assert await found(backend, c("name", "IEQUAL", "orders archive", negated=True)) == EVERY - {D2}


async def test_exists(backend):
    assert await found(backend, c("name", "EXISTS")) == {D1, D2, D3, D4}
    assert await found(backend, c("customProperties", "EXISTS")) == {D1, D2}  # an empty array has no value
    assert await found(backend, c("customProperties", "EXISTS", "ignored", negated=True)) == {D3, D4, D5}
    assert await found(backend, c("columnCount", "EXISTS")) == {D1, D2, D3}
    assert await found(backend, c("urn", "EXISTS")) == EVERY
    # names no document field has (Elasticsearch would read `*` as a field pattern, refuse an empty name)
    assert await found(backend, c("*", "EXISTS")) == set()
    assert await found(backend, c("na?e", "EXISTS", negated=True)) == EVERY
    assert await found(backend, c("", "GREATER_THAN", "a")) == set()


async def test_an_array_field_matches_when_any_element_does(backend):
    assert await found(backend, c("customProperties", "START_WITH", "team=")) == {D1, D2}
    assert await found(backend, c("customProperties", "CONTAIN", "gold")) == {D1}
    assert await found(backend, c("customProperties", "END_WITH", "=ops")) == {D2}
    assert await found(backend, c("customProperties", "START_WITH", "team=", negated=True)) == {D3, D4, D5}
    assert await found(backend, c("customProperties", "GREATER_THAN", "team=p")) == {D1}  # "team=sales"
    assert await found(backend, c("customProperties", "IEQUAL", "TIER=GOLD")) == {D1}


async def test_comparisons_numeric_for_numbers_and_text_for_strings(backend):
    assert await found(backend, c("columnCount", "GREATER_THAN", "8")) == {D2, D3}
    assert await found(backend, c("columnCount", "GREATER_THAN", "9")) == {D2}
    assert await found(backend, c("columnCount", "GREATER_THAN_OR_EQUAL_TO", "9")) == {D2, D3}
    assert await found(backend, c("columnCount", "LESS_THAN", "9")) == {D1}
    assert await found(backend, c("columnCount", "LESS_THAN_OR_EQUAL_TO", "9")) == {D1, D3}
    assert await found(backend, c("columnCount", "GREATER_THAN", "8.5")) == {D2, D3}  # fractions on integers
    assert await found(backend, c("columnCount", "LESS_THAN", "9.5")) == {D1, D3}
    assert await found(backend, c("columnCount", "LESS_THAN_OR_EQUAL_TO", "4.9")) == set()
    assert await found(backend, c("columnCount", "GREATER_THAN", "40", "8")) == {D2, D3}  # any of the values
    assert await found(backend, c("columnCount", "GREATER_THAN", "-1e30")) == {D1, D2, D3}  # beyond a long
    assert await found(backend, c("columnCount", "LESS_THAN", "1e30")) == {D1, D2, D3}
    assert await found(backend, c("columnCount", "GREATER_THAN", "1e30")) == set()
    assert await found(backend, c("columnCount", "GREATER_THAN", "many")) == set()  # no number: never
    assert await found(backend, c("columnCount", "CONTAIN", "5")) == set()  # a pattern never matches a number
    assert await found(backend, c("columnCount", "GREATER_THAN", "8", negated=True)) == {D1, D4, D5}
    assert await found(backend, c("createdAt", "GREATER_THAN", "1650000000000")) == {D1}  # epoch ms
    assert await found(backend, c("createdAt", "LESS_THAN_OR_EQUAL_TO", "1600000000000")) == {D2}
    # a string compares as text, by code point: "10" < "5" < "9" < "abc"
    assert await found(backend, c("externalUrl", "GREATER_THAN", "5")) == {D2, D3}
    assert await found(backend, c("externalUrl", "LESS_THAN", "5")) == {D1}
    assert await found(backend, c("name", "GREATER_THAN_OR_EQUAL_TO", "orders")) == {D2, D4}  # "O" < "o"
    assert await found(backend, c("urn", "LESS_THAN", D2)) == {D1}
    assert await found(backend, c("removed", "GREATER_THAN", "false")) == set()  # booleans never compare


async def test_conditions_combine_in_groups_and_cursors_are_per_condition(backend):
    groups = [(c("name", "START_WITH", "orders"), c("columnCount", "GREATER_THAN", "6")), (c("name", "CONTAIN", "*"),)]
    page = await backend.search("dataset", "*", count=100, any_of=groups, facets=False)
    assert {hit.urn for hit in page.hits} == {D2, D3}
    contain = [TypeSearch("dataset", ((c("name", "CONTAIN", "orders"),),))]
    first = await scroll_across(backend, contain, "*", count=1, sort=[("urn", "asc")])
    assert first.total == 3 and first.scroll_id
    starts = [TypeSearch("dataset", ((c("name", "START_WITH", "orders"),),))]
    with pytest.raises(InvalidCursor, match="another search"):
        await scroll_across(backend, starts, "*", count=1, scroll_id=first.scroll_id, sort=[("urn", "asc")])
    second = await scroll_across(backend, contain, "*", count=5, scroll_id=first.scroll_id, sort=[("urn", "asc")])
    assert [hit.urn for hit in first.hits + second.hits] == sorted([D1, D2, D4])


async def test_criterion_problems():
    assert criterion_problem("CONTAIN", ["x" * 256]) is None
    assert "257 characters" in criterion_problem("CONTAIN", ["x" * 257])[0]
    assert "DESCENDANTS_INCL" in criterion_problem("DESCENDANTS_INCL", ["urn:li:container:x"])[0]
    assert criterion_problem("LIKE", ["x"])[0].startswith("unknown condition")
    assert criterion_problem("EXISTS", []) is None
