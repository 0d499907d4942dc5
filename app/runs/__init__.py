"""Ingestion runs: what a run wrote (`/runs` list and describe) and its rollback, as ordinary writes."""
