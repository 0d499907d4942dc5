"""User plugins from entity_registry.yml's `plugins:` section, in the real write path."""

from __future__ import annotations

import httpx
import pytest_asyncio

from app.main import create_app
from app.settings import Settings
from app.write.rules import PendingChange, PreCommitRule, ProposalRule, Verdict, VerdictKind

DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"


class RejectTodoDescriptions(ProposalRule):
    name = "RejectTodoDescriptions"

    def apply(self, proposal):
        if "TODO" in (proposal.value or {}).get("description", ""):
            return self.verdict(VerdictKind.VALIDATION, "descriptions may not contain TODO")
        return None


class StampReviewer(ProposalRule):
    name = "StampReviewer"

    def apply(self, proposal):
        proposal.value["customProperties"]["reviewed_by"] = "plugin"
        return None


class FrozenDatasets(PreCommitRule):
    name = "FrozenDatasets"

    def check(self, change: PendingChange) -> Verdict | None:
        if change.previous is not None and change.previous.value.get("customProperties", {}).get("frozen") == "true":
            return self.verdict(VerdictKind.PRECONDITION, "the dataset is frozen")
        return None


PLUGINS_YML = """
modelSources:
  - package: acryl-datahub
plugins:
  aspectPayloadValidators:
    - className: tests.integration.test_plugins.RejectTodoDescriptions
      supportedOperations: [UPSERT]
      supportedEntityAspectNames: [{entityName: dataset, aspectName: datasetProperties}]
    - className: tests.integration.test_plugins.FrozenDatasets
      supportedEntityAspectNames: [{entityName: dataset, aspectName: datasetProperties}]
  mutationHooks:
    - className: tests.integration.test_plugins.StampReviewer
      supportedEntityAspectNames: [{entityName: "*", aspectName: datasetProperties}]
    - className: tests.integration.test_plugins.StampReviewer
      enabled: false
"""


@pytest_asyncio.fixture
async def plugin_client(tmp_path, database_url, registry):
    path = tmp_path / "entity_registry.yml"
    path.write_text(PLUGINS_YML.replace("enabled: false", "enabled: true"))
    settings = Settings(database_url=database_url, apply_migrations_on_start=False, registry_path=path)
    app = create_app(settings, registry)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://m") as http:
            yield http


def props(description: str, **custom: str) -> list[dict]:
    return [{"entityType": "dataset", "entityUrn": DATASET, "aspectName": "datasetProperties",
             "aspect": {"value": {"description": description, "customProperties": custom}}}]


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


class BreakTheSchema(ProposalRule):
    name = "BreakTheSchema"

    def apply(self, proposal):
        proposal.value["customProperties"] = "not a map"
        return None


async def test_a_mutator_result_is_validated_again(tmp_path, database_url, registry):
    path = tmp_path / "entity_registry.yml"
    path.write_text("plugins:\n  mutationHooks:\n    - className: tests.integration.test_plugins.BreakTheSchema\n")
    app = create_app(Settings(database_url=database_url, apply_migrations_on_start=False, registry_path=path), registry)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://m") as http:
            response = await http.post("/openapi/v1/proposals", json=props("ok"))
    assert response.status_code == 400
    assert response.json()["issues"][0]["path"] == "$.aspect.value.customProperties"


def test_a_later_disabled_entry_disables_a_plugin(tmp_path):
    from app.write.plugins import load_rule_chain

    path = tmp_path / "entity_registry.yml"
    path.write_text(PLUGINS_YML)
    chain = load_rule_chain(path)
    assert [type(r).__name__ for r in chain.validators] == ["RejectTodoDescriptions"]
    assert chain.mutators == []
    assert type(chain.pre_commit_rules[-1]).__name__ == "FrozenDatasets"
