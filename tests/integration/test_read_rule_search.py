"""The read rule's search condition (app.auth.reads.search_scope) on Elasticsearch/OpenSearch too: the search
surfaces of tests/integration/test_read_rule.py on the OpenSearch-API test server."""

from __future__ import annotations

import pytest

from tests.integration.test_read_rule import EXPECTED, autocomplete, graphql_search, seen_by, v3_list, v3_scroll
from tests.search_server import backend_settings

SEARCHES = [
    ("v3 list", v3_list),
    ("v3 scroll", v3_scroll),
    ("autocomplete", autocomplete),
    ("GraphQL searchAcrossEntities", graphql_search),
]


@pytest.fixture
def settings_overrides(request):
    yield from backend_settings("opensearch", request)


@pytest.mark.parametrize("surface", SEARCHES, ids=[name for name, _ in SEARCHES])
async def test_a_personal_view_is_left_out_of_opensearch_searches(surface, app, client, db):
    assert await seen_by(app, client, db, surface[1]) == EXPECTED
