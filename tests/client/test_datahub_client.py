"""DataHub's real Python client and CLI (PyPI `acryl-datahub`, pinned, in its own virtualenv) against a running
metaledger: emitter, legacy MCE, PATCH builders, `datahub put/get/delete`, DataHubGraph reads, `datahub ingest`.

`test_datahub_ingest_file_timings` prints the end-to-end `datahub ingest` timings (Rest.li and OpenAPI); run with
`-s` to see them, they are also kept in pytest's cache under `metaledger/client_ingest_timings`.
"""

from __future__ import annotations

import json
import time
import uuid
from urllib.parse import quote

import pytest

pytestmark = pytest.mark.client

DS = "urn:li:dataset:(urn:li:dataPlatform:hive,client.{name},PROD)"
RECORDS = 1000  # MCPs in the generated metadata file: ten of the Rest.li sink's batches of 100


def entity(metaledger, entity_type: str, urn: str) -> dict:
    with metaledger.http() as http:
        response = http.get(
            f"/openapi/v3/entity/{entity_type}/{quote(urn, safe='')}", params={"systemMetadata": "true"}
        )
        return response.json() if response.status_code == 200 else {}


def test_emitter_single_batch_and_legacy_mce(datahub, metaledger):
    datahub.script(
        """
        from datahub.emitter.mcp import MetadataChangeProposalWrapper
        from datahub.emitter.rest_emitter import DatahubRestEmitter
        from datahub.metadata.schema_classes import (
            DatasetPropertiesClass, DatasetSnapshotClass, MetadataChangeEventClass, OwnerClass, OwnershipClass,
            OwnershipTypeClass, SchemaFieldClass, SchemaFieldDataTypeClass, SchemaMetadataClass, StatusClass,
            StringTypeClass, OtherSchemaClass, UpstreamClass, UpstreamLineageClass, DatasetLineageTypeClass)

        ds = lambda n: f"urn:li:dataset:(urn:li:dataPlatform:hive,client.{n},PROD)"
        emitter = DatahubRestEmitter(GMS, token=TOKEN)
        emitter.test_connection()
        emitter.emit(MetadataChangeProposalWrapper(entityUrn=ds("single"), aspect=DatasetPropertiesClass(
            description="Orders table \u00e9\u00e8 \u2713 \U0001f600", customProperties={"k": "v"})))
        schema = SchemaMetadataClass(schemaName="t", platform="urn:li:dataPlatform:hive", version=0, hash="",
            platformSchema=OtherSchemaClass(rawSchema=""),
            fields=[SchemaFieldClass(fieldPath="id", type=SchemaFieldDataTypeClass(StringTypeClass()), nativeDataType="string")])
        emitter.emit_mcps([
            MetadataChangeProposalWrapper(entityUrn=ds(f"batch{i}"), aspect=StatusClass(removed=False)) for i in range(5)
        ] + [MetadataChangeProposalWrapper(entityUrn=ds("batch0"), aspect=schema),
             MetadataChangeProposalWrapper(entityUrn=ds("batch0"), aspect=OwnershipClass(
                 owners=[OwnerClass(owner="urn:li:corpuser:jdoe", type=OwnershipTypeClass.DATAOWNER)]))])
        emitter.emit(MetadataChangeEventClass(proposedSnapshot=DatasetSnapshotClass(urn=ds("legacy"), aspects=[
            StatusClass(removed=False), DatasetPropertiesClass(description="legacy mce"),
            UpstreamLineageClass(upstreams=[UpstreamClass(dataset=ds("single"), type=DatasetLineageTypeClass.TRANSFORMED)])])))
        emitter.close()
        """
    )
    single = entity(metaledger, "dataset", DS.format(name="single"))
    assert single["datasetProperties"]["value"]["description"] == "Orders table éè ✓ 😀"
    assert single["datasetProperties"]["systemMetadata"]["properties"]["clientId"] == "acryl-datahub"
    for i in range(5):
        assert entity(metaledger, "dataset", DS.format(name=f"batch{i}"))["status"]["value"] == {"removed": False}
    batch0 = entity(metaledger, "dataset", DS.format(name="batch0"))
    assert batch0["schemaMetadata"]["value"]["fields"][0]["type"] == {"type": {"com.linkedin.schema.StringType": {}}}
    assert batch0["ownership"]["value"]["owners"][0]["owner"] == "urn:li:corpuser:jdoe"
    legacy = entity(metaledger, "dataset", DS.format(name="legacy"))
    assert legacy["datasetProperties"]["value"]["description"] == "legacy mce"
    assert legacy["upstreamLineage"]["value"]["upstreams"][0]["dataset"] == DS.format(name="single")


PATCH_SCRIPT = """
    from datahub.emitter.rest_emitter import DatahubRestEmitter
    from datahub.emitter.mcp import MetadataChangeProposalWrapper
    from datahub.specific.dataset import DatasetPatchBuilder
    from datahub.metadata.schema_classes import (DatasetPropertiesClass, OwnerClass, OwnershipTypeClass,
        TagAssociationClass, GlossaryTermAssociationClass, UpstreamClass, DatasetLineageTypeClass)

    urn = "urn:li:dataset:(urn:li:dataPlatform:hive,client.patched,PROD)"
    up = "urn:li:dataset:(urn:li:dataPlatform:hive,client.upstream,PROD)"
    emitter = DatahubRestEmitter(GMS, token=TOKEN)
    emitter.emit(MetadataChangeProposalWrapper(entityUrn=urn, aspect=DatasetPropertiesClass(description="before")))
    builder = (DatasetPatchBuilder(urn)
        .add_custom_property("team", "growth")
        .add_tag(TagAssociationClass("urn:li:tag:gold"))
        .add_term(GlossaryTermAssociationClass("urn:li:glossaryTerm:revenue"))
        .add_owner(OwnerClass("urn:li:corpuser:jdoe", OwnershipTypeClass.TECHNICAL_OWNER))
        .add_upstream_lineage(UpstreamClass(dataset=up, type=DatasetLineageTypeClass.TRANSFORMED)))
    for mcp in builder.build():
        emitter.emit(mcp)
"""


def test_without_a_valid_token_the_client_fails_cleanly(datahub, metaledger):
    """No token, and a revoked one: the client's connection test (/config) passes, the write fails with the
    service's 401 message (the client does not retry 401), and nothing is stored."""
    from tests.processes import service_token

    revoked = service_token({"METALEDGER_DATABASE_URL": metaledger.database_url}, "urn:li:corpuser:leaver", "writer")
    with metaledger.http() as http:
        token_id = next(
            t["id"]
            for t in http.get("/openapi/v1/auth/tokens", params={"actor": "urn:li:corpuser:leaver"}).json()["tokens"]
        )
        assert http.delete(f"/openapi/v1/auth/tokens/{token_id}").status_code == 200
    out = datahub.script(
        """
        import json
        from datahub.emitter.mcp import MetadataChangeProposalWrapper
        from datahub.emitter.rest_emitter import DatahubRestEmitter
        from datahub.metadata.schema_classes import StatusClass

        outcomes = []
        for token in (None, REVOKED):
            emitter = DatahubRestEmitter(GMS, token=token)
            emitter.test_connection()
            try:
                emitter.emit(MetadataChangeProposalWrapper(entityUrn=URN, aspect=StatusClass(removed=False)))
                outcomes.append("written")
            except Exception as error:
                outcomes.append(f"{type(error).__name__}: {error}")
        print(json.dumps(outcomes))
        """,
        URN=DS.format(name="unauthenticated"),
        REVOKED=revoked,
    )
    no_token, revoked_token = json.loads(out.stdout.strip().splitlines()[-1])
    assert no_token.startswith("OperationalError") and "authentication required" in no_token, no_token
    assert revoked_token.startswith("OperationalError") and "revoked" in revoked_token, revoked_token
    with metaledger.http() as http:
        assert http.get(f"/openapi/v3/entity/dataset/{DS.format(name='unauthenticated')}").status_code == 404


def test_dataset_patch_builders(datahub, metaledger):
    datahub.script(PATCH_SCRIPT)
    patched = entity(metaledger, "dataset", DS.format(name="patched"))
    assert patched["datasetProperties"]["value"]["customProperties"] == {"team": "growth"}
    assert patched["datasetProperties"]["value"]["description"] == "before"
    assert [t["tag"] for t in patched["globalTags"]["value"]["tags"]] == ["urn:li:tag:gold"]
    assert [t["urn"] for t in patched["glossaryTerms"]["value"]["terms"]] == ["urn:li:glossaryTerm:revenue"]
    assert [(o["owner"], o["type"]) for o in patched["ownership"]["value"]["owners"]] == [
        ("urn:li:corpuser:jdoe", "TECHNICAL_OWNER")
    ]
    assert [u["dataset"] for u in patched["upstreamLineage"]["value"]["upstreams"]] == [DS.format(name="upstream")]


def test_cli_put_get_soft_and_hard_delete(datahub, metaledger, tmp_path):
    urn = DS.format(name="cli")
    props = tmp_path / "props.json"
    props.write_text(json.dumps({"description": "from the cli", "customProperties": {"a": "b"}}))
    put = datahub.cli("put", "--urn", urn, "-a", "datasetProperties", "-d", str(props))
    assert "Update succeeded" in put.stdout + put.stderr
    datahub.cli(
        "put",
        "--urn",
        urn,
        "-a",
        "status",
        "-d",
        str(_write(tmp_path / "s.json", {"removed": False})),
        "--run-id",
        "my-run",
    )
    assert entity(metaledger, "dataset", urn)["status"]["systemMetadata"]["runId"] == "my-run"

    got = json.loads(datahub.cli("get", "--urn", urn, "-a", "datasetProperties").stdout)
    assert got["datasetProperties"]["description"] == "from the cli"
    everything = json.loads(datahub.cli("get", "--urn", urn).stdout)
    assert {"datasetKey", "datasetProperties", "status"} <= set(everything)
    missing = datahub.cli("get", "--urn", DS.format(name="nope"), "-a", "status", check=False)
    assert "not found" in (missing.stdout + missing.stderr).lower()
    assert datahub.cli("exists", "--urn", urn).stdout.strip().lower() == "true"

    datahub.cli("delete", "--urn", urn, "--soft", "-f")
    status = entity(metaledger, "dataset", urn)["status"]
    assert status["value"] == {"removed": True} and status["systemMetadata"]["runId"] == "__datahub-delete-cli"

    datahub.cli("delete", "--urn", urn, "--hard", "-f")
    assert entity(metaledger, "dataset", urn) == {}
    assert datahub.cli("exists", "--urn", urn).stdout.strip().lower() == "false"

    # a tag: the hard delete also removes the references to it (deleteReferences)
    tagged = DS.format(name="tagged")
    datahub.cli(
        "put",
        "--urn",
        tagged,
        "-a",
        "globalTags",
        "-d",
        str(_write(tmp_path / "t.json", {"tags": [{"tag": "urn:li:tag:doomed"}]})),
    )
    datahub.cli(
        "put",
        "--urn",
        "urn:li:tag:doomed",
        "-a",
        "tagProperties",
        "-d",
        str(_write(tmp_path / "tp.json", {"name": "doomed"})),
    )
    datahub.cli("delete", "--urn", "urn:li:tag:doomed", "--hard", "-f")
    assert entity(metaledger, "tag", "urn:li:tag:doomed") == {}
    assert entity(metaledger, "dataset", tagged)["globalTags"]["value"]["tags"] == []


def _write(path, value):
    path.write_text(json.dumps(value))
    return path


def test_graph_reads_timeseries_and_hard_delete(datahub, metaledger):
    out = datahub.script(
        """
        import json
        from datahub.emitter.mcp import MetadataChangeProposalWrapper
        from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
        from datahub.metadata.schema_classes import (DatasetKeyClass, DatasetProfileClass, DatasetPropertiesClass,
            PartitionSpecClass, StatusClass, TelemetryClientIdClass)

        urn = "urn:li:dataset:(urn:li:dataPlatform:hive,client.graph,PROD)"
        graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
        graph.emit_mcps([
            MetadataChangeProposalWrapper(entityUrn=urn, aspect=DatasetPropertiesClass(description="graph")),
            MetadataChangeProposalWrapper(entityUrn=urn, aspect=StatusClass(removed=False)),
        ] + [MetadataChangeProposalWrapper(entityUrn=urn, aspect=DatasetProfileClass(
                timestampMillis=1_700_000_000_000 + i * 1000, rowCount=i, columnCount=2,
                partitionSpec=PartitionSpecClass(partition="FULL_TABLE_SNAPSHOT"))) for i in range(5)])
        result = {
            "props": graph.get_aspect(urn, DatasetPropertiesClass).description,
            "key": graph.get_aspect(urn, DatasetKeyClass).name,
            "absent": graph.get_aspect(urn.replace("graph", "nope"), DatasetPropertiesClass),
            "exists": graph.exists(urn),
            "not_exists": graph.exists(urn.replace("graph", "nope")),
            "raw": sorted(graph.get_entity_raw(urn, ["status", "datasetProperties"])["aspects"]),
            "raw_all": sorted(graph.get_entity_raw(urn)["aspects"]),
            "series": [p.rowCount for p in graph.get_timeseries_values(urn, DatasetProfileClass, filter={}, limit=3)],
            "latest": graph.get_latest_timeseries_value(urn, DatasetProfileClass, {"rowCount": "2"}).rowCount,
            "deleted": list(graph.hard_delete_entity(urn)),
            "after": graph.exists(urn),
            "server_id": graph.get_aspect("urn:li:telemetry:clientId", TelemetryClientIdClass).clientId,
        }
        print(json.dumps(result))
        """
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert uuid.UUID(result.pop("server_id"))  # what the CLI reads as the server's id when it connects (app.telemetry)
    assert result == {
        "props": "graph",
        "key": "client.graph",
        "absent": None,
        "exists": True,
        "not_exists": False,
        "raw": ["datasetKey", "datasetProperties", "status"],
        "raw_all": ["datasetKey", "datasetProperties", "status"],
        "series": [4, 3, 2],
        "latest": 2,
        "deleted": [3, 5],
        "after": False,
    }


def test_sdk_v2_client_from_env(datahub, metaledger):
    """SDK v2 (`DataHubClient.from_env()`): /config reports >= 1.0.1, so it writes through the OpenAPI v3 endpoints."""
    out = datahub.script(
        """
        import json, warnings
        warnings.simplefilter("ignore")
        from datahub.sdk import DataHubClient, Dataset
        client = DataHubClient.from_env()
        ds = Dataset(platform="hive", name="client.sdk_v2", description="sdk v2", tags=["urn:li:tag:gold"],
                     owners=["urn:li:corpuser:jdoe"], schema=[("id", "string"), ("amount", "number")],
                     custom_properties={"a": "b"}, subtype="Table")
        client.entities.upsert(ds)
        got = client.entities.get(ds.urn)
        got.set_description("updated")
        client.entities.update(got)
        again = client.entities.get(ds.urn)
        print(json.dumps({"description": again.description, "tags": [str(t.tag) for t in again.tags or []],
                          "owners": [str(o.owner) for o in again.owners or []], "props": again.custom_properties,
                          "fields": [f.field_path for f in again.schema], "openapi": bool(client._graph._openapi_ingestion)}))
        """
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {
        "description": "updated",
        "tags": ["urn:li:tag:gold"],
        "owners": ["urn:li:corpuser:jdoe"],
        "props": {"a": "b"},
        "fields": ["id", "amount"],
        "openapi": True,
    }


GENERATOR = """
    import sys
    from datahub.emitter.mcp import MetadataChangeProposalWrapper
    from datahub.ingestion.sink.file import write_metadata_file
    from datahub.metadata.schema_classes import (DatasetProfileClass, DatasetPropertiesClass, GlobalTagsClass,
        OwnerClass, OwnershipClass, OwnershipTypeClass, SchemaFieldClass, SchemaFieldDataTypeClass, SchemaMetadataClass,
        StatusClass, StringTypeClass, NumberTypeClass, OtherSchemaClass, SubTypesClass, TagAssociationClass)

    path, prefix, records = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mcps = []
    i = 0
    while len(mcps) < records:
        urn = f"urn:li:dataset:(urn:li:dataPlatform:snowflake,{prefix}.schema{i % 7}.table_{i:05d},PROD)"
        fields = [SchemaFieldClass(fieldPath=f"col_{c}", nativeDataType="varchar" if c % 2 else "number",
                  type=SchemaFieldDataTypeClass(StringTypeClass() if c % 2 else NumberTypeClass())) for c in range(8)]
        for aspect in (
            StatusClass(removed=False),
            DatasetPropertiesClass(name=f"table_{i:05d}", description=f"Table {i} of {prefix}", customProperties={"i": str(i)}),
            SubTypesClass(typeNames=["Table"]),
            SchemaMetadataClass(schemaName=f"table_{i:05d}", platform="urn:li:dataPlatform:snowflake", version=0, hash="",
                                platformSchema=OtherSchemaClass(rawSchema=""), fields=fields),
            OwnershipClass(owners=[OwnerClass(owner=f"urn:li:corpuser:user{i % 13}", type=OwnershipTypeClass.DATAOWNER)]),
            GlobalTagsClass(tags=[TagAssociationClass(tag=f"urn:li:tag:t{i % 5}")]),
            DatasetProfileClass(timestampMillis=1_735_689_600_000 + i, rowCount=i * 10, columnCount=8),
        ):
            mcps.append(MetadataChangeProposalWrapper(entityUrn=urn, aspect=aspect))
        i += 1
    write_metadata_file(path, mcps[:records])
    print(i)
"""


def _ingest(datahub, tmp_path, data_file, name: str, extra_sink: dict) -> float:
    recipe = tmp_path / f"{name}-recipe.yml"  # JSON is YAML
    recipe.write_text(
        json.dumps(
            {
                "source": {"type": "file", "config": {"path": str(data_file)}},
                "sink": {
                    "type": "datahub-rest",
                    "config": {
                        "server": datahub.env["DATAHUB_GMS_URL"],
                        "token": datahub.env["DATAHUB_GMS_TOKEN"],
                        **extra_sink,
                    },
                },
            }
        )
    )
    started = time.perf_counter()
    result = datahub.cli("ingest", "-c", str(recipe), check=False, timeout=600)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, f"datahub ingest ({name}) failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert "Pipeline finished successfully" in result.stdout + result.stderr, result.stdout[-3000:]
    return seconds


def test_datahub_ingest_file_timings(datahub, metaledger, tmp_path, request):
    """`datahub ingest` of a metadata file of RECORDS MCPs (made with the client's own classes), end to end: once
    through the default Rest.li batch path, once through the OpenAPI v3 path (sink `endpoint: OPENAPI`)."""
    timings = {}
    for name, sink in (("restli", {}), ("openapi", {"endpoint": "OPENAPI"})):
        data_file = tmp_path / f"{name}-mcps.json"
        generated = datahub.script(
            GENERATOR.replace(
                "sys.argv[1], sys.argv[2], int(sys.argv[3])", f"{str(data_file)!r}, {f'ingest_{name}'!r}, {RECORDS}"
            )
        )
        datasets = int(generated.stdout.strip().splitlines()[-1])
        seconds = _ingest(datahub, tmp_path, data_file, name, sink)
        timings[name] = {"records": RECORDS, "seconds": round(seconds, 2), "records_per_s": round(RECORDS / seconds, 1)}

        # everything arrived: every versioned aspect of the last dataset, and the profile in the timeseries store
        last = f"urn:li:dataset:(urn:li:dataPlatform:snowflake,ingest_{name}.schema{(datasets - 1) % 7}.table_{datasets - 1:05d},PROD)"
        first = f"urn:li:dataset:(urn:li:dataPlatform:snowflake,ingest_{name}.schema0.table_00000,PROD)"
        stored = entity(metaledger, "dataset", first)
        assert {"status", "datasetProperties", "subTypes", "schemaMetadata", "ownership", "globalTags"} <= set(stored)
        assert stored["datasetProperties"]["value"]["description"] == f"Table 0 of ingest_{name}"
        assert entity(metaledger, "dataset", last)
        with metaledger.http() as http:
            series = http.post(
                "/aspects?action=getTimeseriesAspectValues",
                json={"urn": first, "entity": "dataset", "aspect": "datasetProfile", "limit": 5},
            ).json()
        assert len(series["value"]["values"]) == 1
    request.config.cache.set("metaledger/client_ingest_timings", timings)
    for name, t in timings.items():
        print(f"\ndatahub ingest ({name}): {t['records']} records in {t['seconds']} s = {t['records_per_s']} records/s")
