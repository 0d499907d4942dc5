"""An OpenSearch-API test server for the tests: PyPI `osmem-server` (in-memory; a test double, not Elasticsearch).
Known gaps: no painless scripts, no Elasticsearch `_pit`, no knn/function_score; documents are visible before a
refresh (real engines are not)."""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from app.embedded_pg import free_port


def osmem_binary() -> Path:
    path = Path(str(metadata.distribution("osmem-server").locate_file("osmem_server/bin/osmem-server")))
    if not path.exists():
        raise RuntimeError(f"osmem-server is installed but {path} is missing")
    return path


@dataclass
class SearchServer:
    port: int
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10) -> None:
        self.process = subprocess.Popen(
            [str(osmem_binary()), "-addr", f"127.0.0.1:{self.port}", "-no-stdin-watch"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"osmem-server exited with {self.process.returncode}")
                time.sleep(0.02)
        raise RuntimeError(f"osmem-server did not listen on {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(5)
        self.process = None


def start_search_server() -> SearchServer:
    server = SearchServer(free_port())
    server.start()
    return server
