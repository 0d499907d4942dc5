"""OpenSearch indices shared by the tests of a module, cleared after each test: a prefix per test made about 75
indices (3-7 s of a test's set-up on a loaded machine) and deleted them again. A module that runs on both backends
imports `backend_name` and `settings_overrides` from here (tests.search_server's make a prefix per test: a module that
changes mappings, with runtime models, keeps those)."""

from __future__ import annotations

from typing import Any

import pytest

from app.search.elastic import ElasticBackend
from app.settings import Settings
from tests.search_server import backend_settings


@pytest.fixture(scope="module")
def opensearch_overrides(request) -> Any:
    """The module's index prefix on the run's search server: its indices are made by the first backend started on it
    and found by the next ones."""
    yield from backend_settings("opensearch", request)


async def clear(backend: ElasticBackend) -> None:
    """Every document gone, as in new indices. The edge indices are deleted, to be made again by the next backend
    started: edges are versioned externally, and a deleted one leaves a tombstone with its version that would refuse
    the next test's lower version of the same edge. The others are emptied."""
    es = backend.client
    edges = (await es.indices.get_alias(name=[backend.graph_alias, backend.edge_set_alias])).body
    await es.indices.delete(index=sorted(edges))
    emptied = await es.delete_by_query(
        index=f"{backend.prefix}*", query={"match_all": {}}, refresh=True, conflicts="proceed"
    )
    assert not emptied["failures"], emptied


@pytest.fixture(params=["postgres", "opensearch"])
def backend_name(request) -> str:
    return request.param


@pytest.fixture
async def settings_overrides(backend_name: str, request, registry):
    """The app's settings on `backend_name`; on OpenSearch the module's indices, cleared once the app has stopped."""
    if backend_name != "opensearch":
        yield {}
        return
    overrides = request.getfixturevalue("opensearch_overrides")
    yield overrides
    backend = ElasticBackend(Settings(**overrides), registry)
    try:
        await clear(backend)
    finally:
        await backend.close()
