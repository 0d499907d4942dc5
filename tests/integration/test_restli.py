"""DataHub's Rest.li endpoints over HTTP, with the bodies DataHub's Python client sends (see the client protocol notes)."""

from __future__ import annotations

from functools import partial
from urllib.parse import quote

import orjson

from tests import helpers
from tests.helpers import DATASET, RESTLI_HEADERS, restli_propose

OTHER = "urn:li:dataset:(urn:li:dataPlatform:hive,db.customers,PROD)"
TAG = "urn:li:tag:pii"
USER = "urn:li:corpuser:jdoe"
CLIENT_SYSTEM_METADATA = {
    "lastObserved": 1700000000000,
    "runId": "restli-test",
    "lastRunId": "no-run-id-provided",
    "properties": {"clientId": "acryl-datahub", "clientVersion": "1.7.0.17"},
}
# As DataHub's Python client sends them: the aspect value as a JSON string, with the client's systemMetadata.
mcp = partial(helpers.mcp, encode=True, systemMetadata=CLIENT_SYSTEM_METADATA)


async def get_aspect(client, urn: str, aspect: str, version: int = 0):
    return await client.get(
        f"/aspects/{quote(urn, safe='')}", params={"aspect": aspect, "version": version}, headers=RESTLI_HEADERS
    )


async def test_ingest_proposal_and_batch_then_versioned_aspect_reads(client, db):
    response = await restli_propose(client, mcp("status", {"removed": False}))
    assert response.status_code == 200 and response.json() == {"value": "success"}
    # `datahub put` posts to /aspects/ (trailing slash) without systemMetadata
    put = mcp("datasetProperties", {"description": "v1"})
    del put["systemMetadata"]
    response = await restli_propose(client, put, path="/aspects/")
    assert response.status_code == 200, response.text
    response = await restli_propose(
        client,
        mcp("datasetProperties", {"description": "v2"}),
        mcp("status", {"removed": False}, urn=OTHER),
        async_="true",
    )  # no Kafka configured: applied synchronously
    assert response.status_code == 200 and response.json() == {"value": "success"}

    latest = await get_aspect(client, DATASET, "datasetProperties")
    assert latest.status_code == 200
    assert latest.json() == {
        "aspect": {"com.linkedin.dataset.DatasetProperties": {"description": "v2", "customProperties": {}, "tags": []}},
        "version": 0,
    }
    first = (await get_aspect(client, DATASET, "datasetProperties", version=1)).json()
    assert first["version"] == 1 and first["aspect"]["com.linkedin.dataset.DatasetProperties"]["description"] == "v1"
    key = (await get_aspect(client, DATASET, "datasetKey")).json()
    assert key["aspect"] == {
        "com.linkedin.metadata.key.DatasetKey": {
            "platform": "urn:li:dataPlatform:hive",
            "name": "db.orders",
            "origin": "PROD",
        }
    }
    assert (
        await db.fetchval("SELECT count(DISTINCT urn) FROM metadata_aspect_v2 WHERE urn LIKE 'urn:li:dataset:%'") == 2
    )

    missing = await get_aspect(client, DATASET, "ownership")
    assert missing.status_code == 404 and set(missing.json()) == {"error", "message", "issues"}
    assert (
        await get_aspect(client, "urn:li:dataset:(urn:li:dataPlatform:hive,nope,PROD)", "datasetKey")
    ).status_code == 404
    assert (await get_aspect(client, DATASET, "datasetProfile")).status_code == 404  # timeseries: never versioned
    assert (await get_aspect(client, DATASET, "noSuchAspect")).status_code == 400
    # telemetry, as the client's test_connection asks (404 means "not there")
    assert (await get_aspect(client, "urn:li:telemetry:clientId", "telemetryClientId")).status_code == 404


async def test_batch_is_one_transaction_and_names_every_bad_proposal(client, db):
    response = await restli_propose(
        client,
        mcp("status", {"removed": False}),
        mcp("status", {"removed": "yes"}),
        mcp("noSuchAspect", {}),
    )
    assert response.status_code == 400
    error = response.json()
    assert sorted({i["index"] for i in error["issues"]}) == [1, 2]
    assert any(i["path"].startswith("$.proposals[1].aspect.value") for i in error["issues"]), error
    assert any(i["path"].startswith("$.proposals[2]") for i in error["issues"]), error
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn LIKE 'urn:li:dataset:%'") == 0

    single = await restli_propose(client, mcp("status", {"removed": 3}))
    assert single.status_code == 400 and single.json()["issues"][0]["path"].startswith("$.proposal.aspect.value")
    assert (await client.post("/aspects?action=ingestProposal", json={"proposals": []})).status_code == 400
    assert (await client.post("/aspects?action=nope", json={})).status_code == 400
    assert (await client.post("/entities?action=nope", json={})).status_code == 400


async def test_patch_proposals_with_json_patch_content_type(client):
    assert (await restli_propose(client, mcp("datasetProperties", {"description": "d"}))).status_code == 200
    patch = [
        {"op": "add", "path": "/description", "value": "patched"},
        {"op": "add", "path": "/customProperties/k", "value": "v"},
    ]
    response = await restli_propose(
        client, mcp("datasetProperties", patch, change_type="PATCH", content_type="application/json-patch+json")
    )
    assert response.status_code == 200, response.text
    value = (await get_aspect(client, DATASET, "datasetProperties")).json()["aspect"][
        "com.linkedin.dataset.DatasetProperties"
    ]
    assert value["description"] == "patched" and value["customProperties"] == {"k": "v"}


async def test_entities_v2(client):
    await restli_propose(client, mcp("status", {"removed": False}), mcp("datasetProperties", {"description": "d"}))
    base = f"/entitiesV2/{quote(DATASET, safe='')}"
    everything = (await client.get(base, headers=RESTLI_HEADERS)).json()
    assert everything["urn"] == DATASET and everything["entityName"] == "dataset"
    assert set(everything["aspects"]) == {"datasetKey", "status", "datasetProperties"}
    status = everything["aspects"]["status"]
    assert status["name"] == "status" and status["type"] == "VERSIONED" and status["version"] == 0
    assert status["value"] == {"removed": False}
    assert status["created"]["actor"] == "urn:li:corpuser:datahub" and status["created"]["time"] > 1_700_000_000_000
    assert status["systemMetadata"]["runId"] == "restli-test"

    # literal parens and commas, as the client sends them
    some = (await client.get(f"{base}?aspects=List(status,ownership)", headers=RESTLI_HEADERS)).json()
    assert set(some["aspects"]) == {"datasetKey", "status"}
    no_key = (await client.get(f"{base}?aspects=List(status)&alwaysIncludeKeyAspect=false")).json()
    assert set(no_key["aspects"]) == {"status"}

    unknown_urn = "urn:li:dataset:(urn:li:dataPlatform:hive,nope,PROD)"
    unknown = (await client.get(f"/entitiesV2/{quote(unknown_urn, safe='')}")).json()
    assert list(unknown["aspects"]) == ["datasetKey"]
    assert unknown["aspects"]["datasetKey"]["value"] == {
        "platform": "urn:li:dataPlatform:hive",
        "name": "nope",
        "origin": "PROD",
    }
    assert (await client.get(f"{base}?aspects=List(bogus)")).status_code == 400


def profile(ts: int, rows: int, partition: str | None = None, message_id: str | None = None) -> dict:
    value: dict = {"timestampMillis": ts, "rowCount": rows}
    if partition:
        value["partitionSpec"] = {"partition": partition, "type": "PARTITION"}
    if message_id:
        value["messageId"] = message_id
    return value


async def timeseries(client, **body):
    body = {"urn": DATASET, "entity": "dataset", "aspect": "datasetProfile", **body}
    response = await client.post(
        "/aspects?action=getTimeseriesAspectValues", content=orjson.dumps(body), headers=RESTLI_HEADERS
    )
    assert response.status_code == 200, response.text
    value = response.json()["value"]
    assert value["entityName"] == "dataset" and value["aspectName"] == "datasetProfile"
    return value


def row_counts(value) -> list[int]:
    return [orjson.loads(v["aspect"]["value"])["rowCount"] for v in value["values"]]


async def test_timeseries_values_newest_first_filtered_and_deduplicated(client):
    assert (
        await restli_propose(
            client,
            *[mcp("datasetProfile", profile(1000 * i, i)) for i in range(1, 6)],
            mcp("datasetProfile", profile(2000, 22)),  # same point as rowCount 2: newest write wins
            mcp("datasetProfile", profile(3000, 33, partition="p1")),  # another partition: another point
            mcp("datasetProfile", profile(9000, 99), urn=OTHER),
        )
    ).status_code == 200
    everything = await timeseries(client)
    # points with the same timestamp (33 and 3) come in either order, as in DataHub
    assert row_counts(everything) in ([5, 4, 33, 3, 22, 1], [5, 4, 3, 33, 22, 1]) and everything["limit"] == 10_000
    first = everything["values"][0]
    assert first["aspect"]["contentType"] == "application/json" and first["systemMetadata"]["runId"] == "restli-test"
    assert row_counts(await timeseries(client, limit=2)) == [5, 4]
    assert row_counts(await timeseries(client, latestValue=True)) == [5]
    assert row_counts(await timeseries(client, startTimeMillis=2000, endTimeMillis=3000)) in ([33, 3, 22], [3, 33, 22])
    # the client's filter form (get_latest_timeseries_value)
    equal = {"or": [{"and": [{"field": "rowCount", "values": ["4"], "condition": "EQUAL"}]}]}
    assert row_counts(await timeseries(client, filter=equal, limit=1)) == [4]
    nested = {"or": [{"and": [{"field": "partitionSpec.partition", "values": ["p1"], "condition": "EQUAL"}]}]}
    assert row_counts(await timeseries(client, filter=nested)) == [33]
    assert sorted(row_counts(await timeseries(client, filter={"or": [{"and": []}]}))) == [1, 3, 4, 5, 22, 33]
    assert sorted(row_counts(await timeseries(client, filter={}))) == [1, 3, 4, 5, 22, 33]

    bad = await client.post(
        "/aspects?action=getTimeseriesAspectValues", json={"urn": DATASET, "entity": "dataset", "aspect": "status"}
    )
    assert bad.status_code == 400


async def test_delete_entity_aspect_and_timeseries_range(client, db):
    await restli_propose(
        client,
        mcp("status", {"removed": False}),
        mcp("datasetProperties", {"description": "a"}),
        mcp("datasetProperties", {"description": "b"}),
        *[mcp("datasetProfile", profile(1000 * i, i)) for i in range(1, 5)],
        mcp("status", {"removed": False}, urn=OTHER),
    )

    async def delete(body):
        response = await client.post("/entities?action=delete", content=orjson.dumps(body), headers=RESTLI_HEADERS)
        assert response.status_code == 200, response.text
        return response.json()["value"]

    # a timeseries range (bounds inclusive)
    assert await delete(
        {"urn": DATASET, "aspectName": "datasetProfile", "startTimeMillis": 2000, "endTimeMillis": 3000}
    ) == {"urn": DATASET, "rows": 0, "timeseriesRows": 2}
    assert row_counts(await timeseries(client)) == [4, 1]
    # a versioned aspect (every version)
    assert await delete({"urn": DATASET, "aspectName": "datasetProperties"}) == {
        "urn": DATASET,
        "rows": 2,
        "timeseriesRows": 0,
    }
    assert (await get_aspect(client, DATASET, "datasetProperties")).status_code == 404
    # the entity: its rows and its remaining timeseries points
    assert await delete({"urn": DATASET}) == {"urn": DATASET, "rows": 2, "timeseriesRows": 2}
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", DATASET) == 0
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", OTHER) == 2
    assert await delete({"urn": DATASET}) == {"urn": DATASET, "rows": 0, "timeseriesRows": 0}
    # a delete change log was committed for the entity
    assert (
        await db.fetchval(
            "SELECT count(*) FROM change_log_outbox WHERE urn = $1 AND change_type = 'DELETE' AND aspect = 'datasetKey'"
            " AND topic = 'MetadataChangeLog_Versioned_v1'",
            DATASET,
        )
        == 1
    )

    for body in (
        {},
        {"urn": "not-an-urn"},
        {"urn": DATASET, "aspectName": "nope"},
        {"urn": DATASET, "aspectName": "status", "startTimeMillis": 1},
    ):
        response = await client.post("/entities?action=delete", json=body)
        assert response.status_code == 400, (body, response.text)


async def test_delete_references(client, db):
    owners = {
        "owners": [{"owner": USER, "type": "DATAOWNER"}, {"owner": "urn:li:corpuser:other", "type": "DATAOWNER"}],
        "lastModified": {"time": 1, "actor": USER},
    }
    await restli_propose(
        client,
        mcp("globalTags", {"tags": [{"tag": TAG}, {"tag": "urn:li:tag:gold"}]}),
        mcp("ownership", owners),
        mcp(
            "editableSchemaMetadata",
            {"editableSchemaFieldInfo": [{"fieldPath": "email", "globalTags": {"tags": [{"tag": TAG}]}}]},
        ),
        mcp("globalTags", {"tags": [{"tag": TAG}]}, urn=OTHER),
        mcp("datasetProperties", {"description": f"mentions {TAG} in text only"}, urn=OTHER),
        mcp("tagProperties", {"name": "pii"}, urn=TAG, entity="tag"),
    )
    dry = await client.post("/entities?action=deleteReferences", json={"urn": TAG, "dryRun": True})
    assert dry.status_code == 200, dry.text
    value = dry.json()["value"]
    assert value["total"] == 3
    assert sorted((r["relationshipType"], r["entity"], r["aspect"]) for r in value["relatedAspects"]) == sorted(
        [
            ("TaggedWith", DATASET, "editableSchemaMetadata"),
            ("TaggedWith", DATASET, "globalTags"),
            ("TaggedWith", OTHER, "globalTags"),
        ]
    )
    assert (await get_aspect(client, OTHER, "globalTags")).json()["aspect"]["com.linkedin.common.GlobalTags"][
        "tags"
    ] == [{"tag": TAG}]

    done = await client.post("/entities?action=deleteReferences", json={"urn": TAG, "dryRun": False})
    assert done.status_code == 200 and done.json()["value"]["total"] == 3
    tags = (await get_aspect(client, DATASET, "globalTags")).json()["aspect"]["com.linkedin.common.GlobalTags"]["tags"]
    assert tags == [{"tag": "urn:li:tag:gold"}]
    assert (await get_aspect(client, OTHER, "globalTags")).json()["aspect"]["com.linkedin.common.GlobalTags"][
        "tags"
    ] == []
    schema = (await get_aspect(client, DATASET, "editableSchemaMetadata")).json()["aspect"]
    assert (
        schema["com.linkedin.schema.EditableSchemaMetadata"]["editableSchemaFieldInfo"][0]["globalTags"]["tags"] == []
    )
    # a mere mention is not a reference
    props = (await get_aspect(client, OTHER, "datasetProperties")).json()["aspect"][
        "com.linkedin.dataset.DatasetProperties"
    ]
    assert TAG in props["description"]
    again = await client.post("/entities?action=deleteReferences", json={"urn": TAG, "dryRun": False})
    assert again.json()["value"] == {"total": 0, "relatedAspects": []}

    # a user: the owner entry goes, the audit stamp naming the user stays
    done = await client.post("/entities?action=deleteReferences", json={"urn": USER, "dryRun": False})
    assert done.json()["value"]["relatedAspects"] == [
        {"relationshipType": "OwnedBy", "entity": DATASET, "aspect": "ownership"}
    ]
    ownership = (await get_aspect(client, DATASET, "ownership")).json()["aspect"]["com.linkedin.common.Ownership"]
    assert [o["owner"] for o in ownership["owners"]] == ["urn:li:corpuser:other"] and ownership["lastModified"][
        "actor"
    ] == USER

    # a container reference outside any array: the aspect cannot live without it and is deleted
    container = "urn:li:container:abc"
    await restli_propose(client, mcp("container", {"container": container}))
    done = await client.post("/entities?action=deleteReferences", json={"urn": container, "dryRun": False})
    assert done.json()["value"]["total"] == 1
    assert (await get_aspect(client, DATASET, "container")).status_code == 404


async def test_legacy_mce_still_served(client):
    body = {
        "entity": {
            "value": {
                "com.linkedin.metadata.snapshot.DatasetSnapshot": {
                    "urn": DATASET,
                    "aspects": [{"com.linkedin.common.Status": {"removed": False}}],
                }
            }
        }
    }
    response = await client.post("/entities?action=ingest", json=body, headers=RESTLI_HEADERS)
    assert response.status_code == 200 and response.json() == {}
    assert (await get_aspect(client, DATASET, "status")).json()["aspect"] == {
        "com.linkedin.common.Status": {"removed": False}
    }
