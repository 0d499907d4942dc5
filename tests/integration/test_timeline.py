"""DataHub's Timeline API (GET /openapi/v2/timeline/v1/{urn}) over HTTP, from versions written over HTTP."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import quote

import jsonpatch
import pytest

from app.api.timeline import COMPLETE_FROM_HEADER, TRUNCATED_HEADER

DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"
TIMELINE = f"/openapi/v2/timeline/v1/{quote(DATASET, safe='')}"
ALL = "TAG,OWNERSHIP,TECHNICAL_SCHEMA,DOCUMENTATION"


def now_ms() -> int:
    return int(time.time() * 1000)


def tags(*names):
    return {"tags": [{"tag": f"urn:li:tag:{n}"} for n in names]}


def owners(*users):
    return {"owners": [{"owner": f"urn:li:corpuser:{u}", "type": "DATAOWNER"} for u in users]}


def schema(*fields):
    return {
        "schemaName": "orders",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.OtherSchema": {"rawSchema": ""}},
        "fields": [
            {
                "fieldPath": path,
                "nativeDataType": native,
                "type": {
                    "type": {
                        "com.linkedin.schema.NumberType" if native == "int" else "com.linkedin.schema.StringType": {}
                    }
                },
            }
            for path, native in fields
        ],
    }


def properties(description):
    return {"description": description}


# The dataset's ten changes: (aspect, value, what the timeline says of it, its semantic version).
CHANGES = [
    ("globalTags", tags("pii"), [("TAG", "ADD", "urn:li:tag:pii")], "0.0.0-computed"),
    ("ownership", owners("jdoe"), [("OWNERSHIP", "ADD", "urn:li:corpuser:jdoe")], "0.1.0-computed"),
    (
        "schemaMetadata",
        schema(("id", "int"), ("amount", "int")),
        [
            ("TECHNICAL_SCHEMA", "ADD", f"urn:li:schemaField:({DATASET},amount)"),
            ("TECHNICAL_SCHEMA", "ADD", f"urn:li:schemaField:({DATASET},id)"),
        ],
        "0.2.0-computed",
    ),
    ("datasetProperties", properties("orders"), [("DOCUMENTATION", "ADD", None)], "0.3.0-computed"),
    ("globalTags", tags("pii", "gold"), [("TAG", "ADD", "urn:li:tag:gold")], "0.4.0-computed"),
    (
        "schemaMetadata",
        schema(("id", "int"), ("amount", "int"), ("note", "string")),
        [("TECHNICAL_SCHEMA", "ADD", f"urn:li:schemaField:({DATASET},note)")],
        "0.5.0-computed",
    ),
    (
        "ownership",
        owners("alice"),
        [("OWNERSHIP", "REMOVE", "urn:li:corpuser:jdoe"), ("OWNERSHIP", "ADD", "urn:li:corpuser:alice")],
        "0.6.0-computed",
    ),
    ("datasetProperties", properties("all orders"), [("DOCUMENTATION", "MODIFY", None)], "0.7.0-computed"),
    # dropping a column breaks readers: MAJOR
    (
        "schemaMetadata",
        schema(("id", "int"), ("note", "string")),
        [("TECHNICAL_SCHEMA", "REMOVE", f"urn:li:schemaField:({DATASET},amount)")],
        "1.0.0-computed",
    ),
    ("globalTags", tags("gold"), [("TAG", "REMOVE", "urn:li:tag:pii")], "1.1.0-computed"),
]


async def write(client, aspect, value, urn=DATASET):
    response = await client.post(
        "/openapi/v3/entity/dataset?async=false", json=[{"urn": urn, aspect: {"value": value}}]
    )
    assert response.status_code == 200, response.text
    # the next version is of a later millisecond (versions of one millisecond are one transaction): the clock has
    # moved past the one this version was written at
    answered = now_ms()
    while now_ms() <= answered:
        await asyncio.sleep(0.0005)


async def write_history(client) -> list[int]:
    """Writes CHANGES; returns the time (ms) before each write."""
    before = []
    for aspect, value, _, _ in CHANGES:
        before.append(now_ms())
        await write(client, aspect, value)
    return before


def brief(transaction):
    return [(e["category"], e["operation"], e.get("modifier")) for e in transaction["changeEvents"]]


async def test_ten_changes_in_order_with_categories_and_semantic_versions(client):
    await write_history(client)
    response = await client.get(TIMELINE, params={"categories": ALL})
    assert response.status_code == 200, response.text
    assert TRUNCATED_HEADER not in response.headers
    timeline = response.json()
    assert [brief(t) for t in timeline] == [expected for _, _, expected, _ in CHANGES]
    assert [t["semVer"] for t in timeline] == [semver for _, _, _, semver in CHANGES]
    assert [t["semVerChange"] for t in timeline][1:] == ["MINOR"] * 7 + ["MAJOR", "MINOR"]
    timestamps = [t["timestamp"] for t in timeline]
    assert timestamps == sorted(timestamps) and len(set(timestamps)) == 10
    first = timeline[0]
    assert first["actor"] == "urn:li:corpuser:datahub"
    assert first["versionStamp"] == "globalTags:1"
    assert timeline[-1]["versionStamp"] == "datasetProperties:2;globalTags:3;ownership:2;schemaMetadata:3"
    assert "rawDiff" not in first
    event = first["changeEvents"][0]
    assert event == {
        "entityUrn": DATASET,
        "category": "TAG",
        "operation": "ADD",
        "modifier": "urn:li:tag:pii",
        "parameters": {"tagUrn": "urn:li:tag:pii", "context": "{}", "sourceDetails": "{}"},
        "auditStamp": {"time": first["timestamp"], "actor": "urn:li:corpuser:datahub"},
        "semVerChange": "MINOR",
        "description": f"Tag 'pii' added to entity '{DATASET}'.",
    }
    dropped = timeline[8]["changeEvents"][0]
    assert dropped["semVerChange"] == "MAJOR"
    assert dropped["description"] == "A backwards incompatible change due to removal of field: 'amount'."
    assert dropped["parameters"]["modificationCategory"] == "OTHER"


async def test_category_filter_and_its_own_semantic_versions(client):
    await write_history(client)
    # repeated or comma-separated, any case; OWNER is OWNERSHIP
    only_tags = (await client.get(TIMELINE, params={"categories": "tag"})).json()
    assert [brief(t) for t in only_tags] == [CHANGES[i][2] for i in (0, 4, 9)]
    assert [t["semVer"] for t in only_tags] == ["0.0.0-computed", "0.1.0-computed", "0.2.0-computed"]
    both = (await client.get(TIMELINE, params={"categories": ["OWNER", "TECHNICAL_SCHEMA"]})).json()
    assert [brief(t) for t in both] == [CHANGES[i][2] for i in (1, 2, 5, 6, 8)]
    assert [t["semVer"] for t in both] == [
        "0.0.0-computed",
        "0.1.0-computed",
        "0.2.0-computed",
        "0.3.0-computed",
        "1.0.0-computed",
    ]
    # a category with nothing to show for a dataset yields nothing, as in DataHub
    assert (await client.get(TIMELINE, params={"categories": "RUN"})).json() == []


async def test_start_and_end_time_bound_the_range(client):
    before = await write_history(client)
    start, end = before[4], before[8] - 1  # the 5th to the 8th change
    response = await client.get(TIMELINE, params={"categories": ALL, "startTime": start, "endTime": end})
    timeline = response.json()
    # the first change in range is diffed against the version before the range: only `gold` was added
    assert [brief(t) for t in timeline] == [CHANGES[i][2] for i in (4, 5, 6, 7)]
    assert timeline[0]["semVer"] == "0.0.0-computed"
    assert all(start <= t["timestamp"] <= end for t in timeline)
    assert TRUNCATED_HEADER not in response.headers
    # the default range is the week before now
    assert len((await client.get(TIMELINE, params={"categories": ALL})).json()) == 10
    long_ago = {"categories": ALL, "startTime": 0, "endTime": before[0] - 10_000}
    assert (await client.get(TIMELINE, params=long_ago)).json() == []


async def test_raw_adds_each_transactions_json_patch(client):
    await write_history(client)
    timeline = (await client.get(TIMELINE, params={"categories": "TAG", "raw": "true"})).json()
    assert [t["rawDiff"] for t in timeline][0] == [{"op": "add", "path": "/tags", "value": [{"tag": "urn:li:tag:pii"}]}]
    # each patch turns the previous value into the next
    assert jsonpatch.apply_patch(tags("pii"), timeline[1]["rawDiff"]) == tags("pii", "gold")
    assert jsonpatch.apply_patch(tags("pii", "gold"), timeline[2]["rawDiff"]) == tags("gold")


@pytest.mark.parametrize("settings_overrides", [{"retention_max_versions": 2}])
async def test_retention_says_when_the_range_reaches_past_the_oldest_version_kept(client):
    before = []
    names = ["a", "b", "c", "d", "e"]
    for n in range(1, 6):
        before.append(now_ms())
        await write(client, "globalTags", tags(*names[:n]))
    # versions 1 and 2 were pruned: version 3 is the oldest kept and cannot be diffed
    response = await client.get(TIMELINE, params={"categories": "TAG"})
    assert response.status_code == 200
    assert response.headers[TRUNCATED_HEADER] == "globalTags=3"
    timeline = response.json()
    assert [brief(t) for t in timeline] == [[("TAG", "ADD", "urn:li:tag:d")], [("TAG", "ADD", "urn:li:tag:e")]]
    assert int(response.headers[COMPLETE_FROM_HEADER]) <= timeline[0]["timestamp"]
    assert int(response.headers[COMPLETE_FROM_HEADER]) >= before[2]
    # a range that starts after the oldest version kept is whole
    whole = await client.get(TIMELINE, params={"categories": "TAG", "startTime": before[3]})
    assert TRUNCATED_HEADER not in whole.headers
    assert [brief(t) for t in whole.json()] == [[("TAG", "ADD", "urn:li:tag:d")], [("TAG", "ADD", "urn:li:tag:e")]]


async def test_an_entity_without_history_has_an_empty_timeline(client):
    missing = f"/openapi/v2/timeline/v1/{quote('urn:li:dataset:(urn:li:dataPlatform:hive,nothing,PROD)', safe='')}"
    response = await client.get(missing, params={"categories": ALL})
    assert response.status_code == 200 and response.json() == []


async def test_lifecycle_and_documentation_of_links(client):
    await write(client, "status", {"removed": False})
    await write(
        client,
        "institutionalMemory",
        {
            "elements": [
                {
                    "url": "https://wiki/orders",
                    "description": "runbook",
                    "createStamp": {"time": 0, "actor": "urn:li:corpuser:jdoe"},
                }
            ]
        },
    )
    await write(client, "status", {"removed": True})
    lifecycle = (await client.get(TIMELINE, params={"categories": "LIFECYCLE"})).json()
    assert [brief(t) for t in lifecycle] == [[("LIFECYCLE", "CREATE", None)], [("LIFECYCLE", "SOFT_DELETE", None)]]
    docs = (await client.get(TIMELINE, params={"categories": "DOCUMENTATION"})).json()
    assert [brief(t) for t in docs] == [[("DOCUMENTATION", "ADD", "https://wiki/orders")]]


async def test_the_timeline_needs_a_token(anonymous):
    response = await anonymous.get(TIMELINE, params={"categories": "TAG"})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    ("url", "params", "parameter"),
    [
        ("/openapi/v2/timeline/v1/not-a-urn", {"categories": "TAG"}, "$urn"),
        ("/openapi/v2/timeline/v1/urn%3Ali%3AnoSuchEntity%3Ax", {"categories": "TAG"}, "$urn"),
        (TIMELINE, {"categories": "NOPE"}, "$categories"),
        (TIMELINE, {"categories": ","}, "$categories"),
        (TIMELINE, {}, "$categories"),
        (TIMELINE, {"categories": "TAG", "startTime": 2000, "endTime": 1000}, "$startTime"),
        (TIMELINE, {"categories": "TAG", "startTime": "yesterday"}, "$startTime"),
        (TIMELINE, {"categories": "TAG", "endTime": "1.5"}, "$endTime"),
        (TIMELINE, {"categories": "TAG", "endTime": str(10**30)}, "$endTime"),
        (TIMELINE, {"categories": "TAG", "startTime": -5}, "$startTime"),
        (TIMELINE, {"categories": "TAG", "raw": "maybe"}, "$raw"),
    ],
)
async def test_bad_input_is_a_400_naming_the_parameter(client, url, params, parameter):
    response = await client.get(url, params=params)
    assert response.status_code == 400, response.text
    assert [issue["path"] for issue in response.json()["issues"]] == [parameter]
