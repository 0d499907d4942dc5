"""The SDK's OpenAPI helpers (`DataHubGraph.scroll_entities`, `scroll_relationships`, `scroll_lineage`,
`get_entities_v2`; PyPI `acryl-datahub`, pinned) against a running metaledger."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.client

DATASETS = [f"urn:li:dataset:(urn:li:dataPlatform:hive,client.scroll.t{i},PROD)" for i in range(5)]
SYNC = {"X-DataHub-Sync-Index-Update": "true"}


def _write(metaledger) -> None:
    lineage = {
        "upstreams": [
            {
                "dataset": DATASETS[0],
                "type": "TRANSFORMED",
                "auditStamp": {"time": 0, "actor": "urn:li:corpuser:unknown"},
            }
        ]
    }
    items = [{"urn": urn, "datasetProperties": {"value": {"description": f"d{i}"}}} for i, urn in enumerate(DATASETS)]
    items[1]["upstreamLineage"] = {"value": lineage}
    with metaledger.http() as http:
        response = http.post("/openapi/v3/entity/dataset?async=false", json=items, headers=SYNC)
        assert response.status_code == 200, response.text


def test_sdk_scrolls_entities_relationships_and_lineage(datahub, metaledger):
    _write(metaledger)
    result = datahub.script(
        """
        from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
        from datahub.ingestion.graph.openapi import LineageDirection
        from datahub.metadata.schema_classes import DatasetPropertiesClass
        graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))

        urns, descriptions, scroll_id, pages = [], [], None, 0
        while True:
            # (the metaledger of the client tests is shared: this test's datasets only)
            page = graph.scroll_entities(entity_names=["dataset"], aspects=["datasetProperties"], count=2,
                                         scroll_id=scroll_id, with_system_metadata=True, pit_keep_alive="1m",
                                         filter=[{"and": [{"field": "urn", "values": URNS, "condition": "IN"}]}])
            for urn, aspects in page.entities.items():
                urns.append(urn)
                props, system_metadata = aspects["datasetProperties"]
                assert isinstance(props, DatasetPropertiesClass) and system_metadata is not None
                descriptions.append(props.description)
            pages += 1
            scroll_id = page.scroll_id
            if not scroll_id:
                break
        print("entities", pages, page.total_count, ",".join(descriptions))

        bare = graph.scroll_entities(entity_names=["dataset"], count=10,
                                     filter=[{"and": [{"field": "urn", "values": [URNS[3]], "condition": "EQUAL"}]}])
        print("bare", list(bare.entities.items()) == [(URNS[3], {})])

        rels = graph.scroll_relationships(destination_urns=[URNS[0]], count=1)
        print("relationships", [(r.source_urn, r.relationship_type) for r in rels.relationships] == [(URNS[1], "DownstreamOf")])

        lineage = graph.scroll_lineage(urns=[URNS[1]], direction=LineageDirection.UPSTREAM)
        print("lineage", [(r.upstream_urn, r.downstream_urn) for r in lineage.relationships] == [(URNS[0], URNS[1])])

        got = graph.get_entities_v2("dataset", [URNS[2]], aspects=["datasetProperties"])
        print("batch", got[URNS[2]]["datasetProperties"]["value"]["description"])
        """,
        URNS=DATASETS,
    )
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert lines["entities"] == "3 5 d0,d1,d2,d3,d4"
    assert lines["bare"] == "True"
    assert lines["relationships"] == "True"
    assert lines["lineage"] == "True"
    assert lines["batch"] == "d2"


CONDITIONS = [
    f"urn:li:dataset:(urn:li:dataPlatform:hive,client.cond.{name},PROD)" for name in ("orders_a", "Orders%b", "users")
]


def test_sdk_filters_with_conditions(datahub, metaledger):
    """What the SDK sends for conditions beyond EQUAL: `scroll_entities` with an OR of AND clauses (the v3 body's
    `and`), SDK v2 `client.search.get_urns` with `custom_filter`/`not_` (GraphQL orFilters)."""
    items = [
        {
            "urn": urn,
            "datasetProperties": {
                "value": {
                    "name": urn.split(".")[-1].split(",")[0],
                    **({"description": "people"} if "users" in urn else {}),
                }
            },
        }
        for urn in CONDITIONS
    ]
    with metaledger.http() as http:
        response = http.post("/openapi/v3/entity/dataset?async=false", json=items, headers=SYNC)
        assert response.status_code == 200, response.text
    result = datahub.script(
        """
        from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
        from datahub.sdk import DataHubClient
        from datahub.sdk.search_filters import FilterDsl as F
        graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
        mine = {"field": "urn", "values": [PREFIX], "condition": "START_WITH"}  # the client tests share one metaledger
        urns, scroll_id = [], None
        while True:
            page = graph.scroll_entities(entity_names=["dataset"], count=1, scroll_id=scroll_id, filter=[
                {"and": [mine, {"field": "name", "values": ["ORDERS"], "condition": "START_WITH"},
                         {"field": "name", "values": ["%"], "condition": "CONTAIN", "negated": True}]},
                {"and": [mine, {"field": "description", "values": [], "condition": "EXISTS"}]}])
            urns += list(page.entities)
            scroll_id = page.scroll_id
            if not scroll_id:
                break
        print("scroll", ",".join(sorted(urns)))

        client = DataHubClient(server=GMS, token=TOKEN)
        found = client.search.get_urns(filter=F.and_(
            F.entity_type("dataset"), F.custom_filter("urn", "START_WITH", [PREFIX]),
            F.or_(F.custom_filter("name", "END_WITH", ["%B"]), F.not_(F.custom_filter("name", "CONTAIN", ["_"])))))
        print("search", ",".join(sorted(str(u) for u in found)))
        """,
        PREFIX="urn:li:dataset:(urn:li:dataPlatform:hive,client.cond.",
    )
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert lines["scroll"] == ",".join(sorted([CONDITIONS[0], CONDITIONS[2]]))
    assert lines["search"] == ",".join(sorted([CONDITIONS[1], CONDITIONS[2]]))
