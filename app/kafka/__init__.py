"""Kafka: topics, the outbox relay, asynchronous ingestion (MCP/MCE consumers) and their dead letters."""
