"""metaledger's own MCP endpoint (`/mcp`, app.mcp) on a real `metaledger serve`, through the `mcp` SDK's streamable
HTTP client: DataHub's tool names and parameters; the reads on data written through the write path; each curation
tool's change and its undoing, attributed in the change log to the token's actor and the tool; a reader's curation
refused naming the permission it lacks (and its reads not refused); no token, a 401; a search a limit cut says so
and continues; metaledger's own tools (history and diff, change feed, trace, run preview, model set)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from app.embedded_pg import free_port
from tests.helpers import mcp
from tests.processes import service_token, start_service, stop_process, wait_healthy

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
ORDERS = "urn:li:dataset:(urn:li:dataPlatform:hive,mcp.orders,PROD)"
RAW = "urn:li:dataset:(urn:li:dataPlatform:hive,mcp.raw_orders,PROD)"
WRITER = "urn:li:corpuser:mcp_writer"
READER = "urn:li:corpuser:mcp_reader"
TAG, TERM, DOMAIN = "urn:li:tag:pii", "urn:li:glossaryTerm:revenue", "urn:li:domain:sales"
OWNER = "urn:li:corpuser:alice"
PROPERTY = "urn:li:structuredProperty:io.mcp.retention"
RUN_ONLY = "urn:li:dataset:(urn:li:dataPlatform:hive,mcp.run_only,PROD)"
# mcp-server-datahub 0.8.0's tools and their parameters (its `tools/list` with every tool enabled)
DATAHUB_TOOLS = {
    "search": {"query", "filter", "num_results", "sort_by", "sort_order", "offset"},
    "get_lineage": {"urn", "column", "query", "filter", "upstream", "max_hops", "max_results", "offset"},
    "get_dataset_queries": {"urn", "column", "source", "start", "count"},
    "get_entities": {"urns"},
    "get_aspect_history": {"urns", "aspect_names", "from_version", "limit", "include_current"},
    "list_schema_fields": {"urn", "keywords", "limit", "offset"},
    "get_lineage_paths_between": {"source_urn", "target_urn", "source_column", "target_column", "direction"},
    "search_documents": {"query", "semantic_query", "filter", "num_results", "offset"},
    "grep_documents": {"urns", "pattern", "context_chars", "max_matches_per_doc", "start_offset"},
    "add_tags": {"tag_urns", "entity_urns", "column_paths"},
    "remove_tags": {"tag_urns", "entity_urns", "column_paths"},
    "add_terms": {"term_urns", "entity_urns", "column_paths"},
    "remove_terms": {"term_urns", "entity_urns", "column_paths"},
    "add_owners": {"owner_urns", "entity_urns", "ownership_type"},
    "remove_owners": {"owner_urns", "entity_urns", "ownership_type"},
    "set_domains": {"domain_urn", "entity_urns"},
    "remove_domains": {"entity_urns"},
    "update_description": {"entity_urn", "operation", "description", "column_path"},
    "add_structured_properties": {"property_values", "entity_urns"},
    "remove_structured_properties": {"property_urns", "entity_urns"},
    "save_document": {"document_type", "title", "content", "urn", "topics", "related_documents", "related_assets"},
    "get_me": set(),
}


def _schema(*names: str) -> dict[str, Any]:
    return {
        "schemaName": "orders",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.MySqlDDL": {"tableSchema": ""}},
        "fields": [
            {"fieldPath": n, "nativeDataType": "int", "type": {"type": {"com.linkedin.schema.NumberType": {}}}}
            for n in names
        ],
    }


SEED = [
    mcp("datasetProperties", {"name": "orders", "description": "Every order placed"}, ORDERS),
    mcp("schemaMetadata", _schema("order_id", "customer_email", "amount"), ORDERS),
    mcp("upstreamLineage", {"upstreams": [{"dataset": RAW, "type": "TRANSFORMED"}]}, ORDERS),
    mcp("datasetProperties", {"name": "raw_orders", "description": "Orders as they arrive"}, RAW),
    mcp("tagProperties", {"name": "pii"}, TAG, entity="tag"),
    mcp("glossaryTermInfo", {"name": "revenue", "definition": "Money in", "termSource": "INTERNAL"}, TERM,
        entity="glossaryTerm"),
    mcp("domainProperties", {"name": "sales"}, DOMAIN, entity="domain"),
    mcp("corpUserInfo", {"active": True, "displayName": "Alice"}, OWNER, entity="corpuser"),
    mcp("propertyDefinition", {"qualifiedName": "io.mcp.retention", "valueType": "urn:li:dataType:datahub.number",
                               "entityTypes": ["urn:li:entityType:datahub.dataset"], "cardinality": "SINGLE"},
        PROPERTY, entity="structuredProperty"),
]  # fmt: skip


@pytest.fixture(scope="module")
def service(make_database, migrated_template):
    env = {
        "METALEDGER_DATABASE_URL": make_database(template=migrated_template),
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
    }
    port = free_port()
    process = start_service(env, port, workers=1)
    try:
        yield f"http://127.0.0.1:{port}", env
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def tokens(service) -> dict[str, str]:
    _, env = service
    return {
        "admin": service_token(env),
        "writer": service_token(env, WRITER, "writer"),
        "reader": service_token(env, READER, "reader"),
    }


@pytest.fixture
async def seeded(service, tokens) -> str:
    base, _ = service
    await wait_healthy(base, 120)
    async with httpx.AsyncClient(base_url=base, timeout=60, headers=_auth(tokens["admin"])) as http:
        answer = await http.post("/openapi/v1/proposals", json=SEED, headers=SYNC)
        assert answer.status_code == 200, answer.text
    return base


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def session(base: str, token: str | None) -> AsyncIterator[ClientSession]:
    headers = _auth(token) if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with streamable_http_client(f"{base}/mcp", http_client=http) as (read, write, *_):
            async with ClientSession(read, write) as client:
                await client.initialize()
                yield client


async def call(client: ClientSession, tool: str, arguments: dict[str, Any]) -> Any:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, (tool, result.content[0].text)
    return json.loads(result.content[0].text)


async def refused(client: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, (tool, result.content[0].text)
    return json.loads(result.content[0].text)


async def test_the_tools_are_datahubs_by_name_and_parameters_plus_metaledgers(seeded, tokens):
    async with session(seeded, tokens["reader"]) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    for name, parameters in DATAHUB_TOOLS.items():
        assert set(tools[name].input_schema.get("properties", {})) == parameters, name
    assert tools["search"].input_schema["properties"]["num_results"]["default"] == 10
    assert tools["add_owners"].input_schema["required"] == ["owner_urns", "entity_urns", "ownership_type"]
    assert tools["search"].annotations.read_only_hint and not tools["add_tags"].annotations.read_only_hint
    extras = {"get_changes_since", "diff_aspect_versions", "trace_write", "preview_run_rollback", "get_model_set"}
    assert set(tools) == set(DATAHUB_TOOLS) | extras


async def test_reads_answer_what_the_write_path_wrote(seeded, tokens):
    async with session(seeded, tokens["reader"]) as client:
        found = await call(client, "search", {"query": "orders", "filter": "entity_type = dataset"})
        assert ORDERS in [r["entity"]["urn"] for r in found["searchResults"]]
        assert found["truncated"] is False and found["total"] >= 2
        entity, missing = await call(client, "get_entities", {"urns": [ORDERS, ORDERS.replace("orders", "nothing")]})
        assert entity["properties"]["description"] == "Every order placed"
        # DataHub's order of the fields an answer shows: keys, described, tagged or termed, then by path (none here)
        assert [f["fieldPath"] for f in entity["schemaMetadata"]["fields"]] == ["amount", "customer_email", "order_id"]
        assert missing["error"].endswith("not found")
        one = await call(client, "get_entities", {"urns": ORDERS})  # one URN, as DataHub's tool takes it: one answer
        assert one["urn"] == ORDERS
        as_text = await call(client, "get_entities", {"urns": json.dumps([ORDERS])})  # an array sent as a string
        assert [e["urn"] for e in as_text] == [ORDERS]
        lineage = await call(client, "get_lineage", {"urn": ORDERS, "upstream": True})
        assert [r["entity"]["urn"] for r in lineage["upstreams"]["searchResults"]] == [RAW]
        assert lineage["upstreams"]["total"] == 1 and lineage["upstreams"]["truncated"] is False
        paths = await call(client, "get_lineage_paths_between", {"source_urn": RAW, "target_urn": ORDERS})
        assert paths["pathCount"] >= 1 and paths["metadata"]["direction"] == "auto-discovered-downstream"
        fields = await call(client, "list_schema_fields", {"urn": ORDERS, "keywords": ["email"], "limit": 2})
        assert fields["fields"][0]["fieldPath"] == "customer_email" and fields["matchingCount"] == 1
        assert (fields["totalFields"], fields["returned"], fields["remainingCount"], fields["offset"]) == (3, 2, 1, 0)
        me = await call(client, "get_me", {})
        assert me["data"]["corpUser"]["urn"] == READER


CURATION = [
    ("add_tags", "remove_tags", {"tag_urns": [TAG]}, "globalTags", lambda e: TAG in json.dumps(e.get("tags"))),
    ("add_terms", "remove_terms", {"term_urns": [TERM]}, "glossaryTerms",
     lambda e: TERM in json.dumps(e.get("glossaryTerms"))),
    ("add_owners", "remove_owners", {"owner_urns": [OWNER]}, "ownership",
     lambda e: OWNER in json.dumps(e.get("ownership"))),
    ("set_domains", "remove_domains", {"domain_urn": DOMAIN}, "domains",
     lambda e: DOMAIN in json.dumps(e.get("domain"))),
    ("add_structured_properties", "remove_structured_properties", {"property_values": {PROPERTY: ["30"]}},
     "structuredProperties", lambda e: PROPERTY in json.dumps(e.get("structuredProperties"))),
]  # fmt: skip


async def _feed_end(client: ClientSession) -> int:
    return (await call(client, "get_changes_since", {"since": datetime.now(UTC).isoformat(), "limit": 1}))["after"]


async def _changes(
    client: ClientSession, after: int, aspect: str, count: int, urn: str = ORDERS
) -> list[dict[str, Any]]:
    """The change logs of `urn`'s `aspect` after `after`, once `count` of them are in the feed (the sequencer gives
    a committed change log its place in the feed a moment after the commit)."""
    for _ in range(100):
        events = (await call(client, "get_changes_since", {"after": after, "urn": urn, "limit": 1000}))["events"]
        changes = [e for e in events if e["aspect"] == aspect]
        if len(changes) >= count:
            return changes
        await asyncio.sleep(0.1)
    raise AssertionError(f"{count} change logs of {aspect} expected, found {changes}")


@pytest.mark.parametrize(("add", "remove", "what", "aspect", "present"), CURATION, ids=[c[0] for c in CURATION])
async def test_each_curation_tool_changes_and_its_remove_tool_restores_attributed_to_actor_and_tool(
    seeded, tokens, add, remove, what, aspect, present
):
    async with session(seeded, tokens["writer"]) as client:
        start = await _feed_end(client)
        arguments = {"entity_urns": [ORDERS], **what}
        if add == "add_owners":
            arguments["ownership_type"] = "TECHNICAL_OWNER"
        assert (await call(client, add, arguments))["success"] is True
        [entity] = await call(client, "get_entities", {"urns": [ORDERS]})
        assert present(entity)
        undo = {"entity_urns": [ORDERS]}
        if remove == "remove_structured_properties":
            undo["property_urns"] = [PROPERTY]
        elif remove != "remove_domains":
            undo.update({k: v for k, v in what.items()})
        assert (await call(client, remove, undo))["success"] is True
        [entity] = await call(client, "get_entities", {"urns": [ORDERS]})
        assert not present(entity)
        changes = await _changes(client, start, aspect, 2)
    assert [(c["actor"], c["origin"]) for c in changes] == [(WRITER, f"mcp:{add}"), (WRITER, f"mcp:{remove}")]
    assert all(c["traceId"] for c in changes)


async def test_update_description_replaces_appends_and_removes_a_columns_description(seeded, tokens):
    async with session(seeded, tokens["writer"]) as client:
        column = {"entity_urn": ORDERS, "column_path": "amount"}
        await call(client, "update_description", {**column, "description": "In cents"})
        await call(client, "update_description", {**column, "operation": "append", "description": " (tax included)"})
        await call(client, "update_description", {**column, "operation": "remove"})
        changes = await _changes(client, 0, "editableSchemaMetadata", 3)
    assert {c["origin"] for c in changes} == {"mcp:update_description"}, changes
    descriptions = [c["aspectValue"]["editableSchemaFieldInfo"][0]["description"] for c in changes]
    assert descriptions == ["In cents", "In cents (tax included)", ""]


async def test_a_readers_curation_is_refused_naming_the_permission_and_its_reads_are_not(seeded, tokens):
    async with session(seeded, tokens["reader"]) as client:
        before = await _feed_end(client)
        error = await refused(client, "add_tags", {"tag_urns": [TAG], "entity_urns": [ORDERS]})
        assert error["status"] == 403 and "WRITE" in error["message"] and "reader" in error["message"]
        error = await refused(client, "update_description", {"entity_urn": ORDERS, "description": "x"})
        assert error["status"] == 403 and "WRITE" in error["message"]
        assert (await call(client, "search", {"query": "orders"}))["total"] >= 1  # reading stays allowed
        await asyncio.sleep(0.5)  # what a write would have committed is in the feed by then
        events = (await call(client, "get_changes_since", {"after": before, "limit": 1000}))["events"]
        assert [e for e in events if e["actor"] == READER] == []  # nothing was written
    async with session(seeded, tokens["writer"]) as client:  # an admin's tools name ADMIN to a writer
        error = await refused(client, "get_model_set", {})
        assert error["status"] == 403 and "ADMIN" in error["message"]


async def test_no_token_or_a_bad_one_is_a_401_with_www_authenticate(seeded):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=seeded, timeout=30) as http:
        for extra in (
            {},
            {"Authorization": "Bearer not-a-token"},
            {"Cookie": "PLAY_SESSION=x; actor=urn:li:corpuser:datahub"},
        ):
            answer = await http.post("/mcp", json=body, headers={**headers, **extra})
            assert answer.status_code == 401, answer.text
            assert answer.headers["www-authenticate"].startswith("Bearer")
    with pytest.raises(BaseException, match="401|Unauthorized|unhandled errors"):  # the SDK's client sees the 401
        async with session(seeded, None):
            pass


async def test_bad_arguments_are_a_tool_error_naming_the_argument(seeded, tokens):
    async with session(seeded, tokens["reader"]) as client:
        error = await refused(client, "search", {"num_results": -1})
        assert error["issues"][0]["path"] == "$.arguments.num_results"
        error = await refused(client, "get_entities", {"urns": ["x"] * 101})
        assert error["issues"][0]["path"] == "$.arguments.urns"
        error = await refused(client, "search", {"query": "*", "colour": "red"})
        assert error["issues"][0]["path"] == "$.arguments.colour"
        error = await refused(client, "search", {"filter": "platform = (hive"})
        assert error["issues"][0]["path"] == "$.arguments.filter"
        assert (await call(client, "search", {"filter": "platform = hive AND NOT tag IS NOT NULL"}))["total"] >= 2


async def test_a_search_a_limit_cuts_says_so_with_where_to_go_on(seeded, tokens):
    base = seeded
    many = [
        mcp("datasetProperties", {"name": f"cut_{i}"}, f"urn:li:dataset:(urn:li:dataPlatform:kafka,mcp.cut_{i},PROD)")
        for i in range(7)
    ]
    async with httpx.AsyncClient(base_url=base, timeout=60, headers=_auth(tokens["admin"])) as http:
        assert (await http.post("/openapi/v1/proposals", json=many, headers=SYNC)).status_code == 200
    async with session(base, tokens["reader"]) as client:
        arguments = {"query": "*", "filter": "platform = kafka", "num_results": 3}
        seen, offset, pages = [], 0, []
        while True:
            page = await call(client, "search", {**arguments, "offset": offset})
            pages.append(page)
            seen += [r["entity"]["urn"] for r in page["searchResults"]]
            if not page["truncated"]:
                assert "nextOffset" not in page
                break
            offset = page["nextOffset"]
        assert [p["total"] for p in pages] == [7, 7, 7] and len(set(seen)) == 7
        whole = await call(client, "search", {**arguments, "num_results": 60})  # DataHub's cap of 50 says so
        assert whole["cutBy"] == "num_results is at most 50" and whole["truncated"] is False
        lineage = await call(client, "get_lineage", {"urn": ORDERS, "max_results": 500})
        assert lineage["upstreams"]["cutBy"] == "max_results is at most 100"


async def test_history_diff_change_feed_and_trace_of_a_write(seeded, tokens):
    async with session(seeded, tokens["writer"]) as client:
        for _ in range(2):  # history rows enough for a page of one to leave some
            await call(client, "add_tags", {"tag_urns": [TAG], "entity_urns": [RAW]})
            await call(client, "remove_tags", {"tag_urns": [TAG], "entity_urns": [RAW]})
        [history] = (await call(client, "get_aspect_history", {"urns": [RAW], "aspect_names": ["globalTags"]}))[
            "results"
        ]  # DataHub's shape: the current value as version 0, the history rows newest first
        newest = int(history["current"]["systemMetadata"]["version"])
        assert [v["version"] for v in history["history"]][:1] == [newest - 1] and history["page"]["hasMore"] is False
        assert history["current"]["systemMetadata"]["properties"]["metaledger.origin"] == "mcp:remove_tags"
        cut = await call(client, "get_aspect_history", {"urns": [RAW], "aspect_names": ["globalTags"], "limit": 1})
        assert (
            cut["results"][0]["page"]["hasMore"] is True and cut["results"][0]["page"]["nextFromVersion"] == newest - 2
        )
        diff = await call(client, "diff_aspect_versions", {"urn": RAW, "aspect": "globalTags"})
        assert diff["from"]["version"] == newest - 1 and diff["to"]["version"] == newest
        assert [(c["category"], c["operation"]) for c in diff["changes"]] == [("TAG", "REMOVE")]
        missing = await refused(client, "diff_aspect_versions", {"urn": RAW, "aspect": "globalTags", "to_version": 999})
        assert missing["status"] == 404 and missing["issues"][0]["path"] == "$.arguments.to_version"
        tag_changes = await _changes(client, 0, "globalTags", 4, RAW)
        last = tag_changes[-1]
        since = await call(client, "get_changes_since", {"after": last["offset"] - 1, "limit": 1})
        assert since["events"][0]["offset"] == last["offset"] and since["truncated"] is True
        trace = await call(client, "trace_write", {"trace_id": last["traceId"], "aspects": {RAW: ["globalTags"]}})
        assert trace[RAW]["globalTags"]["primaryStorage"]["writeStatus"] == "ACTIVE_STATE"
        assert (
            tag_changes[-2]["traceId"] != last["traceId"]
        )  # each tool call is a request of its own, a trace of its own


async def test_a_runs_rollback_preview_writes_nothing_and_the_model_set_is_an_admins(seeded, tokens):
    run = [mcp("datasetProperties", {"name": "run_only"}, RUN_ONLY,
               systemMetadata={"runId": "mcp-run-1", "lastObserved": 0})]  # fmt: skip
    async with httpx.AsyncClient(base_url=seeded, timeout=60, headers=_auth(tokens["admin"])) as http:
        assert (await http.post("/openapi/v1/proposals", json=run, headers=SYNC)).status_code == 200
    async with session(seeded, tokens["admin"]) as client:
        before = await _feed_end(client)
        preview = await call(client, "preview_run_rollback", {"run_id": "mcp-run-1"})
        assert {(a["urn"], a["aspectName"]) for a in preview["aspects"]} >= {(RUN_ONLY, "datasetProperties")}
        assert preview["rollbackPreview"]["entitiesAffected"] == 1 and preview["truncated"] is False
        await asyncio.sleep(0.5)  # what a rollback would have committed is in the feed by then
        events = (await call(client, "get_changes_since", {"after": before, "limit": 1000}))["events"]
        assert [e for e in events if e["urn"] == RUN_ONLY] == []  # a dry run
        models = await call(client, "get_model_set", {})
        assert models["current"]["version"] == 0 and models["total"] == len(models["history"])
    async with session(seeded, tokens["writer"]) as client:
        error = await refused(client, "preview_run_rollback", {"run_id": "mcp-run-1"})
        assert error["status"] == 403 and "ADMIN" in error["message"]


async def test_a_pattern_that_backtracks_is_stopped_and_the_service_answers_meanwhile(seeded, tokens):
    """grep_documents matches the caller's regular expression with a time limit (DataHub's RE2 is linear; Python's re
    would hold a worker for as long as the pattern backtracks), and the match lets other requests run."""
    urn = "urn:li:document:mcp-backtracking"
    stamp = {"time": 1, "actor": "urn:li:corpuser:datahub"}
    text = "a" * 5_000 + "!"
    async with httpx.AsyncClient(base_url=seeded, timeout=60, headers=_auth(tokens["admin"])) as http:
        info = {
            "title": "Backtracking",
            "contents": {"text": text},
            "created": stamp,
            "lastModified": stamp,
            "status": {"state": "PUBLISHED"},
            "customProperties": {},
        }
        proposal = {
            "entityType": "document",
            "entityUrn": urn,
            "changeType": "UPSERT",
            "aspectName": "documentInfo",
            "aspect": {"value": info},
        }
        assert (await http.post("/openapi/v1/proposals", json=[proposal])).status_code == 200
        async with session(seeded, tokens["reader"]) as client:
            grep = asyncio.create_task(call(client, "grep_documents", {"urns": [urn], "pattern": "(a|a)+$"}))
            started = time.monotonic()
            while not grep.done():  # the service keeps answering while the pattern runs
                assert (await http.get("/health")).status_code == 200
                await asyncio.sleep(0.05)
            answer = await grep
            assert time.monotonic() - started < 10
    assert answer["total_matches"] == 0 and "took more than" in answer["error"]
