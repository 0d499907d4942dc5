"""Fixtures that run DataHub's real Python client (PyPI `acryl-datahub`, pinned) against a real metaledger process.

* The client lives in its own virtualenv, `<repo>/.venv-client` (override with `METALEDGER_CLIENT_VENV`), created
  on first use and stamped with the client version: its ~60 dependencies never touch metaledger's `.venv`.
* `metaledger` (session): `uvicorn app.main:app` on a free port, on a fresh database of the test Postgres.
* `datahub` (session): runs the client (`.script(code)` in its Python, `.cli(*args)` the `datahub` command) as a
  subprocess pointed at that server, telemetry off, with a private HOME (no `~/.datahubenv`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.db import upgrade_database
from app.embedded_pg import free_port
from tests.processes import start_service, stop_process, wait_healthy_sync

ROOT = Path(__file__).resolve().parents[2]
CLIENT_VERSION = "1.7.0.17"
CLIENT_VENV = Path(os.environ.get("METALEDGER_CLIENT_VENV", ROOT / ".venv-client"))


def _ensure_client_venv() -> Path:
    python = CLIENT_VENV / "bin" / "python"
    stamp = CLIENT_VENV / f".acryl-datahub-{CLIENT_VERSION}"
    if stamp.exists() and python.exists():
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(CLIENT_VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", f"acryl-datahub=={CLIENT_VERSION}"],
        check=True,
    )
    for old in CLIENT_VENV.glob(".acryl-datahub-*"):
        old.unlink()
    stamp.touch()
    return python


@dataclass
class Metaledger:
    url: str
    database_url: str

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)


@dataclass
class DataHubClient:
    python: Path
    env: dict[str, str]
    workdir: Path

    def script(self, code: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run `code` in the client's Python; `GMS` is the server URL inside it. Fails on a non-zero exit."""
        result = subprocess.run(
            [str(self.python), "-c", f"GMS = {self.env['DATAHUB_GMS_URL']!r}\n" + textwrap.dedent(code)],
            env=self.env, cwd=self.workdir, capture_output=True, text=True, timeout=timeout,
        )
        assert result.returncode == 0, f"client script failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        return result

    def cli(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(self.python.parent / "datahub"), *args],
            env=self.env, cwd=self.workdir, capture_output=True, text=True, timeout=timeout,
        )
        if check:
            assert result.returncode == 0, f"datahub {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        return result


@pytest.fixture(scope="session")
def client_python() -> Path:
    return _ensure_client_venv()


@pytest.fixture(scope="session")
def client_template(make_database: Callable[..., str]) -> str:
    name = "metaledger_client_template"
    upgrade_database(make_database(name))
    return name


@pytest.fixture(scope="session")
def metaledger(make_database: Callable[..., str], client_template: str) -> Iterator[Metaledger]:
    database_url = make_database(template=client_template)
    port = free_port()
    env = {"METALEDGER_DATABASE_URL": database_url, "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
           "METALEDGER_KAFKA_BOOTSTRAP_SERVERS": ""}
    process = start_service(env, port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy_sync(url, process=process)
        yield Metaledger(url, database_url)
    finally:
        stop_process(process)


@pytest.fixture(scope="session")
def datahub(client_python: Path, metaledger: Metaledger, tmp_path_factory: pytest.TempPathFactory) -> DataHubClient:
    home = tmp_path_factory.mktemp("datahub-home")
    env = {
        "PATH": f"{client_python.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "DATAHUB_GMS_URL": metaledger.url,
        "DATAHUB_GMS_TOKEN": "test-token",  # sent as `Authorization: Bearer`, accepted and ignored
        "DATAHUB_TELEMETRY_ENABLED": "false",
        "DATAHUB_SUPPRESS_LOGGING_MANAGER": "1",
        "PYTHONUNBUFFERED": "1",
    }
    return DataHubClient(client_python, env, home)
