"""The change feed over HTTP: the outbox's change logs in commit order, for readers without Kafka.

    GET /openapi/v1/events/mcl?after=<offset>&limit=<n>[&topic=<name>...]

The feed itself (offsets, order, retention) is the changelog's: app.changelog.feed.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from app.api.http import json_response
from app.changelog import feed
from app.errors import ERROR_RESPONSES, Issue, ValidationFailed

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

    page, next_offset = await feed.read_page(request.app.state.engine, after, limit, topics)
    events = [
        {
            "offset": e.offset,
            "topic": e.topic,
            "key": e.key,
            "urn": e.urn,
            "aspect": e.aspect,
            "version": e.version,
            "changeType": e.change_type,
            "createdAt": e.created_at_ms,
            "mcl": orjson.Fragment(e.payload),  # stored JSON, passed through without re-parsing
        }
        for e in page
    ]
    return json_response({"events": events, "nextOffset": next_offset})
