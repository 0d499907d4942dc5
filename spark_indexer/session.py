"""The SparkSession of a job. Under `spark-submit`, spark-submit's settings win: its master and deploy mode, its
`--conf` and `--properties-file` values and `spark-defaults.conf`; the job's own defaults fill only what none of them
set. Run as `python -m spark_indexer`, the master is the command's `--master` (or `METALEDGER_SPARK_MASTER`).
Either way the job logs the master and the parallelism it got."""

from __future__ import annotations

import logging
import os
import re
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
# Defaults for a local master only (a laptop, tests): no UI or progress bars, few shuffle partitions. A cluster keeps
# Spark's own defaults for these.
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
}
# JVM options of a local master's driver (which runs its executors too): the client-only JIT cuts a session's JVM CPU
# time by ~40% (start and small jobs: 28-31 s against 46-50 s measured). JVM options only count when the JVM is
# launched, so these go to spark-submit's command line; `defaultJavaOptions` come before an operator's
# `spark.driver.extraJavaOptions`, whose flags win.
LOCAL_LAUNCH_DEFAULTS = {"spark.driver.defaultJavaOptions": "-XX:TieredStopAtLevel=1"}
# What PySpark's launcher sets when `python -m …` starts the JVM itself (it submits a "pyspark-shell"): its
# defaults for an interactive shell, not an operator's choices.
LAUNCHER_KEYS = ("spark.master", "spark.app.name", "spark.ui.showConsoleProgress")


def submitted() -> bool:
    """Whether spark-submit started this Python (it hands over its JVM through the gateway port)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def launch_conf(master: str) -> SparkConf | None:
    """What a JVM this process launches for `master` gets on spark-submit's command line: the launch defaults of a
    local master that spark-defaults.conf does not set (a `--conf` would override the file's value)."""
    if not master.startswith("local"):
        return None
    launch = SparkConf(loadDefaults=False)
    for key, value in LOCAL_LAUNCH_DEFAULTS.items():
        if not defaults_file_sets(key):
            launch.set(key, value)
    return launch


def defaults_file_sets(key: str) -> bool:
    """Whether the spark-defaults.conf spark-submit would read (`SPARK_CONF_DIR`, else Spark's conf/) sets `key`."""
    from pyspark.find_spark_home import _find_spark_home

    folder = os.environ.get("SPARK_CONF_DIR") or os.path.join(_find_spark_home(), "conf")
    try:
        with open(os.path.join(folder, "spark-defaults.conf"), encoding="utf-8") as defaults:
            return any(re.match(rf"\s*{re.escape(key)}[\s=:]", line) for line in defaults)
    except OSError:
        return False


def session_conf(master: str, app_name: str, conf: dict[str, str] | None = None) -> SparkConf:
    """The conf the session is built with: what spark-submit or the environment gave (the JVM's system properties),
    then `conf` and the job's defaults only for keys still unset; `master` only when spark-submit gave none."""
    was_submitted = submitted()
    # joins spark-submit's JVM, or launches one: its properties are the given conf
    SparkContext._ensure_initialized(conf=None if was_submitted else launch_conf(master))
    given = SparkConf()
    if not was_submitted:
        jconf = given._jconf
        assert jconf is not None  # made in the JVM, which is up (`_ensure_initialized`)
        for key in LAUNCHER_KEYS:
            jconf.remove(key)
    given.setIfMissing("spark.master", master)
    given.setIfMissing("spark.app.name", app_name)
    is_local = given.get("spark.master", "").startswith("local")
    for key, value in {**JOB_DEFAULTS, **(LOCAL_DEFAULTS if is_local else {}), **(conf or {})}.items():
        given.setIfMissing(key, value)
    return given


def build_session(
    master: str = "local[*]", app_name: str = "metaledger-indexer", conf: dict[str, str] | None = None
) -> SparkSession:
    """An existing session (tests, a notebook) is reused; otherwise one is built from `session_conf`.

    Executors run the Python spark-submit was told to use (`spark.pyspark.python`, `PYSPARK_PYTHON`); only a local
    master, whose executors share this machine, defaults to this process's own interpreter."""
    active = SparkSession.getActiveSession()
    if active is None:
        given = session_conf(master, app_name, conf)
        if (
            given.get("spark.master", "").startswith("local")
            and "PYSPARK_PYTHON" not in os.environ
            and not given.contains("spark.pyspark.python")
        ):
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
    log.info(
        f"Spark session: master {context.master} ({deploy_mode} mode), default parallelism "
        f"{context.defaultParallelism}, {shuffle} shuffle partitions",
        extra={
            "master": context.master,
            "deploy_mode": deploy_mode,
            "default_parallelism": context.defaultParallelism,
            "shuffle_partitions": shuffle,
            "app_id": context.applicationId,
        },
    )
