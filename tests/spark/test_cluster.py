"""The indexer on a real Spark cluster, submitted as docs/spark-indexer.md says: a standalone master and two workers
(tests/spark/cluster.py), executors whose Python lacks the project, the code and its dependencies shipped by
`make spark-dist`'s archive, storage at file:/// URIs in a shared directory.

- the search client's dependency missing from the shipped archive: the batch fails, the job exits non-zero, no
  offsets are committed and no dead letters are written;
- the same stream with the whole archive then indexes every record on both workers, restore-indices runs with one
  worker killed mid-restore, and reconcile (on the test run's local session: it checks Postgres against the index the
  cluster wrote) finds 0 drift.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from spark_indexer.config import IndexerSettings
from tests.helpers import mcp, propose, wait_delivered
from tests.spark.cluster import ROOT, SPARK_HOME, Cluster, cluster_python, spark_dist
from tests.spark.env import metaledger_env
from tests.spark.test_stream import assert_index_current, ds, lineage, search_urns, settings_overrides  # noqa: F401

SETTINGS = (
    "database_url",
    "kafka_bootstrap_servers",
    "topic_mcl_versioned",
    "topic_mcl_timeseries",
    "search_url",
    "search_flavor",
    "search_index_prefix",
    "spark_work_dir",
    "spark_max_offsets_per_trigger",
    "spark_index_partitions",
    "spark_restore_partitions",
    "spark_apply_chunk",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, spark_scratch) -> Cluster:
    base = tmp_path_factory.mktemp("spark-cluster")
    wheel, deps = spark_dist()
    cluster = Cluster(base)
    cluster.python = cluster_python(base)
    cluster.deps = deps
    cluster.java_tmp = spark_scratch / "java"  # where an executor fetches the archive before unpacking it
    cluster.start(workers=2)
    yield cluster
    cluster.stop()


def submit(
    cluster: Cluster,
    settings: IndexerSettings,
    *args: str,
    log: Path,
    deps: Path | None = None,
    conf: dict[str, str] | None = None,
) -> subprocess.Popen:
    """docs/spark-indexer.md's standalone spark-submit line, with the settings as METALEDGER_* variables."""
    command = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--master",
        cluster.url,
        "--name",
        "metaledger-indexer",
        "--archives",
        f"{deps or cluster.deps}#metaledger_deps",
        "--conf",
        "spark.executorEnv.PYTHONPATH=metaledger_deps",
        "--conf",
        f"spark.pyspark.python={cluster.python}",
        "--conf",
        f"spark.pyspark.driver.python={ROOT / '.venv' / 'bin' / 'python'}",
        "--conf",
        "spark.sql.shuffle.partitions=4",
        # short jobs on a shared machine: the client-only JIT (less JVM CPU) for the driver and the executors; no UI
        "--conf",
        "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1",
        "--conf",
        f"spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1 -Djava.io.tmpdir={cluster.java_tmp}",
        "--conf",
        "spark.ui.enabled=false",
        *[arg for key, value in (conf or {}).items() for arg in ("--conf", f"{key}={value}")],
        "spark_indexer/job.py",
        *args,
    ]
    env = {**os.environ, **metaledger_env(settings, *SETTINGS), "SPARK_HOME": str(SPARK_HOME), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
    )


def finished(job: subprocess.Popen, log: Path, timeout: float = 240) -> int:
    try:
        return job.wait(timeout)
    except subprocess.TimeoutExpired:
        job.kill()
        raise AssertionError(f"spark-submit still running after {timeout} s:\n{log.read_text()[-5000:]}") from None


@pytest.fixture
def cluster_settings(settings_overrides, database_url, tmp_path) -> IndexerSettings:  # noqa: F811
    shared = tmp_path / "shared"  # every node (and the next driver) reaches it: a file:/// URI
    return IndexerSettings(
        database_url=database_url,
        spark_work_dir=shared.as_uri(),
        spark_index_partitions=2,
        spark_max_offsets_per_trigger=500,
        spark_restore_partitions=4,
        spark_apply_chunk=200,
        **settings_overrides,
    )


def without_httpx(deps: Path, target: Path) -> Path:
    """The dependency archive with the search client's dependency left out: a broken installation. `zip -d` drops
    the entries without recompressing the others (0.1 s; rewriting the 34 MB archive entry by entry took 11 s)."""
    shutil.copyfile(deps, target)
    subprocess.run(["zip", "-q", "-d", str(target), "httpx/*", "httpx-*"], check=True)  # exit 12: nothing matched
    return target


async def test_stream_and_restore_on_a_standalone_cluster_survive_a_broken_archive_and_a_lost_worker(
    cluster, spark, client, db, cluster_settings, tmp_path
):
    from spark_indexer.reconcile import reconcile

    urns = [ds(f"cluster_{i}") for i in range(300)]
    proposals = [
        mcp("datasetProperties", {"name": f"cluster_{i}", "description": "on the cluster"}, u)
        for i, u in enumerate(urns)
    ]
    proposals += [mcp("upstreamLineage", lineage(urns[i - 1]), urns[i]) for i in range(1, 300, 3)]
    proposals += [
        mcp("datasetProfile", {"timestampMillis": 1_763_700_000_000, "rowCount": i}, u) for i, u in enumerate(urns[:20])
    ]
    await propose(client, *proposals, batch_size=500)
    await wait_delivered(db)
    mcls = await db.fetchval(
        "SELECT count(*) FROM change_log_outbox WHERE topic = ANY($1::text[])",
        [cluster_settings.topic_mcl_versioned, cluster_settings.topic_mcl_timeseries],
    )
    shared = Path(cluster_settings.spark_work_dir.removeprefix("file://"))

    # the search client's dependency missing from the shipped archive: the batch fails, the job exits non-zero. One
    # executor is enough to meet it (spark.cores.max): a second one's JVM start and its unpacking of the archive were
    # 10-20 s of the machine's CPU that showed nothing more.
    broken = await asyncio.to_thread(without_httpx, cluster.deps, tmp_path / "deps-without-httpx.zip")
    log = tmp_path / "stream-broken.log"
    job = submit(
        cluster,
        cluster_settings,
        "stream",
        "--once",
        log=log,
        deps=broken,
        conf={"spark.task.maxFailures": "2", "spark.cores.max": "1"},
    )
    assert await asyncio.to_thread(finished, job, log) != 0, log.read_text()[-5000:]
    text = log.read_text()
    # (the executor meets the missing module setting up the search backend, or first in the runtime-model watcher)
    assert "BackendSetupError" in text or "No module named 'httpx'" in text, text[-5000:]
    assert not list((shared / "checkpoint" / "commits").glob("[0-9]*")), "no batch committed"
    assert not (shared / "dead_letter").exists(), "a broken installation is no record's fault"
    assert await search_urns(client, "cluster") == []

    # the same stream with the whole archive, on both workers: every record of the failed batch comes again
    log = tmp_path / "stream.log"
    job = submit(cluster, cluster_settings, "stream", "--once", log=log)
    assert await asyncio.to_thread(finished, job, log) == 0, log.read_text()[-5000:]
    text = log.read_text()
    assert f"master {cluster.url} (client mode)" in text, text[-3000:]
    assert f"{mcls:,} records" in text and " 0 dead letters" in text, text[-3000:]
    app = re.search(r"Connected to Spark cluster with app ID (app-\S+)", text)[1]
    assert cluster.worker_ran_tasks(0, app) and cluster.worker_ran_tasks(1, app), "both workers run tasks"
    assert sorted(await search_urns(client, "cluster", 1000)) == sorted(urns)
    assert list((shared / "timeseries" / "_batches").iterdir()), "the replay markers live under the timeseries URI"
    assert list((shared / "timeseries").glob("aspect=datasetProfile/day=*/*.parquet"))
    assert not (ROOT / "_batches").exists() and not (ROOT / "timeseries").exists()

    # restore-indices into fresh indices, a worker's JVM killed with -9 while its tasks run
    await propose(
        client,
        *[mcp("datasetProperties", {"name": f"cluster_{i}", "description": "restored"}, u) for i, u in enumerate(urns)],
        batch_size=500,
    )
    await wait_delivered(db)
    log = tmp_path / "restore.log"
    job = submit(cluster, cluster_settings, "restore-indices", "--clean", log=log)
    deadline = time.monotonic() + 120
    while "rows (" not in log.read_text():
        assert job.poll() is None, log.read_text()[-5000:]
        assert time.monotonic() < deadline, log.read_text()[-5000:]
        await asyncio.sleep(0.1)
    cluster.kill_worker(1)
    assert await asyncio.to_thread(finished, job, log) == 0, log.read_text()[-5000:]

    # reconcile reads Postgres and the index the cluster wrote: the run's local session does it
    report = await asyncio.to_thread(reconcile, spark, cluster_settings)
    assert report.ok and report.pg_rows > 0, report.summary()
    assert sorted(await search_urns(client, "restored", 1000)) == sorted(urns)
    await assert_index_current(client, urns[::50])
