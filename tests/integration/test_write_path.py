"""The synchronous write path against the real Postgres: change types, versions, history, no-ops, the outbox."""

from __future__ import annotations

import orjson
import pytest

from tests.helpers import DATASET, mcp, propose

OTHER = "urn:li:dataset:(urn:li:dataPlatform:hive,db.customers,PROD)"


async def rows(db, urn: str = DATASET, aspect: str | None = None):
    query = "SELECT aspect, version, metadata, systemmetadata FROM metadata_aspect_v2 WHERE urn = $1"
    args = [urn]
    if aspect:
        query += " AND aspect = $2"
        args.append(aspect)
    return [
        (r["aspect"], r["version"], orjson.loads(r["metadata"]), orjson.loads(r["systemmetadata"]))
        for r in await db.fetch(query + " ORDER BY aspect, version", *args)
    ]


async def outbox(db, aspect: str | None = None, topic_prefix: str = "MetadataChangeLog_"):
    """Outbox rows (change logs by default; `topic_prefix="PlatformEvent"` for entity change events)."""
    query = (
        "SELECT topic, message_key, aspect, version, change_type, payload FROM change_log_outbox WHERE topic LIKE $1"
    )
    args = [topic_prefix + "%"]
    if aspect:
        query += " AND aspect = $2"
        args.append(aspect)
    records = await db.fetch(query + " ORDER BY id", *args)
    return [dict(r, payload=orjson.loads(r["payload"])) for r in records]


async def test_first_upsert_creates_row_zero_and_the_key_aspect(client, db):
    result = await propose(client, mcp("status", {"removed": False}))
    assert [(r["status"], r["version"]) for r in result["results"]] == [("CREATED", "1")]
    stored = await rows(db)
    assert [(a, v) for a, v, _, _ in stored] == [("datasetKey", 0), ("status", 0)]
    key = stored[0][2]
    assert key == {"platform": "urn:li:dataPlatform:hive", "name": "db.orders", "origin": "PROD"}
    sm = stored[1][3]
    assert sm["version"] == "1" and sm["runId"] == "no-run-id-provided" and sm["lastRunId"] == "no-run-id-provided"
    assert sm["lastObserved"] > 0 and sm["aspectCreated"] == sm["aspectModified"]
    logs = await outbox(db)
    assert [(o["aspect"], o["change_type"], o["version"]) for o in logs] == [
        ("datasetKey", "UPSERT", 1),
        ("status", "UPSERT", 1),
    ]


async def test_changed_value_bumps_version_and_keeps_history(client, db):
    await propose(client, mcp("status", {"removed": False}, systemMetadata={"runId": "run-1"}))
    await propose(client, mcp("status", {"removed": True}, systemMetadata={"runId": "run-2"}))
    stored = await rows(db, aspect="status")
    assert [(v, value, sm["version"]) for _, v, value, sm in stored] == [
        (0, {"removed": True}, "2"),
        (1, {"removed": False}, "1"),
    ]
    assert stored[0][3]["lastRunId"] == "run-1" and stored[0][3]["runId"] == "run-2"
    update = (await outbox(db, "status"))[-1]["payload"]
    assert update["changeType"] == "UPSERT"
    assert orjson.loads(update["aspect"]["value"]) == {"removed": True}
    assert orjson.loads(update["previousAspectValue"]["value"]) == {"removed": False}
    assert update["previousSystemMetadata"]["version"] == "1" and update["systemMetadata"]["version"] == "2"
    assert update["created"]["actor"] == "urn:li:corpuser:datahub"


async def test_no_op_keeps_version_refreshes_run_and_logs_nothing(client, db):
    await propose(client, mcp("status", {"removed": False}, systemMetadata={"runId": "a", "lastObserved": 1000}))
    logs_before = len(await outbox(db))
    result = await propose(
        client, mcp("status", {"removed": False}, systemMetadata={"runId": "b", "lastObserved": 2000})
    )
    assert result["results"][0]["status"] == "UNCHANGED" and result["results"][0]["version"] == "1"
    stored = await rows(db, aspect="status")
    assert len(stored) == 1
    sm = stored[0][3]
    assert (sm["version"], sm["runId"], sm["lastRunId"], sm["lastObserved"]) == ("1", "b", "a", 2000)
    assert len(await outbox(db)) == logs_before


@pytest.mark.parametrize("settings_overrides", [{"always_emit_change_log": True}])
async def test_always_emit_change_log_logs_no_ops_as_restate(client, db, settings_overrides):
    await propose(client, mcp("status", {"removed": False}))
    await propose(client, mcp("status", {"removed": False}))
    assert [o["change_type"] for o in await outbox(db, "status")] == ["UPSERT", "RESTATE"]


async def test_create_conflicts_when_the_aspect_exists_and_if_none_match_drops_it(client, db):
    await propose(client, mcp("status", {"removed": False}, change_type="CREATE"))
    conflict = await propose(client, mcp("status", {"removed": True}, change_type="CREATE"), expect=409)
    assert conflict["issues"][0]["aspect"] == "status" and "already exists" in conflict["issues"][0]["message"]
    # If-None-Match: * turns the conflict into a reported drop while the rest of the batch commits
    result = await propose(
        client,
        mcp("status", {"removed": True}, change_type="CREATE", headers={"If-None-Match": "*"}),
        mcp("status", {"removed": True}, urn=OTHER),
    )
    assert [r["status"] for r in result["results"]] == ["FILTERED", "CREATED"]
    assert (await rows(db, aspect="status"))[0][2] == {"removed": False}


async def test_create_entity_fails_for_an_existing_entity(client, db):
    await propose(client, mcp("status", {"removed": False}, change_type="CREATE_ENTITY"))
    # several aspects of a new entity may be created with CREATE_ENTITY in one batch
    await propose(
        client,
        mcp("status", {"removed": False}, urn=OTHER, change_type="CREATE_ENTITY"),
        mcp("subTypes", {"typeNames": ["Table"]}, urn=OTHER, change_type="CREATE_ENTITY"),
    )
    body = await propose(client, mcp("subTypes", {"typeNames": ["View"]}, change_type="CREATE_ENTITY"), expect=409)
    assert "entity already exists" in body["issues"][0]["message"]


async def test_update_requires_an_existing_aspect(client, db):
    body = await propose(client, mcp("status", {"removed": True}, change_type="UPDATE"), expect=409)
    assert "does not exist" in body["issues"][0]["message"]
    assert await rows(db) == []
    await propose(client, mcp("status", {"removed": False}))
    result = await propose(client, mcp("status", {"removed": True}, change_type="UPDATE"))
    assert result["results"][0]["version"] == "2"


async def test_if_version_match(client, db):
    body = await propose(client, mcp("status", {"removed": False}, headers={"If-Version-Match": "1"}), expect=412)
    assert body["error"] == "Precondition Error" and "actual version -1" in body["issues"][0]["message"]
    await propose(client, mcp("status", {"removed": False}, headers={"if-version-match": "-1"}))
    await propose(client, mcp("status", {"removed": True}, headers={"IF-VERSION-MATCH": "1"}))
    body = await propose(client, mcp("status", {"removed": False}, headers={"If-Version-Match": "1"}), expect=412)
    assert "Expected version 1, actual version 2" in body["issues"][0]["message"]
    assert (await rows(db, aspect="status"))[0][3]["version"] == "2"


async def test_if_modified_and_unmodified_since(client, db):
    await propose(client, mcp("status", {"removed": False}))
    past, future = "2000-01-01T00:00:00Z", "2999-01-01T00:00:00Z"
    await propose(client, mcp("status", {"removed": True}, headers={"If-Modified-Since": past}))
    await propose(client, mcp("status", {"removed": False}, headers={"If-Modified-Since": future}), expect=412)
    await propose(client, mcp("status", {"removed": False}, headers={"If-Unmodified-Since": past}), expect=412)
    await propose(client, mcp("status", {"removed": False}, headers={"If-Unmodified-Since": future}))
    bad = await propose(
        client, mcp("status", {"removed": True}, headers={"If-Unmodified-Since": "yesterday"}), expect=400
    )
    assert "ISO-8601" in bad["issues"][0]["message"]


async def test_a_failed_precondition_fails_the_whole_batch(client, db):
    body = await propose(
        client,
        mcp("status", {"removed": False}, urn=OTHER),
        mcp("status", {"removed": False}, headers={"If-Version-Match": "7"}),
        expect=412,
    )
    assert [i["index"] for i in body["issues"]] == [1]
    assert await rows(db, urn=OTHER) == [] and await outbox(db) == []


async def test_delete_aspect_and_hard_delete_entity(client, db):
    await propose(client, mcp("status", {"removed": False}), mcp("subTypes", {"typeNames": ["Table"]}))
    await propose(client, mcp("status", {"removed": True}))
    result = await propose(client, mcp("status", None, change_type="DELETE"))
    assert result["results"][0]["status"] == "DELETED"
    assert [a for a, *_ in await rows(db)] == ["datasetKey", "subTypes"]
    deleted = (await outbox(db, "status"))[-1]["payload"]
    assert deleted["changeType"] == "DELETE" and "aspect" not in deleted
    assert orjson.loads(deleted["previousAspectValue"]["value"]) == {"removed": True}
    # deleting what is not there is idempotent
    assert (await propose(client, mcp("status", None, change_type="DELETE")))["results"][0]["status"] == "ABSENT"
    # deleting the key aspect deletes the entity, every aspect and version
    await propose(client, mcp("datasetKey", None, change_type="DELETE"))
    assert await rows(db) == []
    assert (await outbox(db, "datasetKey"))[-1]["change_type"] == "DELETE"


async def test_soft_delete_is_a_status_upsert(client, db):
    await propose(client, mcp("status", {"removed": True}))
    response = await client.get(f"/openapi/v3/entity/dataset/{DATASET}/status")
    assert response.json()["value"] == {"removed": True}


async def test_patch_applies_to_the_locked_latest_value_and_is_validated(client, db):
    await propose(client, mcp("datasetProperties", {"name": "orders", "description": "old"}))
    patch = [
        {"op": "add", "path": "/description", "value": "new"},
        {"op": "add", "path": "/customProperties/team", "value": "core"},
    ]
    result = await propose(client, mcp("datasetProperties", patch, change_type="PATCH"))
    assert result["results"][0]["version"] == "2"
    value = (await rows(db, aspect="datasetProperties"))[0][2]
    assert value["description"] == "new" and value["customProperties"] == {"team": "core"} and value["name"] == "orders"
    bad = await propose(
        client,
        mcp("datasetProperties", [{"op": "add", "path": "/description", "value": 5}], change_type="PATCH"),
        expect=400,
    )
    assert "description" in bad["issues"][0]["message"]


async def test_entity_key_aspect_identifies_the_entity(client, db):
    key = {"platform": "urn:li:dataPlatform:hive", "name": "db.orders", "origin": "PROD"}
    proposal = {
        "entityType": "dataset",
        "entityKeyAspect": {"value": orjson.dumps(key).decode(), "contentType": "application/json"},
        "aspectName": "status",
        "aspect": {"value": '{"removed": false}', "contentType": "application/json"},
    }
    result = await propose(client, proposal)
    assert result["results"][0]["urn"] == DATASET
    both = dict(proposal, entityUrn=DATASET)
    body = await propose(client, both, expect=400)
    assert "exactly one of entityUrn and entityKeyAspect" in body["issues"][0]["message"]


@pytest.mark.parametrize(
    "urn, fragment",
    [
        ("urn:li:dataset:(urn:li:dataPlatform:hive,db.orders)", "same length"),
        ("urn:li:dataset:(urn:li:dataPlatform:hive,,PROD)", "empty part"),
        ("urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,NOPE)", "NOPE"),
        ("urn:li:chart:(looker,1)", "entity type"),
        ("urn:li:dataset:(urn:li:dataPlatform:hive,db(x),PROD)", "reserved characters"),
    ],
)
async def test_bad_urns_are_rejected_with_the_reason(client, db, urn, fragment):
    body = await propose(client, mcp("status", {"removed": False}, urn=urn), expect=400)
    assert fragment in body["issues"][0]["message"], body
    assert body["issues"][0]["index"] == 0


async def test_schema_errors_name_path_expected_and_found_and_nothing_is_written(client, db):
    body = await propose(
        client,
        mcp("status", {"removed": False}, urn=OTHER),
        mcp("datasetProperties", {"name": 42, "surprise": True}),
        expect=400,
    )
    issues = {i["path"]: i for i in body["issues"]}
    assert all(i["index"] == 1 and i["aspect"] == "datasetProperties" for i in body["issues"])
    assert any(path.endswith(".name") for path in issues), issues
    assert any("surprise" in i["message"] for i in body["issues"])
    assert await rows(db, urn=OTHER) == []


async def test_unknown_aspect_and_wrong_change_type(client, db):
    body = await propose(client, mcp("chartInfo", {"title": "x"}), expect=400)
    assert "chartInfo" in body["issues"][0]["message"] and body["issues"][0]["path"] == "$[0].aspectName"
    body = await propose(client, mcp("status", {"removed": False}, change_type="RESTATE"), expect=400)
    assert body["issues"][0]["path"] == "$[0].changeType"


async def test_timeseries_aspects_are_upsert_only_and_go_to_the_change_log(client, db):
    profile = {"timestampMillis": 1_700_000_000_000, "rowCount": 10}
    result = await propose(client, mcp("datasetProfile", profile))
    assert result["results"][0]["status"] == "APPENDED"
    assert [a for a, *_ in await rows(db)] == ["datasetKey"]
    log = (await outbox(db, "datasetProfile"))[0]
    assert log["topic"] == "MetadataChangeLog_Timeseries_v1" and log["version"] == 1_700_000_000_000
    body = await propose(client, mcp("datasetProfile", profile, change_type="CREATE"), expect=400)
    assert "UPSERT only" in body["issues"][0]["message"]


@pytest.mark.parametrize(
    "settings_overrides", [{"retention_max_versions": 3, "retention_overrides": {"dataset/subTypes": 0}}]
)
async def test_retention_keeps_n_history_versions(client, db, settings_overrides):
    for i in range(6):
        await propose(client, mcp("status", {"removed": i % 2 == 1}), mcp("subTypes", {"typeNames": [f"T{i}"]}))
    assert [(v, sm["version"]) for _, v, _, sm in await rows(db, aspect="status")] == [
        (0, "6"),
        (3, "3"),
        (4, "4"),
        (5, "5"),
    ]
    assert [v for _, v, _, _ in await rows(db, aspect="subTypes")] == [0]


async def test_versions_within_one_batch_apply_in_order(client, db):
    result = await propose(client, mcp("status", {"removed": False}), mcp("status", {"removed": True}))
    assert [r["version"] for r in result["results"]] == ["1", "2"]
    assert [(v, value) for _, v, value, _ in await rows(db, aspect="status")] == [
        (0, {"removed": True}),
        (1, {"removed": False}),
    ]


async def test_a_batch_of_more_change_logs_than_one_statement_takes_stores_them_all_in_order(client, db):
    from app.write.repository import OUTBOX_ROWS_PER_STATEMENT

    count = OUTBOX_ROWS_PER_STATEMENT + 50  # each dataset: its properties' and its key aspect's change logs
    urns = [f"urn:li:dataset:(urn:li:dataPlatform:hive,db.t{i},PROD)" for i in range(count)]
    await propose(client, *(mcp("datasetProperties", {"name": f"t{i}"}, urn=urn) for i, urn in enumerate(urns)))
    logged = [
        (row["payload"]["entityUrn"], row["aspect"]) for row in await outbox(db) if row["payload"]["entityUrn"] in urns
    ]
    assert len(logged) == 2 * count
    assert [urn for urn, aspect in logged if aspect == "datasetProperties"] == urns  # the batch's order
    # one transaction, the rows too (more than one statement's INSERT_ROWS_PER_STATEMENT of them)
    assert await db.fetchval("SELECT count(DISTINCT xmin::text) FROM change_log_outbox WHERE urn = ANY($1)", urns) == 1
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = ANY($1)", urns) == 2 * count
    # a second version of each: as many history rows inserted, every row 0 updated
    await propose(client, *(mcp("datasetProperties", {"name": f"v2.t{i}"}, urn=urn) for i, urn in enumerate(urns)))
    rows = await db.fetch(
        "SELECT version, metadata FROM metadata_aspect_v2 WHERE urn = ANY($1) AND aspect = "
        "'datasetProperties' ORDER BY urn, version",
        urns,
    )
    assert (
        sorted((r["version"], orjson.loads(r["metadata"])["name"].startswith("v2.")) for r in rows)
        == [(0, True)] * count + [(1, False)] * count
    )


async def test_request_limits(client, app, db):
    limit = app.state.settings.max_request_bytes
    big = {"name": "x" * (limit + 10)}
    response = await client.post("/openapi/v1/proposals", json=[mcp("datasetProperties", big)])
    assert response.status_code == 413, response.text
    assert response.json()["error"] == "Payload Too Large" and str(limit) in response.json()["message"], response.text
    response = await client.post(
        "/openapi/v1/proposals", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["error"] == "Validation Error"
    # neither wrote anything
    assert await rows(db) == [] and await outbox(db) == []


async def platform_events(db) -> list[dict]:
    rows = await outbox(db, topic_prefix="PlatformEvent_v1")
    events = []
    for row in rows:
        assert row["payload"]["name"] == "entityChangeEvent"
        events.append(dict(orjson.loads(row["payload"]["payload"]["value"]), _key=row["message_key"]))
    return events


async def test_platform_events_commit_with_the_change(client, db):
    owners = {"owners": [{"owner": "urn:li:corpuser:ann", "type": "DATAOWNER"}]}
    await propose(client, mcp("globalTags", {"tags": [{"tag": "urn:li:tag:pii"}]}), mcp("ownership", owners))
    await propose(client, mcp("globalTags", {"tags": [{"tag": "urn:li:tag:gold"}]}), mcp("status", {"removed": True}))
    await propose(client, mcp("ownership", owners))  # a no-op: no event
    events = [(e["category"], e["operation"], e.get("modifier")) for e in await platform_events(db)]
    assert events == [
        ("LIFECYCLE", "CREATE", None),
        ("TAG", "ADD", "urn:li:tag:pii"),
        ("OWNERSHIP", "ADD", "urn:li:corpuser:ann"),
        ("TAG", "ADD", "urn:li:tag:gold"),  # DataHub's order: by tag URN
        ("TAG", "REMOVE", "urn:li:tag:pii"),
        ("LIFECYCLE", "SOFT_DELETE", None),
    ]
    first = (await platform_events(db))[1]
    assert first["_key"] == f"entityChangeEvent-{DATASET}" and first["entityUrn"] == DATASET
    assert first["parameters"]["tagUrn"] == "urn:li:tag:pii" and first["version"] == 0
    assert first["auditStamp"]["actor"] == "urn:li:corpuser:datahub"
    await propose(client, mcp("datasetKey", None, change_type="DELETE"))
    assert (await platform_events(db))[-1]["operation"] == "HARD_DELETE"


@pytest.mark.parametrize("settings_overrides", [{"platform_events_enabled": False}])
async def test_platform_events_can_be_turned_off(client, db, settings_overrides):
    await propose(client, mcp("globalTags", {"tags": [{"tag": "urn:li:tag:pii"}]}))
    assert await platform_events(db) == []


async def test_keyed_and_template_patches_as_the_client_sends_them(client, db):
    add_tag = {
        "arrayPrimaryKeys": {"tags": ["attribution\u241fsource", "tag"]},
        "patch": [{"op": "add", "path": "/tags//urn:li:tag:gold", "value": {"tag": "urn:li:tag:gold"}}],
    }
    patch_mcp = mcp("globalTags", None, change_type="PATCH")
    patch_mcp["aspect"] = {"value": orjson.dumps(add_tag).decode(), "contentType": "application/json-patch+json"}
    await propose(client, patch_mcp)
    await propose(
        client,
        dict(
            patch_mcp,
            aspect={
                "value": orjson.dumps(
                    {
                        **add_tag,
                        "patch": [{"op": "add", "path": "/tags//urn:li:tag:pii", "value": {"tag": "urn:li:tag:pii"}}],
                    }
                ).decode(),
                "contentType": "application/json-patch+json",
            },
        ),
    )
    assert (await rows(db, aspect="globalTags"))[0][2] == {
        "tags": [{"tag": "urn:li:tag:gold"}, {"tag": "urn:li:tag:pii"}]
    }
    # a template patch (no arrayPrimaryKeys) on an absent aspect starts from the template's default
    owner = [
        {
            "op": "add",
            "path": "/owners/urn:li:corpuser:ann/DATAOWNER",
            "value": {"owner": "urn:li:corpuser:ann", "type": "DATAOWNER"},
        }
    ]
    await propose(client, mcp("ownership", owner, change_type="PATCH"))
    ownership = (await rows(db, aspect="ownership"))[0][2]
    assert ownership["owners"] == [{"owner": "urn:li:corpuser:ann", "type": "DATAOWNER"}]
    bad = await propose(
        client, mcp("globalTags", [{"op": "remove", "path": "/nothing/here"}], change_type="PATCH"), expect=400
    )
    assert "patch" in bad["issues"][0]["message"].lower()


# --- versions are monotonic across hard deletes -----------------------------------------------------------------


def _mcl_versions(logs):
    return [(o["aspect"], o["change_type"], o["version"], o["payload"]["systemMetadata"].get("version")) for o in logs]


async def test_recreate_after_an_aspect_delete_continues_the_version(client, db):
    await propose(client, mcp("status", {"removed": False}))
    await propose(client, mcp("status", {"removed": True}))
    await propose(client, mcp("status", None, change_type="DELETE"))
    result = await propose(client, mcp("status", {"removed": False}))
    assert result["results"][0]["status"] == "CREATED" and result["results"][0]["version"] == "3"
    assert [(a, v, sm["version"]) for a, v, _, sm in await rows(db, aspect="status")] == [("status", 0, "3")]
    assert _mcl_versions(await outbox(db, "status")) == [
        ("status", "UPSERT", 1, "1"),
        ("status", "UPSERT", 2, "2"),
        ("status", "DELETE", 2, "2"),
        ("status", "UPSERT", 3, "3"),
    ]
    # deleted and written again in one batch: the same
    result = await propose(client, mcp("status", None, change_type="DELETE"), mcp("status", {"removed": True}))
    assert [r["status"] for r in result["results"]] == ["DELETED", "CREATED"] and result["results"][1]["version"] == "4"
    # absent after a delete: If-Version-Match -1 (must not exist) holds, a stale version does not
    await propose(client, mcp("status", None, change_type="DELETE"))
    await propose(client, mcp("status", {"removed": False}, headers={"If-Version-Match": "4"}), expect=412)
    result = await propose(client, mcp("status", {"removed": False}, headers={"If-Version-Match": "-1"}))
    assert result["results"][0]["version"] == "5"


async def test_recreate_after_an_entity_delete_continues_every_version(client, db):
    await propose(client, mcp("status", {"removed": False}), mcp("globalTags", {"tags": [{"tag": "urn:li:tag:a"}]}))
    await propose(client, mcp("globalTags", {"tags": [{"tag": "urn:li:tag:b"}]}))
    await propose(client, mcp("status", {"removed": False}, urn=OTHER))
    await propose(client, mcp("datasetKey", None, change_type="DELETE"))
    assert await rows(db) == []
    # every deleted aspect has its DELETE change log at the version it was deleted at, the key aspect's last
    deletes = [o for o in await outbox(db) if o["change_type"] == "DELETE"]
    assert _mcl_versions(deletes) == [
        ("globalTags", "DELETE", 2, "2"),
        ("status", "DELETE", 1, "1"),
        ("datasetKey", "DELETE", 1, "1"),
    ]
    assert orjson.loads(deletes[0]["payload"]["previousAspectValue"]["value"]) == {"tags": [{"tag": "urn:li:tag:b"}]}
    # one entity event for the hard delete, not one per aspect
    assert [e["operation"] for e in await platform_events(db)][-2:] == ["CREATE", "HARD_DELETE"]  # OTHER's, ours

    result = await propose(
        client, mcp("globalTags", {"tags": [{"tag": "urn:li:tag:c"}]}), mcp("subTypes", {"typeNames": ["View"]})
    )
    assert [r["version"] for r in result["results"]] == ["3", "1"]
    versions = {a: sm["version"] for a, v, _, sm in await rows(db) if v == 0}
    assert versions == {"datasetKey": "2", "globalTags": "3", "subTypes": "1"}
    logs = await outbox(db)
    assert _mcl_versions(logs[-3:]) == [
        ("datasetKey", "UPSERT", 2, "2"),
        ("globalTags", "UPSERT", 3, "3"),
        ("subTypes", "UPSERT", 1, "1"),
    ]
    # another entity's versions are its own
    assert [sm["version"] for _, _, _, sm in await rows(db, urn=OTHER, aspect="status")] == ["1"]
    # deleted again: the floors only go up
    await propose(client, mcp("datasetKey", None, change_type="DELETE"))
    result = await propose(client, mcp("status", {"removed": True}))
    assert result["results"][0]["version"] == "2"
    assert {a: sm["version"] for a, v, _, sm in await rows(db) if v == 0} == {"datasetKey": "3", "status": "2"}
