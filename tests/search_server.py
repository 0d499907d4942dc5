"""An OpenSearch-API test server for the tests: PyPI `osmem-server` (in-memory; a test double, not Elasticsearch).
Known gaps: no painless scripts, no Elasticsearch `_pit`, no knn/function_score; documents are visible before a
refresh (real engines are not)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

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
