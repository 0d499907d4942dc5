"""A real dbt project run with OpenLineage's `dbt-ol` wrapper (openlineage-dbt, dbt-core, dbt-postgres in their own
virtualenv, `.venv-dbt`) against a database of the test Postgres: its events reach a metaledger process over
OpenLineage's HTTP transport, and the models' datasets and their lineage are there.

The first run creates the virtualenv (about 90 s, from PyPI); after that the test takes some 20 s, mostly dbt's own
start-up. dbt-ol names a model's job `<database>.<schema>.<project>.<model>`, its flow the dbt run (`dbt-run-<project>`,
the parent facet), its orchestrator `dbt` (the processing-engine facet).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import textwrap
import time
from urllib.parse import urlsplit

import asyncpg
import pytest

pytestmark = pytest.mark.client

PROJECT = {
    "dbt_project.yml": """
        name: shop
        version: "1.0"
        config-version: 2
        profile: shop
        model-paths: [models]
        models:
          shop:
            +materialized: table
    """,
    "models/sources.yml": """
        version: 2
        sources:
          - name: raw
            schema: public
            tables:
              - name: raw_orders
    """,
    "models/schema.yml": """
        version: 2
        models:
          - name: revenue
            description: Revenue of the orders with an amount
            meta:
              owner: "user:alice"
            columns:
              - name: total
                data_type: numeric
              - name: orders
                data_type: bigint
    """,
    "models/stg_orders.sql": "select id, amount from {{ source('raw', 'raw_orders') }} where amount > 0",
    "models/revenue.sql": "select sum(amount) as total, count(*) as orders from {{ ref('stg_orders') }}",
}


def _dataset(database: str, table: str) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:postgres,{database}.public.{table},PROD)"


def test_dbt_ol_run_writes_its_models_lineage(dbt_python, metaledger, make_database, tmp_path):
    url = urlsplit(make_database().replace("+asyncpg", ""))
    database = url.path.lstrip("/")

    async def create_source() -> None:
        connection = await asyncpg.connect(url.geturl())
        try:
            await connection.execute(
                "CREATE TABLE raw_orders (id int, amount numeric); "
                "INSERT INTO raw_orders VALUES (1, 10.5), (2, -1), (3, 4)"
            )
        finally:
            await connection.close()

    asyncio.run(create_source())
    for name, text in PROJECT.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text).strip() + "\n")
    (tmp_path / "profiles.yml").write_text(
        textwrap.dedent(f"""
        shop:
          target: test
          outputs:
            test:
              type: postgres
              host: {url.hostname}
              port: {url.port}
              user: {url.username}
              password: "{url.password or ""}"
              dbname: {database}
              schema: public
              threads: 1
    """)
    )
    env = {
        "PATH": f"{dbt_python.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(tmp_path),
        "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
        "DO_NOT_TRACK": "1",
        # OpenLineage's HTTP transport, configured as its users do: the URL and an API key sent as a bearer token
        "OPENLINEAGE_URL": metaledger.url,
        "OPENLINEAGE_API_KEY": metaledger.token,
        "OPENLINEAGE_NAMESPACE": "dbt-test",
    }
    started = time.monotonic()
    run = subprocess.run(
        [str(dbt_python.parent / "dbt-ol"), "run", "--project-dir", str(tmp_path), "--profiles-dir", str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "Emitted" in run.stdout + run.stderr, run.stdout[-4000:] + run.stderr[-4000:]
    assert time.monotonic() - started < 60

    source, staged, revenue = (_dataset(database, t) for t in ("raw_orders", "stg_orders", "revenue"))
    with metaledger.http() as http:
        deadline = time.monotonic() + 30
        while True:  # the lineage indexes are written after the events are stored
            response = http.post("/openapi/v3/lineage/scroll", json={"urns": [staged]}, params={"count": 100})
            assert response.status_code == 200, response.text
            # the jobs' edges (the runs, DataProcessInstances, have their own)
            edges = {
                (r["upstream"], r["downstream"])
                for r in response.json()["results"]
                if "urn:li:dataProcessInstance:" not in r["upstream"] + r["downstream"]
            }
            if len(edges) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        jobs = {up for up, down in edges if down == staged} | {down for up, down in edges if up == staged}
        assert len(jobs) == 2 and all(
            j.startswith("urn:li:dataJob:(urn:li:dataFlow:(dbt,dbt-run-shop,dbt-test),") for j in jobs
        ), edges
        builds_staged = next(j for j in jobs if (j, staged) in edges)
        reads_staged = next(j for j in jobs if (staged, j) in edges)
        assert builds_staged.endswith(f"{database}.public.shop.stg_orders)") and reads_staged.endswith(
            "shop.revenue)"
        ), jobs
        for job, inputs, outputs in ((builds_staged, [source], [staged]), (reads_staged, [staged], [revenue])):
            io = http.get(f"/openapi/v3/entity/dataJob/{job}", params={"aspects": ["dataJobInputOutput"]}).json()
            value = io["dataJobInputOutput"]["value"]
            assert [e["destinationUrn"] for e in value["inputDatasetEdges"]] == inputs, value
            assert [e["destinationUrn"] for e in value["outputDatasetEdges"]] == outputs, value
        # the model's table: the columns, description and owner its schema.yml gives it
        revenue_aspects = http.get(
            f"/openapi/v3/entity/dataset/{revenue}",
            params={"aspects": ["schemaMetadata", "datasetProperties", "ownership"]},
        ).json()
        fields = revenue_aspects["schemaMetadata"]["value"]["fields"]
        assert [(f["fieldPath"], f["nativeDataType"]) for f in fields] == [
            ("total", "numeric"),
            ("orders", "bigint"),
        ], fields
        assert revenue_aspects["datasetProperties"]["value"]["description"] == "Revenue of the orders with an amount"
        assert [o["owner"] for o in revenue_aspects["ownership"]["value"]["owners"]] == ["urn:li:corpuser:alice"]
