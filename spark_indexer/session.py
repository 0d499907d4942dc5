"""The SparkSession of a job: the one `spark-submit` made, or a local one built from the settings."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.stopGracefullyOnShutdown": "true",
}


def build_session(master: str = "local[*]", app_name: str = "metaledger-indexer",
                  conf: dict[str, str] | None = None) -> SparkSession:
    """An existing session (spark-submit, tests) is reused; otherwise a local one is built with the project's
    Python on the executors."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if not os.environ.get("SPARK_SUBMIT_MASTER") and "spark.master" not in (conf or {}):
        builder = builder.master(master)
    for key, value in {**LOCAL_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
