"""Fixtures that run DataHub's real Python client (PyPI `acryl-datahub`, pinned) against a real metaledger process.

* The client lives in its own virtualenv, `<repo>/.venv-client` (override with `METALEDGER_CLIENT_VENV`), created
  on first use and stamped with the client version: its ~60 dependencies never touch metaledger's `.venv`.
* `metaledger` (session): `uvicorn app.main:app` on a free port, on a fresh database of the test Postgres.
* `datahub` (session): runs the client (`.script(code)` in its Python, `.cli(*args)` the `datahub` command) as a
  process of its own pointed at that server, telemetry off, with a private HOME (no `~/.datahubenv`); each is forked
  from one process that imported the client once (tests/client/forkserver.py).

DataHub's Kafka wire (Avro, the schema registry metaledger serves), with the real Kafka clients:

* The client venv has the `datahub-kafka` extra (confluent-kafka, fastavro); DataHub Actions
  (`acryl-datahub-actions`, pinned) lives in `<repo>/.venv-actions` (override with `METALEDGER_ACTIONS_VENV`), made
  the same way. Each venv's stamp names what it holds, so a venv made for less is upgraded in place.
* `kafka_metaledger` (package): a metaledger process on the test broker (Tansu) with topics of its own, the relay
  publishing Avro (`METALEDGER_KAFKA_VALUE_FORMAT=avro`) and the MCP and MCE consumers running; its registry is
  `<url>/schema-registry/api/`. Its log is kept in a file (`.log_tail()`), for failure messages.
* `kafka_datahub` (package): the `datahub` client (as `datahub`) pointed at that process.

DataHub's MCP server (`mcp-server-datahub`, pinned, with the `acryl-datahub` it pins) lives in `<repo>/.venv-mcp`
(override with `METALEDGER_MCP_VENV`), made the same way: `mcp_python` (session).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from app.embedded_pg import free_port
from tests.helpers import unique_topics
from tests.processes import service_token, start_service, stop_process, wait_healthy_sync

ROOT = Path(__file__).resolve().parents[2]
CLIENT_VERSION = "1.7.0.17"
CLIENT_VENV = Path(os.environ.get("METALEDGER_CLIENT_VENV", ROOT / ".venv-client"))
ACTIONS_VENV = Path(os.environ.get("METALEDGER_ACTIONS_VENV", ROOT / ".venv-actions"))
# What each venv holds (the Makefile's client-venv / actions-venv targets install the same) and its stamp file.
CLIENT_REQUIREMENT = (
    f"acryl-datahub[datahub-kafka]=={CLIENT_VERSION}",
    f".acryl-datahub-datahub-kafka-{CLIENT_VERSION}",
)
ACTIONS_REQUIREMENT = (f"acryl-datahub-actions=={CLIENT_VERSION}", f".acryl-datahub-actions-{CLIENT_VERSION}")
# openapi-python-client: generates a Python client from the committed OpenAPI document (tests/client/test_generated_client.py)
GENERATOR_VENV = Path(os.environ.get("METALEDGER_OPENAPI_CLIENT_VENV", ROOT / ".venv-openapi-client"))
GENERATOR_VERSION = "0.29.1"
GENERATOR_REQUIREMENT = (
    f"openapi-python-client=={GENERATOR_VERSION}",
    f".acryl-openapi-python-client-{GENERATOR_VERSION}",
)


def _ensure_venv(venv: Path, requirement: str | tuple[str, ...], stamp_name: str) -> Path:
    """`venv` with `requirement` (one, or several) installed (from PyPI, once: a stamp file records it); returns its python.
    uv (in the test extras) makes it in seconds. A lock keeps two test runs from installing into the same venv at once."""
    python = venv / "bin" / "python"
    stamp = venv / stamp_name
    if stamp.exists() and python.exists():
        return python
    lock_path = (
        Path(tempfile.gettempdir())
        / f"metaledger-venv-{hashlib.sha256(str(venv.resolve()).encode()).hexdigest()[:12]}.lock"
    )
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and python.exists():
            return python
        uv = Path(sys.executable).parent / "uv"
        if not python.exists():
            # --seed: pip too, for what the client's own tools may install at run time
            subprocess.run([str(uv), "venv", "-q", "--seed", "--python", sys.executable, str(venv)], check=True)
        subprocess.run(
            [
                str(uv),
                "pip",
                "install",
                "-q",
                "--compile-bytecode",  # its processes read .pyc files, also where PYTHONDONTWRITEBYTECODE is set
                "--python",
                str(python),
                *([requirement] if isinstance(requirement, str) else requirement),
            ],
            check=True,
        )
        for old in venv.glob(".acryl-*"):  # the stamps of what it held before
            old.unlink()
        stamp.touch()
    return python


def _ensure_client_venv() -> Path:
    return _ensure_venv(CLIENT_VENV, *CLIENT_REQUIREMENT)


def _ensure_actions_venv() -> Path:
    return _ensure_venv(ACTIONS_VENV, *ACTIONS_REQUIREMENT)


@pytest.fixture(scope="session")
def generator_python() -> Path:
    return _ensure_venv(GENERATOR_VENV, *GENERATOR_REQUIREMENT)


@dataclass
class Metaledger:
    url: str
    database_url: str
    token: str  # an admin token for urn:li:corpuser:datahub (tests.processes.service_token)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {self.token}"})


FORKSERVER = Path(__file__).resolve().parent / "forkserver.py"


@dataclass
class DataHubClient:
    """The client's Python and `datahub` command with `env`, in `workdir`. Each `script` or `cli` call is a process of
    its own, forked (tests/client/forkserver.py, started on first use, stopped by `close`) from one that has imported
    the CLI once: a fresh `datahub` process spends seconds of CPU on that import alone."""

    python: Path
    env: dict[str, str]
    workdir: Path
    _server: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _outputs: Path | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def script(self, code: str, timeout: float = 300, **names: object) -> subprocess.CompletedProcess:
        """Run `code` in the client's Python; `GMS` is the server URL inside it, `TOKEN` its token, each keyword argument a name
        bound to its value (a Python literal). Fails on a non-zero exit."""
        prelude = "".join(
            f"{name} = {value!r}\n"
            for name, value in {
                "GMS": self.env["DATAHUB_GMS_URL"],
                "TOKEN": self.env.get("DATAHUB_GMS_TOKEN"),
                **names,
            }.items()
        )
        result = self._run({"code": prelude + textwrap.dedent(code)}, ["python", "-c", "<script>"], timeout)
        assert result.returncode == 0, f"client script failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        return result

    def cli(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        result = self._run({"argv": list(args)}, ["datahub", *args], timeout)
        if check:
            assert result.returncode == 0, (
                f"datahub {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        return result

    def _run(self, request: dict, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        with self._lock:
            if self._server is None:
                self._outputs = Path(tempfile.mkdtemp(prefix="datahub-forkserver-"))
                with open(self._outputs / "server.log", "wb") as log:
                    self._server = subprocess.Popen(
                        [str(self.python), str(FORKSERVER)],
                        env=self.env,
                        cwd=self.workdir,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=log,
                        text=True,
                    )
            stdout, stderr = self._outputs / "stdout", self._outputs / "stderr"
            self._server.stdin.write(
                json.dumps({**request, "stdout": str(stdout), "stderr": str(stderr), "timeout": timeout}) + "\n"
            )
            self._server.stdin.flush()
            answer = self._server.stdout.readline()
            if not answer:
                raise RuntimeError(
                    f"the client's fork server exited ({self._server.wait()}):\n"
                    f"{(self._outputs / 'server.log').read_text(errors='replace')[-3000:]}"
                )
            out, err = stdout.read_text(errors="replace"), stderr.read_text(errors="replace")
            answer = json.loads(answer)
            if answer.get("timeout"):
                raise subprocess.TimeoutExpired(args, timeout, out, err)
            return subprocess.CompletedProcess(args, answer["returncode"], out, err)

    def close(self) -> None:
        if self._server is not None:
            self._server.stdin.close()
            try:
                self._server.wait(10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait(5)
            shutil.rmtree(self._outputs, ignore_errors=True)
            self._server = self._outputs = None


@pytest.fixture(scope="session")
def client_python() -> Path:
    return _ensure_client_venv()


@pytest.fixture(scope="session")
def metaledger(make_database: Callable[..., str], migrated_template: str) -> Iterator[Metaledger]:
    yield from metaledger_process(make_database(template=migrated_template))


def metaledger_process(database_url: str) -> Iterator[Metaledger]:
    """metaledger as its own process on `database_url` (no Kafka), with an admin token, until the caller is done."""
    port = free_port()
    env = {
        "METALEDGER_DATABASE_URL": database_url,
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
        "METALEDGER_KAFKA_BOOTSTRAP_SERVERS": "",
        "METALEDGER_TELEMETRY_CLIENT_ID": "true",
    }  # as the CLI meets it
    process = start_service(env, port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy_sync(url, process=process)
        yield Metaledger(url, database_url, service_token(env))
    finally:
        stop_process(process)


@pytest.fixture(scope="session")
def datahub(
    client_python: Path, metaledger: Metaledger, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DataHubClient]:
    home = tmp_path_factory.mktemp("datahub-home")
    client = DataHubClient(client_python, _client_env(client_python, home, metaledger.url, metaledger.token), home)
    yield client
    client.close()


def _client_env(python: Path, home: Path, gms: str, token: str | None) -> dict[str, str]:
    return {
        "PATH": f"{python.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "DATAHUB_GMS_URL": gms,
        **({"DATAHUB_GMS_TOKEN": token} if token else {}),  # sent as `Authorization: Bearer`
        "DATAHUB_TELEMETRY_ENABLED": "false",
        "DATAHUB_CALLER": "metaledger-tests",  # the User-Agent's caller, which each process otherwise guesses with 8 `ps` runs
        "DATAHUB_SUPPRESS_LOGGING_MANAGER": "1",
        "PYTHONUNBUFFERED": "1",
    }


# --- DataHub's Kafka wire: a metaledger on the test broker, the Kafka clients, DataHub Actions -------------------


@dataclass
class KafkaMetaledger(Metaledger):
    """A metaledger process publishing to (relay) and consuming from (MCP, MCE consumers) the test broker."""

    bootstrap: str = ""
    topics: dict[str, str] = field(default_factory=dict)  # setting name ("topic_mcp", ...) -> topic name
    log_path: Path | None = None

    @property
    def registry_url(self) -> str:
        """The schema registry metaledger serves, as DataHub's clients are configured with it."""
        return f"{self.url}/schema-registry/api/"

    def topic(self, setting: str) -> str:
        return self.topics[setting]

    def log_tail(self, lines: int = 60) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def kafka_service_env(database_url: str, bootstrap: str, topics: dict[str, str]) -> dict[str, str]:
    """The whole environment of a metaledger on the test broker (no METALEDGER_* variable of the caller's leaks in:
    an external registry URL set in a developer's shell would change what is tested)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METALEDGER_")}
    env.update(
        {
            "METALEDGER_DATABASE_URL": database_url,
            "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
            "METALEDGER_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "METALEDGER_KAFKA_VALUE_FORMAT": "avro",
            "METALEDGER_MCP_CONSUMER_ENABLED": "true",
            "METALEDGER_MCE_CONSUMER_ENABLED": "true",
            "METALEDGER_MCP_CONSUMER_GROUP": f"group-{topics['topic_mcp']}",
            "METALEDGER_RELAY_POLL_INTERVAL_MS": "20",
            "METALEDGER_AUTH_BOOTSTRAP_ADMIN_TOKEN": "false",
            "METALEDGER_SHUTDOWN_DRAIN_S": "0",  # no load balancer to drain from: stopped at once at the end
            **{f"METALEDGER_{setting.upper()}": name for setting, name in topics.items()},
        }
    )
    return env


@pytest.fixture(scope="package")
def kafka_metaledger(
    make_database: Callable[..., str], migrated_template: str, kafka_broker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaMetaledger]:
    """One process for the package's Kafka tests (its consumer groups join once: joins are slow on Tansu); topics
    of its own, so nothing another test published reaches it."""
    database_url = make_database(template=migrated_template)
    topics = unique_topics()
    port = free_port()
    log_path = tmp_path_factory.mktemp("kafka-metaledger") / "metaledger.log"
    env = kafka_service_env(database_url, kafka_broker.bootstrap_servers, topics)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "app.main:app",
                "--port",
                str(port),
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    server = KafkaMetaledger(url, database_url, service_token(env), kafka_broker.bootstrap_servers, topics, log_path)
    try:
        try:
            wait_healthy_sync(url, process=process)
        except RuntimeError as error:
            raise RuntimeError(f"{error}\n{server.log_tail()}") from None
        yield server
    finally:
        stop_process(process)


@pytest.fixture(scope="package")
def kafka_datahub(
    client_python: Path, kafka_metaledger: KafkaMetaledger, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DataHubClient]:
    """The `datahub` client (with confluent-kafka) pointed at the Kafka-enabled metaledger."""
    home = tmp_path_factory.mktemp("datahub-kafka-home")
    client = DataHubClient(
        client_python, _client_env(client_python, home, kafka_metaledger.url, kafka_metaledger.token), home
    )
    yield client
    client.close()


@pytest.fixture(scope="session")
def actions_python() -> Path:
    return _ensure_actions_venv()


ACTIONS_PLUGIN_DIR = Path(__file__).resolve().parent / "actions_plugin"


@dataclass
class ActionsPipeline:
    """A running `datahub actions -c pipeline.yml` (DataHub Actions' own CLI) whose action records every event."""

    process: subprocess.Popen
    record_path: Path
    log_path: Path

    def events(self) -> list[dict]:
        if not self.record_path.exists():
            return []
        return [json.loads(line) for line in self.record_path.read_text().splitlines() if line.strip()]

    def log_tail(self, lines: int = 60) -> str:
        return (
            "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:]) if self.log_path.exists() else ""
        )

    def wait_for(self, check: Callable[[list[dict]], object], timeout: float = 60, what: str = "events") -> object:
        """Poll the recording until `check(events)` is truthy; returns that. Fails early if the pipeline died."""
        deadline = time.monotonic() + timeout
        while True:
            result = check(self.events())
            if result:
                return result
            if self.process.poll() is not None:
                raise AssertionError(
                    f"datahub actions exited ({self.process.returncode}) before {what}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what} not recorded within {timeout}s; recorded {len(self.events())} events:\n"
                    f"{json.dumps(self.events()[-10:], indent=1)}\n--- actions log ---\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@pytest.fixture
def actions_pipeline(actions_python: Path, tmp_path: Path) -> Iterator[Callable[..., ActionsPipeline]]:
    """`start(name, source_config, **pipeline)` runs a DataHub Actions pipeline with the Kafka (or any) event source
    and the recording action; stopped at the end of the test."""
    started: list[ActionsPipeline] = []
    home = tmp_path / "actions-home"
    home.mkdir()

    def start(name: str, source: dict, **pipeline: object) -> ActionsPipeline:
        record_path = tmp_path / f"{name}.events.jsonl"
        config = {
            "name": name,
            "source": source,
            "action": {"type": "recording_action.RecordingAction", "config": {"path": str(record_path)}},
            **pipeline,
        }
        config_path = tmp_path / f"{name}.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        log_path = tmp_path / f"{name}.log"
        env = {
            **_client_env(actions_python, home, "", None),
            "PYTHONPATH": str(ACTIONS_PLUGIN_DIR),
        }
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [str(actions_python.parent / "datahub"), "actions", "-c", str(config_path)],
                env=env,
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        pipeline_ = ActionsPipeline(process, record_path, log_path)
        started.append(pipeline_)
        return pipeline_

    yield start
    for pipeline_ in started:
        pipeline_.stop()


# --- OpenLineage's own Python client (tests/client/test_openlineage_client.py) ------------------------------------

OPENLINEAGE_VERSION = "1.54.0"
OPENLINEAGE_VENV = Path(os.environ.get("METALEDGER_OPENLINEAGE_VENV", ROOT / ".venv-openlineage"))
OPENLINEAGE_REQUIREMENT = (
    f"openlineage-python=={OPENLINEAGE_VERSION}",
    f".acryl-openlineage-python-{OPENLINEAGE_VERSION}",
)


@pytest.fixture(scope="session")
def openlineage_python() -> Path:
    """The Python of a virtualenv with `openlineage-python` (HTTP transport), apart from DataHub's client."""
    return _ensure_venv(OPENLINEAGE_VENV, *OPENLINEAGE_REQUIREMENT)


# --- dbt with OpenLineage's `dbt-ol` wrapper (tests/client/test_openlineage_dbt.py) --------------------------------

DBT_VENV = Path(os.environ.get("METALEDGER_DBT_VENV", ROOT / ".venv-dbt"))
DBT_REQUIREMENT = (
    (f"openlineage-dbt=={OPENLINEAGE_VERSION}", "dbt-core==1.10.15", "dbt-postgres==1.9.1"),
    f".acryl-openlineage-dbt-{OPENLINEAGE_VERSION}-dbt-1.10.15-postgres-1.9.1",
)


@pytest.fixture(scope="session")
def dbt_python() -> Path:
    """The Python of a virtualenv with dbt (Postgres adapter) and OpenLineage's `dbt-ol` beside it (its bin/)."""
    return _ensure_venv(DBT_VENV, *DBT_REQUIREMENT)


# --- DataHub's MCP server (tests/client/test_mcp_server_operations.py, test_reported_version.py) ------------------

MCP_SERVER_VERSION = "0.8.0"
MCP_VENV = Path(os.environ.get("METALEDGER_MCP_VENV", ROOT / ".venv-mcp"))
MCP_REQUIREMENT = (f"mcp-server-datahub=={MCP_SERVER_VERSION}", f".acryl-mcp-server-datahub-{MCP_SERVER_VERSION}")


AGENT_CONTEXT_VERSION = "1.7.0.17"
AGENT_CONTEXT_VENV = Path(os.environ.get("METALEDGER_AGENT_CONTEXT_VENV", ROOT / ".venv-agent-context"))
# apart from the MCP server's: it pins another acryl-datahub (1.6.0.6)
AGENT_CONTEXT_REQUIREMENT = (
    f"datahub-agent-context=={AGENT_CONTEXT_VERSION}",
    f".acryl-datahub-agent-context-{AGENT_CONTEXT_VERSION}",
)


@pytest.fixture(scope="session")
def agent_context_python() -> Path:
    """The Python of a virtualenv with `datahub-agent-context` (DataHub's agent tools for LangChain, Google ADK, …)."""
    return _ensure_venv(AGENT_CONTEXT_VENV, *AGENT_CONTEXT_REQUIREMENT)


@pytest.fixture(scope="session")
def mcp_python() -> Path:
    """The Python of a virtualenv with DataHub's MCP server (`mcp-server-datahub`, which brings its own pinned
    `acryl-datahub`, fastmcp and the `mcp` SDK) and its `mcp-server-datahub` command beside it (its bin/)."""
    return _ensure_venv(MCP_VENV, *MCP_REQUIREMENT)
