"""User plugins from entity_registry.yml's `plugins:` section, in the real write path."""

from __future__ import annotations

import httpx
import pytest_asyncio

from app.main import create_app
from app.settings import Settings
from tests.helpers import bearer

DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"


PLUGINS_YML = """
modelSources:
  - package: acryl-datahub
plugins:
  aspectPayloadValidators:
    - className: tests.plugins.RejectTodoDescriptions
      supportedOperations: [UPSERT]
      supportedEntityAspectNames: [{entityName: dataset, aspectName: datasetProperties}]
    - className: tests.plugins.FrozenDatasets
      supportedEntityAspectNames: [{entityName: dataset, aspectName: datasetProperties}]
  mutationHooks:
    - className: tests.plugins.StampReviewer
      supportedEntityAspectNames: [{entityName: "*", aspectName: datasetProperties}]
    - className: tests.plugins.StampReviewer
      enabled: false
"""


@pytest_asyncio.fixture
async def plugin_client(tmp_path, database_url, registry):
    path = tmp_path / "entity_registry.yml"
    path.write_text(PLUGINS_YML.replace("enabled: false", "enabled: true"))
    settings = Settings(database_url=database_url, apply_migrations_on_start=False, registry_path=path)
    app = create_app(settings, registry)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://m", headers=await bearer(app)
        ) as http:
            yield http


def props(description: str, **custom: str) -> list[dict]:
    return [
        {
            "entityType": "dataset",
            "entityUrn": DATASET,
            "aspectName": "datasetProperties",
            "aspect": {"value": {"description": description, "customProperties": custom}},
        }
    ]


async def test_validators_mutators_and_pre_commit_rules_run_in_order(plugin_client):
    rejected = await plugin_client.post("/openapi/v1/proposals", json=props("TODO: write this"))
    assert rejected.status_code == 400
    assert rejected.json()["issues"][0]["message"] == "RejectTodoDescriptions: descriptions may not contain TODO"

    written = await plugin_client.post("/openapi/v1/proposals", json=props("Orders", frozen="true"))
    assert written.status_code == 200, written.text
    stored = (await plugin_client.get(f"/openapi/v3/entity/dataset/{DATASET}/datasetProperties")).json()
    assert stored["value"]["customProperties"] == {"frozen": "true", "reviewed_by": "plugin"}

    frozen = await plugin_client.post("/openapi/v1/proposals", json=props("Orders v2"))
    assert frozen.status_code == 412 and "frozen" in frozen.json()["issues"][0]["message"]
    assert (await plugin_client.get(f"/openapi/v3/entity/dataset/{DATASET}/datasetProperties")).json() == stored


async def test_a_mutator_result_is_validated_again(tmp_path, database_url, registry, db):
    path = tmp_path / "entity_registry.yml"
    path.write_text("plugins:\n  mutationHooks:\n    - className: tests.plugins.BreakTheSchema\n")
    app = create_app(Settings(database_url=database_url, apply_migrations_on_start=False, registry_path=path), registry)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://m", headers=await bearer(app)
        ) as http:
            response = await http.post("/openapi/v1/proposals", json=props("ok"))
    assert response.status_code == 400
    assert response.json()["issues"][0]["path"] == "$[0].aspect.value.customProperties"
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", DATASET) == 0


def test_a_later_disabled_entry_disables_a_plugin(tmp_path):
    from app.write.plugins import load_rule_chain

    path = tmp_path / "entity_registry.yml"
    path.write_text(PLUGINS_YML)
    chain = load_rule_chain(path)
    assert [type(r).__name__ for r in chain.validators] == ["RejectTodoDescriptions"]
    assert chain.mutators == []
    assert type(chain.pre_commit_rules[-1]).__name__ == "FrozenDatasets"
