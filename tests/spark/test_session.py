"""The job's SparkSession on a local master: the JVM options it needs at launch reach the JVM it launches."""

from __future__ import annotations

from spark_indexer.session import LOCAL_LAUNCH_DEFAULTS


def test_a_local_masters_jvm_runs_with_the_launch_defaults(spark):
    jvm = spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    for options in LOCAL_LAUNCH_DEFAULTS.values():
        assert set(options.split()) <= set(arguments), arguments
