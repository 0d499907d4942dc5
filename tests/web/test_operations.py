"""The operator's dashboard (`/operations`) and its live change feed (`/operations/feed`), against the app (httpx
in-process, real Postgres): each figure with the value its owner holds, the policies, the model-set diff, and the
live feed's bounds — events after it opened, resumption after Last-Event-ID, heartbeats, the cap on streams, and its
end when the process stops (the drain, the lifespan's shutdown, uvicorn's graceful stop)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
import time
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
import pytest_asyncio
import uvicorn

from app.embedded_pg import free_port
from app.main import create_app
from app.ops.metrics import REGISTRY
from app.registry import load_registry
from app.settings import Settings
from app.web import operations
from tests.helpers import TEST_ACTOR, ds, eventually, mcp, propose
from tests.web.browsing import sign_in

ORDERS = ds("ops.orders")
MODELS = "/openapi/v1/models"
PROCESSORS = "tests.unit.test_processors"
RATING = {
    "type": "record",
    "name": "Rating",
    "namespace": "com.acme",
    "Aspect": {"name": "acmeRating"},
    "fields": [{"name": "stars", "type": "int"}, {"name": "note", "type": ["null", "string"], "default": None}],
}
MODEL_SET = {"aspects": [{"schema": RATING}], "entities": [{"name": "dataset", "aspects": ["acmeRating"]}]}


@pytest.fixture(scope="module")
def registry():
    """A registry of this module's own: a runtime model set changes it in place (the session's stays the base)."""
    return load_registry(Settings().registry_path)


# --- reading pages and streams --------------------------------------------------------------------------------------


def section(html: str, name: str) -> str:
    start = html.index(f'<section id="{name}"')
    return html[start : html.index("</section>", start)]


def figure(html: str, label: str) -> str:
    """The value of a figure's row (`<th scope="row">label</th><td>value</td>`)."""
    found = re.search(rf'<th scope="row">{re.escape(label)}</th>\s*<td>(.*?)</td>', html, re.S)
    assert found, f"no figure {label!r}"
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


class StreamingTransport(httpx.AsyncBaseTransport):
    """Requests to the ASGI app in-process, whose response body is handed over as the app sends it: httpx's
    ASGITransport waits for the whole body, and a live feed's does not end by itself. Closing the response is the
    client going away (`http.disconnect`)."""

    def __init__(self, app) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "server": (request.url.host, request.url.port or 80),
            "client": ("127.0.0.1", 50000),
            "root_path": "",
        }
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        head: asyncio.Future = asyncio.get_running_loop().create_future()
        gone = asyncio.Event()
        sent_body = False

        async def receive() -> dict:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                head.set_result(message)
            elif message["type"] == "http.response.body":
                chunks.put_nowait(message.get("body", b""))
                if not message.get("more_body", False):
                    chunks.put_nowait(None)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                chunks.put_nowait(None)

        task = asyncio.create_task(run())
        await asyncio.wait([head, task], return_when=asyncio.FIRST_COMPLETED)
        if not head.done():
            task.result()  # the app's error
            raise AssertionError("the app answered nothing")
        start = head.result()
        return httpx.Response(
            start["status"], headers=start.get("headers", []), stream=_Body(chunks, gone, task), request=request
        )


class _Body(httpx.AsyncByteStream):
    def __init__(self, chunks: asyncio.Queue, gone: asyncio.Event, task: asyncio.Task) -> None:
        self.chunks, self.gone, self.task = chunks, gone, task

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self.chunks.get()) is not None:
            yield chunk

    async def aclose(self) -> None:
        self.gone.set()
        done, _ = await asyncio.wait([self.task], timeout=5)
        assert done, "the app went on streaming after its client left"
        self.task.result()


@contextlib.asynccontextmanager
async def browser(app, role: str = "admin") -> AsyncIterator[httpx.AsyncClient]:
    """A signed-in browser whose responses stream."""
    signed_in = await sign_in(app, role=role)
    async with httpx.AsyncClient(
        transport=StreamingTransport(app), base_url="http://metaledger", cookies=signed_in.cookies, timeout=10
    ) as http:
        yield http
    await signed_in.aclose()


async def next_event(lines: AsyncIterator[str], timeout: float = 10) -> dict:
    """The next block of a server-sent event stream: its fields, and its comments under `comments`; {} at the
    stream's end."""

    async def read() -> dict:
        block: dict = {}
        async for line in lines:
            if line == "":
                if block:
                    return block
                continue
            if line.startswith(":"):
                block.setdefault("comments", []).append(line[1:].strip())
            else:
                name, _, value = line.partition(":")
                block[name] = value.removeprefix(" ")
        return block

    return await asyncio.wait_for(read(), timeout)


async def next_change(lines: AsyncIterator[str], aspect: str = "datasetProperties", timeout: float = 15) -> dict:
    """The next change event of `aspect` (a new entity's key aspect comes first): its data, with its id."""
    deadline = time.monotonic() + timeout
    while True:
        block = await next_event(lines, max(0.1, deadline - time.monotonic()))
        assert block, "the stream ended before a change came"
        if block.get("event") == "change" and orjson.loads(block["data"])["aspect"] == aspect:
            return {**orjson.loads(block["data"]), "id": block["id"]}


async def until_end(lines: AsyncIterator[str], timeout: float) -> list[dict]:
    """Every block up to the stream's end, which must come within `timeout`."""
    blocks = []
    deadline = time.monotonic() + timeout
    while block := await next_event(lines, max(0.1, deadline - time.monotonic())):
        blocks.append(block)
    return blocks


# --- the page -------------------------------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def written(client, db) -> None:
    """A pipeline of two steps (the second disabled), a model set, writes through both, every change log sequenced
    and indexed, and a change log the search backend refused."""
    steps = [{"name": f"{PROCESSORS}.Lowercase"}, {"name": f"{PROCESSORS}.NeedsOwner", "enabled": False}]
    stored = await client.put("/openapi/v1/change-processors", json={"steps": steps})
    assert stored.status_code == 200, stored.text
    applied = await client.post(MODELS, json=MODEL_SET)
    assert applied.status_code == 200, applied.text
    await propose(
        client,
        mcp("datasetProperties", {"name": "orders", "description": "All orders"}, ORDERS, sync=True),
        mcp("globalTags", {"tags": [{"tag": "urn:li:tag:PII"}]}, ORDERS, sync=True),
        mcp("acmeRating", {"stars": 4}, ORDERS, sync=True),
    )

    async def indexed() -> bool:  # every change log sequenced, and the embedded indexer past them
        return await db.fetchval(
            """SELECT NOT EXISTS (SELECT 1 FROM change_log_outbox WHERE feed_offset IS NULL)
                      AND (SELECT last_offset FROM feed_reader_state WHERE reader = 'search-indexer')
                          = (SELECT last_offset FROM change_log_feed_state WHERE id = 1)"""
        )

    await eventually(indexed, what="every change log sequenced and indexed")
    # a refusal, recorded once the indexer is past it: its pass over that version drops the failures it supersedes
    await db.execute(
        """INSERT INTO search_index_failure (outbox_id, feed_offset, topic, urn, aspect, version, payload, reason,
                                             attempts, next_retry_at)
           SELECT id, feed_offset, topic, urn, aspect, version, payload, 'IndexRefused: mapper_parsing_exception', 3,
                  now() + interval '1 hour'
           FROM change_log_outbox WHERE urn = $1 AND aspect = 'datasetProperties' LIMIT 1""",
        ORDERS,
    )


async def test_an_admin_sees_every_figure_with_its_value(app, written, db):
    admin = await sign_in(app, role="admin")
    response = await admin.get("/operations")
    assert response.status_code == 200, response.text
    html = response.text
    assert response.headers["content-security-policy"].startswith("default-src 'self'")
    assert 'style="' not in html and not re.search(r"<script(?![^>]*(src=|application/json))", html)

    ready = section(html, "readiness")
    assert "ready</span>" in ready and "not ready" not in ready
    for check in ("database", "migrations", "broker", "registry", "indexing"):
        assert re.search(rf'<th scope="row">{check}</th>\s*<td><span class="state state-ok">', ready), check
    assert "latencyMs" in ready  # the database check's own figure

    admission = section(html, "admission")
    limit = app.state.ops.admission.limit
    assert figure(admission, "Writes in flight") == "0" and f"0 of {limit}" in admission
    assert '<svg class="bar' in admission  # drawn, and written as text
    assert figure(admission, "Outbox backlog limit") == "off"

    feed_end = await db.fetchval("SELECT last_offset FROM change_log_feed_state WHERE id = 1")
    outbox = section(html, "outbox")
    assert figure(outbox, "Feed end offset") == str(feed_end)
    assert figure(outbox, "Without a feed offset") == "0"

    indexing = section(html, "indexing")
    assert figure(indexing, "Failing rows") == "1"
    assert "IndexRefused: mapper_parsing_exception" in indexing and ORDERS in indexing
    assert figure(indexing, "Indexer cursor").isdigit()

    processors = section(html, "processors")
    lowercase, needs_owner = processors.index(f"{PROCESSORS}.Lowercase"), processors.index(f"{PROCESSORS}.NeedsOwner")
    assert lowercase < needs_owner  # in the pipeline's order
    assert "stored pipeline, version 1" in processors
    row = processors[needs_owner : processors.index("</tr>", needs_owner)]
    assert "disabled" in row
    mutated = REGISTRY.get_sample_value(
        "metaledger_change_processor_calls_total",
        {"processor": f"{PROCESSORS}.Lowercase", "phase": "before", "outcome": "mutated"},
    )
    assert mutated and f"mutated: {int(mutated)}" in processors  # the tag was lowercased, and counted

    models = section(html, "models")
    assert figure(models, "Version in force here") == "1" and figure(models, "Latest stored version") == "1"
    assert "acmeRating" in models and TEST_ACTOR in models

    tail = section(html, "feed")
    assert ORDERS in tail and "acmeRating" in tail and TEST_ACTOR in tail and "UPSERT" in tail
    config = re.search(r'<script type="application/json" id="ops-feed-config">(.*?)</script>', tail, re.S)
    assert orjson.loads(config.group(1))["after"] == feed_end
    for asset in ("operations.js", "operations.css"):
        assert (await admin.get(f"/web/static/{asset}")).status_code == 200
    await admin.aclose()


@pytest.mark.parametrize("settings_overrides", [{"relay_enabled": False, "max_outbox_backlog": 3}])
async def test_429s_of_an_outbox_backlog_are_counted_and_drawn(app, client):
    # as in tests/integration/test_operations.py: no relay, the change logs stay unsequenced: a backlog
    await propose(client, *[mcp("datasetProperties", {"name": f"held{i}"}, urn=ds(f"ops.held_{i}")) for i in range(2)])
    await app.state.ops.sampler.sample()
    refused = await client.post("/openapi/v1/proposals", json=[mcp("status", {"removed": False}, ds("ops.held_5"))])
    assert refused.status_code == 429, refused.text
    admin = await sign_in(app, role="admin")
    html = (await admin.get("/operations")).text
    admission = section(html, "admission")
    backlog_429s = REGISTRY.get_sample_value("metaledger_write_rejections_total", {"reason": "backlog"})
    assert backlog_429s >= 1 and figure(admission, "Outbox backlog over its limit") == str(int(backlog_429s))
    assert figure(admission, "Outbox backlog limit") == "3"
    answered = REGISTRY.get_sample_value(
        "metaledger_http_requests_total", {"route": "/openapi/v1/proposals", "method": "POST", "status": "429"}
    )
    assert re.search(rf"<code>/openapi/v1/proposals</code></th><td>POST</td><td>{int(answered)}</td>", admission)
    outbox = section(html, "outbox")
    backlog = app.state.ops.sampler.latest.backlog
    assert backlog > 3 and figure(outbox, "Backlog rows") == str(backlog)
    assert f"{backlog} of 3 rows" in outbox and "bar-high" in outbox  # drawn against its limit
    await admin.aclose()


async def test_only_an_admin_sees_the_page_and_the_feed(app, anonymous):
    for role in ("writer", "reader"):
        async with browser(app, role) as http:
            for path in ("/operations", "/operations/feed"):
                response = await http.get(path)
                assert response.status_code == 403, (role, path)
                assert "needs the ADMIN permission" in response.text
    for path in ("/operations", "/operations/feed"):
        response = await anonymous.get(path)
        assert response.status_code == 303 and response.headers["location"] == f"/login?next={path}"
    # a bearer token is no session
    token = await anonymous.get("/operations", headers={"Authorization": "Bearer x"})
    assert token.status_code == 303


async def test_the_model_set_diff_names_the_changed_aspect(app, client):
    assert (await client.post(MODELS, json=MODEL_SET)).status_code == 200
    changed = copy.deepcopy(MODEL_SET)
    changed["aspects"][0]["schema"]["fields"].append(
        {"name": "comment", "type": ["null", "string"], "default": None, "doc": "Why"}
    )
    changed["aspects"][0]["schema"]["fields"][0]["doc"] = "1 to 5"
    assert (await client.post(MODELS, json=changed)).status_code == 200
    admin = await sign_in(app, role="admin")

    models = section((await admin.get("/operations")).text, "models")  # by default: the latest against the one before
    assert "From version 1 to version 2" in models
    diff = models[models.index("model-diff") :]
    assert '<strong>acmeRating</strong> <span class="change change-changed">changed</span>' in diff
    assert re.search(r"<code>schema\.fields\[comment\]</code></th><td>added</td>", diff)
    assert re.search(r"<code>schema\.fields\[stars\]\.doc</code></th><td>added</td>", diff)
    assert "No change." in diff  # the entities

    models = section((await admin.get("/operations", params={"from": "0", "to": "2"})).text, "models")
    assert '<strong>acmeRating</strong> <span class="change change-added">added</span>' in models
    assert "fields: stars, note, comment" in models

    missing = await admin.get("/operations", params={"from": "7"})
    assert missing.status_code == 404 and "Version 7 of the model set is not stored" in missing.text
    assert (await admin.get("/operations", params={"to": "two"})).status_code == 400
    await admin.aclose()


# --- the live feed --------------------------------------------------------------------------------------------------


async def test_the_feed_sends_a_write_made_after_it_opened(app, client):
    async with browser(app) as http, http.stream("GET", "/operations/feed") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-store"
        lines = response.aiter_lines()
        assert (await next_event(lines))["retry"] == str(operations.RETRY_MS)
        await propose(client, mcp("datasetProperties", {"name": "late"}, ds("ops.late")))
        change = await next_change(lines)
    assert change["urn"] == ds("ops.late") and change["aspect"] == "datasetProperties"
    assert change["changeType"] == "UPSERT" and change["actor"] == TEST_ACTOR and change["version"] == 1
    assert change["id"] == str(change["offset"]) and change["url"].startswith("/dataset/")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", change["when"])


async def test_the_feed_resumes_after_last_event_id_without_repeating(app, client):
    async with browser(app) as http:
        async with http.stream("GET", "/operations/feed") as response:
            lines = response.aiter_lines()
            await next_event(lines)
            await propose(client, mcp("datasetProperties", {"name": "first"}, ds("ops.first")))
            first = await next_change(lines)
        assert first["urn"] == ds("ops.first")
        await propose(client, mcp("datasetProperties", {"name": "second"}, ds("ops.second")))
        # a reconnecting browser sends the last id it saw; it wins over the `after` of the source's URL
        resumed = http.stream("GET", "/operations/feed", params={"after": "0"}, headers={"Last-Event-ID": first["id"]})
        async with resumed as response:
            second = await next_change(response.aiter_lines())
        assert second["urn"] == ds("ops.second") and int(second["id"]) > int(first["id"])
        refused = await http.get("/operations/feed", headers={"Last-Event-ID": "not-an-offset"})
        assert refused.status_code == 400


async def test_the_feed_sends_heartbeats_and_ends_after_its_lifetime(app, monkeypatch):
    monkeypatch.setattr(operations, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(operations, "LIFETIME_S", 1.5)
    started = time.monotonic()
    async with browser(app) as http, http.stream("GET", "/operations/feed") as response:
        blocks = await until_end(response.aiter_lines(), timeout=10)
    took = time.monotonic() - started
    comments = [c for b in blocks for c in b.get("comments", ())]
    assert comments.count("heartbeat") >= 3, blocks
    assert "reconnect with Last-Event-ID" in comments[-1]
    assert 1.5 <= took < 5, took
    assert app.state.feed_streams.open == 0  # its place is given back


async def test_the_feed_refuses_past_its_cap_with_retry_after(app, monkeypatch):
    monkeypatch.setattr(operations, "MAX_STREAMS", 2)
    async with browser(app) as http, contextlib.AsyncExitStack() as streams:
        for _ in range(2):
            response = await streams.enter_async_context(http.stream("GET", "/operations/feed"))
            assert response.status_code == 200
        refused = await http.get("/operations/feed")
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == str(operations.STREAM_REFUSED_RETRY_S)
        assert "At most 2 live change feeds" in refused.text
        assert app.state.feed_streams.open == 2
    # the browsers left: their places are free again
    assert app.state.feed_streams.open == 0
    async with browser(app) as http, http.stream("GET", "/operations/feed") as response:
        assert response.status_code == 200


async def test_the_feed_ends_when_the_process_drains(app):
    async with browser(app) as http, http.stream("GET", "/operations/feed") as response:
        lines = response.aiter_lines()
        await next_event(lines)
        started = time.monotonic()
        app.state.drain.draining = True  # what SIGTERM sets first (app.ops.drain)
        try:
            await until_end(lines, timeout=3)
            ended = time.monotonic() - started
            again = await http.get("/operations/feed")  # the browser's reconnection: told to go elsewhere
            assert again.status_code == 503 and again.headers["retry-after"]
        finally:
            app.state.drain.draining = False
    assert ended < 1.5


async def test_the_feed_ends_when_the_app_shuts_down(database_url, registry):
    settings = Settings(database_url=database_url, apply_migrations_on_start=False, auth_bootstrap_admin_token=False)
    application = create_app(settings, registry)
    lifespan = application.router.lifespan_context(application)
    await lifespan.__aenter__()
    stopping = None
    try:
        async with browser(application) as http, http.stream("GET", "/operations/feed") as response:
            lines = response.aiter_lines()
            await next_event(lines)
            started = time.monotonic()
            stopping = asyncio.create_task(lifespan.__aexit__(None, None, None))
            await until_end(lines, timeout=3)
            ended = time.monotonic() - started
        await asyncio.wait_for(stopping, 30)
    finally:
        if stopping is None:
            await lifespan.__aexit__(None, None, None)
    assert ended < 1.5


async def test_the_feed_does_not_hold_uvicorns_graceful_stop(app):
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    config.timeout_graceful_shutdown = 30  # what a stream that went on would hold the stop for
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: asyncio.sleep(0, server.started), timeout=10, what="uvicorn started")
        base = f"http://127.0.0.1:{port}"
        signed_in = await sign_in(app, role="admin", base_url=base)  # its cookie is the host's
        async with httpx.AsyncClient(base_url=base, cookies=signed_in.cookies) as http:
            async with http.stream("GET", "/operations/feed", timeout=10) as response:
                assert response.status_code == 200
                lines = response.aiter_lines()
                await next_event(lines)
                started = time.monotonic()
                server.should_exit = True  # what uvicorn's handler of SIGINT, and the SIGTERM drain's end, set
                await until_end(lines, timeout=5)
        await asyncio.wait_for(serving, 10)
        assert time.monotonic() - started < 3
        await signed_in.aclose()
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 35)
