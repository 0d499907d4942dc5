"""The real SDK's `EmitMode.ASYNC_WAIT` over OpenAPI against the Kafka-enabled metaledger: `emit_mcps` sends
`async=true` writes (queued on the MCP topic), then polls `POST /openapi/v1/trace/write/{traceId}` until no aspect is
PENDING; it returns only once every aspect is stored (the MCP consumer) and searchable (an indexer), and raises
`TraceValidationError` for a proposal the MCP consumer refused (a precondition that fails when it is applied).

With Kafka, `serve` runs the relay (sequencer and publisher) and the consumers but no indexer (app.background: that
is the Spark job's). The indexer here is a second metaledger process on the same database without Kafka and without
a relay: its background work is the embedded indexing worker, which reads the change feed the Kafka process
sequences (the same topic names, or it would skip every change log as another topic's) into the Postgres search
backend both processes read. It is started only once the SDK has seen its aspects stored and not yet searchable."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import asyncpg
import pytest

from app.changelog.cursor import SEARCH_INDEXER
from app.embedded_pg import free_port
from tests.client.conftest import DataHubClient, KafkaMetaledger, kafka_service_env
from tests.processes import start_service, stop_process, wait_healthy_sync

pytestmark = pytest.mark.client

# Run in the client venv. Each trace poll's answer is printed as the SDK got it (`TRACE <json>`), then how emit_mcps
# ended: `RETURNED <trace ids>`, or `REFUSED <the TraceValidationError's aspect status>` with exit status 3.
EMIT = """
import json, sys
from datahub.configuration.common import TraceValidationError
from datahub.emitter.mcp import MetadataChangeProposalWrapper
from datahub.emitter.rest_emitter import DataHubRestEmitter, EmitMode
from datahub.metadata.schema_classes import DatasetPropertiesClass, StatusClass

class Emitter(DataHubRestEmitter):
    def _emit_generic(self, url, payload, method="POST"):
        response = super()._emit_generic(url, payload, method)
        if "/openapi/v1/trace/write/" in url:
            print("TRACE", json.dumps(response.json()), flush=True)
        return response

emitter = Emitter(GMS, token=TOKEN, openapi_ingestion=True)
emitter.test_connection()
mcps = [MetadataChangeProposalWrapper(entityUrn=URN, aspect=StatusClass(removed=False)),
        MetadataChangeProposalWrapper(entityUrn=URN, aspect=DatasetPropertiesClass(description=DESCRIPTION),
                                      headers=HEADERS)]
try:
    traces = emitter.emit_mcps(mcps, emit_mode=EmitMode.ASYNC_WAIT)
except TraceValidationError as error:
    print("REFUSED", json.dumps(error.info), flush=True)
    sys.exit(3)
print("RETURNED", json.dumps([t.trace_id for t in traces]), flush=True)
"""


class Emission:
    """`emit_mcps(..., ASYNC_WAIT)` running in the client venv; its output lines are collected as they come."""

    def __init__(self, client: DataHubClient, urn: str, description: str, headers: dict | None) -> None:
        prelude = "".join(
            f"{k} = {v!r}\n"
            for k, v in {
                "GMS": client.env["DATAHUB_GMS_URL"],
                "TOKEN": client.env.get("DATAHUB_GMS_TOKEN"),
                "URN": urn,
                "DESCRIPTION": description,
                "HEADERS": headers,
            }.items()
        )
        self.process = subprocess.Popen(
            [str(client.python), "-c", prelude + EMIT],
            env=client.env,
            cwd=client.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.stderr: list[str] = []  # read as it comes, so that a chatty SDK never blocks on a full pipe
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.process.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def traces(self) -> list[dict]:
        return [json.loads(line.removeprefix("TRACE ")) for line in self.seen if line.startswith("TRACE ")]

    def wait_for_trace(self, check: Callable[[dict], bool], timeout: float) -> dict:
        """The first trace answer the SDK got (from now on) for which `check` holds; fails if the SDK ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            self.seen.append(line)
            if line.startswith("TRACE ") and check(answer := json.loads(line.removeprefix("TRACE "))):
                return answer
            if not line.startswith("TRACE "):
                raise AssertionError(f"emit_mcps ended before the trace answer awaited: {line}\n{self.finish(5)}")
        raise AssertionError(f"no such trace answer within {timeout}s; the SDK's: {self.traces()}")

    def finish(self, timeout: float) -> tuple[int, str, str]:
        """Exit status, the last line and stderr, once the script ends."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
            raise AssertionError(
                f"emit_mcps still waiting after {timeout}s; the SDK's trace answers: {self.traces()}"
            ) from None
        while True:
            try:
                self.seen.append(self.lines.get(timeout=1))
            except queue.Empty:
                break
        return self.process.returncode, self.seen[-1] if self.seen else "", "".join(self.stderr)


@pytest.fixture
def indexer(kafka_metaledger: KafkaMetaledger) -> Iterator[Callable[[], None]]:
    """Starts (when called) the indexing process on the Kafka process's database and topics; stopped after the test."""
    started: list[subprocess.Popen] = []

    def start() -> None:
        env = kafka_service_env(kafka_metaledger.database_url, "", kafka_metaledger.topics)
        env["METALEDGER_RELAY_ENABLED"] = "false"  # the Kafka process sequences the feed and publishes it
        port = free_port()
        started.append(start_service(env, port))
        wait_healthy_sync(f"http://127.0.0.1:{port}", process=started[-1])

    yield start
    for process in started:
        stop_process(process)


async def hold_indexing(database_url: str) -> asyncpg.Connection:
    """Holds the indexing worker as a lagging one would be: its position locked (`FOR UPDATE`, as the worker locks it
    to apply a batch) in a transaction that lasts until the connection is closed; whatever it reads in the meantime
    waits for the lock."""
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    await conn.execute(
        "INSERT INTO feed_reader_state (reader, last_offset) VALUES ($1, 0) ON CONFLICT DO NOTHING", SEARCH_INDEXER
    )
    await conn.execute("BEGIN")
    await conn.execute("SELECT 1 FROM feed_reader_state WHERE reader = $1 FOR UPDATE", SEARCH_INDEXER)
    return conn


def _statuses(answer: dict, urn: str, storage: str) -> dict[str, str]:
    return {aspect: status[storage]["writeStatus"] for aspect, status in answer.get(urn, {}).items()}


async def test_async_wait_returns_once_every_aspect_is_stored_and_searchable(kafka_datahub, kafka_metaledger, indexer):
    tag = uuid.uuid4().hex[:12]
    urn = f"urn:li:dataset:(urn:li:dataPlatform:hive,db.async_wait_{tag},PROD)"
    description = f"waited for {tag}"
    held = await hold_indexing(kafka_metaledger.database_url)
    emission = Emission(kafka_datahub, urn, description, None)
    try:
        await asyncio.to_thread(indexer)  # its start overlaps the SDK's
        # The SDK polls again after 2 s, 4 s more, ...: one of its answers has both aspects stored and not searchable.
        seen = await asyncio.to_thread(
            emission.wait_for_trace,
            lambda answer: set(_statuses(answer, urn, "primaryStorage").values()) == {"ACTIVE_STATE"},
            30,
        )
        assert _statuses(seen, urn, "searchStorage")["datasetProperties"] == "PENDING", seen
        assert emission.process.poll() is None, "emit_mcps returned before the writes were searchable"
        await held.close()  # the indexer catches up
        returncode, last, stderr = await asyncio.to_thread(emission.finish, 40)
    finally:
        if not held.is_closed():
            await held.close()
        if emission.process.poll() is None:
            emission.process.kill()
    assert returncode == 0 and last.startswith("RETURNED"), f"{last}\n{stderr}"
    assert "No trace ID found" not in stderr
    final = emission.traces()[-1]
    assert _statuses(final, urn, "primaryStorage") == {"status": "ACTIVE_STATE", "datasetProperties": "ACTIVE_STATE"}
    assert _statuses(final, urn, "searchStorage")["datasetProperties"] == "ACTIVE_STATE"

    # Right after emit_mcps returned: no waiting, no retry.
    with kafka_metaledger.http() as http:
        stored = http.get(f"/openapi/v3/entity/dataset/{urn}", params={"aspects": ["status", "datasetProperties"]})
        assert stored.status_code == 200, stored.text
        assert stored.json()["datasetProperties"]["value"]["description"] == description
        assert stored.json()["status"]["value"] == {"removed": False}
        found = http.get("/openapi/v3/entity/dataset", params={"query": tag}).json()
        assert [e["urn"] for e in found["entities"]] == [urn]


def test_async_wait_raises_trace_validation_error_for_a_proposal_the_consumer_refused(kafka_datahub, kafka_metaledger):
    urn = f"urn:li:dataset:(urn:li:dataPlatform:hive,db.async_refused_{uuid.uuid4().hex[:12]},PROD)"
    emission = Emission(kafka_datahub, urn, "never stored", {"If-Version-Match": "999"})
    returncode, last, stderr = emission.finish(timeout=40)
    assert returncode == 3 and last.startswith("REFUSED"), f"{last}\n{stderr}"
    status = json.loads(last.removeprefix("REFUSED "))
    assert status["success"] is False
    assert status["primaryStorage"]["writeStatus"] == "ERROR"
    reasons = json.dumps(status["primaryStorage"]["writeExceptions"])
    assert "999" in reasons, status  # the consumer's reason: the version the precondition expected
    assert _statuses(emission.traces()[-1], urn, "primaryStorage")["datasetProperties"] == "ERROR"
    with kafka_metaledger.http() as http:
        refused = http.get(f"/openapi/v3/entity/dataset/{urn}/datasetProperties")
        assert refused.status_code == 404, refused.text
