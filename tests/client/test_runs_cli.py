"""`datahub ingest list-runs | show | rollback` (the real CLI) against a metaledger process: two `datahub ingest` runs
of `file` recipes with known run ids, then the first one rolled back, checked aspect by aspect and on the change feed."""

from __future__ import annotations

import json
import time
from urllib.parse import quote

X = "urn:li:dataset:(urn:li:dataPlatform:hive,cli_runs.orders,PROD)"
Y = "urn:li:dataset:(urn:li:dataPlatform:hive,cli_runs.created,PROD)"

WRITE_FILE = """
    import sys
    from datahub.emitter.mcp import MetadataChangeProposalWrapper as W
    from datahub.ingestion.sink.file import write_metadata_file
    from datahub.metadata.schema_classes import DatasetPropertiesClass, GlobalTagsClass, StatusClass, TagAssociationClass

    tags = lambda t: GlobalTagsClass(tags=[TagAssociationClass(tag=f"urn:li:tag:{t}")])
    files = {
        "seed": [W(entityUrn=X, aspect=DatasetPropertiesClass(description="before")), W(entityUrn=X, aspect=StatusClass(removed=False))],
        "run1": [W(entityUrn=X, aspect=DatasetPropertiesClass(description="by run 1")), W(entityUrn=X, aspect=tags("run1")),
                 W(entityUrn=X, aspect=StatusClass(removed=False)),
                 W(entityUrn=Y, aspect=DatasetPropertiesClass(description="new")), W(entityUrn=Y, aspect=StatusClass(removed=False))],
        "run2": [W(entityUrn=X, aspect=tags("run2"))],
    }
    for name, mcps in files.items():
        write_metadata_file(f"{DIR}/{name}.json", mcps)
"""


def _ingest(datahub, tmp_path, name: str, run_id: str) -> None:
    recipe = tmp_path / f"{name}.yml"
    recipe.write_text(
        json.dumps(
            {
                "run_id": run_id,
                "source": {"type": "file", "config": {"path": str(tmp_path / f"{name}.json")}},
                "sink": {
                    "type": "datahub-rest",
                    "config": {"server": datahub.env["DATAHUB_GMS_URL"], "token": datahub.env["DATAHUB_GMS_TOKEN"]},
                },
            }
        )
    )
    result = datahub.cli("ingest", "-c", str(recipe), "--no-default-report", timeout=300)
    assert "Pipeline finished successfully" in result.stdout + result.stderr, result.stdout[-3000:]


def _runs(datahub, *flags: str) -> dict[str, str]:
    """`datahub ingest list-runs`' table: run id → rows."""
    rows = [
        line.strip("|").split("|")
        for line in datahub.cli("ingest", "list-runs", *flags).stdout.splitlines()
        if line.startswith("|")
    ]
    return {cells[0].strip(): cells[1].strip() for cells in rows[1:]}


def _aspect(http, urn: str, aspect: str):
    response = http.get(f"/aspects/{quote(urn, safe='')}", params={"aspect": aspect})
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    return next(iter(response.json()["aspect"].values()))


def _feed_end(http) -> int:
    after = 0
    while page := http.get("/openapi/v1/events/mcl", params={"after": after, "limit": 1000}).json()["events"]:
        after = page[-1]["offset"]
    return after


def _feed(http, after: int) -> list[dict]:
    """The change logs after `after`, once some have arrived."""
    events, deadline = [], time.monotonic() + 20
    while True:
        page = http.get("/openapi/v1/events/mcl", params={"after": after, "limit": 1000}).json()
        events += page["events"]
        after = page["nextOffset"]
        if not page["events"] and (events or time.monotonic() > deadline):
            return events
        if not page["events"]:
            time.sleep(0.2)


def test_list_show_and_rollback_with_the_cli(datahub, metaledger, tmp_path):
    datahub.script(WRITE_FILE, X=X, Y=Y, DIR=str(tmp_path))
    for name in ("seed", "run1", "run2"):
        _ingest(datahub, tmp_path, name, f"cli-{name}")

    assert _runs(datahub)["cli-run1"] == "5"  # X's properties and status, Y's key, properties and status

    shown = datahub.cli("ingest", "show", "--run-id", "cli-run1").stdout
    assert shown.count("cli_runs.created") == 3 and "datasetProperties" in shown
    detailed = datahub.cli("ingest", "show", "--run-id", "cli-run1", "--show-aspect").stdout
    assert '"description": "by run 1"' in detailed

    with metaledger.http() as http:
        feed_at = _feed_end(http)
        dry = datahub.cli("ingest", "rollback", "--run-id", "cli-run1", "--dry-run").stdout
        # the CLI says "delete" of entitiesAffected (X and Y); only Y, which run 1 created, is removed
        assert "will delete 2 entities and will roll back 2 aspects" in " ".join(dry.split()), dry
        assert "related to 1 entities" in dry  # X's tags, changed by run 2 since
        assert _aspect(http, X, "datasetProperties")["description"] == "by run 1"  # the dry run wrote nothing

        done = datahub.cli("ingest", "rollback", "--run-id", "cli-run1", "-f").stdout
        assert "deleted 2 entities and rolled back 2 aspects" in " ".join(done.split()), done
        assert _aspect(http, X, "datasetProperties")["description"] == "before"  # updated by run 1: restored
        assert _aspect(http, X, "globalTags")["tags"] == [{"tag": "urn:li:tag:run2"}]  # run 2's later change survives
        assert _aspect(http, X, "status") == {"removed": False}
        assert _aspect(http, Y, "datasetProperties") is None  # created by run 1: deleted
        assert _aspect(http, Y, "status") == {"removed": True}  # Y, created by run 1: soft-removed
        reports = list(datahub.workdir.glob("rollback-reports/*/unsafe_entities.csv"))  # the CLI's report of them
        assert reports and X in reports[-1].read_text()

        events = _feed(http, feed_at)
        assert sorted((e["urn"], e["aspect"], e["changeType"]) for e in events) == [
            (Y, "datasetProperties", "DELETE"),
            (Y, "status", "UPSERT"),
            (X, "datasetProperties", "UPSERT"),
        ]
        assert {e["mcl"]["systemMetadata"]["runId"] for e in events} == {"__rollback:cli-run1"}

    again = datahub.cli("ingest", "rollback", "--run-id", "cli-run1", "-f").stdout
    assert "rolled back 0 aspects" in " ".join(again.split())  # nothing left to do
    listed = _runs(datahub)
    assert "cli-run1" not in listed and listed["__rollback:cli-run1"] == "2"  # the rollback is a run of its own
    assert "cli-run1" in _runs(datahub, "--include-soft-deletes")
