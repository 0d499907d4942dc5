"""The change feed over HTTP: the outbox's change logs in commit order, for readers without Kafka.

    GET /openapi/v1/events/mcl?after=<offset>&limit=<n>[&topic=<name>...]          metaledger's pages
    GET /openapi/v1/events/poll?topic=&offsetId=&limit=&pollTimeoutSeconds=&lookbackWindowDays=
                                                                                   DataHub's Events API

The feed itself (offsets, order, retention) is the changelog's: app.changelog.feed. A caller reads what the read
rule lets it read (app.auth.reads.readable_events): the rest is left out of a page, whose offset still moves past it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from app.api.deps import ALLOW_READ, Caller, ReadEngine, ReadSession, SettingsDep
from app.api.http import json_response
from app.auth.reads import readable_events
from app.changelog import feed
from app.errors import ERROR_RESPONSES, Issue, ValidationFailed
from app.limits import MAX_LONG, clip
from app.write.repository import AspectRepository

router = APIRouter(prefix="/openapi/v1/events", tags=["events"], dependencies=[ALLOW_READ])

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


@router.get(
    "/mcl",
    response_model=ChangeFeedPage,
    responses=ERROR_RESPONSES,
    summary="Read the Metadata Change Logs in commit order (a change feed without Kafka)",
)
async def change_feed(
    settings: SettingsDep,
    engine: ReadEngine,
    session: ReadSession,
    caller: Caller,
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
    if not 0 <= after <= MAX_LONG:
        issues.append(Issue(f"after must be between 0 and {MAX_LONG}", path="$.after", found=clip(str(after), 40)))
    if not 1 <= limit <= MAX_LIMIT:
        issues.append(Issue(f"limit must be between 1 and {MAX_LIMIT}", path="$.limit", found=clip(str(limit), 40)))
    default, allowed = feed.feed_topics(settings)
    topics = default
    if topic:
        unknown = [t for t in topic if t not in allowed]
        if unknown:
            issues.append(Issue("unknown topic", path="$.topic", expected=", ".join(allowed), found=", ".join(unknown)))
        topics = list(dict.fromkeys(topic))
    if issues:
        raise ValidationFailed("invalid change feed parameters", issues)

    page, next_offset = await feed.read_page(engine, after, limit, topics)
    page = await readable_events(caller, page, AspectRepository(session))  # the read rule; the offset moves on
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


# --- DataHub's Events API (ExternalEventsController), what DataHub Actions' HTTP event source polls ------------------

POLL_DEFAULT_LIMIT = 100
POLL_MAX_LIMIT = 5000  # DataHub's caps
POLL_DEFAULT_TIMEOUT_S = 10
POLL_MAX_TIMEOUT_S = 60


class ExternalEvent(BaseModel):
    contentType: str = Field(examples=["application/json"])
    value: str = Field(description="The event's JSON text: a PlatformEvent or a MetadataChangeLog, as on Kafka in JSON")


class ExternalEventsResponse(BaseModel):
    offsetId: str = Field(description="Pass it back as `offsetId` to continue after these events")
    count: int
    events: list[ExternalEvent]


@router.get(
    "/poll",
    response_model=ExternalEventsResponse,
    responses=ERROR_RESPONSES,
    summary="DataHub's Events API: poll one topic's events after an offset (long poll)",
)
async def poll_events(
    settings: SettingsDep,
    engine: ReadEngine,
    session: ReadSession,
    caller: Caller,
    topic: Annotated[
        str, Query(description="PlatformEvent_v1, MetadataChangeLog_Versioned_v1 or MetadataChangeLog_Timeseries_v1")
    ],
    offsetId: Annotated[str | None, Query(description="Continue after this offset (from a previous answer)")] = None,
    limit: Annotated[
        int | None,
        Query(description=f"At most this many events (default {POLL_DEFAULT_LIMIT}, capped at {POLL_MAX_LIMIT})"),
    ] = None,
    pollTimeoutSeconds: Annotated[
        int | None,
        Query(
            description=f"Wait this long for a first event (default {POLL_DEFAULT_TIMEOUT_S}, capped at {POLL_MAX_TIMEOUT_S})"
        ),
    ] = None,
    lookbackWindowDays: Annotated[
        int | None, Query(description="Without offsetId: start this many days back (default: from now on)")
    ] = None,
):
    """DataHub's shape and caps. Without `offsetId` the read starts at the end of the feed (only new events), or
    `lookbackWindowDays` back. The events of one topic come in commit order; delivery is at least once."""
    _, allowed = feed.feed_topics(settings)
    issues = []
    if topic not in allowed:
        issues.append(Issue("unknown topic", path="$.topic", expected=", ".join(allowed), found=topic[:200]))
    after = None
    if offsetId is not None:
        if not (offsetId.isascii() and offsetId.isdigit()) or len(offsetId) > 18:
            issues.append(
                Issue("offsetId must be an offset this API returned", path="$.offsetId", found=clip(offsetId, 100))
            )
        else:
            after = int(offsetId)
    if limit is not None and limit < 1:
        issues.append(Issue("limit must be 1 or more", path="$.limit", found=str(limit)))
    if pollTimeoutSeconds is not None and pollTimeoutSeconds < 0:
        issues.append(
            Issue("pollTimeoutSeconds must be 0 or more", path="$.pollTimeoutSeconds", found=str(pollTimeoutSeconds))
        )
    if lookbackWindowDays is not None and not 0 <= lookbackWindowDays <= 36_500:
        issues.append(
            Issue(
                "lookbackWindowDays must be between 0 and 36500",
                path="$.lookbackWindowDays",
                found=str(lookbackWindowDays),
            )
        )
    if issues:
        raise ValidationFailed("invalid events poll parameters", issues)
    if after is None:
        if lookbackWindowDays is not None:
            after = await feed.offset_before(engine, datetime.now(UTC) - timedelta(days=lookbackWindowDays))
        else:
            after = await feed.last_offset(engine)
    timeout_s = min(POLL_DEFAULT_TIMEOUT_S if pollTimeoutSeconds is None else pollTimeoutSeconds, POLL_MAX_TIMEOUT_S)
    page, next_offset = await feed.poll(
        engine, after, min(limit or POLL_DEFAULT_LIMIT, POLL_MAX_LIMIT), [topic], timeout_s
    )
    page = await readable_events(caller, page, AspectRepository(session))  # the read rule; the offset moves on
    events = [{"contentType": "application/json", "value": e.payload} for e in page]
    return json_response({"offsetId": str(next_offset), "count": len(events), "events": events})
