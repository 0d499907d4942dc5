"""The SparkSession of a job. Under `spark-submit`, spark-submit's settings win: its master and deploy mode, its
`--conf` and `--properties-file` values and `spark-defaults.conf`; the job's own defaults fill only what none of them
set. Run as `python -m spark_indexer`, the master is the command's `--master` (or `METALEDGER_SPARK_MASTER`).
Either way the job logs the master and the parallelism it got."""

from __future__ import annotations

import logging
import os
import sys

from pyspark import SparkConf, SparkContext, SparkFiles
from pyspark.sql import SparkSession

log = logging.getLogger("metaledger.spark_indexer")

# The job's defaults wherever it runs.
JOB_DEFAULTS = {
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.stopGracefullyOnShutdown": "true",
}
# Defaults for a local master only (a laptop, tests): no UI or progress bars, few shuffle partitions, a faster JVM
# start. A cluster keeps Spark's own defaults for these.
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
}
# What PySpark's launcher sets when `python -m …` starts the JVM itself (it submits a "pyspark-shell"): its
# defaults for an interactive shell, not an operator's choices.
LAUNCHER_KEYS = ("spark.master", "spark.app.name", "spark.ui.showConsoleProgress")


def submitted() -> bool:
    """Whether spark-submit started this Python (it hands over its JVM through the gateway port)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def session_conf(master: str, app_name: str, conf: dict[str, str] | None = None) -> SparkConf:
    """The conf the session is built with: what spark-submit or the environment gave (the JVM's system properties),
    then `conf` and the job's defaults only for keys still unset; `master` only when spark-submit gave none."""
    was_submitted = submitted()
    SparkContext._ensure_initialized()  # joins spark-submit's JVM, or launches one: its properties are the given conf
    given = SparkConf()
    if not was_submitted:
        for key in LAUNCHER_KEYS:
            given._jconf.remove(key)  # type: ignore[union-attr]
    given.setIfMissing("spark.master", master)
    given.setIfMissing("spark.app.name", app_name)
    is_local = given.get("spark.master", "").startswith("local")
    for key, value in {**JOB_DEFAULTS, **(LOCAL_DEFAULTS if is_local else {}), **(conf or {})}.items():
        given.setIfMissing(key, value)
    return given


def build_session(master: str = "local[*]", app_name: str = "metaledger-indexer",
                  conf: dict[str, str] | None = None) -> SparkSession:
    """An existing session (tests, a notebook) is reused; otherwise one is built from `session_conf`.

    Executors run the Python spark-submit was told to use (`spark.pyspark.python`, `PYSPARK_PYTHON`); only a local
    master, whose executors share this machine, defaults to this process's own interpreter."""
    active = SparkSession.getActiveSession()
    if active is None:
        given = session_conf(master, app_name, conf)
        if (given.get("spark.master", "").startswith("local") and "PYSPARK_PYTHON" not in os.environ
                and not given.contains("spark.pyspark.python")):
            os.environ["PYSPARK_PYTHON"] = sys.executable
        active = SparkSession.builder.config(conf=given).getOrCreate()
        active.sparkContext.setLogLevel("WARN")
        plan_with_shipped_code(active.sparkContext)
    log_session(active)
    return active


def plan_with_shipped_code(context: SparkContext) -> None:
    """Python data sources are planned in a Python the driver's JVM starts, with the executors' interpreter and
    environment: `spark.executorEnv.PYTHONPATH=metaledger_deps` names the shipped archive relative to an executor's
    working directory, which is not the driver's. The driver's own copy of each such archive (spark-submit unpacks
    `--archives` in the driver's SparkFiles directory too) is added to that path, so the planner imports the same code
    as the executors; on executors the added entry does not exist and is skipped by Python."""
    entries = [e for e in context.environment.get("PYTHONPATH", "").split(os.pathsep) if e]
    root = SparkFiles.getRootDirectory()
    shipped = [os.path.join(root, e) for e in entries if not os.path.isabs(e) and os.path.isdir(os.path.join(root, e))]
    if shipped:
        context.environment["PYTHONPATH"] = os.pathsep.join([*entries, *shipped])


def log_session(spark: SparkSession) -> None:
    context = spark.sparkContext
    deploy_mode = context.getConf().get("spark.submit.deployMode", "client")
    shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    log.info(f"Spark session: master {context.master} ({deploy_mode} mode), default parallelism "
             f"{context.defaultParallelism}, {shuffle} shuffle partitions",
             extra={"master": context.master, "deploy_mode": deploy_mode,
                    "default_parallelism": context.defaultParallelism, "shuffle_partitions": shuffle,
                    "app_id": context.applicationId})
