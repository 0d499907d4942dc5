"""An OpenSearch-API test server for the tests: PyPI `osmem-server` (in-memory; a test double, not Elasticsearch).
Known gaps: no painless scripts, no Elasticsearch `_pit`, no knn/function_score; documents are visible before a
refresh (real engines are not)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.embedded_pg import free_port
from tests.processes import LoopbackServer


def osmem_binary() -> Path:
    path = Path(str(metadata.distribution("osmem-server").locate_file("osmem_server/bin/osmem-server")))
    if not path.exists():
        raise RuntimeError(f"osmem-server is installed but {path} is missing")
    return path


@dataclass
class SearchServer(LoopbackServer):
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [str(osmem_binary()), "-addr", f"127.0.0.1:{self.port}", "-no-stdin-watch"]


def start_search_server() -> SearchServer:
    server = SearchServer(free_port())
    server.start()
    return server


def backend_settings(backend_name: str, request: Any) -> Iterator[dict[str, Any]]:
    """Settings for an app on one search backend (a test module's `settings_overrides` yields from it): nothing for
    the embedded Postgres; for OpenSearch, the run's shared server with an index prefix of the test's own, whose
    indices are deleted afterwards (left behind, they slow every later search)."""
    if backend_name != "opensearch":
        yield {}
        return
    server = request.getfixturevalue("search_server")
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    yield {"search_url": server.url, "search_flavor": "opensearch", "search_index_prefix": prefix}
    names = [
        i["index"]
        for i in httpx.get(f"{server.url}/_cat/indices?format=json", timeout=30).json()
        if i["index"].startswith(prefix)
    ]
    for start in range(0, len(names), 50):
        httpx.delete(f"{server.url}/{','.join(names[start : start + 50])}", timeout=30).raise_for_status()


# A module whose tests run on both backends imports these two (`from tests.search_server import backend_name,
# settings_overrides`); one that needs a single backend parametrises `backend_name` itself.
@pytest.fixture(params=["postgres", "opensearch"])
def backend_name(request) -> str:
    return request.param


@pytest.fixture
def settings_overrides(backend_name: str, request):
    yield from backend_settings(backend_name, request)
