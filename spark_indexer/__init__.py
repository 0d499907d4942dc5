"""The PySpark indexer: streams change logs into search, graph and timeseries (`stream`), rebuilds the indices from
the latest rows of `metadata_aspect_v2` (`restore-indices`) and compares them with it (`reconcile`); see cli.py."""
