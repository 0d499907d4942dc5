"""DataHub's real client over metaledger's GraphQL (`/api/graphql`): `DataHubGraph.get_urns_by_filter` across pages
(2,600 datasets), SDK v2 `client.search.get_urns`, `datahub delete` by platform / env / entity type / query (dry
run, soft-deleted included), the tag mutations (`create_tag`, `remove_tag`, deleteTag), and GraphQL errors.

The module runs its own metaledger process (a fresh database): `datahub delete --platform hive` must delete exactly
the hive entities, which the session's shared process (other tests' hive datasets) cannot tell apart."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.client.conftest import DataHubClient, Metaledger, _client_env, metaledger_process

pytestmark = pytest.mark.client

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
BIG = 2_600  # snowflake PROD datasets: get_urns_by_filter pages through them


def ds(platform: str, name: str, env: str = "PROD") -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:{platform},{name},{env})"


def dataset(platform: str, name: str, env: str = "PROD", title: str | None = None, removed: bool = False) -> list[dict]:
    urn = ds(platform, name, env)
    proposals = [
        {
            "entityType": "dataset",
            "entityUrn": urn,
            "changeType": "UPSERT",
            "aspectName": "datasetKey",
            "aspect": {"value": {"platform": f"urn:li:dataPlatform:{platform}", "name": name, "origin": env}},
        },
        {
            "entityType": "dataset",
            "entityUrn": urn,
            "changeType": "UPSERT",
            "aspectName": "status",
            "aspect": {"value": {"removed": removed}},
        },
    ]
    if title:
        proposals.append(
            {
                "entityType": "dataset",
                "entityUrn": urn,
                "changeType": "UPSERT",
                "aspectName": "datasetProperties",
                "aspect": {"value": {"name": title}},
            }
        )
    return proposals


@pytest.fixture(scope="module")
def service(make_database: Callable[..., str], migrated_template: str) -> Iterator[Metaledger]:
    yield from metaledger_process(make_database(template=migrated_template))  # its own: deletes are checked exactly


@pytest.fixture(scope="module")
def client(
    client_python: Path, service: Metaledger, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DataHubClient]:
    home = tmp_path_factory.mktemp("datahub-graphql-home")
    client = DataHubClient(client_python, _client_env(client_python, home, service.url, service.token), home)
    yield client
    client.close()


@pytest.fixture(scope="module")
def loaded(service: Metaledger) -> dict[str, list[str]]:
    """The module's entities, written in batches through /openapi/v1/proposals and indexed before the answer."""
    groups: dict[str, list[list[dict]]] = {
        "snowflake_prod": [dataset("snowflake", f"big.t{i:05d}") for i in range(BIG)],
        "snowflake_dev": [dataset("snowflake", f"big.d{i:03d}", "DEV") for i in range(100)],
        "hive_prod": [dataset("hive", f"h.t{i:02d}") for i in range(30)],
        "hive_dev": [dataset("hive", f"h.d{i:02d}", "DEV") for i in range(10)],
        "hive_removed": [dataset("hive", f"h.r{i:02d}", removed=True) for i in range(5)],
        "kafka_orders": [dataset("kafka", f"k.o{i:02d}", title=f"orders stream {i}") for i in range(8)],
        "kafka_clicks": [dataset("kafka", f"k.c{i:02d}", title=f"clicks stream {i}") for i in range(12)],
    }
    proposals = [p for entities in groups.values() for entity in entities for p in entity]
    with service.http() as http:
        for start in range(0, len(proposals), 2_000):
            response = http.post(
                "/openapi/v1/proposals", json=proposals[start : start + 2_000], headers=SYNC, timeout=300
            )
            assert response.status_code == 200, response.text[:2000]
    return {name: [entity[0]["entityUrn"] for entity in entities] for name, entities in groups.items()}


def urns_by_filter(client: DataHubClient, **kwargs: Any) -> tuple[list[str], int]:
    """`graph.get_urns_by_filter(**kwargs)` in the client, and how many GraphQL pages it took."""
    out = client.script(
        """
        import json
        from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
        from datahub.ingestion.graph.filters import RemovedStatusFilter
        graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
        pages = 0
        execute = graph.execute_graphql
        def counting(*args, **kw):
            global pages
            pages += 1
            return execute(*args, **kw)
        graph.execute_graphql = counting
        args = dict(KWARGS)
        if "status" in args:
            args["status"] = RemovedStatusFilter[args["status"]]
        urns = list(graph.get_urns_by_filter(**args))
        print(json.dumps({"urns": urns, "pages": pages}))
        """,
        KWARGS=kwargs,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["urns"], result["pages"]


def stored(service: Metaledger, urn: str) -> bool:
    with service.http() as http:
        return http.get(f"/openapi/v3/entity/dataset/{quote(urn, safe='')}").status_code == 200


def test_get_urns_by_filter_pages_through_thousands(client, loaded):
    started = time.perf_counter()
    urns, pages = urns_by_filter(client, platform="snowflake", env="PROD", entity_types=["dataset"], batch_size=1_000)
    seconds = time.perf_counter() - started
    assert len(urns) == BIG and set(urns) == set(loaded["snowflake_prod"])
    assert pages == 3, pages  # 1,000 + 1,000 + 600
    print(f"get_urns_by_filter: {len(urns)} URNs in {pages} pages, {seconds:.2f}s")

    # every searchable type (no entity_types), the client's default batch of 5,000
    urns, _ = urns_by_filter(client, platform="snowflake")
    assert set(urns) == set(loaded["snowflake_prod"] + loaded["snowflake_dev"])
    urns, _ = urns_by_filter(client, platform="hive", env="DEV")
    assert sorted(urns) == sorted(loaded["hive_dev"])
    urns, _ = urns_by_filter(client, platform="hive", status="ONLY_SOFT_DELETED")
    assert sorted(urns) == sorted(loaded["hive_removed"])
    urns, _ = urns_by_filter(client, platform="kafka", query="orders")
    assert sorted(urns) == sorted(loaded["kafka_orders"])


def test_sdk_v2_search_get_urns(client, loaded):
    out = client.script(
        """
        import json, warnings
        warnings.simplefilter("ignore")
        from datahub.sdk import DataHubClient
        from datahub.sdk.search_filters import FilterDsl as F
        client = DataHubClient(server=GMS, token=TOKEN)
        kafka = [str(u) for u in client.search.get_urns(filter=F.and_(F.entity_type("dataset"), F.platform("kafka")))]
        dev = [str(u) for u in client.search.get_urns(filter=F.and_(F.platform("hive"), F.env("DEV")))]
        orders = [str(u) for u in client.search.get_urns(query="orders", filter=F.platform("kafka"))]
        not_hive = [str(u) for u in client.search.get_urns(
            filter=F.and_(F.entity_type("dataset"), F.not_(F.platform("hive")), F.not_(F.platform("snowflake"))))]
        print(json.dumps({"kafka": kafka, "dev": dev, "orders": orders, "not_hive": not_hive}))
        """
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(result["kafka"]) == sorted(loaded["kafka_orders"] + loaded["kafka_clicks"])
    assert sorted(result["dev"]) == sorted(loaded["hive_dev"])
    assert sorted(result["orders"]) == sorted(loaded["kafka_orders"])
    assert sorted(result["not_hive"]) == sorted(loaded["kafka_orders"] + loaded["kafka_clicks"])


def test_tag_mutations_through_the_client(client, service, loaded):
    target = loaded["kafka_clicks"][0]
    with service.http() as http:
        http.post(
            "/openapi/v1/proposals",
            json=[
                {
                    "entityType": "dataset",
                    "entityUrn": target,
                    "changeType": "UPSERT",
                    "aspectName": "globalTags",
                    "aspect": {"value": {"tags": [{"tag": "urn:li:tag:gql-tag"}, {"tag": "urn:li:tag:other"}]}},
                }
            ],
        ).raise_for_status()
    out = client.script(
        """
        import json
        from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
        from datahub.configuration.common import GraphError
        graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
        urn = graph.create_tag("gql-tag")
        try:
            graph.create_tag("gql-tag")
            again = None
        except GraphError as e:
            again = str(e)
        removed = graph.remove_tag("urn:li:tag:gql-tag", TARGET)
        deleted = graph.execute_graphql('mutation($urn: String!) { deleteTag(urn: $urn) }', variables={"urn": urn})
        print(json.dumps({"urn": urn, "again": again, "removed": removed, "deleted": deleted}))
        """,
        TARGET=target,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["urn"] == "urn:li:tag:gql-tag" and "already exists" in result["again"]
    assert result["removed"] is True and result["deleted"] == {"deleteTag": True}
    with service.http() as http:
        tags = http.get(f"/openapi/v3/entity/dataset/{quote(target, safe='')}/globalTags").json()
        assert tags["value"]["tags"] == [{"tag": "urn:li:tag:other"}]
        assert http.get(f"/openapi/v3/entity/tag/{quote('urn:li:tag:gql-tag', safe='')}").status_code == 404


def test_graphql_errors_through_the_client(client, service):
    out = client.script(
        """
        import json
        from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
        from datahub.configuration.common import GraphError
        graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
        errors = []
        for query in ['query { scrollAcrossEntities(', 'query { scrollAcrossEntities(input: {query: "*"}) { nope } }',
                      'query { ' + ' '.join(f'a{i}: __typename' for i in range(500)) + ' }']:
            try:
                graph.execute_graphql(query)
                errors.append(None)
            except GraphError as e:
                errors.append(str(e))
        print(json.dumps(errors))
        """
    )
    errors = json.loads(out.stdout.strip().splitlines()[-1])
    assert "Syntax Error" in errors[0] and "'nope'" in errors[1] and "aliased" in errors[2]
    assert httpx.post(f"{service.url}/api/graphql", json={"query": "{ __typename }"}).status_code == 401


def test_schema_resolver_bulk_fetch(client, service):
    """The SQL parser's schema resolver: schemaMetadata of a platform's datasets through scrollAcrossEntities."""
    fields = [
        {"fieldPath": c, "nativeDataType": "varchar", "type": {"type": {"com.linkedin.schema.StringType": {}}}}
        for c in ("id", "amount")
    ]
    proposals = []
    for name in ("shop.orders", "shop.items"):
        proposals += dataset("mysql", name)
        proposals.append(
            {
                "entityType": "dataset",
                "entityUrn": ds("mysql", name),
                "changeType": "UPSERT",
                "aspectName": "schemaMetadata",
                "aspect": {
                    "value": {
                        "schemaName": name,
                        "platform": "urn:li:dataPlatform:mysql",
                        "version": 0,
                        "hash": "",
                        "platformSchema": {"com.linkedin.schema.MySqlDDL": {"tableSchema": ""}},
                        "fields": fields,
                    }
                },
            }
        )
    with service.http() as http:
        http.post("/openapi/v1/proposals", json=proposals, headers=SYNC).raise_for_status()
    out = client.script(
        """
        import json
        from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
        from datahub.sql_parsing.schema_resolver_provider import SchemaResolverProvider
        graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
        resolver = SchemaResolverProvider(graph).get("mysql", None, "PROD")
        print(json.dumps({"count": resolver.schema_count(), "urns": sorted(resolver.get_urns())}))
        """
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"count": 2, "urns": sorted(ds("mysql", n) for n in ("shop.orders", "shop.items"))}


def test_sdk_v2_lineage(client, service):
    """`client.lineage.get_lineage` (scrollAcrossLineage with a degree filter)."""
    a, b, c = (ds("postgres", f"lin.{n}") for n in "abc")
    stamp = {"time": 0, "actor": "urn:li:corpuser:unknown"}
    proposals = [p for name in "abc" for p in dataset("postgres", f"lin.{name}")]
    proposals += [
        {
            "entityType": "dataset",
            "entityUrn": down,
            "changeType": "UPSERT",
            "aspectName": "upstreamLineage",
            "aspect": {"value": {"upstreams": [{"dataset": up, "type": "TRANSFORMED", "auditStamp": stamp}]}},
        }
        for down, up in ((b, a), (c, b))
    ]
    with service.http() as http:
        http.post("/openapi/v1/proposals", json=proposals, headers=SYNC).raise_for_status()
    out = client.script(
        """
        import json, warnings
        warnings.simplefilter("ignore")
        from datahub.sdk import DataHubClient
        client = DataHubClient(server=GMS, token=TOKEN)
        down = client.lineage.get_lineage(source_urn=A, direction="downstream", max_hops=2)
        up = client.lineage.get_lineage(source_urn=C, direction="upstream")
        print(json.dumps({"down": [[r.urn, r.hops, r.platform] for r in down], "up": [[r.urn, r.hops] for r in up]}))
        """,
        A=a,
        C=c,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"down": [[b, 1, "postgres"], [c, 2, "postgres"]], "up": [[b, 1]]}


def test_datahub_delete_by_filter(client, service, loaded):
    """Runs last in the module: it deletes the hive and some kafka datasets."""

    def remaining(**kwargs: Any) -> list[str]:
        return urns_by_filter(client, **kwargs)[0]

    dry = client.cli("delete", "--platform", "hive", "--hard", "--dry-run")
    assert "dry" in (dry.stdout + dry.stderr).lower()
    hive = loaded["hive_prod"] + loaded["hive_dev"] + loaded["hive_removed"]
    assert all(stored(service, urn) for urn in hive)

    client.cli("delete", "--entity-type", "dataset", "--platform", "kafka", "--query", "orders", "--hard", "-f")
    assert not any(stored(service, urn) for urn in loaded["kafka_orders"])
    assert all(stored(service, urn) for urn in loaded["kafka_clicks"])

    client.cli("delete", "--platform", "hive", "--env", "DEV", "--hard", "-f")
    assert not any(stored(service, urn) for urn in loaded["hive_dev"])
    assert all(stored(service, urn) for urn in loaded["hive_prod"] + loaded["hive_removed"])

    client.cli("delete", "--platform", "hive", "--hard", "-f")  # soft-deleted ones too (a hard delete takes all)
    assert not any(stored(service, urn) for urn in hive)
    assert all(stored(service, urn) for urn in loaded["kafka_clicks"] + loaded["snowflake_dev"])
    deadline = time.monotonic() + 30  # the index follows the deletes (the embedded indexer)
    while remaining(platform="hive", status="ALL") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert remaining(platform="hive", status="ALL") == []
    assert len(remaining(platform="snowflake")) == BIG + 100
