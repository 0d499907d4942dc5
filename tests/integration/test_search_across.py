"""`app.search.across` on the embedded Postgres backend: the composite cursor at type boundaries, totals, count-only
and offset pages, and refused cursors (the GraphQL tests cover the same through HTTP, on both backends)."""

from __future__ import annotations

import pytest
import pytest_asyncio

from app.errors import ValidationFailed
from app.search.across import TypeSearch, scroll_across, search_across
from app.search.cursors import InvalidCursor
from app.search.model import MAX_PAGE_SIZE, AspectFields
from tests.helpers import ds


@pytest_asyncio.fixture
async def backend(backend):
    datasets = [
        AspectFields(
            "dataset", ds(f"t{i}"), "datasetKey", 1, {"platform": "urn:li:dataPlatform:hive", "origin": "PROD"}
        )
        for i in range(4)
    ]
    charts = [AspectFields("chart", f"urn:li:chart:(looker,c{i})", "chartKey", 1, {}) for i in range(3)]
    await backend.apply(datasets + charts)
    return backend


SEARCHES = [TypeSearch("dataset"), TypeSearch("corpuser"), TypeSearch("chart")]


async def test_pages_end_at_type_boundaries_and_carry_the_total(backend):
    first = await scroll_across(backend, SEARCHES, "*", count=4)
    assert len(first.hits) == 4 and {h.entity_type for h in first.hits} == {"dataset"}
    assert first.total == 7 and first.scroll_id  # the next page starts in the next type
    await backend.apply([AspectFields("chart", "urn:li:chart:(looker,late)", "chartKey", 1, {})])
    second = await scroll_across(backend, SEARCHES, "*", count=4, scroll_id=first.scroll_id)
    assert {h.entity_type for h in second.hits} == {"chart"} and len(second.hits) == 4
    assert second.total == 7 and second.scroll_id is None  # the first page's count; the late chart is found anyway


async def test_count_only_offsets_and_empty(backend):
    counted = await scroll_across(backend, SEARCHES, "*", count=0)
    assert counted.hits == [] and counted.total == 7 and counted.scroll_id is None
    assert (await scroll_across(backend, [], "*", count=5)).total == 0
    every = (await scroll_across(backend, SEARCHES, "*", count=100)).hits
    middle = await search_across(backend, SEARCHES, "*", start=2, count=3)
    assert [h.urn for h in middle.hits] == [h.urn for h in every[2:5]] and middle.total == 7
    with pytest.raises(ValidationFailed):
        await search_across(backend, SEARCHES, "*", start=MAX_PAGE_SIZE, count=1)
    with pytest.raises(ValidationFailed):
        await scroll_across(backend, SEARCHES, "*", count=MAX_PAGE_SIZE + 1)


async def test_cursors_of_other_searches_or_tampered_are_refused(backend):
    page = await scroll_across(backend, SEARCHES, "*", count=2)
    with pytest.raises(InvalidCursor, match="another search"):
        await scroll_across(backend, SEARCHES[:2], "*", count=2, scroll_id=page.scroll_id)
    with pytest.raises(InvalidCursor, match="another search"):
        await scroll_across(backend, SEARCHES, "other", count=2, scroll_id=page.scroll_id)
    for bad in ["", "!!", "eyJwIjo5OTksImEiOm51bGwsIm4iOjAsImYiOiJ4In0", page.scroll_id[:-4]]:
        if bad:
            with pytest.raises(InvalidCursor):
                await scroll_across(backend, SEARCHES, "*", count=2, scroll_id=bad)


class CountingBackend:
    """The backend, with the page searches (count > 0) it was asked for, by entity type."""

    def __init__(self, backend):
        self.backend = backend
        self.pages: list[str] = []

    async def search(self, entity_type, query, **kw):
        if kw.get("count", 10) > 0:
            self.pages.append(entity_type)
        return await self.backend.search(entity_type, query, **kw)


async def test_a_first_page_does_not_walk_the_types_nothing_matches(backend):
    searches = [
        TypeSearch("corpuser"),
        TypeSearch("dataset"),
        TypeSearch("corpGroup"),
        TypeSearch("chart"),
        TypeSearch("tag"),
    ]
    counting = CountingBackend(backend)
    first = await scroll_across(counting, searches, "*", count=4)
    assert [h.entity_type for h in first.hits] == ["dataset"] * 4 and first.total == 7
    assert counting.pages == ["dataset"]  # not corpuser, counted empty with every type at once
    second = await scroll_across(counting, searches, "*", count=4, scroll_id=first.scroll_id)
    assert [h.entity_type for h in second.hits] == ["chart"] * 3 and second.total == 7
    assert second.scroll_id is None
    # a page that ends at the last type with matches has no next page, though empty types follow
    every = await scroll_across(counting, searches, "*", count=7)
    assert len(every.hits) == 7 and every.scroll_id is None
    assert sorted(h.urn for h in every.hits) == sorted(h.urn for h in first.hits + second.hits)
