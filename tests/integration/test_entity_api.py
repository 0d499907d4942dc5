"""DataHub's OpenAPI v3 entity endpoints."""

from __future__ import annotations

from urllib.parse import quote

DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"
PATH = f"/openapi/v3/entity/dataset/{quote(DATASET, safe='')}"


async def test_batch_upsert_then_read_entity_and_aspect(client):
    body = [
        {"urn": DATASET, "status": {"value": {"removed": False}}, "datasetProperties": {"value": {"name": "orders"}}},
    ]
    response = await client.post("/openapi/v3/entity/dataset?async=false", json=body)
    assert response.status_code == 200, response.text
    written = response.json()[0]
    assert written["urn"] == DATASET
    assert written["status"]["systemMetadata"]["version"] == "1"
    # defaults of the schema are applied
    assert written["datasetProperties"]["value"]["customProperties"] == {}

    entity = (await client.get(PATH)).json()
    assert set(entity) == {"urn", "datasetKey", "status", "datasetProperties"}
    assert entity["status"] == {"value": {"removed": False}}
    only = (await client.get(PATH, params={"aspects": ["status"], "systemMetadata": "true"})).json()
    assert set(only) == {"urn", "status"} and only["status"]["systemMetadata"]["version"] == "1"

    aspect = await client.get(f"{PATH}/status")
    assert aspect.status_code == 200 and aspect.json()["value"] == {"removed": False}
    assert (await client.head(PATH)).status_code == 204
    assert (await client.head(f"{PATH}/subTypes")).status_code == 404


async def stored_aspect(client, aspect: str) -> tuple[dict, str] | None:
    """The dataset's aspect as read back: (value, version), None when absent."""
    entity = (await client.get(PATH, params={"aspects": [aspect], "systemMetadata": "true"})).json()
    return (entity[aspect]["value"], entity[aspect]["systemMetadata"]["version"]) if aspect in entity else None


async def test_single_aspect_defaults_to_create_and_headers_select_upsert(client):
    url = f"{PATH}/status"
    assert (await client.post(url, json={"value": {"removed": False}})).status_code == 200
    assert await stored_aspect(client, "status") == ({"removed": False}, "1")
    # default createIfNotExists=true: a second write is a CREATE conflict
    conflict = await client.post(url, json={"value": {"removed": True}})
    assert conflict.status_code == 409
    assert await stored_aspect(client, "status") == ({"removed": False}, "1")
    # an If-Version-Match header (in the body, or as an HTTP header) makes it a conditional UPSERT
    ok = await client.post(url, json={"value": {"removed": True}, "headers": {"If-Version-Match": "1"}})
    assert ok.status_code == 200 and ok.json()["status"]["systemMetadata"]["version"] == "2"
    assert await stored_aspect(client, "status") == ({"removed": True}, "2")
    stale = await client.post(url, json={"value": {"removed": False}}, headers={"If-Version-Match": "1"})
    assert stale.status_code == 412
    assert await stored_aspect(client, "status") == ({"removed": True}, "2")
    upsert = await client.post(url, params={"createIfNotExists": "false"}, json={"value": {"removed": False}})
    assert upsert.status_code == 200
    assert await stored_aspect(client, "status") == ({"removed": False}, "3")


async def test_history_reads_by_version(client):
    url = f"{PATH}/status"
    for removed in (False, True, False):
        await client.post(url, params={"createIfNotExists": "false"}, json={"value": {"removed": removed}})
    assert (await client.get(url, params={"version": 2})).json()["value"] == {"removed": True}
    assert (await client.get(url, params={"version": 3})).json()["value"] == {"removed": False}
    assert (await client.get(url, params={"version": 1})).json()["version"] == "1"
    missing = await client.get(url, params={"version": 9})
    assert missing.status_code == 404 and missing.json()["error"] == "Not Found"


async def test_delete_endpoints(client):
    await client.post(
        "/openapi/v3/entity/dataset",
        json=[
            {"urn": DATASET, "status": {"value": {"removed": False}}, "subTypes": {"value": {"typeNames": ["Table"]}}}
        ],
    )
    assert (await client.delete(f"{PATH}/subTypes")).json()["status"] == "DELETED"
    assert (await client.get(f"{PATH}/subTypes")).status_code == 404
    assert (await client.delete(PATH)).status_code == 200
    assert (await client.get(PATH)).status_code == 404
    assert (await client.head(PATH)).status_code == 404


async def test_batch_get(client):
    await client.post("/openapi/v3/entity/dataset", json=[{"urn": DATASET, "status": {"value": {"removed": False}}}])
    response = await client.post(
        "/openapi/v3/entity/dataset/batchGet",
        json=[{"urn": DATASET, "status": {}}, {"urn": "urn:li:dataset:(urn:li:dataPlatform:hive,none,PROD)"}],
    )
    assert response.json() == [{"urn": DATASET, "status": {"value": {"removed": False}}}]


async def test_malformed_bodies_are_400_with_paths(client):
    response = await client.post("/openapi/v3/entity/dataset", json=[{"status": {"value": {"removed": False}}}])
    assert response.status_code == 400 and response.json()["issues"][0]["path"] == "$[0].urn"
    response = await client.post("/openapi/v3/entity/dataset", json=[{"urn": DATASET, "status": {"removed": False}}])
    assert response.status_code == 400 and response.json()["issues"][0]["aspect"] == "status"
    response = await client.post("/openapi/v3/entity/nosuchentity", json=[])
    assert response.status_code == 400 and "nosuchentity" in response.json()["message"]


async def test_config_and_health(client):
    config = (await client.get("/config")).json()
    assert config["noCode"] == "true"
    major, minor, patch = (int(x) for x in config["versions"]["acryldata/datahub"]["version"].lstrip("v").split("."))
    # >= 1.0.1: the Python SDK v2 writes through OpenAPI v3; < 1.7.0: sources keep sending status as an UPSERT
    assert (1, 0, 1) <= (major, minor, patch) < (1, 7, 0)
    health = await client.get("/health")
    assert health.status_code == 200 and health.json()["database"] == "ok"


async def test_patch_endpoints(client):
    await client.post(
        "/openapi/v3/entity/dataset?async=false",
        json=[{"urn": DATASET, "datasetProperties": {"value": {"name": "orders"}}}],
    )
    batch = [
        {
            "urn": DATASET,
            "datasetProperties": {"value": {"patch": [{"op": "add", "path": "/description", "value": "patched"}]}},
        }
    ]
    response = await client.patch("/openapi/v3/entity/dataset?async=false", json=batch)
    assert response.status_code == 200, response.text
    assert response.json()[0]["datasetProperties"]["systemMetadata"]["version"] == "2"
    single = await client.patch(
        f"{PATH}/datasetProperties", json={"patch": [{"op": "add", "path": "/customProperties/team", "value": "core"}]}
    )
    assert single.status_code == 200, single.text
    value = (await client.get(f"{PATH}/datasetProperties")).json()["value"]
    assert value["description"] == "patched" and value["customProperties"] == {"team": "core"}
    patched = await stored_aspect(client, "datasetProperties")
    assert patched[1] == "3"
    stale = await client.patch(
        f"{PATH}/datasetProperties", json=[{"op": "remove", "path": "/description"}], headers={"If-Version-Match": "1"}
    )
    assert stale.status_code == 412
    missing = await client.patch(
        "/openapi/v3/entity/dataset?async=false",
        json=[{"urn": DATASET, "datasetProperties": {"value": {"nopatch": []}}}],
    )
    assert missing.status_code == 400, missing.text
    assert [i["path"] for i in missing.json()["issues"]] == ["$[0].datasetProperties.value"], missing.text
    assert await stored_aspect(client, "datasetProperties") == patched  # neither changed it
