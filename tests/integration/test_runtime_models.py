"""Models registered at run time over the admin API: apply, dry run, history, refusals naming the rule and the field,
the checks against stored data, the take-up in the process (v3 routes, the OpenAPI document, writes and their change
logs) and by a second process's watcher."""

from __future__ import annotations

import copy

import pytest

from app.api.entities import expanded
from app.main import create_app
from app.modelset.watcher import ModelWatcher
from app.registry import load_registry
from app.registry.runtime import MODELS_ASPECT
from app.settings import Settings
from app.write.rules import MODELS_URN
from tests.helpers import mcp, mint_token

MODELS = "/openapi/v1/models"
DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,models.orders,PROD)"

RATING = {
    "type": "record",
    "name": "Rating",
    "namespace": "com.acme",
    "Aspect": {"name": "acmeRating"},
    "fields": [{"name": "stars", "type": "int"}, {"name": "note", "type": ["null", "string"], "default": None}],
}
WIDGET_KEY = {
    "type": "record",
    "name": "WidgetKey",
    "namespace": "com.acme",
    "Aspect": {"name": "acmeWidgetKey"},
    "fields": [{"name": "id", "type": "string"}],
}
MODEL_SET = {
    "aspects": [{"schema": RATING}, {"schema": WIDGET_KEY}],
    "entities": [
        {"name": "dataset", "aspects": ["acmeRating"]},
        {"name": "acmeWidget", "keyAspect": "acmeWidgetKey", "aspects": ["acmeRating", "status"]},
    ],
}


@pytest.fixture(scope="module")
def registry():
    """A registry of this module's own: the runtime models change it in place (the session's stays the base)."""
    return load_registry(Settings().registry_path)


def with_rating(**change) -> dict:
    models = copy.deepcopy(MODEL_SET)
    models["aspects"][0]["schema"] = {**RATING, **change}
    return models


async def test_apply_takes_up_at_once_and_is_versioned(client, app, db):
    dry = await client.post(MODELS, params={"dryRun": "true"}, json=MODEL_SET)
    assert dry.status_code == 200, dry.text
    assert dry.json()["dryRun"] and dry.json()["diff"]["aspects"]["added"] == ["acmeRating", "acmeWidgetKey"]
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", MODELS_URN) == 0

    applied = await client.post(MODELS, json=MODEL_SET)
    assert applied.status_code == 200, applied.text
    assert applied.json()["version"] == 1 and applied.json()["diff"]["entities"]["added"] == ["acmeWidget", "dataset"]
    # written through the ordinary write path: a change log in the outbox, the admin's actor on the row
    assert (
        await db.fetchval(
            "SELECT createdby FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = $2 AND version = 0",
            MODELS_URN,
            MODELS_ASPECT,
        )
        == "urn:li:corpuser:datahub"
    )

    written = await client.post(f"/openapi/v3/entity/dataset/{DATASET}/acmeRating", json={"value": {"stars": 4}})
    assert written.status_code in (200, 201), written.text
    widget = await client.post(
        "/openapi/v3/entity/acmeWidget",
        params={"async": "false"},
        json=[{"urn": "urn:li:acmeWidget:w1", "acmeRating": {"value": {"stars": 5}}}],
    )
    assert widget.status_code == 200, widget.text
    read = await client.get("/openapi/v3/entity/acmeWidget/urn:li:acmeWidget:w1")
    assert read.status_code == 200 and read.json()["acmeRating"]["value"] == {"stars": 5}
    document = (await client.get("/openapi.json")).json()
    assert "/openapi/v3/entity/acmeWidget/{urn}" in document["paths"]
    assert any("acmeRating" in name or "AcmeRating" in name for name in document["components"]["schemas"])
    # their change logs are queued as any (the GenericAspect JSON needs no new Avro schema), and the model set's own
    assert await db.fetchval("SELECT count(*) FROM change_log_outbox WHERE aspect = 'acmeRating'") == 2
    assert (
        await db.fetchval(
            "SELECT count(*) FROM change_log_outbox WHERE urn = $1 AND aspect = $2", MODELS_URN, MODELS_ASPECT
        )
        == 1
    )

    current = (await client.get(MODELS)).json()
    assert current["version"] == 1 and [a["name"] for a in current["aspects"]] == ["acmeRating", "acmeWidgetKey"]
    # a compatible change: a new optional field with a default
    fields = [*RATING["fields"], {"name": "source", "type": "string", "default": "manual"}]
    assert (await client.post(MODELS, json=with_rating(fields=fields))).json()["version"] == 2
    history = (await client.get(f"{MODELS}/history")).json()["versions"]
    assert [v["version"] for v in history] == [2, 1]
    assert history[0]["aspects"] == {"acmeRating": "BACKWARD", "acmeWidgetKey": "BACKWARD"}


@pytest.mark.parametrize(
    ("fields", "rule", "path"),
    [
        ([{"name": "stars", "type": "string"}, RATING["fields"][1]], "TypeChanged", "$.fields.stars.type"),
        ([RATING["fields"][0]], "FieldRemoved", "$.fields.note"),
        ([*RATING["fields"], {"name": "source", "type": "string"}], "FieldAddedWithoutDefault", "$.fields.source"),
    ],
)
async def test_incompatible_changes_are_refused_naming_the_rule_and_the_field(client, fields, rule, path):
    assert (await client.post(MODELS, json=MODEL_SET)).status_code == 200
    refused = await client.post(MODELS, json=with_rating(fields=fields))
    assert refused.status_code == 400, refused.text
    issue = refused.json()["issues"][0]
    assert issue["message"].startswith(rule) and issue["path"] == path and issue["aspect"] == "acmeRating"
    assert (await client.get(MODELS)).json()["version"] == 1


async def test_compatibility_none_accepts_a_change_that_stored_values_still_pass(client):
    assert (await client.post(MODELS, json=MODEL_SET)).status_code == 200
    models = with_rating(
        fields=[{"name": "stars", "type": "long"}, RATING["fields"][1], {"name": "extra", "type": "string"}]
    )
    models["aspects"][0]["compatibility"] = "NONE"
    applied = await client.post(MODELS, json=models)
    assert applied.status_code == 200, applied.text
    assert applied.json()["version"] == 2 and applied.json()["diff"]["aspects"]["changed"] == ["acmeRating"]
    current = (await client.get(MODELS)).json()
    assert [a["compatibility"] for a in current["aspects"] if a["name"] == "acmeRating"] == ["NONE"]


async def test_checks_against_stored_data(client):
    assert (await client.post(MODELS, json=MODEL_SET)).status_code == 200
    written = await client.post(f"/openapi/v3/entity/dataset/{DATASET}/acmeRating", json={"value": {"stars": 4}})
    assert written.status_code in (200, 201), written.text

    removed = copy.deepcopy(MODEL_SET)
    removed["entities"][0]["aspects"] = []
    refused = await client.post(MODELS, json=removed)
    assert refused.status_code == 400
    assert "RemovedAspectHasValues" in refused.text and "1 dataset entities" in refused.text

    # NONE lets the schema change, but the stored value (stars: 4) must pass it
    models = with_rating(fields=[{"name": "stars", "type": "string"}, RATING["fields"][1]])
    models["aspects"][0]["compatibility"] = "NONE"
    refused = await client.post(MODELS, json=models)
    assert refused.status_code == 400
    issue = refused.json()["issues"][0]
    assert issue["message"].startswith("StoredValueInvalid") and DATASET in issue["message"]


async def test_base_aspects_keys_and_schemas_are_checked(client):
    redefine = {"aspects": [{"schema": {**RATING, "Aspect": {"name": "status"}}}]}
    refused = await client.post(MODELS, json=redefine)
    assert refused.status_code == 400 and refused.json()["issues"][0]["message"].startswith("RedefinesBaseAspect")
    keyless = {"aspects": [{"schema": RATING}], "entities": [{"name": "acmeGadget", "aspects": ["acmeRating"]}]}
    refused = await client.post(MODELS, json=keyless)
    assert refused.status_code == 400 and refused.json()["issues"][0]["path"] == "$.entities[0].keyAspect"
    broken = {"aspects": [{"schema": {**RATING, "fields": [{"name": "x", "type": "com.acme.Nowhere"}]}}]}
    refused = await client.post(MODELS, json=broken)
    assert refused.status_code == 400 and refused.json()["issues"][0]["message"].startswith("DoesNotCompile")
    unnamed = await client.post(MODELS, json={"aspects": [{"schema": {"type": "record", "name": "X", "fields": []}}]})
    assert unnamed.status_code == 400 and unnamed.json()["issues"][0]["path"] == "$.aspects[0].schema.Aspect.name"


async def test_the_set_is_written_only_through_the_models_api(client):
    """A v3 or MCP write of the stored set would skip the checks (and leave every process's watcher with a set that
    does not build): refused naming the rule, and the set in force stays as the models API stored it."""
    assert (await client.post(MODELS, json=MODEL_SET)).status_code == 200
    unchecked = {"aspects": [{"name": "acmeRating", "schema": "{}", "compatibility": "BACKWARD"}], "entities": []}
    writes = [
        client.post(f"/openapi/v3/entity/metaledgerSystem/{MODELS_URN}/{MODELS_ASPECT}", json={"value": unchecked}),
        client.post(
            "/aspects?action=ingestProposal",
            json={"proposal": mcp(MODELS_ASPECT, unchecked, MODELS_URN, entity="metaledgerSystem")},
        ),
        client.post(
            "/aspects?action=ingestProposal",
            json={"proposal": mcp(MODELS_ASPECT, None, MODELS_URN, "DELETE", entity="metaledgerSystem")},
        ),
    ]
    for write in writes:
        refused = await write
        assert refused.status_code == 400, refused.text
        assert "SystemEntityThroughItsServices" in refused.text and "POST /openapi/v1/models" in refused.text
    current = (await client.get(MODELS)).json()
    assert current["version"] == 1 and [a["name"] for a in current["aspects"]] == ["acmeRating", "acmeWidgetKey"]


async def test_a_concurrent_apply_is_a_conflict(client):
    assert (await client.post(MODELS, json=MODEL_SET)).status_code == 200
    stale = await client.post(MODELS, params={"ifVersion": "0"}, json=MODEL_SET)
    assert stale.status_code == 409 and "version 1, not 0" in stale.json()["message"], stale.text
    assert [v["version"] for v in (await client.get(f"{MODELS}/history")).json()["versions"]] == [1]


async def test_only_admins_apply_or_read(app, anonymous):
    writer = {"Authorization": f"Bearer {await mint_token(app, 'writer')}"}
    for method, path in (("POST", MODELS), ("GET", MODELS), ("GET", f"{MODELS}/history")):
        assert (await anonymous.request(method, path, json=MODEL_SET)).status_code == 401
        assert (await anonymous.request(method, path, json=MODEL_SET, headers=writer)).status_code == 403


async def test_another_process_takes_up_the_set_through_its_watcher(client, app, database_url):
    other_registry = load_registry(Settings().registry_path)
    other = create_app(app.state.settings, other_registry)
    async with other.router.lifespan_context(other):
        assert not other_registry.has_entity("acmeWidget")
        assert (await client.post(MODELS, json=MODEL_SET)).status_code == 200
        watcher = ModelWatcher(app.state.settings, other.state.sessionmaker, other_registry)
        assert await watcher.refresh()
        assert other_registry.has_entity("acmeWidget") and other_registry.runtime_version == 1
        served = expanded(other.router.routes)
        assert any(getattr(r, "path", "").startswith("/openapi/v3/entity/acmeWidget") for r in served)
        assert not await watcher.refresh()  # nothing new: one query, no rebuild
