"""The change feed: the outbox's change logs over HTTP, in commit order, for readers without Kafka.

    GET /openapi/v1/events/mcl?after=<offset>&limit=<n>[&topic=<name>...]

Offsets are assigned by the relay's sequencer (`app.kafka.outbox.sequence`) once a change log's transaction and
every transaction that could precede it have finished, so the feed only grows at its end: a reader that keeps the
`nextOffset` of each page and asks again from it sees every change log exactly once, in commit order per URN (and in
one total order for all URNs). Rows leave the feed when the relay prunes them (`outbox_retention_hours`).
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from app.errors import ERROR_RESPONSES, Issue, ValidationFailed
from app.http import json_response
from app.kafka import outbox

router = APIRouter(prefix="/openapi/v1/events", tags=["events"])

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


class ChangeFeedEvent(BaseModel):
    offset: int = Field(description="Position in the change feed (commit order); pass it as `after` to continue")
    topic: str = Field(description="The Kafka topic this change log is (or would be) published to")
    key: str = Field(description="The Kafka message key: the entity URN")
    urn: str
    aspect: str
    version: int = Field(description="The aspect version (timeseries aspects: the timestamp in milliseconds)")
    changeType: str = Field(examples=["UPSERT"])
    createdAt: int = Field(description="When the change was written, epoch milliseconds")
    mcl: dict[str, Any] = Field(description="The Metadata Change Log exactly as published to Kafka")


class ChangeFeedPage(BaseModel):
    events: list[ChangeFeedEvent]
    nextOffset: int = Field(description="The last offset of this page, or `after` when the page is empty")


def _feed_topics(request: Request) -> tuple[list[str], list[str]]:
    """(default topics, every topic that may be asked for)."""
    settings = request.app.state.settings
    default = list(dict.fromkeys([settings.topic_mcl_versioned, settings.topic_mcl_timeseries]))
    allowed = list(dict.fromkeys([*default, settings.topic_platform_event]))
    return default, allowed


@router.get(
    "/mcl",
    response_model=ChangeFeedPage,
    responses=ERROR_RESPONSES,
    summary="Read the Metadata Change Logs in commit order (a change feed without Kafka)",
)
async def change_feed(
    request: Request,
    after: Annotated[int, Query(description="Return events after this offset (0: from the start)")] = 0,
    limit: Annotated[int, Query(description=f"At most this many events (1..{MAX_LIMIT})")] = DEFAULT_LIMIT,
    topic: Annotated[
        list[str] | None,
        Query(description="Only these topics (repeatable); default: the versioned and timeseries MCL topics"),
    ] = None,
):
    """Delivery is at least once across retries of a page and in commit order; readers deduplicate on
    (urn, aspect, version). Only change logs whose place in the order is final are returned."""
    issues = []
    if after < 0:
        issues.append(Issue("after must be 0 or more", path="$.after", found=str(after)))
    if not 1 <= limit <= MAX_LIMIT:
        issues.append(Issue(f"limit must be between 1 and {MAX_LIMIT}", path="$.limit", found=str(limit)))
    default, allowed = _feed_topics(request)
    topics = default
    if topic:
        unknown = [t for t in topic if t not in allowed]
        if unknown:
            issues.append(Issue("unknown topic", path="$.topic", expected=", ".join(allowed), found=", ".join(unknown)))
        topics = list(dict.fromkeys(topic))
    if issues:
        raise ValidationFailed("invalid change feed parameters", issues)

    async with request.app.state.engine.connect() as connection:
        raw = await connection.get_raw_connection()
        records = await outbox.read_feed(raw.driver_connection, after, limit, topics)
    events = [
        {
            "offset": r["feed_offset"],
            "topic": r["topic"],
            "key": r["message_key"],
            "urn": r["urn"],
            "aspect": r["aspect"],
            "version": r["version"],
            "changeType": r["change_type"],
            "createdAt": int(r["created_at"].timestamp() * 1000),
            "mcl": orjson.Fragment(r["payload"]),  # stored JSON, passed through without re-parsing
        }
        for r in records
    ]
    return json_response({"events": events, "nextOffset": records[-1]["feed_offset"] if records else after})
