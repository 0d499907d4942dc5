"""The OpenAPI v3 batchGet reads the version an aspect's `If-Version-Match` header asks for, as DataHub's
EntityController.getEntityBatch does (`[{"urn", "<aspect>": {"headers": {"If-Version-Match": "<n>"}}}]`, the request
DataHub's MCP server's get_aspect_history sends): that version, left out when there is no such version (and the
entity left out when nothing of it is found); 0 or no header: the latest. What the caller may not see is left out."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import pytest

from tests.helpers import bearer, ds, mcp, propose

pytestmark = pytest.mark.asyncio

ORDERS, USERS = ds("hist.orders"), ds("hist.users")
BATCH_GET = "/openapi/v3/entity/dataset/batchGet"
ALICE, BOB = "urn:li:corpuser:alice", "urn:li:corpuser:bob"
ALICE_VIEW = "urn:li:dataHubView:alice_private"


def asking(version: int | str | None) -> dict[str, Any]:
    return {} if version is None else {"headers": {"If-Version-Match": str(version)}}


async def write_history(client) -> None:
    """Three versions of ORDERS' datasetProperties (descriptions v1, v2, v3) and one of its status; one of USERS'."""
    for n in (1, 2, 3):
        await propose(client, mcp("datasetProperties", {"description": f"v{n}"}, urn=ORDERS))
    await propose(
        client,
        mcp("status", {"removed": False}, urn=ORDERS),
        mcp("datasetProperties", {"description": "u1"}, urn=USERS),
    )


async def batch_get(client, body: list[dict[str, Any]], expect: int = 200, **kw: Any) -> Any:
    response = await client.post(BATCH_GET, json=body, **kw)
    assert response.status_code == expect, response.text
    return response.json()


def described(answer: list[dict[str, Any]]) -> dict[str, str | None]:
    return {
        e["urn"]: (e["datasetProperties"]["value"]["description"] if "datasetProperties" in e else None) for e in answer
    }


async def test_each_aspect_at_the_version_its_header_asks_for(client):
    await write_history(client)
    for version, description in ((1, "v1"), (2, "v2"), (3, "v3"), (0, "v3"), (None, "v3")):
        answer = await batch_get(client, [{"urn": ORDERS, "datasetProperties": asking(version)}])
        assert described(answer) == {ORDERS: description}, version
        assert set(answer[0]) == {"urn", "datasetProperties"}

    # per aspect and per URN in one request, with the system metadata the history tool reads the version from
    answer = await batch_get(
        client,
        [
            {"urn": ORDERS, "datasetProperties": asking(1), "status": {}},
            {"urn": USERS, "datasetProperties": asking(1)},
        ],
        params={"systemMetadata": "true"},
    )
    assert answer[0]["datasetProperties"]["value"]["description"] == "v1"
    assert answer[0]["datasetProperties"]["systemMetadata"]["version"] == "1"
    assert answer[0]["status"]["value"] == {"removed": False}
    assert answer[1]["urn"] == USERS and answer[1]["datasetProperties"]["value"]["description"] == "u1"
    latest = await batch_get(client, [{"urn": ORDERS, "datasetProperties": {}}], params={"systemMetadata": "true"})
    assert latest[0]["datasetProperties"]["systemMetadata"]["version"] == "3"


async def test_an_unknown_version_is_left_out(client):
    await write_history(client)
    # the version asked is absent: that aspect is left out, the rest answered
    answer = await batch_get(client, [{"urn": ORDERS, "datasetProperties": asking(9), "status": {}}])
    assert answer == [{"urn": ORDERS, "status": {"value": {"removed": False}}}]
    # nothing of the entity found: the entity is left out, as DataHub's batchGet does
    assert await batch_get(client, [{"urn": ORDERS, "datasetProperties": asking(4)}]) == []
    assert await batch_get(client, [{"urn": ds("hist.never"), "datasetProperties": asking(1)}]) == []
    assert described(
        await batch_get(
            client, [{"urn": ORDERS, "datasetProperties": asking(7)}, {"urn": USERS, "datasetProperties": asking(1)}]
        )
    ) == {USERS: "u1"}


async def test_a_version_that_is_no_version_is_a_400_naming_it(client):
    await write_history(client)
    for bad in ("latest", "-1", "1.5", "", str(2**63)):
        refused = await batch_get(client, [{"urn": ORDERS, "datasetProperties": asking(bad)}], expect=400)
        assert refused["issues"][0]["path"] == "$[0].datasetProperties.headers.If-Version-Match", bad
    refused = await batch_get(
        client, [{"urn": ORDERS, "datasetProperties": {"headers": {"If-Version-Match": 2}}}], expect=400
    )
    assert refused["issues"][0]["path"] == "$[0].datasetProperties.headers"
    # a timeseries aspect has no versions
    refused = await batch_get(client, [{"urn": ORDERS, "datasetProfile": asking(2)}], expect=400)
    assert refused["issues"][0]["path"] == "$[0].datasetProfile.headers.If-Version-Match"
    # the header's name in any case, as an HTTP header's
    answer = await batch_get(client, [{"urn": ORDERS, "datasetProperties": {"headers": {"if-version-match": "2"}}}])
    assert described(answer) == {ORDERS: "v2"}


async def test_a_version_the_caller_may_not_see_is_left_out(app, client):
    """A PERSONAL view is its creator's: another reader gets none of its versions (nor its latest)."""

    def info(name: str) -> dict[str, Any]:
        value = {
            "name": name,
            "type": "PERSONAL",
            "definition": {"entityTypes": [], "filter": {"or": []}},
            "created": {"time": 1, "actor": ALICE},
            "lastModified": {"time": 1, "actor": ALICE},
        }
        return mcp("dataHubViewInfo", value, urn=ALICE_VIEW, entity="dataHubView")

    await propose(client, info("first"))
    await propose(client, info("second"))
    path = "/openapi/v3/entity/dataHubView/batchGet"
    body = [{"urn": ALICE_VIEW, "dataHubViewInfo": asking(1)}]
    alice = await bearer(app, "reader", actor=ALICE)
    bob = await bearer(app, "reader", actor=BOB)

    mine = await client.post(path, json=body, headers=alice)
    assert mine.status_code == 200, mine.text
    assert mine.json()[0]["dataHubViewInfo"]["value"]["name"] == "first"
    for asked in (
        body,
        [{"urn": ALICE_VIEW, "dataHubViewInfo": asking(2)}],
        [{"urn": ALICE_VIEW, "dataHubViewInfo": {}}],
    ):
        theirs = await client.post(path, json=asked, headers=bob)
        assert theirs.status_code == 200 and theirs.json() == [], theirs.text


async def test_each_version_says_who_wrote_it_and_when(app, client):
    """DataHub's auditStamp beside each aspect of a v3 read with systemMetadata=true: the history tool shows it."""
    await propose(
        client,
        mcp("datasetProperties", {"description": "by alice"}, urn=ORDERS),
        headers=await bearer(app, "writer", actor=ALICE),
    )
    await propose(
        client,
        mcp("datasetProperties", {"description": "by bob"}, urn=ORDERS),
        headers=await bearer(app, "writer", actor=BOB),
    )
    body = [{"urn": ORDERS, "datasetProperties": asking(1)}]
    first = (await batch_get(client, body, params={"systemMetadata": "true"}))[0]["datasetProperties"]["auditStamp"]
    latest_read = await client.get(
        f"/openapi/v3/entity/dataset/{quote(ORDERS, safe='')}", params={"systemMetadata": "true"}
    )
    latest = latest_read.json()["datasetProperties"]["auditStamp"]
    assert (first["actor"], latest["actor"]) == (ALICE, BOB)
    assert 0 < first["time"] <= latest["time"] <= time.time() * 1000
    # without the system metadata, neither
    plain = await batch_get(client, body)
    assert set(plain[0]["datasetProperties"]) == {"value"}
