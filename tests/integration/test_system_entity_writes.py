"""metaledger's own entity, `metaledgerSystem` (the runtime model set, the change-processor pipeline), is written only
by its own services: `POST /openapi/v1/models` and `PUT /openapi/v1/change-processors`. Every general write path
(v1 proposals, v3 entity writes and deletes, Rest.li ingestProposal/ingest/delete, OpenLineage, the MCP and MCE
topics) is refused by one rule of the write path (app.write.rules.SystemEntityThroughItsServices), naming the entity
and the route to use; rollback of a run and deleteReferences never touch it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from app.registry.runtime import MODELS_ASPECT
from app.write.processors import PIPELINE_ASPECT, PIPELINE_URN
from app.write.rules import MODELS_URN
from tests import helpers
from tests.helpers import RESTLI_HEADERS, bearer, restli_propose, stored

SYSTEM = "metaledgerSystem"
KEY = "metaledgerSystemKey"
MODELS = "/openapi/v1/models"
PROCESSORS = "/openapi/v1/change-processors"
P = "tests.unit.test_processors"
DATASET = helpers.ds("db.system_writes")
RATING = {
    "type": "record",
    "name": "Rating",
    "namespace": "com.acme",
    "Aspect": {"name": "acmeRating"},
    "fields": [{"name": "stars", "type": "int"}],
}
MODEL_SET = {"aspects": [{"schema": RATING}], "entities": [{"name": "dataset", "aspects": ["acmeRating"]}]}
PIPELINE = {"steps": [{"name": f"{P}.Lowercase"}]}
OTHER_PIPELINE = {"steps": [{"name": f"{P}.NoSecrets", "config": {"word": "secret"}}]}
UNCHECKED_MODELS = {"aspects": [{"name": "acmeRating", "schema": "{}", "compatibility": "BACKWARD"}], "entities": []}


def system_mcp(urn: str, aspect: str, value: Any = None, change_type: str = "UPSERT", **kw: Any) -> dict[str, Any]:
    return helpers.mcp(aspect, value, urn, change_type, entity=SYSTEM, **kw)


async def system_rows(db) -> list[tuple]:
    """Every stored row of metaledgerSystem, every version."""
    rows = await db.fetch(
        "SELECT urn, aspect, version, metadata FROM metadata_aspect_v2 "
        "WHERE urn LIKE 'urn:li:metaledgerSystem:%' ORDER BY urn, aspect, version"
    )
    return [tuple(r) for r in rows]


async def seed(client, db) -> list[tuple]:
    """A model set and a pipeline stored through their services; the rows they left."""
    applied = await client.post(MODELS, json=MODEL_SET)
    assert applied.status_code == 200, applied.text
    put = await client.put(PROCESSORS, json=PIPELINE)
    assert put.status_code == 200, put.text
    rows = await system_rows(db)
    assert {(urn, aspect) for urn, aspect, _, _ in rows} == {
        (MODELS_URN, KEY),
        (MODELS_URN, MODELS_ASPECT),
        (PIPELINE_URN, KEY),
        (PIPELINE_URN, PIPELINE_ASPECT),
    }
    return rows


def _patched_lineage(monkeypatch, change_type: str, aspect: str, value: Any) -> None:
    """The OpenLineage mapping, made to map an event onto metaledgerSystem (it never does: this stands for a mapping
    bug or a future facet). The write path must refuse it all the same."""
    import app.api.openlineage as openlineage
    from app.openlineage.mapping import Change

    monkeypatch.setattr(
        openlineage, "map_event", lambda event: [Change(SYSTEM, MODELS_URN, aspect, value, change_type)]
    )


LINEAGE_EVENT = {
    "eventType": "COMPLETE",
    "eventTime": "2024-05-01T10:00:00.000Z",
    "producer": "https://github.com/OpenLineage/OpenLineage/tree/1.30.0/client/python",
    "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
    "run": {"runId": "0190b7e4-3b5e-7a4e-9b1e-5f0f6d9c2a11"},
    "job": {"namespace": "analytics", "name": "etl"},
}

# (name, the route it names, the request): each a general write path's write or delete of metaledgerSystem
WRITE_SURFACES = [
    (
        "v1 proposals: DELETE of the models' key aspect",
        MODELS,
        lambda c, mp: c.post("/openapi/v1/proposals", json=[system_mcp(MODELS_URN, KEY, change_type="DELETE")]),
    ),
    (
        "v1 proposals: DELETE of the pipeline's key aspect",
        PROCESSORS,
        lambda c, mp: c.post("/openapi/v1/proposals", json=[system_mcp(PIPELINE_URN, KEY, change_type="DELETE")]),
    ),
    (
        "v1 proposals: UPSERT of the pipeline",
        PROCESSORS,
        lambda c, mp: c.post("/openapi/v1/proposals", json=[system_mcp(PIPELINE_URN, PIPELINE_ASPECT, OTHER_PIPELINE)]),
    ),
    (
        "v1 proposals: UPSERT of the models",
        MODELS,
        lambda c, mp: c.post("/openapi/v1/proposals", json=[system_mcp(MODELS_URN, MODELS_ASPECT, UNCHECKED_MODELS)]),
    ),
    (
        "v1 proposals, async: DELETE of the pipeline",
        PROCESSORS,
        lambda c, mp: c.post(
            "/openapi/v1/proposals",
            params={"async": "true"},
            json=[system_mcp(PIPELINE_URN, PIPELINE_ASPECT, change_type="DELETE")],
        ),
    ),
    (
        "v3 POST entities",
        PROCESSORS,
        lambda c, mp: c.post(
            f"/openapi/v3/entity/{SYSTEM}", json=[{"urn": PIPELINE_URN, PIPELINE_ASPECT: {"value": OTHER_PIPELINE}}]
        ),
    ),
    (
        "v3 POST aspect",
        MODELS,
        lambda c, mp: c.post(
            f"/openapi/v3/entity/{SYSTEM}/{MODELS_URN}/{MODELS_ASPECT}", json={"value": UNCHECKED_MODELS}
        ),
    ),
    (
        "v3 PATCH aspect",
        PROCESSORS,
        lambda c, mp: c.patch(
            f"/openapi/v3/entity/{SYSTEM}/{PIPELINE_URN}/{PIPELINE_ASPECT}",
            json=[{"op": "add", "path": "/steps/-", "value": {"name": f"{P}.Boom"}}],
        ),
    ),
    ("v3 DELETE entity", MODELS, lambda c, mp: c.delete(f"/openapi/v3/entity/{SYSTEM}/{MODELS_URN}")),
    (
        "v3 DELETE aspects",
        PROCESSORS,
        lambda c, mp: c.delete(f"/openapi/v3/entity/{SYSTEM}/{PIPELINE_URN}", params={"aspects": PIPELINE_ASPECT}),
    ),
    ("v3 DELETE aspect", MODELS, lambda c, mp: c.delete(f"/openapi/v3/entity/{SYSTEM}/{MODELS_URN}/{MODELS_ASPECT}")),
    (
        "Rest.li ingestProposal: DELETE of the key aspect",
        MODELS,
        lambda c, mp: restli_propose(c, system_mcp(MODELS_URN, KEY, change_type="DELETE")),
    ),
    (
        "Rest.li ingestProposalBatch: UPSERT of the pipeline",
        PROCESSORS,
        lambda c, mp: restli_propose(
            c,
            system_mcp(PIPELINE_URN, PIPELINE_ASPECT, OTHER_PIPELINE, encode=True),
            helpers.mcp("status", {"removed": False}, DATASET, encode=True),
        ),
    ),
    (
        "Rest.li entities delete",
        MODELS,
        lambda c, mp: c.post(
            "/entities?action=delete", content=orjson.dumps({"urn": MODELS_URN}), headers=RESTLI_HEADERS
        ),
    ),
    (
        "Rest.li entities ingest (an MCE)",
        PROCESSORS,
        lambda c, mp: c.post(
            "/entities?action=ingest",
            headers=RESTLI_HEADERS,
            content=orjson.dumps(
                {
                    "entity": {
                        "value": {
                            "com.linkedin.metadata.snapshot.MetaledgerSystemSnapshot": {
                                "urn": PIPELINE_URN,
                                "aspects": [{"io.metaledger.system.ChangeProcessorPipeline": OTHER_PIPELINE}],
                            }
                        }
                    }
                }
            ),
        ),
    ),
    (
        "OpenLineage: DELETE of the key aspect",
        MODELS,
        lambda c, mp: (_patched_lineage(mp, "DELETE", KEY, None), c.post("/api/v1/lineage", json=LINEAGE_EVENT))[1],
    ),
]


@pytest.mark.parametrize("surface", WRITE_SURFACES, ids=[s[0] for s in WRITE_SURFACES])
async def test_general_write_paths_refuse_metaledger_system(surface, client, db, monkeypatch):
    name, route, request = surface
    before = await seed(client, db)
    response = await request(client, monkeypatch)
    assert response.status_code == 400, (name, response.status_code, response.text)
    text = response.text
    assert "SystemEntityThroughItsServices" in text and SYSTEM in text and route in text, (name, text)
    assert await system_rows(db) == before  # nothing written, nothing deleted, history kept
    assert (await client.get(PROCESSORS)).json()["version"] == 1
    assert (await client.get(MODELS)).json()["version"] == 1


async def test_a_writer_is_refused_too_naming_the_service(app, client, db):
    before = await seed(client, db)
    writer = await bearer(app, role="writer", actor="urn:li:corpuser:alice")
    refused = await client.post(
        "/openapi/v1/proposals", headers=writer, json=[system_mcp(PIPELINE_URN, PIPELINE_ASPECT, OTHER_PIPELINE)]
    )
    assert refused.status_code == 403 and SYSTEM in refused.text and PROCESSORS in refused.text, refused.text
    assert (await client.put(PROCESSORS, json=OTHER_PIPELINE, headers=writer)).status_code == 403
    assert (await client.post(MODELS, json=MODEL_SET, headers=writer)).status_code == 403
    assert await system_rows(db) == before


@pytest.mark.parametrize("kind", ["MCP", "MCE"])
async def test_the_kafka_consumers_refuse_metaledger_system(kind, app, client, db):
    """The MCP and MCE topics' records go through the same preparation (app.kafka.consumers.records.read_batch): the
    record fails (its dead letter names the rule), nothing is written."""
    from types import SimpleNamespace

    from app.kafka.consumers.records import MCE, MCP, read_batch
    from tests.helpers import codec

    before = await seed(client, db)
    if kind == "MCP":
        payload = system_mcp(MODELS_URN, KEY, change_type="DELETE")
    else:
        payload = {
            "proposedSnapshot": {
                "com.linkedin.metadata.snapshot.MetaledgerSystemSnapshot": {
                    "urn": PIPELINE_URN,
                    "aspects": [{"io.metaledger.system.ChangeProcessorPipeline": OTHER_PIPELINE}],
                }
            }
        }
    record = SimpleNamespace(topic="t", partition=0, offset=0, timestamp=0, key=b"k", value=orjson.dumps(payload))
    (unit,) = await read_batch([record], MCP if kind == "MCP" else MCE, app.state.gateway, codec("json"))
    assert unit.error is not None and not unit.proposals
    assert "SystemEntityThroughItsServices" in str(getattr(unit.error, "message", unit.error)) or any(
        "SystemEntityThroughItsServices" in i.message for i in getattr(unit.error, "issues", ())
    )
    assert await system_rows(db) == before


async def test_rollback_of_a_run_never_touches_metaledger_system(app, client, db):
    """Rows of metaledgerSystem that carry a run's id (stored before the rule, or by a service under that run) are not
    the run's to revert: a hard rollback reverts the run's dataset and leaves them as they are."""
    from app.auth.model import SYSTEM_PRINCIPAL
    from app.write.proposal import Draft
    from app.write.rules import system_service_write

    run = {"runId": "r-system", "lastObserved": 1700000000000}
    written = await restli_propose(
        client,
        helpers.mcp("datasetProperties", {"description": "by the run"}, DATASET, encode=True, systemMetadata=run),
    )
    assert written.status_code == 200, written.text
    gateway = app.state.gateway
    for urn, aspect, value in (
        (PIPELINE_URN, PIPELINE_ASPECT, PIPELINE),
        (MODELS_URN, MODELS_ASPECT, {"aspects": [], "entities": []}),
    ):
        with system_service_write(urn, aspect):
            async with app.state.sessionmaker() as session:
                await gateway.submit(
                    session,
                    [Draft(0, SYSTEM, aspect, "UPSERT", urn=urn, value=value, system_metadata=run)],
                    SYSTEM_PRINCIPAL,
                )
    before = await system_rows(db)
    assert len(before) == 4

    response = await client.post(
        "/runs?action=rollback",
        headers=RESTLI_HEADERS,
        content=orjson.dumps({"runId": "r-system", "dryRun": False, "safe": False}),
    )
    assert response.status_code == 200, response.text
    assert await stored(db, DATASET, "datasetProperties") is None  # the run's own write: reverted
    assert await system_rows(db) == before
    summaries = response.json()["value"]["aspectRowSummaries"]
    assert all(not s["urn"].startswith("urn:li:metaledgerSystem:") for s in summaries)


async def test_delete_references_never_touches_metaledger_system(client, db, registry, monkeypatch):
    """deleteReferences rewrites the aspects that reference a URN: one of metaledgerSystem holding it (a step's config
    naming a tag, made a relationship here: none of its aspects has one) is left as it is, the others lose it."""
    from app.ingest.references import relationship_paths

    tag = "urn:li:tag:secret"
    paths = dict(relationship_paths(registry))
    paths[PIPELINE_ASPECT] = [(["steps", "*", "config", "*"], "Mentions")]
    monkeypatch.setattr(registry, "_restli_relationship_paths", paths)
    await seed(client, db)
    assert (
        await client.put(PROCESSORS, json={"steps": [{"name": f"{P}.Lowercase", "config": {"tag": tag}}]})
    ).status_code == 200
    assert (
        await restli_propose(client, helpers.mcp("globalTags", {"tags": [{"tag": tag}]}, DATASET, encode=True))
    ).status_code == 200
    before = await system_rows(db)

    done = await client.post("/entities?action=deleteReferences", json={"urn": tag, "dryRun": False})
    assert done.status_code == 200, done.text
    assert [r["entity"] for r in done.json()["value"]["relatedAspects"]] == [DATASET]
    assert (await stored(db, DATASET, "globalTags"))["value"]["tags"] == []
    assert await system_rows(db) == before


async def test_the_models_api_and_the_processors_api_still_write_it(client, db, app):
    # the model set: applied, versioned, taken up
    assert (await client.post(MODELS, json=MODEL_SET)).json()["version"] == 1
    written = await client.post("/openapi/v1/proposals", json=[helpers.mcp("acmeRating", {"stars": 4}, DATASET)])
    assert written.status_code == 200, written.text

    # the pipeline: stored, versioned, in force at once in this process, conditional on its version
    put = await client.put(PROCESSORS, json=PIPELINE)
    assert put.status_code == 200, put.text
    body = put.json()
    assert (
        body["version"] == 1
        and body["urn"] == PIPELINE_URN
        and [s["name"] for s in body["steps"]] == [f"{P}.Lowercase"]
    )
    assert body["steps"][0]["loaded"] is True
    tags = await client.post(
        "/openapi/v1/proposals", json=[helpers.mcp("globalTags", {"tags": [{"tag": "urn:li:tag:PII"}]}, DATASET)]
    )
    assert tags.status_code == 200 and (await stored(db, DATASET, "globalTags"))["value"]["tags"] == [
        {"tag": "urn:li:tag:pii"}
    ]
    stale = await client.put(PROCESSORS, params={"ifVersion": "0"}, json=OTHER_PIPELINE)
    assert stale.status_code == 409, stale.text
    again = await client.put(PROCESSORS, params={"ifVersion": "1"}, json=OTHER_PIPELINE)
    assert again.status_code == 200 and again.json()["version"] == 2
    assert (await client.get(PROCESSORS)).json()["version"] == 2
    bad = await client.put(PROCESSORS, json={"steps": [{"enabled": True}]})
    assert bad.status_code == 400 and bad.json()["issues"][0]["path"].startswith("$.steps[0]"), bad.text
    row = await stored(db, PIPELINE_URN, PIPELINE_ASPECT)
    assert row["createdBy"] == helpers.TEST_ACTOR and row["systemMetadata"]["version"] == "2"
    # with its change log, as any aspect
    assert (
        await db.fetchval(
            "SELECT count(*) FROM change_log_outbox WHERE urn = $1 AND aspect = $2 "
            "AND topic = 'MetadataChangeLog_Versioned_v1'",
            PIPELINE_URN,
            PIPELINE_ASPECT,
        )
        == 2
    )
