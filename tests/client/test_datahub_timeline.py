"""`datahub timeline` (DataHub's CLI, PyPI `acryl-datahub`, pinned) and the SDK's entity-spec discovery against a
running metaledger."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.client

URN = "urn:li:dataset:(urn:li:dataPlatform:hive,client.timeline,PROD)"


def _write(metaledger, aspect: str, value: dict) -> None:
    with metaledger.http() as http:
        response = http.post("/openapi/v3/entity/dataset?async=false", json=[{"urn": URN, aspect: {"value": value}}])
        assert response.status_code == 200, response.text
    # one millisecond per version (each is its own transaction): the clock has moved past the one it was written at
    answered = int(time.time() * 1000)
    while int(time.time() * 1000) <= answered:
        time.sleep(0.0005)


def test_cli_timeline_lists_the_changes_of_a_category(datahub, metaledger):
    _write(metaledger, "globalTags", {"tags": [{"tag": "urn:li:tag:pii"}]})
    _write(metaledger, "ownership", {"owners": [{"owner": "urn:li:corpuser:jdoe", "type": "DATAOWNER"}]})
    _write(metaledger, "globalTags", {"tags": [{"tag": "urn:li:tag:gold"}, {"tag": "urn:li:tag:pii"}]})
    _write(metaledger, "globalTags", {"tags": [{"tag": "urn:li:tag:gold"}]})

    out = datahub.cli("timeline", "--urn", URN, "--category", "TAG").stdout
    versions = [line.split(" - ")[1] for line in out.splitlines() if " - " in line and not line.startswith("\t")]
    assert versions == ["0.0.0-computed", "0.1.0-computed", "0.2.0-computed"]
    events = [line.strip() for line in out.splitlines() if line.startswith("\t")]
    assert events == [
        f"ADD TAG dataset:hive:client.timeline (urn:li:tag:pii): Tag 'pii' added to entity '{URN}'.",
        f"ADD TAG dataset:hive:client.timeline (urn:li:tag:gold): Tag 'gold' added to entity '{URN}'.",
        f"REMOVE TAG dataset:hive:client.timeline (urn:li:tag:pii): Tag 'pii' removed from entity '{URN}'.",
    ]

    # `--category owner` is sent as OWNERSHIP; --verbose prints the JSON as received
    owner = datahub.cli("timeline", "--urn", URN, "--category", "owner", "--verbose").stdout
    body = json.loads(owner[owner.index("[") :])
    assert [[(e["category"], e["operation"], e["modifier"]) for e in t["changeEvents"]] for t in body] == [
        [("OWNERSHIP", "ADD", "urn:li:corpuser:jdoe")],
    ]
    assert "'jdoe' added as a `DATAOWNER`" in body[0]["changeEvents"][0]["description"]

    # --raw (sent as raw=True) adds each transaction's JSON Patch, which --verbose shows
    raw = datahub.cli("timeline", "--urn", URN, "--category", "TAG", "--raw", "--verbose").stdout
    diffs = [t["rawDiff"] for t in json.loads(raw[raw.index("[") :])]
    assert diffs[-1] == [{"op": "remove", "path": "/tags/1"}]


def test_sdk_reads_the_entity_aspect_specs(datahub):
    result = datahub.script(
        """
        from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
        graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
        specs = graph.get_entity_aspect_specs()
        assert specs is not None, "no specs"
        print(specs.supports("dataset", "schemaMetadata"), specs.supports("dataset", "dashboardInfo"),
              specs.schema_version("schemaMetadata"))
        """
    )
    assert result.stdout.split() == ["True", "False", "1"]
