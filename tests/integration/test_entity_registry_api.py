"""DataHub's entity registry API: GET /openapi/v1/registry/models/entity/specifications."""

from __future__ import annotations

SPECS = "/openapi/v1/registry/models/entity/specifications"


async def test_pages_through_every_entity_with_its_aspects(client, registry):
    elements, start = [], 0
    while True:  # as DataHubGraph._paginate_offset does
        page = (await client.get(SPECS, params={"start": start, "count": 100})).json()
        elements += page["elements"]
        start += page["count"]
        if page["count"] == 0 or start >= page["total"]:
            break
    assert [e["name"] for e in elements] == sorted(registry.entities)
    dataset = next(e for e in elements if e["name"] == "dataset")
    assert dataset["keyAspectName"] == "datasetKey"
    assert dataset["entityAnnotation"]["keyAspect"] == "datasetKey"
    assert dataset["keyAspectSpec"]["aspectAnnotation"]["name"] == "datasetKey"
    names = {spec["aspectAnnotation"]["name"] for spec in dataset["aspectSpecs"]}
    assert names == set(registry.entities["dataset"].aspect_names)
    assert set(dataset["aspectSpecMap"]) == names
    schema = dataset["aspectSpecMap"]["schemaMetadata"]["aspectAnnotation"]
    assert schema == {
        "name": "schemaMetadata",
        "timeseries": False,
        "autoRender": False,
        "schemaVersion": registry.aspects["schemaMetadata"].schema_version,
    }
    profile = dataset["aspectSpecMap"]["datasetProfile"]["aspectAnnotation"]
    assert profile["timeseries"] is True


async def test_default_page_and_bounds(client, registry):
    page = (await client.get(SPECS)).json()
    assert page["start"] == 0 and page["count"] == 5 and page["total"] == len(registry.entities)
    last = len(registry.entities) - 1
    assert (await client.get(SPECS, params={"start": last})).json()["count"] == 1
    past = await client.get(SPECS, params={"start": last + 1})
    assert past.status_code == 400 and past.json()["issues"][0]["path"] == "$start"
    assert (await client.get(SPECS, params={"count": -1})).status_code == 400


async def test_needs_a_token(anonymous):
    assert (await anonymous.get(SPECS)).status_code == 401
