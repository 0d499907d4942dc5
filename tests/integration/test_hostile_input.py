"""Hostile input (issue 13): bounded memory, no 500 for bad input, content types enforced, CORS.

Every input the issue lists answers a 4xx naming the field or the limit; none is a 500, none grows the process.
The app runs in this process (ASGI transport), so its memory is this process's RSS (`/proc/self/statm`).
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import gc
import os
from typing import Any
from urllib.parse import quote

import orjson
import pytest
import pytest_asyncio

from app.urns import _parse_cached, _validate_cached
from app.write.repository import AspectRepository

DS = "urn:li:dataset:(urn:li:dataPlatform:hive,db.hostile,PROD)"
Q = quote(DS, safe="")
OVER = str(2**63)  # one above the largest 64-bit integer
JSON = {"Content-Type": "application/json"}
SNAPSHOT = "com.linkedin.metadata.snapshot.DatasetSnapshot"


def rss_mb() -> float:
    """This process's resident memory, after the garbage collector and glibc's `malloc_trim`: the C allocator keeps
    the pages of freed buffers for reuse (about 30 MB after a few hundred 100 KB bodies, a one-off high-water mark
    that is not growth, and varies run to run); trimmed, RSS is what the process holds."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


def nested_objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def nested_arrays(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


def mcp(urn: str = DS, aspect: str = "status", value: Any = None, **extra: Any) -> dict[str, Any]:
    return {
        "entityType": "dataset",
        "entityUrn": urn,
        "aspectName": aspect,
        "aspect": {"value": {"removed": False} if value is None else value},
        **extra,
    }


def issue_paths(response) -> list[str]:
    return [issue.get("path", "") for issue in response.json()["issues"]]


async def write_dataset(client, urn: str = DS) -> None:
    response = await client.post("/openapi/v1/proposals", json=[mcp(urn)])
    assert response.status_code == 200, response.text


async def exists(db, urn: str = DS) -> bool:
    return await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", urn) > 0


# --- item 3: every input that was a 500 is a 400 naming the field ------------------------------------------------

MCE_1000 = (
    b'{"entity": {"value": {"'
    + SNAPSHOT.encode()
    + b'": {"urn": "'
    + DS.encode()
    + b'", "aspects": [{"com.linkedin.dataset.DatasetProperties": {"customProperties": '
    + nested_objects(1000)
    + b"}}]}}}}"
)
ITEM_3: dict[str, tuple[str, str, bytes | None, str]] = {
    # case: (method, url, JSON body, the path an issue names)
    "search scrollId not base64": ("GET", "/openapi/v3/entity/dataset?scrollId=!!!notbase64", None, "$scrollId"),
    "search scrollId base64 of text": (
        "GET",
        f"/openapi/v3/entity/dataset?scrollId={b64(b'not json')}",
        None,
        "$scrollId",
    ),
    "search scrollId not a pair": ("GET", f"/openapi/v3/entity/dataset?scrollId={b64(b'[1]')}", None, "$scrollId"),
    "search scrollId an object": ("GET", f"/openapi/v3/entity/dataset?scrollId={b64(b'{}')}", None, "$scrollId"),
    "search scrollId key not a number": (
        "GET",
        f"/openapi/v3/entity/dataset?scrollId={b64(orjson.dumps(['x', DS]))}",
        None,
        "$scrollId",
    ),
    "search scrollId with a NUL": (
        "GET",
        f"/openapi/v3/entity/dataset?scrollId={b64(orjson.dumps([1.0, DS + chr(0)]))}",
        None,
        "$scrollId",
    ),
    "relationship scrollId above 2^63-1": (
        "GET",
        f"/openapi/v3/relationship/dataset/{Q}?scrollId={OVER}",
        None,
        "$scrollId",
    ),
    "relationship scrollId not ASCII digits": (
        "GET",
        f"/openapi/v3/relationship/dataset/{Q}?scrollId=%C2%B2",
        None,
        "$scrollId",
    ),
    "v3 aspect version above 2^63-1": (
        "GET",
        f"/openapi/v3/entity/dataset/{Q}/status?version={OVER}",
        None,
        "$version",
    ),
    "Rest.li aspect version above 2^63-1": ("GET", f"/aspects/{Q}?aspect=status&version={OVER}", None, "$version"),
    "change feed after above 2^63-1": ("GET", f"/openapi/v1/events/mcl?after={OVER}", None, "$.after"),
    "events poll offsetId a unicode digit": (
        "GET",
        "/openapi/v1/events/poll?topic=PlatformEvent_v1&offsetId=%C2%B2&pollTimeoutSeconds=0",
        None,
        "$.offsetId",
    ),
    "timeseries start above 2^63-1": (
        "GET",
        f"/openapi/v1/timeseries/dataset/datasetProfile/daily?urn={Q}&start={OVER}",
        None,
        "$start",
    ),
    "timeseries end above 2^63-1": (
        "GET",
        f"/openapi/v1/timeseries/dataset/datasetProfile/daily?urn={Q}&end={OVER}",
        None,
        "$end",
    ),
    "getTimeseriesAspectValues startTimeMillis above 2^63-1": (
        "POST",
        "/aspects?action=getTimeseriesAspectValues",
        orjson.dumps({"urn": DS, "entity": "dataset", "aspect": "datasetProfile", "startTimeMillis": 2**63}),
        "$.startTimeMillis",
    ),
    "getTimeseriesAspectValues endTimeMillis as a long string": (
        "POST",
        "/aspects?action=getTimeseriesAspectValues",
        orjson.dumps({"urn": DS, "entity": "dataset", "aspect": "datasetProfile", "endTimeMillis": OVER}),
        "$.endTimeMillis",
    ),
    "getTimeseriesAspectValues limit with a unicode digit": (
        "POST",
        "/aspects?action=getTimeseriesAspectValues",
        orjson.dumps({"urn": DS, "entity": "dataset", "aspect": "datasetProfile", "limit": "\u00b2"}),
        "$.limit",
    ),
    "entities delete startTimeMillis above 2^63-1": (
        "POST",
        "/entities?action=delete",
        orjson.dumps({"urn": DS, "aspectName": "datasetProfile", "startTimeMillis": 2**63}),
        "$.startTimeMillis",
    ),
    "batchGet URN with a NUL": (
        "POST",
        "/openapi/v3/entity/dataset/batchGet",
        orjson.dumps([{"urn": "urn:li:dataset:(urn:li:dataPlatform:hive,a\u0000b,PROD)"}]),
        "$[0].urn",
    ),
    "single-aspect headers a list": (
        "POST",
        f"/openapi/v3/entity/dataset/{Q}/status",
        orjson.dumps({"value": {"removed": False}, "headers": ["x"]}),
        "$.headers",
    ),
    "single-aspect systemMetadata a string": (
        "POST",
        f"/openapi/v3/entity/dataset/{Q}/status",
        orjson.dumps({"value": {"removed": False}, "systemMetadata": "x"}),
        "$.systemMetadata",
    ),
    "v3 batch headers a list": (
        "POST",
        "/openapi/v3/entity/dataset",
        orjson.dumps([{"urn": DS, "status": {"value": {"removed": False}, "headers": ["x"]}}]),
        "$[0].status.headers",
    ),
    "systemMetadata nested 300 deep": (
        "POST",
        "/openapi/v1/proposals",
        b'[{"entityType": "dataset", "entityUrn": "' + DS.encode() + b'", "aspectName": "status", '
        b'"aspect": {"value": {"removed": true}}, "systemMetadata": {"properties": ' + nested_objects(300) + b"}}]",
        "$[0].systemMetadata.properties",
    ),
    "patch value nested 1000 deep": (
        "PATCH",
        f"/openapi/v3/entity/dataset/{Q}/datasetProperties",
        b'[{"op": "add", "path": "/customProperties/a", "value": ' + nested_objects(1000) + b"}]",
        "$[0].value",
    ),
    "patch value of arrays nested 1000 deep": (
        "PATCH",
        f"/openapi/v3/entity/dataset/{Q}/datasetProperties",
        b'[{"op": "add", "path": "/customProperties/a", "value": ' + nested_arrays(1000) + b"}]",
        "$[0].value",
    ),
    "Rest.li patch as JSON text nested 1000 deep": (
        "POST",
        "/aspects?action=ingestProposal",
        orjson.dumps(
            {
                "proposal": {
                    "entityType": "dataset",
                    "entityUrn": DS,
                    "aspectName": "datasetProperties",
                    "changeType": "PATCH",
                    "aspect": {
                        "contentType": "application/json-patch+json",
                        "value": '[{"op": "add", "path": "/customProperties/a", "value": '
                        + nested_objects(1000).decode()
                        + "}]",
                    },
                }
            }
        ),
        "$.proposal.aspect.value",
    ),
    "legacy MCE aspect nested 1000 deep": (
        "POST",
        "/entities?action=ingest",
        MCE_1000,
        f'$.entity.value["{SNAPSHOT}"].aspects[0]["com.linkedin.dataset.DatasetProperties"].customProperties',
    ),
    "NUL in systemMetadata": (
        "POST",
        "/openapi/v1/proposals",
        orjson.dumps([mcp(systemMetadata={"runId": "a\u0000b"})]),
        "$[0].systemMetadata",
    ),
    "lastObserved above 2^64": (
        "POST",
        "/openapi/v1/proposals",
        orjson.dumps([mcp()])[:-2] + b', "systemMetadata": {"lastObserved": 18446744073709551616}}]',
        "$[0].systemMetadata.lastObserved",
    ),
    "entity URN longer than the aspect store's column": (
        "POST",
        "/openapi/v1/proposals",
        orjson.dumps(
            [
                {
                    "entityType": "schemaField",
                    "aspectName": "status",
                    "aspect": {"value": {"removed": False}},
                    "entityUrn": f"urn:li:schemaField:({DS},{'f' * 600})",
                }
            ]
        ),
        "$[0].entityUrn",
    ),
    "search filter with a NUL": ("GET", "/openapi/v3/entity/dataset?filter_platform=%00", None, "$filter_platform"),
    "search query with a NUL": ("GET", "/openapi/v3/entity/dataset?query=a%00b", None, "$query"),
    "autocomplete query with a NUL": ("GET", "/openapi/v1/search/dataset/autocomplete?query=%00", None, "$query"),
    "v3 GET of a URN with a NUL": ("GET", f"/openapi/v3/entity/dataset/{quote(DS + chr(0), safe='')}", None, "$urn"),
    "timeseries latest of a URN with a NUL": (
        "GET",
        "/openapi/v1/timeseries/dataset/datasetProfile/latest?urn=a%00b",
        None,
        "$urn",
    ),
}


@pytest.mark.parametrize("case", list(ITEM_3))
async def test_item_3_inputs_are_400s_naming_the_field(client, db, case):
    await write_dataset(client)
    before = await db.fetchval("SELECT count(*) FROM metadata_aspect_v2")
    method, url, body, path = ITEM_3[case]
    response = await client.request(method, url, content=body, headers=JSON if body is not None else None)
    assert response.status_code == 400, response.text
    assert any(p.startswith(path) for p in issue_paths(response)), (path, response.json())
    assert len(response.content) < 4000  # nothing echoed at length
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2") == before  # nothing written


async def test_a_scroll_id_the_search_gave_still_works(client):
    urns = [f"urn:li:dataset:(urn:li:dataPlatform:hive,db.page{i},PROD)" for i in range(3)]
    written = await client.post(
        "/openapi/v1/proposals", json=[mcp(u) for u in urns], headers={"X-DataHub-Sync-Index-Update": "true"}
    )  # searchable when answered
    assert written.status_code == 200 and written.json()["index"]["status"] == "UPDATED", written.text
    first = (await client.get("/openapi/v3/entity/dataset", params={"count": 2})).json()
    scroll_id = first["scrollId"]
    for given in (scroll_id, scroll_id.rstrip("=")):  # padded or not
        second = await client.get("/openapi/v3/entity/dataset", params={"count": 2, "scrollId": given})
        assert second.status_code == 200, second.text
        assert {e["urn"] for e in second.json()["entities"]}.isdisjoint(e["urn"] for e in first["entities"])


async def test_timeseries_points_beyond_the_calendar_do_not_break_daily_buckets(client):
    """A `timestampMillis` is any long: one past year 9999 is stored, read back, and left out of the day buckets."""
    for ts in (2**62, 1_700_000_000_000):
        response = await client.post(
            "/openapi/v1/proposals",
            headers={"X-DataHub-Sync-Index-Update": "true"},
            json=[mcp(aspect="datasetProfile", value={"timestampMillis": ts, "rowCount": 1})],
        )
        assert response.status_code == 200, response.text
    daily = await client.get("/openapi/v1/timeseries/dataset/datasetProfile/daily", params={"urn": DS})
    assert daily.status_code == 200, daily.text
    assert [b["date"] for b in daily.json()["buckets"]] == ["2023-11-14"]
    latest = await client.get("/openapi/v1/timeseries/dataset/datasetProfile/latest", params={"urn": DS})
    assert latest.json()["timestampMillis"] == 2**62


async def test_a_nul_that_reaches_a_query_is_a_400(client):
    """What no handler checks itself (the token and policy routes) is caught where Postgres refuses the NUL."""
    for response in (
        await client.get("/openapi/v1/auth/tokens", params={"actor": "a\u0000"}),
        await client.delete("/openapi/v1/auth/tokens/%00"),
        await client.post(
            "/openapi/v1/auth/tokens", json={"actor": "urn:li:corpuser:a", "role": "reader", "description": "\u0000"}
        ),
    ):
        assert response.status_code == 400 and "NUL" in response.json()["message"], response.text
    # the schema registry: no such subject (a read), an invalid one (a write), in Confluent's terms
    read = await client.get("/schema-registry/api/subjects/%00/versions")
    assert read.status_code == 404 and read.json()["error_code"] == 40401
    write = await client.post("/schema-registry/api/subjects/%00/versions", json={"schema": '"string"'})
    assert write.status_code == 422 and write.json()["error_code"] == 42208


# --- item 2 and 6: bounded memory -------------------------------------------------------------------------------


async def test_900_distinct_100kb_urns_do_not_grow_the_process(client):
    def urn(i: int) -> str:
        return f"urn:li:dataset:(urn:li:dataPlatform:hive,db.{i:06d}{'x' * 100_000},PROD)"

    async def send(i: int) -> None:
        u = urn(i)
        if i % 3 == 0:  # a write
            response = await client.post("/openapi/v1/proposals", json=[mcp(u)])
        elif i % 3 == 1:  # a read (httpx, as HTTP servers, refuses a 100 KB URL: the URN goes in a body)
            response = await client.post("/openapi/v3/entity/dataset/batchGet", json=[{"urn": u}])
        else:  # a Rest.li action
            response = await client.post("/entities?action=delete", json={"urn": u})
        assert response.status_code == 400, response.text[:500]
        assert len(response.content) < 4000, len(response.content)  # the URN is not echoed
        assert "chars)" in response.text  # ... but cut, saying how long it was

    for i in range(30):  # warm up: first-use allocations are not growth
        await send(10_000 + i)
    cached = (_parse_cached.cache_info().currsize, _validate_cached.cache_info().currsize)
    before = rss_mb()
    for i in range(900):
        await send(i)
    grown = rss_mb() - before
    assert grown < 20, f"RSS grew by {grown:.1f} MB"
    # None of them was cached: the caches hold no more than before (fewer when settling memory after the suite's
    # earlier writes emptied them meanwhile: app.ops.backpressure.settle_memory, which made an equality flaky)
    after = (_parse_cached.cache_info().currsize, _validate_cached.cache_info().currsize)
    assert after[0] <= cached[0] and after[1] <= cached[1], (cached, after)


async def test_a_100000_item_batch_is_refused_naming_the_limit(client, db):
    item = mcp()
    cases = {
        "/openapi/v1/proposals": [item] * 100_000,
        "/openapi/v3/entity/dataset": [{"urn": DS, "status": {"value": {"removed": False}}}] * 100_000,
        "/aspects?action=ingestProposalBatch": {"proposals": [item] * 100_000, "async": "false"},
        "/openapi/v3/entity/dataset/batchGet": [{"urn": DS}] * 100_000,
    }
    for url, body in cases.items():
        response = await client.post(url, content=orjson.dumps(body), headers=JSON)
        assert response.status_code == 413, (url, response.text[:300])
        message = response.json()["message"]
        assert "100000 items" in message and "10000" in message and "METALEDGER_MAX_BATCH_ITEMS" in message, message
    assert not await exists(db)


@pytest.mark.parametrize("settings_overrides", [{"max_batch_items": 2}])
async def test_the_batch_limit_is_a_setting(client, db):
    urns = [f"urn:li:dataset:(urn:li:dataPlatform:hive,db.limit{i},PROD)" for i in range(3)]
    assert (await client.post("/openapi/v1/proposals", json=[mcp(u) for u in urns])).status_code == 413
    assert (await client.post("/openapi/v1/proposals", json=[mcp(u) for u in urns[:2]])).status_code == 200
    # a v3 batch and an MCE count their aspects (one entity may carry hundreds)
    three = {
        "status": {"value": {"removed": False}},
        "subTypes": {"value": {"typeNames": ["Table"]}},
        "datasetProperties": {"value": {"name": "x"}},
    }
    v3 = await client.post("/openapi/v3/entity/dataset", json=[{"urn": urns[2], **three}])
    assert v3.status_code == 413 and "3 aspects" in v3.json()["message"]
    aspects = [
        {"com.linkedin.common.Status": {"removed": False}},
        {"com.linkedin.common.SubTypes": {"typeNames": ["T"]}},
        {"com.linkedin.dataset.DatasetProperties": {"name": "x"}},
    ]
    mce = await client.post(
        "/entities?action=ingest", json={"entity": {"value": {SNAPSHOT: {"urn": urns[2], "aspects": aspects}}}}
    )
    assert mce.status_code == 413 and "3 aspects" in mce.json()["message"]
    assert not await exists(db, urns[2])


@pytest.mark.parametrize("settings_overrides", [{"max_request_bytes": 1_000_000}])
async def test_a_chunked_body_over_the_limit_is_413_without_buffering_it(client, db):
    chunk = b" " * 65_536
    sent = 0

    async def fifty_megabytes():
        nonlocal sent
        yield b"["
        for _ in range(800):  # 50 MB, without a Content-Length: chunked
            sent += 1
            yield chunk

    before = rss_mb()
    response = await client.post("/openapi/v1/proposals", content=fifty_megabytes(), headers=JSON)
    assert response.status_code == 413, response.text
    assert "1000000" in response.json()["message"]
    assert sent <= 1_000_000 // len(chunk) + 2, f"{sent} chunks read before the 413"
    assert rss_mb() - before < 20
    # within the limit, a chunked body is fine
    small = orjson.dumps([mcp()])

    async def in_pieces():
        for i in range(0, len(small), 10):
            yield small[i : i + 10]

    assert (await client.post("/openapi/v1/proposals", content=in_pieces(), headers=JSON)).status_code == 200


async def test_error_bodies_cut_echoed_input(client):
    long_urn = f"urn:li:dataset:(urn:li:dataPlatform:hive,{'y' * 150_000},PROD)"
    response = await client.post("/openapi/v1/proposals", json=[mcp(long_urn)])
    assert response.status_code == 400
    body = response.json()
    assert len(response.content) < 4000
    issue = body["issues"][0]
    assert issue["urn"].startswith(long_urn[:200]) and issue["urn"].endswith(f"…({len(long_urn)} chars)")
    assert issue["path"] == "$[0].entityUrn"
    unknown = await client.post(f"/openapi/v3/entity/{'e' * 60_000}", json=[{"urn": DS}])
    assert unknown.status_code == 400 and len(unknown.content) < 4000
    path_urn = f"urn:li:dataset:(urn:li:dataPlatform:hive,{'z' * 60_000},PROD)"
    read = await client.get(f"/openapi/v3/entity/dataset/{quote(path_urn, safe='')}")
    assert read.status_code == 400 and len(read.content) < 4000 and read.json()["issues"][0]["path"] == "$urn"


async def test_a_large_value_is_not_echoed_in_full(client):
    """DataHub echoes the written aspects; metaledger too, up to METALEDGER_MAX_ECHO_VALUE_BYTES (1 MiB) each."""
    description = "d" * 2_000_000
    body = [
        {
            "urn": DS,
            "status": {"value": {"removed": False}},
            "datasetProperties": {"value": {"name": "big", "description": description}},
        }
    ]
    response = await client.post("/openapi/v3/entity/dataset?async=false", json=body)
    assert response.status_code == 200, response.text[:300]
    assert len(response.content) < 10_000
    written = response.json()[0]
    assert written["status"]["value"] == {"removed": False}  # small values are echoed as before
    big = written["datasetProperties"]
    assert "value" not in big and big["status"] == "CREATED" and "METALEDGER_MAX_ECHO_VALUE_BYTES" in big["message"]
    assert big["systemMetadata"]["version"] == "1"
    stored = await client.get(f"/openapi/v3/entity/dataset/{Q}/datasetProperties")
    assert stored.json()["value"]["description"] == description


async def test_batch_get_reads_the_whole_batch_in_one_query(client, monkeypatch):
    urns = [f"urn:li:dataset:(urn:li:dataPlatform:hive,db.bulk{i},PROD)" for i in range(400)]
    response = await client.post("/openapi/v1/proposals", json=[mcp(u) for u in urns[:200]])
    assert response.status_code == 200
    calls = []
    original = AspectRepository.entities_latest

    async def counted(self, wanted):
        calls.append(len(wanted))
        return await original(self, wanted)

    async def per_urn(self, *args, **kwargs):
        raise AssertionError("batchGet must not read one URN at a time")

    monkeypatch.setattr(AspectRepository, "entities_latest", counted)
    monkeypatch.setattr(AspectRepository, "entity_latest", per_urn)
    items = [{"urn": u} if i % 2 else {"urn": u, "status": {}} for i, u in enumerate(urns)]
    response = await client.post("/openapi/v3/entity/dataset/batchGet", json=items)
    assert response.status_code == 200, response.text[:300]
    assert calls == [400]
    found = response.json()
    assert [e["urn"] for e in found] == urns[:200]  # in request order, absent ones left out
    assert set(found[0]) == {"urn", "status"} and set(found[1]) == {"urn", "datasetKey", "status"}
    unknown = await client.post("/openapi/v3/entity/dataset/batchGet", json=[{"urn": DS, "noSuchAspect": {}}])
    assert unknown.status_code == 400 and issue_paths(unknown) == ["$[0]"]


# --- item 5: content types --------------------------------------------------------------------------------------

NOT_JSON = {
    "text/plain": "text/plain",
    "form": "application/x-www-form-urlencoded",
    "multipart": "multipart/form-data; boundary=x",
    "no content type": None,
}


@pytest.mark.parametrize("settings_overrides", [{"auth_enabled": False}])
@pytest.mark.parametrize("kind", list(NOT_JSON))
async def test_a_cross_site_delete_is_415_and_deletes_nothing(anonymous, db, kind):
    """What a web page can make any browser send without asking first (a CORS "simple" request), against a
    metaledger with authentication off (the case where nothing else stops it)."""
    await write_dataset(anonymous)
    headers = {} if NOT_JSON[kind] is None else {"Content-Type": NOT_JSON[kind]}
    response = await anonymous.post("/entities?action=delete", content=orjson.dumps({"urn": DS}), headers=headers)
    assert response.status_code == 415, response.text
    assert response.json()["error"] == "Unsupported Media Type"
    assert await exists(db)
    for url in ("/openapi/v1/proposals", "/openapi/v3/entity/dataset", "/aspects?action=ingestProposal"):
        body = [mcp(aspect="status", value={"removed": True})] if "proposals" in url else {}
        assert (await anonymous.post(url, content=orjson.dumps(body), headers=headers)).status_code == 415
    assert (await anonymous.get(f"/openapi/v3/entity/dataset/{Q}/status")).json()["value"] == {"removed": False}


async def test_json_content_types_are_accepted(client, db):
    for content_type in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
        response = await client.post(
            "/openapi/v1/proposals", content=orjson.dumps([mcp()]), headers={"Content-Type": content_type}
        )
        assert response.status_code == 200, (content_type, response.text)
    patch = [{"op": "add", "path": "/customProperties/k", "value": "v"}]
    response = await client.patch(
        f"/openapi/v3/entity/dataset/{Q}/datasetProperties",
        content=orjson.dumps(patch),
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert response.status_code == 200, response.text
    stored = {
        r["aspect"]: (r["version"], orjson.loads(r["metadata"]))
        for r in await db.fetch(
            "SELECT aspect, (systemmetadata::jsonb ->> 'version')::int AS version, metadata FROM metadata_aspect_v2 "
            "WHERE urn = $1 AND aspect IN ('status', 'datasetProperties') AND version = 0",
            DS,
        )
    }
    assert stored["status"] == (1, {"removed": False})  # written once, then the same value again (no-ops)
    assert stored["datasetProperties"][1]["customProperties"] == {"k": "v"}
    response = await client.post("/entities?action=delete", content=orjson.dumps({"urn": DS}), headers=JSON)
    assert response.status_code == 200 and not await exists(db)


async def test_model_bodies_and_the_schema_registry_check_the_content_type(client):
    token = {"actor": "urn:li:corpuser:alice", "role": "reader"}

    async def alices_tokens() -> list[str]:
        listed = await client.get("/openapi/v1/auth/tokens", params={"actor": token["actor"]})
        return [t["role"] for t in listed.json()["tokens"]]

    assert (
        await client.post(
            "/openapi/v1/auth/tokens", content=orjson.dumps(token), headers={"Content-Type": "text/plain"}
        )
    ).status_code == 415
    assert await alices_tokens() == []
    assert (await client.post("/openapi/v1/auth/tokens", json=token)).status_code == 201
    assert await alices_tokens() == ["reader"]
    url = "/schema-registry/api/subjects/hostile-value/versions"
    schema = orjson.dumps({"schema": '"string"'})
    refused = await client.post(url, content=schema, headers={"Content-Type": "text/plain"})
    assert refused.status_code == 415 and refused.json()["error_code"] == 415
    assert (await client.post(url, content=schema)).status_code == 415
    assert (await client.get(url)).status_code == 404  # nothing registered
    ids = set()
    for content_type in (
        "application/vnd.schemaregistry.v1+json",
        "application/vnd.schemaregistry+json",
        "application/json",
        "application/octet-stream",
    ):
        response = await client.post(url, content=schema, headers={"Content-Type": content_type})
        assert response.status_code == 200, (content_type, response.text)
        ids.add(response.json()["id"])
    assert len(ids) == 1 and (await client.get(url)).json() == [1]  # one schema, registered once, read back
    assert (await client.get(f"/schema-registry/api/schemas/ids/{ids.pop()}")).json() == {"schema": '"string"'}


# --- CORS -------------------------------------------------------------------------------------------------------

PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}


async def test_cors_is_off_by_default(client):
    response = await client.get("/openapi/v1/auth/me", headers={"Origin": "https://ui.example.com"})
    assert response.status_code == 200 and "access-control-allow-origin" not in response.headers
    preflight = await client.options("/openapi/v1/proposals", headers={"Origin": "https://ui.example.com", **PREFLIGHT})
    assert "access-control-allow-origin" not in preflight.headers


@pytest.mark.parametrize("settings_overrides", [{"cors_origins": ["https://ui.example.com"]}])
async def test_cors_allows_the_configured_origins_only(client):
    preflight = await client.options("/openapi/v1/proposals", headers={"Origin": "https://ui.example.com", **PREFLIGHT})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://ui.example.com"
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    response = await client.get("/openapi/v1/auth/me", headers={"Origin": "https://ui.example.com"})
    assert response.headers["access-control-allow-origin"] == "https://ui.example.com"
    other = await client.options("/openapi/v1/proposals", headers={"Origin": "https://evil.example.com", **PREFLIGHT})
    assert "access-control-allow-origin" not in other.headers
    assert (
        "access-control-allow-origin"
        not in (await client.get("/openapi/v1/auth/me", headers={"Origin": "https://evil.example.com"})).headers
    )


# --- Kafka records: the same depth limit, dead-lettered with the reason --------------------------------------------


class TestKafkaRecords:
    @pytest.fixture
    def topics(self) -> dict[str, str]:
        from tests.helpers import unique_topics

        return unique_topics("topic_mcp", "topic_fmcp", "topic_mce", "topic_fmce")

    @pytest_asyncio.fixture
    async def settings_overrides(self, kafka_broker, topics, monkeypatch) -> dict[str, Any]:
        from tests.helpers import create_topics, fast_groups, kafka_overrides

        await create_topics(kafka_broker.bootstrap_servers, *topics.values())
        fast_groups(monkeypatch)
        return kafka_overrides(kafka_broker.bootstrap_servers, topics)

    async def test_deep_records_are_dead_lettered_not_walked(self, app, kafka_broker, topics, db):
        from app.kafka.consumers import MceConsumer, McpConsumer
        from tests.helpers import dead_letter, produce, read_topic

        bootstrap = kafka_broker.bootstrap_servers
        deep_mcp = (
            b'{"entityType": "dataset", "entityUrn": "' + DS.encode() + b'", "aspectName": "status", '
            b'"aspect": {"value": "{\\"removed\\": false}"}, "systemMetadata": {"properties": '
            + nested_objects(900)
            + b"}}"
        )
        deep_mce = (
            b'{"proposedSnapshot": {"' + SNAPSHOT.encode() + b'": {"urn": "' + DS.encode() + b'", "aspects": '
            b'[{"com.linkedin.dataset.DatasetProperties": {"customProperties": ' + nested_arrays(900) + b"}}]}}}"
        )
        await produce(bootstrap, topics["topic_mcp"], [(DS, deep_mcp)])
        await produce(bootstrap, topics["topic_mce"], [(DS, deep_mce)])
        for consumer_class, failed_topic in ((McpConsumer, "topic_fmcp"), (MceConsumer, "topic_fmce")):
            stop = asyncio.Event()
            consumer = consumer_class(
                app.state.settings, app.state.sessionmaker, app.state.gateway, group_id=f"deep-{topics[failed_topic]}"
            )
            task = asyncio.create_task(consumer.run(stop))
            try:
                (record,) = await read_topic(bootstrap, topics[failed_topic], expect=1)
                _, trace = dead_letter(record)
                assert trace["status"] == 400 and "nested more than 100 levels" in trace["message"], trace
            finally:
                stop.set()
                await asyncio.wait_for(task, 15)
        assert not await exists(db)
