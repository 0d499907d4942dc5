"""Write tracing, DataHub's protocol: each request has a W3C trace id, and every write it makes keeps that id in its
system metadata (`properties.telemetryTraceId`, DataHub's key), so that `POST /openapi/v1/trace/write/{traceId}`
(app.api.trace_write) can say where the write stands.

The id is the caller's (the trace id of its `traceparent` header) or a new one in DataHub's form (TraceIdGenerator:
16 hex digits of the time in microseconds, then 16 random ones: the SDK reads the time back from it). It lives in
`REQUEST_TRACE_ID` for the request (set by app.api.trace_write.TraceparentMiddleware) and is stamped on the drafts
by the ingest gateway: a write queued on the MCP topic carries it, and the MCP consumer, which has no request, keeps
the one its record carries.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

from app.write.proposal import Draft

TELEMETRY_TRACE_KEY = "telemetryTraceId"  # DataHub's SystemTelemetryContext.TELEMETRY_TRACE_KEY

REQUEST_TRACE_ID: ContextVar[str | None] = ContextVar("metaledger_request_trace_id", default=None)

_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
_INVALID_TRACE_ID = "0" * 32  # W3C: an all-zero trace id is invalid

# DataHub's TraceIdGenerator.getTimestampMillis: a trace id whose first 16 hex digits are not a plausible time (an
# external tracer's random id) has no time.
_MIN_PLAUSIBLE_MS = 1_577_836_800_000  # 2020-01-01
_MAX_CLOCK_SKEW_MS = 86_400_000


def new_trace_id(now_ms: int | None = None) -> str:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{now_ms * 1000:016x}{secrets.randbits(64):016x}"


def trace_id_of_traceparent(header: str | None) -> str | None:
    """The trace id of a W3C `traceparent` header (None when absent or malformed: the request then gets a new one)."""
    if not header:
        return None
    match = _TRACEPARENT.fullmatch(header.strip().lower())
    if match is None or match.group(1) == _INVALID_TRACE_ID:
        return None
    return match.group(1)


def trace_id_of_path(raw: str) -> str | None:
    """What DataHub's TraceController accepts as the trace to look up: a whole `traceparent` or a bare trace id."""
    text = raw.strip().lower()
    if "-" in text:
        parts = text.split("-")
        text = parts[1] if len(parts) >= 2 else ""
    return text if _TRACE_ID.fullmatch(text) else None


def traceparent(trace_id: str) -> str:
    """A `traceparent` header of this trace (a new span id; sampled)."""
    return f"00-{trace_id}-{secrets.token_hex(8)}-01"


def trace_time_ms(trace_id: str | None) -> int | None:
    if not trace_id or len(trace_id) < 16:
        return None
    try:
        millis = int(trace_id[:16], 16) // 1000
    except ValueError:
        return None
    if _MIN_PLAUSIBLE_MS <= millis <= time.time() * 1000 + _MAX_CLOCK_SKEW_MS:
        return millis
    return None


def trace_id_in(system_metadata: Any) -> str | None:
    """The trace id kept in a write's system metadata (a dict, or None)."""
    if not isinstance(system_metadata, dict):
        return None
    properties = system_metadata.get("properties")
    return properties.get(TELEMETRY_TRACE_KEY) if isinstance(properties, dict) else None


def stamp_trace(drafts: Iterable[Draft]) -> None:
    """Keep the request's trace id with each write (a draft whose system metadata is not an object is left for the
    write pipeline to refuse). Outside a request (the MCP consumer) the drafts keep the id their record carries."""
    trace_id = REQUEST_TRACE_ID.get()
    if trace_id is None:
        return
    for draft in drafts:
        system_metadata = draft.system_metadata if draft.system_metadata is not None else {}
        if not isinstance(system_metadata, dict):
            continue
        properties = system_metadata.get("properties")
        if properties is not None and not isinstance(properties, dict):
            continue
        draft.system_metadata = {**system_metadata, "properties": {**(properties or {}), TELEMETRY_TRACE_KEY: trace_id}}
