"""The PySpark indexer (built in a later issue): streams change logs into search, graph and timeseries."""
