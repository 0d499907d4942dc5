"""The bytes a GraphQL answer may hold (METALEDGER_GRAPHQL_MAX_RESPONSE_BYTES), in a real `metaledger serve`: the
probe of issue 3 at a smaller scale (aliases of `aspects(input:)` over a page of datasets with large aspects) is
refused with a 400 naming the setting while the answer is being produced, and the API process's peak memory stays
bounded; DataHub's clients' queries and a normal `aspects(input:)` query are answered."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Self

import datahub.cli
import httpx
import orjson
import psutil
import pytest

from app.embedded_pg import free_port
from app.graphql import resolvers
from tests.helpers import mcp, propose
from tests.processes import service_token, start_service, stop_process, wait_healthy

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
DATASETS = 40
ALIASES = 4
DESCRIPTION_CHARS = 200_000
SCHEMA_FIELDS = 600


def ds(name: str) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:hive,{name},PROD)"


def large_dataset(i: int) -> list[dict]:
    """A dataset of about 0.5 MB of aspects: a long description and a schema of 600 described fields."""
    urn = ds(f"big.t{i:03d}")
    words = " ".join(f"w{i}x{n}" for n in range(DESCRIPTION_CHARS // 8))[:DESCRIPTION_CHARS]
    fields = [
        {
            "fieldPath": f"col_{n}",
            "nativeDataType": "varchar",
            "description": f"column {n} of t{i}: " + "d" * 400,
            "type": {"type": {"com.linkedin.schema.StringType": {}}},
        }
        for n in range(SCHEMA_FIELDS)
    ]
    schema = {
        "schemaName": f"t{i}",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.OtherSchema": {"rawSchema": ""}},
        "fields": fields,
    }
    return [
        {
            "entityType": "dataset",
            "entityUrn": urn,
            "changeType": "UPSERT",
            "aspectName": name,
            "aspect": {"value": value, "contentType": "application/json"},
        }
        for name, value in [
            ("datasetKey", {"platform": "urn:li:dataPlatform:hive", "name": f"big.t{i:03d}", "origin": "PROD"}),
            ("datasetProperties", {"name": f"t{i}", "description": words}),
            ("schemaMetadata", schema),
        ]
    ]


BUDGET = 24 * 2**20  # the service's METALEDGER_GRAPHQL_MAX_RESPONSE_BYTES here (the default is 64 MiB)


def probe(count: int) -> str:
    """The probe's query: ALIASES aliased searches of `count` datasets, each with its two large aspects' payloads."""
    return (
        "query { "
        + " ".join(
            f'a{n}: searchAcrossEntities(input: {{types: [DATASET], query: "*", count: {count}}}) {{ searchResults {{ '
            f'entity {{ urn ... on Dataset {{ aspects(input: {{aspectNames: ["datasetProperties", "schemaMetadata"]}}) '
            f"{{ aspectName payload }} }} }} }} }}"
            for n in range(ALIASES)
        )
        + " }"
    )


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


class PeakRss:
    """The highest RSS of a process, sampled every millisecond while the block runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._done = pid, 0.0, threading.Event()

    def __enter__(self) -> Self:
        self.peak = rss_mb(self.pid)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        process = psutil.Process(self.pid)
        while not self._done.is_set():
            self.peak = max(self.peak, process.memory_info().rss / 2**20)
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def datahub_clients_queries() -> list[tuple[str, dict]]:
    """What DataHub's clients send: `datahub search`'s bundled query, `get_urns_by_filter`'s scroll and the SQL
    parser's schema resolver (`_bulk_fetch_schema_info_by_filter`, 100 datasets' schemaMetadata a page)."""
    gql = Path(datahub.cli.__file__).with_name("gql")
    cli = (gql / "search.gql").read_text() + (gql / "fragments.gql").read_text()
    urns = """query($n: Int!) { scrollAcrossEntities(input: {query: "*", count: $n, searchFlags: {skipAggregates: true}})
              { nextScrollId searchResults { entity { urn } extraProperties { name value } } } }"""
    schemas = """query scrollUrnsWithFilters($types: [EntityType!], $query: String!, $batchSize: Int!, $scrollId: String) {
        scrollAcrossEntities(input: {query: $query, count: $batchSize, scrollId: $scrollId, types: $types,
                                     searchFlags: {skipHighlighting: true, skipAggregates: true}}) {
          nextScrollId searchResults { entity { urn ... on Dataset {
            schemaMetadata(version: 0) { fields { fieldPath nativeDataType } } } } } } }"""
    return [
        (cli, {"query": "*", "count": 50, "start": 0, "types": ["DATASET"]}),
        (urns, {"n": 10_000}),
        (schemas, {"types": ["DATASET"], "query": "*", "batchSize": 100}),
    ]


async def test_aliased_aspects_over_large_datasets_are_refused_in_bounded_memory(make_database, migrated_template):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        "METALEDGER_DATABASE_URL": make_database(template=migrated_template),
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
        "METALEDGER_GRAPHQL_MAX_RESPONSE_BYTES": str(BUDGET),
    }
    service = start_service(env, port, workers=1)
    try:
        await wait_healthy(base, 90, service)
        reader = {"Authorization": f"Bearer {service_token(env, role='reader')}"}
        admin = {"Authorization": f"Bearer {service_token(env)}"}
        async with httpx.AsyncClient(base_url=base, timeout=120) as http:
            for start in range(0, DATASETS, 10):
                proposals = [p for i in range(start, start + 10) for p in large_dataset(i)]
                written = await http.post("/openapi/v1/proposals", json=proposals, headers={**admin, **SYNC})
                assert written.status_code == 200, written.text[:500]
            # warm: the same query over one dataset (each alias ~0.5 MB), answered
            warm = await http.post("/api/graphql", headers=reader, json={"query": probe(1)})
            assert warm.status_code == 200 and "errors" not in warm.json(), warm.text[:300]

            before = rss_mb(service.pid)
            with PeakRss(service.pid) as peak:
                refused = await http.post("/api/graphql", headers=reader, json={"query": probe(DATASETS)})
            grown = peak.peak - before
            print(
                f"\nprobe ({ALIASES} aliases x {DATASETS} datasets): {refused.status_code}, RSS {before:.0f} MB before, "
                f"peak {peak.peak:.0f} MB (+{grown:.0f} MB)"
            )
            assert refused.status_code == 400, refused.text[:300]  # unbounded: 200 with an 87 MB answer, +212 MB
            error = refused.json()["errors"][0]
            assert f"the limit is {BUDGET} bytes (METALEDGER_GRAPHQL_MAX_RESPONSE_BYTES)" in error["message"], error
            assert ".aspects." in error["message"] and error["extensions"]["code"] == 400, error
            # bounded by the budget (24 MiB of answer and of aspects read), not by what was asked: unbounded, the
            # same query took +205-218 MB; refused it takes +43 MB on a quiet machine, +65 MB beside the whole suite
            assert grown < 110, f"RSS grew by {grown:.0f} MB"

            # under the budget: a page of a few, and one dataset's every aspect (DataHub's RawAspect)
            few = await http.post("/api/graphql", headers=reader, json={"query": probe(5)})
            assert few.status_code == 200 and "errors" not in few.json(), few.text[:300]
            assert len(few.content) > 8 * 2**20  # 4 aliases x 5 datasets x ~0.5 MB
            one = await http.post(
                "/api/graphql",
                headers=reader,
                json={
                    "query": """query($urn: String!) {
                dataset(urn: $urn) { aspects(input: {autoRenderOnly: false}) { aspectName payload } } }""",
                    "variables": {"urn": ds("big.t007")},
                },
            )
            assert one.status_code == 200, one.text[:300]
            payloads = {a["aspectName"]: orjson.loads(a["payload"]) for a in one.json()["data"]["dataset"]["aspects"]}
            assert payloads["schemaMetadata"]["fields"][599]["fieldPath"] == "col_599"
            assert payloads["datasetProperties"]["description"] == large_dataset(7)[1]["aspect"]["value"]["description"]

            for query, variables in datahub_clients_queries():
                answered = await http.post(
                    "/api/graphql", headers=reader, json={"query": query, "variables": variables}
                )
                assert answered.status_code == 200 and "errors" not in answered.json(), answered.text[:300]
            # the service is as it was: the refused request left nothing running on its session
            assert (await http.post("/api/graphql", headers=reader, json={"query": probe(1)})).status_code == 200
    finally:
        stop_process(service)


SMALL_BUDGET = 8_192


@pytest.fixture
def settings_overrides() -> dict:
    """The in-process app of the tests below: an answer of 8 KB at most."""
    return {"graphql_max_response_bytes": SMALL_BUDGET}


async def test_every_resolver_is_bounded_and_the_request_after_is_answered(client):
    urns = [ds(f"small.t{i}") for i in range(3)]
    await propose(
        client,
        *(
            mcp("datasetProperties", {"name": f"t{i}", "description": "d" * 2_000}, urn=urn)
            for i, urn in enumerate(urns)
        ),
        headers=SYNC,
    )
    one = """query($urn: String!) { dataset(urn: $urn) { urn properties { description }
                                   aspects(input: {aspectNames: ["datasetProperties"]}) { payload } } }"""
    answered = await client.post("/api/graphql", json={"query": one, "variables": {"urn": urns[0]}})
    assert answered.status_code == 200 and "errors" not in answered.json(), answered.text

    # the same over three datasets, twice: ~12 KB; refused where it crossed 8 KB, whichever resolver produced it
    aliased = (
        "query { "
        + " ".join(
            f'{alias}{i}: dataset(urn: "{urn}") {{ properties {{ description }} aspects {{ payload }} }}'
            for alias in "ab"
            for i, urn in enumerate(urns)
        )
        + " }"
    )
    introspection = "query { __schema { types { name description fields { name description } } } }"
    # a small answer read from large aspects: the aspects read count too (3 x 6 KB of schema for 3 names)
    schema = {
        "schemaName": "s",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.OtherSchema": {"rawSchema": "r" * 6_000}},
        "fields": [],
    }
    await propose(client, *(mcp("schemaMetadata", schema, urn=ds(f"wide.t{i}")) for i in range(3)), headers=SYNC)
    read = """query { searchAcrossEntities(input: {types: [DATASET], query: "wide", count: 3}) {
                searchResults { entity { ... on Dataset { schemaMetadata { name } } } } } }"""
    for query in (aliased, introspection, read):
        refused = await client.post("/api/graphql", json={"query": query})
        assert refused.status_code == 400, refused.text[:300]
        error = refused.json()["errors"][0]
        assert f"grew past {SMALL_BUDGET} bytes at `" in error["message"], error
        assert "(METALEDGER_GRAPHQL_MAX_RESPONSE_BYTES)" in error["message"] and error["extensions"]["code"] == 400
        assert "data" not in refused.json()  # refused whole: no partial answer
    again = await client.post("/api/graphql", json={"query": one, "variables": {"urn": urns[1]}})
    assert again.status_code == 200 and again.json()["data"]["dataset"]["urn"] == urns[1], again.text


async def test_a_page_is_read_in_chunks_each_counted(client, monkeypatch):
    monkeypatch.setattr(resolvers, "READ_CHUNK", 2)  # 5 entities: three reads of the aspect store
    urns = [ds(f"chunk.t{i}") for i in range(5)]
    await propose(
        client, *(mcp("datasetProperties", {"name": f"n{i}"}, urn=urn) for i, urn in enumerate(urns)), headers=SYNC
    )
    page = """query { searchAcrossEntities(input: {types: [DATASET], query: "chunk", count: 5}) {
                searchResults { entity { urn ... on Dataset { properties { name } } } } } }"""
    body = (await client.post("/api/graphql", json={"query": page})).json()
    assert "errors" not in body, body
    names = {
        r["entity"]["urn"]: r["entity"]["properties"]["name"]
        for r in body["data"]["searchAcrossEntities"]["searchResults"]
    }
    assert names == {urn: f"n{i}" for i, urn in enumerate(urns)}
