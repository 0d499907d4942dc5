"""Helpers the real-client tests share: writes over plain HTTP to a metaledger process, and DataHub Actions
recordings (tests/client/actions_plugin/recording_action.py)."""

from __future__ import annotations

import time

MCL = "MetadataChangeLogEvent_v1"
ECE = "EntityChangeEvent_v1"


def propose(server, *proposals: dict) -> dict:
    """POST the MCPs to /openapi/v1/proposals; the answer (200 asserted)."""
    with server.http() as http:
        response = http.post("/openapi/v1/proposals", json=list(proposals))
        assert response.status_code == 200, response.text
        return response.json()


def mcp(urn: str, aspect: str, value, change_type: str = "UPSERT", **extra) -> dict:
    proposal = {
        "entityType": urn.split(":")[2],
        "entityUrn": urn,
        "changeType": change_type,
        "aspectName": aspect,
        **extra,
    }
    if value is not None:
        proposal["aspect"] = {"value": value, "contentType": "application/json"}
    return proposal


def warm_up(pipeline, server, tag: str, timeout: float = 90, every: float = 1) -> None:
    """Write a new status aspect every `every` seconds until the pipeline records one: a source that starts at the
    end of its stream (Kafka `latest`, the Events API without an offset) is then reading."""
    deadline = time.monotonic() + timeout
    sent: set[str] = set()
    while True:
        urn = f"urn:li:dataset:(urn:li:dataPlatform:hive,warmup.{tag}_{len(sent)},PROD)"
        propose(server, mcp(urn, "status", {"removed": False}))
        sent.add(urn)
        try:
            pipeline.wait_for(
                lambda events: any(e.get("urn") in sent for e in events), timeout=every, what="a warm-up event"
            )
            return
        except AssertionError:
            if pipeline.process.poll() is not None or time.monotonic() > deadline:
                raise


def of(events: list[dict], urn: str, event_type: str) -> list[dict]:
    return [e for e in events if e["eventType"] == event_type and e.get("urn") == urn]
