"""metaledger's own MCP endpoint: `POST /mcp`, the Model Context Protocol's streamable HTTP transport (the `mcp` SDK's
low-level `Server` and its session manager), stateless and answering JSON.

Stateless, with JSON answers, because every call then is one HTTP request that ends with its answer: nothing lives
between requests (no session to lose when a worker of `serve --workers N` is not the one that opened it, none to
drain on SIGTERM: a graceful stop waits for the requests in flight, app.ops.drain, and the SDK's task group is
closed after them, in the app's lifespan), and the route is an ordinary one of the app: its policy (READ) runs first
and answers 401 with `WWW-Authenticate` without a token, its body is read by the app's bounded parser (413, 415,
400 past MAX_JSON_DEPTH) before the SDK sees it, and its metrics, request id, trace and drain are every route's.

The caller is the request's (its bearer token: a cookie never authorizes anything here); each tool decides what it
needs beyond READ (the curation tools WRITE, the runs and model set ADMIN) and its writes go through the ingest
gateway as that caller, attributed to the tool (app.mcp.call)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from app.api.deps import ALLOW_READ, Caller, DeclaredBody
from app.api.route_index import include_once
from app.errors import ERROR_RESPONSES
from app.mcp import datahub as _datahub  # noqa: F401  (declares DataHub's tools)
from app.mcp import extras as _extras  # noqa: F401  (declares metaledger's)
from app.mcp.tools import TOOLS

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

PATH = "/mcp"

router = APIRouter(tags=["mcp"], dependencies=[ALLOW_READ])


class JsonRpcBody(DeclaredBody[bytes]):
    """A JSON-RPC message of MCP, read by the app's bounded parser, handed on to the SDK as JSON text."""

    def request_body_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "required": ["jsonrpc", "method"],
            "properties": {
                "jsonrpc": {"type": "string", "enum": ["2.0"]},
                "id": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                "method": {"type": "string", "examples": ["initialize", "tools/list", "tools/call"]},
                "params": {"type": "object", "additionalProperties": True},
            },
        }

    async def parse(self, document: Any, request: Request) -> bytes:
        return orjson.dumps(document)


class _Forwarded(Response):
    """The request, its body already read (and checked), handed to the SDK's transport, which answers it."""

    def __init__(self, manager: StreamableHTTPSessionManager, body: bytes) -> None:
        self.manager, self.body_bytes = manager, body
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": self.body_bytes, "more_body": False}
            return await receive()  # the disconnect, when it comes

        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(self.body_bytes)).encode()))
        await self.manager.handle_request({**scope, "headers": headers}, replay, send)


@router.post(
    PATH,
    summary="metaledger's MCP endpoint (Model Context Protocol, streamable HTTP, stateless, JSON answers)",
    description=(
        "One JSON-RPC message of MCP per request (`initialize`, `tools/list`, `tools/call`, ...), answered as JSON "
        "(`Accept: application/json, text/event-stream`). The bearer token decides what each tool may do: READ "
        "for the reads, WRITE for the curation tools, ADMIN for the runs and the model set. A refused or invalid "
        "tool call is a tool result with `isError: true` naming what is missing. Tools: " + ", ".join(TOOLS)
    ),
    responses={
        **ERROR_RESPONSES,
        200: {"description": "The JSON-RPC answer", "content": {"application/json": {"schema": {"type": "object"}}}},
        202: {"description": "A notification or response was accepted (no answer)"},
    },
    operation_id="mcp",
)
async def mcp_endpoint(request: Request, caller: Caller, message: Annotated[bytes, Depends(JsonRpcBody())]) -> Response:
    endpoint: McpEndpoint = request.app.state.mcp
    await endpoint.start()
    assert endpoint.manager is not None
    return _Forwarded(endpoint.manager, message)


STOP_WAIT_S = 5.0


class McpEndpoint:
    """The MCP server of one app and its session manager (started and stopped by the app's lifespan)."""

    def __init__(self, max_request_bytes: int) -> None:
        self.max_request_bytes = max_request_bytes
        self.manager: StreamableHTTPSessionManager | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._started = asyncio.Event()

    async def start(self) -> None:
        """Run the session manager in a task of its own, on the first call (at once when it runs already): its task
        group is entered and left in that task, whichever tasks start and stop the app (a test's lifespan may start
        in one and stop in another). Not in the lifespan's start-up: a worker whose supervisor was killed while it
        started up stayed, its session manager's task in the way of its stop."""
        if self._task is not None:
            await self._started.wait()
            return
        started = self._started = asyncio.Event()
        self._stop = asyncio.Event()
        # The SDK is imported here, not with the app: it is most of a process's start-up time, and most processes
        # (every test's, most workers) never answer an MCP call.
        from app.mcp.protocol import session_manager

        manager = self.manager = session_manager(self.max_request_bytes)

        async def run() -> None:
            async with manager.run():
                started.set()
                await self._stop.wait()

        self._task = asyncio.create_task(run(), name="mcp-session-manager")
        await started.wait()

    async def stop(self) -> None:
        """Leave the session manager's task group; cancelled if it has not left within STOP_WAIT_S: a stop never
        waits on it for ever."""
        if self._task is not None:
            self._stop.set()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), STOP_WAIT_S)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None


def install(app: FastAPI) -> None:
    """The `/mcp` route and its server, on `app` (before app.api.route_index files the routes)."""
    app.state.mcp = McpEndpoint(app.state.settings.max_request_bytes)
    include_once(app, [router])
