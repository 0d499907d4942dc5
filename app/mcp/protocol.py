"""The `mcp` SDK's side of metaledger's MCP endpoint (app.mcp.server): its low-level `Server` listing and calling the
tools of app.mcp.tools as the request's caller, and the stateless session manager that answers each request with
JSON. Imported on the endpoint's first call (app.mcp.server.McpEndpoint.start)."""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as types
import orjson
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request

from app import __version__
from app.api.deps import authenticate
from app.db_faults import DatabaseFault, classify
from app.errors import MetaledgerError
from app.mcp.call import ToolCall
from app.mcp.tools import TOOLS, definitions

log = logging.getLogger("metaledger.mcp")
INSTRUCTIONS = (
    "metaledger: a metadata catalog that speaks DataHub's API. DataHub's MCP tools (search, get_entities, "
    "get_lineage, ...) with the same names and answers, and metaledger's own: get_changes_since, "
    "diff_aspect_versions, trace_write, preview_run_rollback, get_model_set. A list answer says its `total`, and "
    "`truncated` with `nextOffset` when a limit cut it."
)


def session_manager(max_request_bytes: int) -> StreamableHTTPSessionManager:
    server: Server[Any] = Server(
        "metaledger",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
    )
    return StreamableHTTPSessionManager(
        server,
        json_response=True,
        stateless=True,
        # Bearer tokens authorize (never a cookie), so a page a DNS rebinding points at a local metaledger has no
        # credentials to use; browsers' cross-origin calls follow the app's CORS setting like every route's.
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=max_request_bytes,
    )


async def _list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=definitions())


def _text(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def _refusal(error: MetaledgerError) -> types.CallToolResult:
    body = {**error.to_json(), "status": error.status_code}
    return types.CallToolResult(content=[types.TextContent(text=_text(body))], is_error=True)


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    request: Request | None = ctx.request
    found = TOOLS.get(params.name)
    if found is None or request is None:
        message = f"unknown tool {params.name!r}" if found is None else "no HTTP request carries this call"
        return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)
    try:
        arguments = found.parse(params.arguments)
        caller = await authenticate(request)  # the route's policy authenticated it: kept on the request's scope
        async with request.app.state.sessionmaker() as session:
            result = await found.run(ToolCall(found.name, request, caller, session), arguments)
    except MetaledgerError as error:
        return _refusal(error)
    except (SQLAlchemyError, OSError) as error:
        if classify(error) is not DatabaseFault.UNAVAILABLE:
            raise
        log.warning("mcp tool: database unavailable", extra={"tool": found.name, "error": str(error)[:300]})
        return types.CallToolResult(
            content=[types.TextContent(text="the database is unavailable; retry shortly")], is_error=True
        )
    except Exception:  # a bug of the tool's: logged whole, answered without internals (as app.graphql.service does)
        log.exception("mcp tool failed", extra={"tool": found.name})
        return types.CallToolResult(content=[types.TextContent(text="An unknown error occurred.")], is_error=True)
    structured = result if isinstance(result, dict) else {"result": result}
    return types.CallToolResult(content=[types.TextContent(text=_text(result))], structured_content=structured)
