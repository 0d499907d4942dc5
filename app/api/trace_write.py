"""Write tracing as DataHub's clients use it (app.ingest.trace keeps the trace id with each write).

* Every HTTP response carries a W3C `traceparent` (`TraceparentMiddleware`): the caller's trace id if it sent one,
  else a new one; the writes of the request keep it in their system metadata (`properties.telemetryTraceId`).
* `POST /openapi/v1/trace/write/{traceId}?onlyIncludeErrors=true&detailed=false&skipCache=false` with
  `{"<urn>": ["<aspectName>", ...]}` → `{"<urn>": {"<aspect>": {"success", "primaryStorage": {"writeStatus",
  "writeMessage"?, "writeExceptions"?}, "searchStorage": {...}}}}` (DataHub's TraceController / TraceServiceImpl).

Where each answer comes from, and how a large trace is read: app.ingest.write_trace, the service this route and the
MCP tool `trace_write` call. `skipCache` is accepted and changes nothing: nothing is cached.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, RootModel
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.deps import ALLOW_READ, Backend, Caller, JsonBody, Registry, Session
from app.api.http import Flag
from app.errors import ERROR_RESPONSES
from app.ingest import write_trace
from app.ingest.trace import REQUEST_TRACE_ID, new_trace_id, trace_id_of_traceparent, traceparent
from app.ingest.write_trace import WriteStatus

router = APIRouter(tags=["trace"], dependencies=[ALLOW_READ])


class TraceparentMiddleware:
    """The request's trace id (`REQUEST_TRACE_ID`) and the `traceparent` of its response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope["headers"]).get(b"traceparent")
        trace_id = trace_id_of_traceparent(sent.decode("latin-1") if sent else None) or new_trace_id()
        token = REQUEST_TRACE_ID.set(trace_id)

        async def send_with_traceparent(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["traceparent"] = traceparent(trace_id)
            await send(message)

        try:
            await self.app(scope, receive, send_with_traceparent)
        finally:
            REQUEST_TRACE_ID.reset(token)


# --- the answer's model (DataHub's TraceResponseV1) --------------------------------------------------------------


class TraceException(BaseModel):
    message: str | None = None
    exceptionClass: str | None = None
    stackTrace: list[str] | None = None
    cause: TraceException | None = None


class TraceStorageStatus(BaseModel):
    writeStatus: WriteStatus
    writeMessage: str | None = None
    writeExceptions: list[TraceException] | None = None


class TraceStatus(BaseModel):
    success: bool
    primaryStorage: TraceStorageStatus
    searchStorage: TraceStorageStatus


class TraceRequest(RootModel[dict[str, list[str]]]):
    model_config = ConfigDict(
        json_schema_extra={
            "description": "The aspects to trace, per URN",
            "examples": [{"urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)": ["status", "datasetProperties"]}],
        }
    )


@router.post(
    "/openapi/v1/trace/write/{traceId}",
    response_model=dict[str, dict[str, TraceStatus]],
    response_model_exclude_none=True,
    responses=ERROR_RESPONSES,
    summary="Where the writes of a trace stand: primary storage and the search index (DataHub's write tracing)",
    description="`traceId`: the trace id of a write response's `traceparent` (or the whole header). Per aspect asked: "
    "`success`, `primaryStorage.writeStatus` and `searchStorage.writeStatus` (ERROR, PENDING, ACTIVE_STATE, "
    "HISTORIC_STATE, NO_OP, UNKNOWN, TRACE_NOT_IMPLEMENTED). `onlyIncludeErrors` (default true) answers only the "
    "aspects with an ERROR; `detailed` adds the MCP consumer's reasons of a refused asynchronous write "
    "(`writeExceptions`); `skipCache` changes nothing (nothing is cached).",
)
async def trace_writes(
    request: Request,
    session: Session,
    registry: Registry,
    backend: Backend,
    caller: Caller,
    body: Annotated[TraceRequest, Depends(JsonBody(TraceRequest))],
    traceId: Annotated[str, Path(description="A trace id (32 hex digits) or a whole `traceparent`")],
    onlyIncludeErrors: Annotated[Flag, Query()] = True,
    detailed: Annotated[Flag, Query()] = False,
    skipCache: Annotated[Flag, Query()] = False,
) -> Any:
    return await write_trace.trace_writes(
        session,
        registry,
        backend,
        caller,
        request.app.state.settings,
        request.app.state.value_codec,
        body.root,
        traceId,
        only_include_errors=onlyIncludeErrors,
        detailed=detailed,
    )
