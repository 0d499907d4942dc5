"""Change processors end to end (app.write.processors): the before phase in the real write path over HTTP, the
stored pipeline changed over the API and taken up by another process, emitted proposals with their cause, the after
phase exactly once, the example package loaded through its entry points, and the MCP topic's failed proposals."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import orjson
import pytest_asyncio

from app.embedded_pg import free_port
from app.main import create_app
from app.settings import Settings
from app.write.after_processors import AfterProcessorWorker
from app.write.processors import (
    CAUSE_ASPECT,
    CAUSE_PROCESSOR,
    CAUSE_URN,
    CAUSE_VERSION,
    PIPELINE_URN,
    Accept,
    ChangeProcessor,
    EmittedProposal,
    Phase,
    ProposedChange,
    Reject,
    Scope,
)
from tests.helpers import bearer, eventually, restli_propose, stored
from tests.helpers import mcp as wire_mcp
from tests.processes import SYSTEM_AUTH, start_service, stop_process, wait_healthy

PROD = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"
DEV = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,DEV)"
P = "tests.unit.test_processors"
HERE = __name__


# --- processors of these tests -------------------------------------------------------------------------------------
class RejectsUppercaseTags(ChangeProcessor):
    name = "rejects-uppercase-tags"
    scope = Scope(aspects=("globalTags",))

    def process(self, change: ProposedChange):
        tags = [t["tag"] for t in (change.proposed or {}).get("tags") or []]
        return Reject(f"upper-case tag {tags}") if any(t != t.lower() for t in tags) else Accept()


class TagsNewDatasets(ChangeProcessor):
    """Before phase: a dataset's first properties emit a tag on it and the tag entity's properties (another entity:
    its rows are locked in the same transaction)."""

    name = "tags-new-datasets"
    scope = Scope(entity_types=("dataset",), aspects=("datasetProperties",))

    def process(self, change: ProposedChange):
        if change.previous is not None:
            return Accept()
        return Accept(
            emit=[
                EmittedProposal(change.urn, "dataset", "globalTags", {"tags": [{"tag": "urn:li:tag:new"}]}),
                EmittedProposal("urn:li:tag:new", "tag", "tagProperties", {"name": "new"}),
            ]
        )


class MarksDeprecated(ChangeProcessor):
    """After phase: each deprecation change log gets one more Ownership entry... simpler: one `status` write whose
    version counts how many times the side effect was applied."""

    name = "marks-deprecated"
    phase = Phase.AFTER
    scope = Scope(entity_types=("dataset",), aspects=("deprecation",))

    def process(self, change: ProposedChange):
        note = (change.proposed or {}).get("note", "")
        return Accept(
            emit=[EmittedProposal(change.urn, "dataset", "editableDatasetProperties", {"description": f"seen {note}"})]
        )


# --- fixtures ------------------------------------------------------------------------------------------------------
def registry_yml(steps: str) -> str:
    return f"modelSources:\n  - package: acryl-datahub\nchangeProcessors:\n{steps}"


PIPELINE_YML = registry_yml(f"""  - name: {P}.NoSecrets
    config: {{word: confidential}}
  - name: {P}.Lowercase
  - name: {P}.NeedsOwner
  - name: {P}.Boom
    scope: {{aspects: [institutionalMemory]}}
  - name: {P}.Slow
    scope: {{aspects: [subTypes]}}
  - name: {HERE}.TagsNewDatasets
""")


async def started(tmp_path, database_url, registry, yml: str, **settings):
    path = tmp_path / "entity_registry.yml"
    path.write_text(yml)
    app = create_app(
        Settings(
            database_url=database_url,
            apply_migrations_on_start=False,
            registry_path=path,
            auth_bootstrap_admin_token=False,
            **settings,
        ),
        registry,
    )
    return app


@pytest_asyncio.fixture
async def pipeline_app(tmp_path, database_url, registry):
    app = await started(tmp_path, database_url, registry, PIPELINE_YML)
    async with app.router.lifespan_context(app):
        yield app


@pytest_asyncio.fixture
async def pipeline_client(pipeline_app):
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=pipeline_app), base_url="http://m", headers=await bearer(pipeline_app)
    ) as http:
        yield http


def mcp(urn: str, aspect: str, value: dict, entity: str = "dataset") -> dict:
    return {"entityType": entity, "entityUrn": urn, "aspectName": aspect, "aspect": {"value": value}}


def pipeline(*steps: dict) -> dict:
    """The body of PUT /openapi/v1/change-processors (the only route that writes the pipeline)."""
    return {"steps": list(steps)}


# --- the before phase ----------------------------------------------------------------------------------------------
async def test_before_phase_outcomes_over_http(pipeline_client, db: asyncpg.Connection):
    # mutate: tags lower-cased, the result validated and stored; the answer lists what each processor did
    tags = await pipeline_client.post(
        "/openapi/v1/proposals", json=[mcp(DEV, "globalTags", {"tags": [{"tag": "urn:li:tag:PII"}]})]
    )
    assert tags.status_code == 200, tags.text
    reports = tags.json()["results"][0]["changeProcessors"]
    assert [(r["processor"].rsplit(".", 1)[1], r["outcome"]) for r in reports] == [
        ("NoSecrets", "accepted"),
        ("Lowercase", "mutated"),
    ]
    stored_tags = (await pipeline_client.get(f"/openapi/v3/entity/dataset/{DEV}/globalTags")).json()
    assert stored_tags["value"]["tags"] == [{"tag": "urn:li:tag:pii"}]

    # reject: the batch refused as a whole, the processor named; nothing of the batch written
    refused = await pipeline_client.post(
        "/openapi/v1/proposals",
        json=[mcp(DEV, "status", {"removed": False}), mcp(PROD, "datasetProperties", {"name": "orders"})],
    )
    assert refused.status_code == 400
    assert (
        "NeedsOwner" in refused.text and "need an owner" in refused.text and refused.json()["issues"][0]["index"] == 1
    )
    assert await stored(db, DEV, "status") is None
    # the same pipeline for DataHub's Rest.li entry (the `datahub` client's)
    restli = await restli_propose(
        pipeline_client, wire_mcp("datasetProperties", {"name": "orders"}, urn=PROD, encode=True)
    )
    assert restli.status_code == 400 and "NeedsOwner" in restli.text and "need an owner" in restli.text

    # ignore, by the previous value: a word the previous description did not have is dropped, not an error
    first = await pipeline_client.post(
        "/openapi/v1/proposals", json=[mcp(DEV, "datasetProperties", {"description": "orders"})]
    )
    assert first.status_code == 200
    ignored = await pipeline_client.post(
        "/openapi/v1/proposals", json=[mcp(DEV, "datasetProperties", {"description": "confidential orders"})]
    )
    assert ignored.status_code == 200, ignored.text
    item = ignored.json()["results"][0]
    assert item["status"] == "IGNORED" and "NoSecrets" in item["message"]
    assert item["changeProcessors"][0]["outcome"] == "ignored"
    assert (
        await db.fetchval(
            "SELECT count(*) FROM change_log_outbox WHERE urn = $1 AND aspect = 'datasetProperties' "
            "AND topic = 'MetadataChangeLog_Versioned_v1'",
            DEV,
        )
        == 1
    )  # the ignored change has no change log
    assert (await stored(db, DEV, "datasetProperties"))["value"]["description"] == "orders"

    # a processor that raises, and one past its time budget: refusals naming them; the service still answers
    failed = await pipeline_client.post(
        "/openapi/v1/proposals", json=[mcp(DEV, "institutionalMemory", {"elements": []})]
    )
    assert failed.status_code == 400 and "Boom" in failed.text and "kaput" in failed.text
    slow = await pipeline_client.post("/openapi/v1/proposals", json=[mcp(DEV, "subTypes", {"typeNames": ["t"]})])
    assert slow.status_code == 400 and "Slow" in slow.text and "budget" in slow.text
    assert (await pipeline_client.get("/health")).status_code == 200
    again = await pipeline_client.post("/openapi/v1/proposals", json=[mcp(DEV, "status", {"removed": False})])
    assert again.status_code == 200


async def test_emitted_proposals_are_written_with_their_cause(pipeline_client, db: asyncpg.Connection):
    new = "urn:li:dataset:(urn:li:dataPlatform:hive,db.fresh,DEV)"
    written = await pipeline_client.post(
        "/openapi/v1/proposals",
        json=[{**mcp(new, "datasetProperties", {"description": "fresh"}), "systemMetadata": {"runId": "run-7"}}],
    )
    assert written.status_code == 200, written.text
    item = written.json()["results"][0]
    assert item["status"] == "CREATED" and item["version"] == "1"
    # the emitted proposals went through the pipeline too (the tag lower-cased already: no mutation needed)
    assert [(e["urn"], e["aspectName"], e["status"]) for e in item["emitted"]] == [
        (new, "globalTags", "CREATED"),
        ("urn:li:tag:new", "tagProperties", "CREATED"),
    ]
    for urn, aspect in [(new, "globalTags"), ("urn:li:tag:new", "tagProperties")]:
        row = await stored(db, urn, aspect)
        assert row is not None, (urn, aspect)
        properties = row["systemMetadata"]["properties"]
        assert properties[CAUSE_URN] == new and properties[CAUSE_ASPECT] == "datasetProperties"
        assert properties[CAUSE_VERSION] == "1" and properties[CAUSE_PROCESSOR].endswith("TagsNewDatasets")
        assert row["systemMetadata"]["runId"] == "run-7"
    # committed with the cause, in one transaction: every change log of it, the cause's first
    logs = await db.fetch(
        "SELECT urn, aspect FROM change_log_outbox WHERE topic = 'MetadataChangeLog_Versioned_v1' "
        "AND aspect <> 'datasetKey' AND aspect <> 'tagKey' ORDER BY id"
    )
    assert [tuple(r) for r in logs] == [
        (new, "datasetProperties"),
        (new, "globalTags"),
        ("urn:li:tag:new", "tagProperties"),
    ]
    # a second change of the properties emits nothing (the processor looks at the previous value)
    second = await pipeline_client.post(
        "/openapi/v1/proposals", json=[mcp(new, "datasetProperties", {"description": "again"})]
    )
    assert "emitted" not in second.json()["results"][0]


async def test_the_pipeline_is_listed_and_counted(pipeline_client, anonymous):
    listed = await pipeline_client.get("/openapi/v1/change-processors")
    assert listed.status_code == 200
    body = listed.json()
    assert body["version"] == 0 and "entity_registry.yml" in body["source"]
    steps = body["steps"]
    assert [s["name"].rsplit(".", 1)[1] for s in steps] == [
        "NoSecrets",
        "Lowercase",
        "NeedsOwner",
        "Boom",
        "Slow",
        "TagsNewDatasets",
    ]
    assert all(s["loaded"] and s["phase"] == "before" for s in steps)
    assert steps[0]["origin"] == P and steps[3]["scope"]["aspects"] == ["institutionalMemory"]
    assert (await anonymous.get("/openapi/v1/change-processors")).status_code == 401
    await pipeline_client.post(
        "/openapi/v1/proposals", json=[mcp(DEV, "globalTags", {"tags": [{"tag": "urn:li:tag:A"}]})]
    )
    metrics = (await pipeline_client.get("/metrics")).text
    assert (
        f'metaledger_change_processor_calls_total{{outcome="mutated",phase="before",processor="{P}.Lowercase"}}'
        in metrics
    )


async def test_a_required_step_that_is_missing_refuses_the_writes_in_its_scope(tmp_path, database_url, registry):
    app = await started(
        tmp_path,
        database_url,
        registry,
        registry_yml(
            "  - name: no_such_package.Validator\n    required: true\n    scope: {aspects: [globalTags]}\n"
            "  - name: no_such_package.Optional\n"
        ),
    )
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://m", headers=await bearer(app)
        ) as http:
            refused = await http.post("/openapi/v1/proposals", json=[mcp(DEV, "globalTags", {"tags": []})])
            assert refused.status_code == 400
            assert "no_such_package.Validator" in refused.text and "not available" in refused.text
            # out of its scope, and the optional missing step: writes pass
            assert (
                await http.post("/openapi/v1/proposals", json=[mcp(DEV, "status", {"removed": False})])
            ).status_code == 200
            steps = (await http.get("/openapi/v1/change-processors")).json()["steps"]
            assert [(s["loaded"], s["required"]) for s in steps] == [(False, True), (False, False)]


# --- the stored pipeline -------------------------------------------------------------------------------------------
async def test_the_stored_pipeline_is_admin_only_and_another_process_takes_it_up(
    make_database, migrated_template, registry
):
    database_url = make_database(template=migrated_template)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    other = start_service(
        {
            "METALEDGER_DATABASE_URL": database_url,
            "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
            "METALEDGER_CHANGE_PROCESSOR_REFRESH_S": "1",
        },
        port,
    )
    app = create_app(Settings(database_url=database_url, apply_migrations_on_start=False), registry)
    try:
        await wait_healthy(base, 90, other)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://m") as here,
            httpx.AsyncClient(base_url=base, headers=SYSTEM_AUTH, timeout=30) as there,
        ):
            upper = [mcp(DEV, "globalTags", {"tags": [{"tag": "urn:li:tag:PII"}]})]
            lower_first = pipeline({"name": f"{P}.Lowercase"}, {"name": f"{HERE}.RejectsUppercaseTags"})
            reject_first = pipeline({"name": f"{HERE}.RejectsUppercaseTags"}, {"name": f"{P}.Lowercase"})

            # a writer may not change the pipeline (403 naming the permission); an admin may
            writer = await bearer(app, role="writer", actor="urn:li:corpuser:alice")
            forbidden = await here.put("/openapi/v1/change-processors", json=lower_first, headers=writer)
            assert forbidden.status_code == 403 and "ADMIN" in forbidden.text
            admin = await bearer(app)
            assert (await here.put("/openapi/v1/change-processors", json=lower_first, headers=admin)).status_code == 200

            # the other process takes it up within seconds, without a restart: the tag is lower-cased. A write
            # there may come before it looks again (it looks at most every CHANGE_PROCESSOR_REFRESH_S, and it may
            # have looked just before the PUT): what counts is that one within the time is lower-cased
            async def there_status(expected: int) -> bool:
                response = await there.post("/openapi/v1/proposals", json=upper)
                return response.status_code == expected

            async def lowercased_there() -> bool:
                if not await there_status(200):
                    return False
                stored = await there.get(f"/openapi/v3/entity/dataset/{DEV}/globalTags")
                return stored.json()["value"]["tags"] == [{"tag": "urn:li:tag:pii"}]

            assert await eventually(lowercased_there, timeout=15)
            listed = (await there.get("/openapi/v1/change-processors")).json()
            assert listed["version"] == 1 and [s["name"] for s in listed["steps"]] == [
                f"{P}.Lowercase",
                f"{HERE}.RejectsUppercaseTags",
            ]

            # reordered over the API: now the same write is refused there, naming the processor
            assert (
                await here.put("/openapi/v1/change-processors", json=reject_first, headers=admin)
            ).status_code == 200
            assert await eventually(lambda: there_status(400), timeout=15)
            refused = await there.post("/openapi/v1/proposals", json=upper)
            assert "RejectsUppercaseTags" in refused.text

            # versioned and audited like any aspect, with a change log
            history = (
                await here.get(
                    f"/openapi/v3/entity/metaledgerSystem/{PIPELINE_URN}/changeProcessorPipeline?systemMetadata=true",
                    headers=admin,
                )
            ).json()
            assert history["systemMetadata"]["version"] == "2"
    finally:
        stop_process(other)


# --- the after phase -----------------------------------------------------------------------------------------------
async def test_after_phase_side_effects_are_applied_exactly_once(
    tmp_path, database_url, registry, db: asyncpg.Connection
):
    app = await started(
        tmp_path,
        database_url,
        registry,
        registry_yml(f"  - name: {HERE}.MarksDeprecated\n"),
        after_processor_poll_ms=20,
    )
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://m", headers=await bearer(app)
        ) as http:
            for note in ("one", "two", "three"):
                written = await http.post(
                    "/openapi/v1/proposals",
                    json=[
                        mcp(DEV, "deprecation", {"deprecated": True, "note": note, "actor": "urn:li:corpuser:alice"})
                    ],
                )
                assert written.status_code == 200, written.text

            async def applied() -> bool:
                row = await stored(db, DEV, "editableDatasetProperties")
                return row is not None and row["value"]["description"] == "seen three"

            assert await eventually(applied)
            row = await stored(db, DEV, "editableDatasetProperties")
            assert row["systemMetadata"]["version"] == "3"  # one write per change log
            properties = row["systemMetadata"]["properties"]
            assert properties[CAUSE_ASPECT] == "deprecation" and properties[CAUSE_VERSION] == "3"

            # The same change logs delivered again: two readers at once, and a batch whose transaction dies after its
            # side effects were written. The position is moved in the transaction that writes them: each once.
            await db.execute("UPDATE feed_reader_state SET last_offset = 0 WHERE reader = 'change-processors'")
            writer = app.state.write_service
            real_commit = writer.commit
            crashes = []

            async def commit_then_die(session, proposals, audit):
                result = await real_commit(session, proposals, audit)
                if not crashes:
                    crashes.append(1)
                    raise ConnectionResetError("the process died after writing the side effects")
                return result

            writer.commit = commit_then_die
            readers = [
                AfterProcessorWorker(app.state.settings, app.state.engine, app.state.sessionmaker, writer)
                for _ in range(2)
            ]  # and the app's own reader, running all along
            try:
                await asyncio.gather(*(r.step() for r in readers), return_exceptions=True)

                async def replayed() -> bool:
                    row = await stored(db, DEV, "editableDatasetProperties")
                    return row["systemMetadata"]["version"] == "6"

                assert await eventually(replayed)
                assert crashes  # one delivery died after writing its side effects
                while sum(await asyncio.gather(*(r.step() for r in readers))):
                    pass  # the feed read to its end (the side effects' own change logs are not in scope)
            finally:
                writer.commit = real_commit
            # what is asserted is that nothing more happens: the app's own reader, running all along, gets time to
            # write a side effect a fourth time (nothing to wait on for a write that must not come)
            await asyncio.sleep(0.3)
            row = await stored(db, DEV, "editableDatasetProperties")
            # the replay wrote the side effects of the three change logs once more each (the position was reset by
            # hand: the test delivers them again on purpose), never more: versions 4, 5, 6
            assert row["systemMetadata"]["version"] == "6"


# --- the example package ---------------------------------------------------------------------------------------------
EXAMPLES_YML = registry_yml("""  - name: ignore-disallowed-words
    config: {words: "confidential,secret"}
  - name: lowercase-tags
  - name: prod-datasets-need-an-owner
    required: true
  - name: deprecated-datasets-get-a-tag
""")


async def test_the_example_package_is_loaded_through_its_entry_points(tmp_path, database_url, registry, db):
    """examples/change_processors, installed with pip (the Makefile's venv target), found by entry-point name."""
    app = await started(tmp_path, database_url, registry, EXAMPLES_YML, after_processor_poll_ms=20)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://m", headers=await bearer(app)
        ) as http:
            steps = (await http.get("/openapi/v1/change-processors")).json()["steps"]
            assert [(s["name"], s["origin"], s["loaded"], s["phase"]) for s in steps] == [
                (name, "metaledger-example-processors==0.1.0", True, phase)
                for name, phase in (
                    ("ignore-disallowed-words", "before"),
                    ("lowercase-tags", "before"),
                    ("prod-datasets-need-an-owner", "before"),
                    ("deprecated-datasets-get-a-tag", "after"),
                )
            ]
            owner = {"owners": [{"owner": "urn:li:corpuser:alice", "type": "DATAOWNER"}]}
            assert (await http.post("/openapi/v1/proposals", json=[mcp(PROD, "ownership", owner)])).status_code == 200
            emptied = await http.post("/openapi/v1/proposals", json=[mcp(PROD, "ownership", {"owners": []})])
            assert emptied.status_code == 400 and "needs an owner" in emptied.text
            secret = await http.post(
                "/openapi/v1/proposals", json=[mcp(PROD, "datasetProperties", {"description": "a secret"})]
            )
            assert secret.json()["results"][0]["status"] == "IGNORED"
            tags = await http.post(
                "/openapi/v1/proposals", json=[mcp(PROD, "globalTags", {"tags": [{"tag": "urn:li:tag:Gold"}]})]
            )
            assert tags.json()["results"][0]["changeProcessors"][0]["outcome"] == "mutated"
            deprecated = await http.post(
                "/openapi/v1/proposals",
                json=[
                    mcp(
                        PROD,
                        "deprecation",
                        {"deprecated": True, "note": "use orders_v2", "actor": "urn:li:corpuser:alice"},
                    )
                ],
            )
            assert deprecated.status_code == 200

            async def tagged():
                row = await stored(db, PROD, "globalTags")
                return row is not None and len(row["value"]["tags"]) == 2

            assert await eventually(tagged)
            row = await stored(db, PROD, "globalTags")
            assert [t["tag"] for t in row["value"]["tags"]] == ["urn:li:tag:gold", "urn:li:tag:deprecated"]
            assert row["systemMetadata"]["properties"][CAUSE_PROCESSOR] == "deprecated-datasets-get-a-tag"


# --- the MCP topic -------------------------------------------------------------------------------------------------
async def test_the_mcp_topic_runs_the_same_pipeline(tmp_path, database_url, registry, db, kafka_broker, monkeypatch):
    """The async MCP consumer: a rejection goes to FailedMetadataChangeProposal_v1 with the processor's reason, an
    ignored change is dropped without a failure, a mutation is written."""
    from app.ingest.gateway import IngestGateway
    from app.kafka.consumers import McpConsumer
    from tests.helpers import (
        create_topics,
        dead_letter,
        fast_groups,
        kafka_overrides,
        produce,
        read_topic,
        unique_topics,
    )

    bootstrap = kafka_broker.bootstrap_servers
    topics = unique_topics("topic_mcp", "topic_fmcp", "topic_mce", "topic_fmce")
    await create_topics(bootstrap, *topics.values())
    fast_groups(monkeypatch)
    app = await started(tmp_path, database_url, registry, PIPELINE_YML, **kafka_overrides(bootstrap, topics))
    async with app.router.lifespan_context(app):
        await produce(
            bootstrap,
            topics["topic_mcp"],
            [
                (
                    PROD,
                    wire_mcp("datasetProperties", {"name": "orders"}, urn=PROD, encode=True),
                ),  # rejected: NeedsOwner
                (DEV, wire_mcp("datasetProperties", {"description": "plain"}, urn=DEV, encode=True)),
                (DEV, wire_mcp("datasetProperties", {"description": "confidential"}, urn=DEV, encode=True)),  # ignored
                (DEV, wire_mcp("globalTags", {"tags": [{"tag": "urn:li:tag:Loud"}]}, urn=DEV, encode=True)),  # mutated
            ],
        )
        stop = asyncio.Event()
        consumer = McpConsumer(app.state.settings, app.state.sessionmaker, IngestGateway(app.state.write_service))
        task = asyncio.create_task(consumer.run(stop))
        try:
            (failed,) = await read_topic(bootstrap, topics["topic_fmcp"], expect=1, timeout=30)
            payload, trace = dead_letter(failed)
            assert payload["entityUrn"] == PROD and trace["status"] == 400
            described = trace["message"] + orjson.dumps(trace["body"]).decode()
            assert (
                "change processor tests.unit.test_processors.NeedsOwner" in described and "need an owner" in described
            )

            async def tags_written():
                row = await stored(db, DEV, "globalTags")
                return row is not None and row["value"]["tags"] != [{"tag": "urn:li:tag:new"}]  # TagsNewDatasets' first

            assert await eventually(tags_written, timeout=30)
            assert (await stored(db, DEV, "globalTags"))["value"]["tags"] == [{"tag": "urn:li:tag:loud"}]
            assert (await stored(db, DEV, "datasetProperties"))["value"]["description"] == "plain"
            assert await stored(db, PROD, "datasetProperties") is None
        finally:
            stop.set()
            await task
