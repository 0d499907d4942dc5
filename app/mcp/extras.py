"""What only metaledger has, as tools: the change feed since a point, an aspect's history and the diff between two of
its versions, a write's trace, an ingestion run and its rollback preview, the runtime model set. Each calls the
service its HTTP route calls (app.changelog.feed, app.timeline, app.changelog.entity_change_events,
app.ingest.write_trace, app.runs, app.modelset) with the same permission: the runs and the model set are an admin's."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import jsonpatch
import orjson
from pydantic import Field, StringConstraints

from app.auth.model import Permission
from app.auth.reads import readable_events
from app.changelog import feed
from app.changelog.entity_change_events import aspect_changes
from app.errors import Issue, NotFound
from app.ingest.write_trace import trace_writes
from app.limits import MAX_LONG
from app.mcp.call import ToolCall
from app.mcp.datahub import NoInput, Urn, aspect_versions, version_json
from app.mcp.tools import Page, ToolInput, tool
from app.modelset.store import model_history, stored_models
from app.runs.service import Rollback, check_run_id, describe_run
from app.write.repository import AspectRepository

MAX_FEED = 1000


class ChangesSinceInput(ToolInput):
    after: int = Field(0, ge=0, le=MAX_LONG, description="The feed offset to read after (0: from the start)")
    since: datetime | None = Field(
        None, description="Instead of `after`: every change written since this time (ISO 8601, e.g. 2026-01-31T12:00Z)"
    )
    limit: int = Field(100, ge=1, le=MAX_FEED, description=f"At most this many change logs (1..{MAX_FEED})")
    urn: Urn | None = Field(None, description="Only the changes of this entity (the page still moves past others)")


@tool(
    "get_changes_since",
    ChangesSinceInput,
    "metaledger's change feed: the Metadata Change Logs committed after a feed offset (or since a time), in commit "
    "order: urn, aspect, version, change type, when, who (`actor`), the tool or trace that wrote it (`origin`, "
    "`traceId`). Continue with `after = nextOffset` while `truncated` (a full page: more may follow).",
    metaledger=True,
)
async def get_changes_since(call: ToolCall, arguments: ChangesSinceInput) -> Any:
    engine = call.request.app.state.engine
    settings = call.settings
    after = arguments.after
    if arguments.since is not None:
        since = arguments.since if arguments.since.tzinfo else arguments.since.replace(tzinfo=UTC)
        after = await feed.offset_before(engine, since)
    topics = list(dict.fromkeys([settings.topic_mcl_versioned, settings.topic_mcl_timeseries]))
    page, next_offset = await feed.read_page(engine, after, arguments.limit, topics)
    full = len(page) == arguments.limit
    page = await readable_events(call.caller, page, AspectRepository(call.session))  # the read rule
    events = []
    for event in page:
        if arguments.urn is not None and event.urn != arguments.urn:
            continue
        mcl = orjson.loads(event.payload)
        properties = (mcl.get("systemMetadata") or {}).get("properties") or {}
        events.append(
            {
                "offset": event.offset,
                "urn": event.urn,
                "aspect": event.aspect,
                "version": event.version,
                "changeType": event.change_type,
                "createdAt": event.created_at_ms,
                "actor": (mcl.get("created") or {}).get("actor"),
                "origin": properties.get("metaledger.origin"),
                "traceId": properties.get("telemetryTraceId"),
                "aspectValue": _aspect_value(mcl),
            }
        )
    body: dict[str, Any] = {"after": after, "events": events, "nextOffset": next_offset, "truncated": full}
    return body


def _aspect_value(mcl: dict[str, Any]) -> Any:
    aspect = mcl.get("aspect")
    if isinstance(aspect, dict) and isinstance(aspect.get("value"), str):
        try:
            return orjson.loads(aspect["value"])
        except orjson.JSONDecodeError:
            return aspect["value"]
    return aspect


class AspectDiffInput(ToolInput):
    urn: Urn = Field(description="The entity")
    aspect: Annotated[str, StringConstraints(min_length=1, max_length=200)] = Field(description="The aspect")
    from_version: int | None = Field(None, ge=0, description="The older version (default: the one before `to_version`)")
    to_version: int | None = Field(None, ge=0, description="The newer version (default: the current one)")


@tool(
    "diff_aspect_versions",
    AspectDiffInput,
    "What changed in an aspect between two of its versions: the semantic changes (tag added, owner removed, field "
    "type changed, ... as the Timeline and the entity change events say them) and the JSON Patch, with who wrote "
    "each version and with which tool or trace. get_aspect_history lists the versions.",
    metaledger=True,
)
async def diff_aspect_versions(call: ToolCall, arguments: AspectDiffInput) -> Any:
    rows = await aspect_versions(call, arguments.urn, arguments.aspect, "$.arguments.urn")
    by_version = {version_json(r)["version"]: r for r in rows}
    newest = max(by_version) if by_version else 0
    to_version = arguments.to_version if arguments.to_version is not None else newest
    older = [v for v in by_version if v < to_version]
    from_version = arguments.from_version if arguments.from_version is not None else (max(older) if older else None)
    if to_version not in by_version:
        raise NotFound(f"version {to_version} of {arguments.aspect} is not kept", [_missing("to_version", by_version)])
    if from_version is not None and from_version not in by_version:
        raise NotFound(
            f"version {from_version} of {arguments.aspect} is not kept", [_missing("from_version", by_version)]
        )
    previous = by_version[from_version].value if from_version is not None else None
    current = by_version[to_version].value
    changes = aspect_changes(arguments.urn, arguments.aspect, previous, current)
    return {
        "urn": arguments.urn,
        "aspect": arguments.aspect,
        "from": version_json(by_version[from_version]) if from_version is not None else None,
        "to": version_json(by_version[to_version]),
        "changes": [
            {"category": c.category, "operation": c.operation, "modifier": c.modifier, "semVerChange": c.semver,
             "description": c.description, "parameters": c.parameters}
            for c in changes
        ],
        "jsonPatch": jsonpatch.make_patch(previous or {}, current).patch,
        "versionsKept": sorted(by_version),
    }  # fmt: skip


def _missing(argument: str, kept: dict[int, Any]) -> Issue:
    return Issue("not kept", path=f"$.arguments.{argument}", expected=", ".join(map(str, sorted(kept))) or "none")


class TraceInput(ToolInput):
    trace_id: Annotated[str, StringConstraints(min_length=1, max_length=200)] = Field(
        description="A write's trace id (32 hex digits, the `traceId` of a change) or a whole traceparent"
    )
    aspects: dict[Urn, Annotated[list[Annotated[str, StringConstraints(max_length=200)]], Field(max_length=100)]] = (
        Field(description="The aspects to trace, per URN", min_length=1, max_length=100)
    )


@tool(
    "trace_write",
    TraceInput,
    "Where the writes of a trace stand, per aspect: primary storage (ACTIVE_STATE: it is the current version; "
    "HISTORIC_STATE: replaced since; PENDING; ERROR with the reason) and search index (ACTIVE_STATE once "
    "searchable). The trace id is in each change's `traceId` (get_changes_since, get_aspect_history).",
    metaledger=True,
)
async def trace_write(call: ToolCall, arguments: TraceInput) -> Any:
    return await trace_writes(
        call.session,
        call.registry,
        await call.backend(),
        call.caller,
        call.settings,
        call.request.app.state.value_codec,
        arguments.aspects,
        arguments.trace_id,
        only_include_errors=False,  # an agent asks where its writes stand, not only which failed
        detailed=True,
        trace_id_path="$.arguments.trace_id",
        aspects_path="$.arguments.aspects",
    )


class RunPreviewInput(ToolInput):
    run_id: Annotated[str, StringConstraints(min_length=1, max_length=500)] = Field(
        description="The ingestion run's id"
    )
    start: int = Field(0, ge=0, description="Where the page of the run's aspects starts")
    count: int = Field(50, ge=1, le=500, description="The run's aspects per page")


@tool(
    "preview_run_rollback",
    RunPreviewInput,
    "An ingestion run: the aspects it wrote (paged by `start`/`count`: `truncated`/`nextOffset` while more are "
    "left), and what rolling it back would do (a dry run: nothing is written) — aspects reverted to their value "
    "before the run, entities removed, and what others changed since (kept). Needs the ADMIN role, as /runs.",
    metaledger=True,
)
async def preview_run_rollback(call: ToolCall, arguments: RunPreviewInput) -> Any:
    call.require(Permission.ADMIN)
    run_id = check_run_id(arguments.run_id)
    aspects = await describe_run(
        call.session, call.registry, run_id, arguments.start, arguments.count + 1, include_soft=False,
        include_aspect=False,
    )  # fmt: skip
    preview = await Rollback(call.session, call.gateway, call.caller, run_id, dry_run=True, safe=True).run()
    shown = aspects[: arguments.count]
    more = len(aspects) > len(shown)
    page = {"returned": len(shown), "offset": arguments.start, "truncated": more}
    if more:
        page["nextOffset"] = arguments.start + len(shown)
    return {"runId": run_id, "aspects": shown, **page, "rollbackPreview": preview}


@tool(
    "get_model_set",
    NoInput,
    "The runtime model set in force (the entity types and aspects registered at run time, beside DataHub's): its "
    "version, who applied it and when, and every stored version. Needs the ADMIN role, as /openapi/v1/models.",
    metaledger=True,
)
async def get_model_set(call: ToolCall, arguments: NoInput) -> Any:
    call.require(Permission.ADMIN)
    current = (await stored_models(call.session)).to_json()
    history = await model_history(call.session)
    return {"current": current, "history": history, **Page(len(history), len(history), 0).to_json()}
