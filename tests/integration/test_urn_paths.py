"""URNs whose names hold a `/` (an s3 dataset's key), URL-encoded as `%2F` in a path segment: every `{urn}` route
finds the entity (before app.api.urn_paths, the router split the URN at the decoded `/` and answered 404)."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from app.api.urn_paths import _REWRITTEN, ROUTING_SLASH, restore_slashes

S3 = "urn:li:dataset:(urn:li:dataPlatform:s3,bucket/raw/orders,PROD)"
UPSTREAM = "urn:li:dataset:(urn:li:dataPlatform:s3,bucket/raw/customers,PROD)"
ENCODED = quote(S3, safe="")
SYNC = {"X-DataHub-Sync-Index-Update": "true"}


def test_restore_slashes_turns_the_placeholder_back_only_in_a_rewritten_request():
    assert restore_slashes(f"a{ROUTING_SLASH}b") == f"a{ROUTING_SLASH}b"  # a NUL the client sent stays one
    token = _REWRITTEN.set(True)
    try:
        assert restore_slashes(f"a{ROUTING_SLASH}b%2Fc") == "a/b%2Fc"
    finally:
        _REWRITTEN.reset(token)


async def test_an_encoded_nul_beside_an_encoded_slash_is_never_read_as_a_slash(client, s3_dataset):
    # routed as before (the decoded / splits the segment): not found, rather than the s3 dataset
    nul = f"/openapi/v3/entity/dataset/{ENCODED.replace('%2F', '%00%2F', 1)}"
    response = await client.get(nul)
    assert response.status_code == 404, response.text


@pytest.fixture
async def s3_dataset(client):
    response = await client.post(
        "/openapi/v3/entity/dataset",
        json=[
            {
                "urn": S3,
                # indexed before the answer: the lineage and relationship reads see the edge at once
                "datasetProperties": {"value": {"name": "orders", "description": "raw orders"}, "headers": SYNC},
                "upstreamLineage": {
                    "value": {"upstreams": [{"dataset": UPSTREAM, "type": "TRANSFORMED"}]},
                    "headers": SYNC,
                },
            }
        ],
    )
    assert response.status_code == 200, response.text
    return S3


@pytest.mark.parametrize(
    ("path", "read", "expected"),
    [
        (
            f"/openapi/v3/entity/dataset/{ENCODED}",
            lambda body: (body["urn"], body["datasetProperties"]["value"]["description"]),
            (S3, "raw orders"),
        ),
        (
            f"/openapi/v3/entity/dataset/{ENCODED}/datasetProperties",
            lambda body: body["value"]["description"],
            "raw orders",
        ),
        (
            f"/openapi/v2/timeline/v1/{ENCODED}?categories=DOCUMENTATION",
            lambda body: [(e["entityUrn"], e["category"]) for t in body for e in t["changeEvents"]],
            [(S3, "DOCUMENTATION")],
        ),
        (
            f"/openapi/v1/lineage/{ENCODED}?direction=UPSTREAM",
            lambda body: [e["urn"] for e in body["entities"]],
            [UPSTREAM],
        ),
        (
            f"/openapi/v3/relationship/dataset/{ENCODED}?relationshipType[]=DownstreamOf&direction=OUTGOING",
            lambda body: [(r["source"]["urn"], r["destination"]["urn"]) for r in body["results"]],
            [(S3, UPSTREAM)],
        ),
        (
            f"/aspects/{ENCODED}?aspect=datasetProperties&version=0",
            lambda body: body["aspect"]["com.linkedin.dataset.DatasetProperties"]["description"],
            "raw orders",
        ),
    ],
)
async def test_every_urn_route_reads_an_s3_dataset(client, s3_dataset, path, read, expected):
    response = await client.get(path)
    assert response.status_code == 200, response.text
    assert read(response.json()) == expected, response.text


async def test_the_v3_aspect_routes_write_and_delete_an_s3_dataset(client, s3_dataset):
    written = await client.post(f"/openapi/v3/entity/dataset/{ENCODED}/status", json={"value": {"removed": False}})
    assert written.status_code == 200, written.text
    assert written.json()["urn"] == S3
    assert (await client.head(f"/openapi/v3/entity/dataset/{ENCODED}/status")).status_code == 204
    read = await client.get(f"/openapi/v3/entity/dataset/{ENCODED}/status")
    assert read.json()["value"] == {"removed": False}
    assert (await client.delete(f"/openapi/v3/entity/dataset/{ENCODED}/status")).status_code == 200
    assert (await client.head(f"/openapi/v3/entity/dataset/{ENCODED}/status")).status_code == 404
    # the status only: the rest of the s3 dataset is still there
    entity = (await client.get(f"/openapi/v3/entity/dataset/{ENCODED}")).json()
    assert "status" not in entity and entity["datasetProperties"]["value"]["description"] == "raw orders"


async def test_an_encoded_slash_outside_a_urn_is_still_not_a_route(client):
    response = await client.get("/openapi/v3/entity/data%2Fset/urn%3Ali%3Acorpuser%3Ajdoe")
    assert response.status_code in (400, 404), response.text
