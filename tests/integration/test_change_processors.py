"""Change processors (issue 15, work in progress): the before phase in the real write path, over HTTP, with the
pipeline from entity_registry.yml's `changeProcessors:`; the processors are tests/unit/test_processors.py's."""

from __future__ import annotations

import asyncpg
import httpx
import pytest_asyncio

from app.main import create_app
from app.settings import Settings
from tests.helpers import bearer

PROD = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"
DEV = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,DEV)"
P = "tests.unit.test_processors"

PIPELINE_YML = f"""
modelSources:
  - package: acryl-datahub
changeProcessors:
  - name: {P}.NoSecrets
    config: {{word: confidential}}
  - name: {P}.Lowercase
  - name: {P}.NeedsOwner
  - name: {P}.Boom
    scope: {{aspects: [institutionalMemory]}}
"""


@pytest_asyncio.fixture
async def pipeline_client(tmp_path, database_url, registry):
    path = tmp_path / "entity_registry.yml"
    path.write_text(PIPELINE_YML)
    settings = Settings(database_url=database_url, apply_migrations_on_start=False, registry_path=path)
    app = create_app(settings, registry)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://m", headers=await bearer(app)) as http:
            yield http


def mcp(urn: str, aspect: str, value: dict) -> dict:
    return {"entityType": "dataset", "entityUrn": urn, "aspectName": aspect, "aspect": {"value": value}}


async def test_before_phase_outcomes_over_http(pipeline_client, db: asyncpg.Connection):
    # mutate: tags lower-cased, and the result validated and stored
    tags = await pipeline_client.post("/openapi/v1/proposals", json=[mcp(DEV, "globalTags", {"tags": [{"tag": "urn:li:tag:PII"}]})])
    assert tags.status_code == 200, tags.text
    stored = (await pipeline_client.get(f"/openapi/v3/entity/dataset/{DEV}/globalTags")).json()
    assert stored["value"]["tags"] == [{"tag": "urn:li:tag:pii"}]

    # reject: the batch refused, the processor named
    refused = await pipeline_client.post("/openapi/v1/proposals", json=[mcp(PROD, "datasetProperties", {"name": "orders"})])
    assert refused.status_code == 400
    assert "NeedsOwner" in refused.text and "need an owner" in refused.text

    # ignore, by the previous value: a word the previous description did not have is dropped, not an error
    first = await pipeline_client.post("/openapi/v1/proposals", json=[mcp(DEV, "datasetProperties", {"description": "orders"})])
    assert first.status_code == 200
    ignored = await pipeline_client.post("/openapi/v1/proposals", json=[mcp(DEV, "datasetProperties", {"description": "confidential orders"})])
    assert ignored.status_code == 200, ignored.text
    item = ignored.json()["results"][0]
    assert item["status"] == "IGNORED" and "NoSecrets" in item["message"]
    assert await db.fetchval(
        "SELECT count(*) FROM change_log_outbox WHERE urn = $1 AND aspect = 'datasetProperties' "
        "AND topic = 'MetadataChangeLog_Versioned_v1'", DEV) == 1  # the ignored change has no MCL

    # a processor that raises: a refusal naming it, the service still answers
    failed = await pipeline_client.post("/openapi/v1/proposals", json=[mcp(DEV, "institutionalMemory", {"elements": []})])
    assert failed.status_code == 400 and "Boom" in failed.text and "kaput" in failed.text
    assert (await pipeline_client.get("/health")).status_code == 200


async def test_the_pipeline_is_listed_and_counted(pipeline_client, anonymous):
    listed = await pipeline_client.get("/openapi/v1/change-processors")
    assert listed.status_code == 200
    steps = listed.json()["steps"]
    assert [s["name"].rsplit(".", 1)[1] for s in steps] == ["NoSecrets", "Lowercase", "NeedsOwner", "Boom"]
    assert all(s["loaded"] and s["origin"] == P and s["phase"] == "before" for s in steps)
    assert steps[3]["scope"]["aspects"] == ["institutionalMemory"]
    await pipeline_client.post("/openapi/v1/proposals", json=[mcp(DEV, "globalTags", {"tags": [{"tag": "urn:li:tag:A"}]})])
    metrics = (await pipeline_client.get("/metrics")).text
    assert f'metaledger_change_processor_calls_total{{outcome="mutated",phase="before",processor="{P}.Lowercase"}}' in metrics


EXAMPLES_YML = """
modelSources:
  - package: acryl-datahub
changeProcessors:
  - name: ignore-disallowed-words
    config: {words: [confidential]}
  - name: lowercase-tags
  - name: prod-datasets-need-an-owner
    required: true
"""


async def test_the_example_package_is_loaded_through_its_entry_points(tmp_path, database_url, registry):
    """examples/change_processors, installed with pip (the Makefile's venv target), found by entry-point name."""
    path = tmp_path / "entity_registry.yml"
    path.write_text(EXAMPLES_YML)
    app = create_app(Settings(database_url=database_url, apply_migrations_on_start=False, registry_path=path), registry)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://m", headers=await bearer(app)) as http:
            steps = (await http.get("/openapi/v1/change-processors")).json()["steps"]
            assert [(s["name"], s["origin"], s["loaded"]) for s in steps] == [
                (name, "metaledger-example-processors==0.1.0", True)
                for name in ("ignore-disallowed-words", "lowercase-tags", "prod-datasets-need-an-owner")
            ]
            refused = await http.post("/openapi/v1/proposals", json=[mcp(PROD, "datasetProperties", {"name": "o"})])
            assert refused.status_code == 400 and "need an owner" in refused.text
            owned = await http.post("/openapi/v1/proposals", json=[
                mcp(PROD, "datasetProperties", {"name": "o", "customProperties": {"owner": "alice"}})])
            assert owned.status_code == 200, owned.text
