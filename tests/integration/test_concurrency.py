"""Concurrent writers: compare-and-set with If-Version-Match, and first-insert races, against the real Postgres."""

from __future__ import annotations

import asyncio

import orjson

DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,db.counter,PROD)"


def properties(count: int, version_header: str | None = None) -> dict:
    proposal = {
        "entityType": "dataset",
        "entityUrn": DATASET,
        "aspectName": "datasetProperties",
        "aspect": {"value": {"customProperties": {"count": str(count)}}},
    }
    if version_header is not None:
        proposal["headers"] = {"If-Version-Match": version_header}
    return proposal


async def test_read_modify_write_with_if_version_match_loses_no_update(client, db):
    await client.post("/openapi/v1/proposals", json=[properties(0)])
    winners: list[int] = []
    losers = 0

    async def increment_once() -> None:
        nonlocal losers
        while True:
            current = (
                await client.get(
                    f"/openapi/v3/entity/dataset/{DATASET}/datasetProperties", params={"systemMetadata": "true"}
                )
            ).json()
            count = int(current["value"]["customProperties"]["count"])
            response = await client.post(
                "/openapi/v1/proposals", json=[properties(count + 1, current["systemMetadata"]["version"])]
            )
            if response.status_code == 200:
                winners.append(count + 1)
                return
            assert response.status_code == 412, response.text
            losers += 1

    await asyncio.gather(*(increment_once() for _ in range(32)))
    assert sorted(winners) == list(range(1, 33))  # every increment landed exactly once
    history = await db.fetch(
        "SELECT version, metadata, systemmetadata FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'datasetProperties'",
        DATASET,
    )
    latest = next(r for r in history if r["version"] == 0)
    assert orjson.loads(latest["systemmetadata"])["version"] == "33"
    assert orjson.loads(latest["metadata"])["customProperties"]["count"] == "32"
    # contiguous versions: history rows 13..32 (20 kept) and each holds count = version - 1
    kept = sorted(
        (r["version"], orjson.loads(r["metadata"])["customProperties"]["count"]) for r in history if r["version"]
    )
    assert kept == [(v, str(v - 1)) for v in range(13, 33)]
    assert losers > 0


async def test_first_insert_race_on_a_new_aspect_never_500s(client, db):
    async def write(i: int):
        return await client.post("/openapi/v1/proposals", json=[properties(i)])

    responses = await asyncio.gather(*(write(i) for i in range(20)))
    assert {r.status_code for r in responses} == {200}
    versions = sorted(int(r.json()["results"][0]["version"]) for r in responses)
    assert versions == list(range(1, 21))
    logs = await db.fetch("SELECT version FROM change_log_outbox WHERE aspect = 'datasetProperties' ORDER BY id")
    assert [r["version"] for r in logs] == list(range(1, 21))  # one change log per version, in commit order
