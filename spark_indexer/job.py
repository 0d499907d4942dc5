"""Entry file for `spark-submit`: `spark-submit --master spark://… spark_indexer/job.py stream` (ship the project
with `--py-files` or install it on the cluster's Python)."""

from spark_indexer.cli import main

if __name__ == "__main__":
    main()
