"""An MCP client session driven over stdin/stdout: run in the MCP server's virtualenv (tests/client/conftest.py
`mcp_python`), which has the `mcp` client SDK and DataHub's SDK (`acryl-datahub`, the server's own pin).

    python mcp_session.py TARGET URL TOKEN LOG_FILE

TARGET is where the session goes:
  stdio           DataHub's MCP server (`mcp-server-datahub`, beside this Python) over stdio, pointed at URL
  datahub-http    DataHub's MCP server as its own streamable-HTTP process (`mcp-server-datahub-http`), pointed at URL;
                  the token travels with each request, as that mode requires
  metaledger      metaledger's own MCP endpoint, URL + /mcp

One JSON object per line in, one per line out:
  {"op": "list_tools"}                              -> {"ok": true, "value": [tool names]}
  {"op": "call", "tool": …, "arguments": {…}}      -> {"ok": true, "value": the tool's result}
                                                       or {"ok": false, "error": the tool's error text}
  {"op": "aspect", "urn": …, "aspect": "GlobalTagsClass"}
                                                    -> {"ok": true, "value": the aspect as DataHub's SDK reads it
                                                       (`DataHubGraph.get_aspect`, as JSON) or null}
The first line out is {"ready": true} once the session is initialized. The server's own log goes to LOG_FILE."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
CALL_TIMEOUT_S = 120


def _server_env(url: str, token: str | None) -> dict[str, str]:
    """What DataHub's MCP server needs to list every tool an OSS server offers: mutations and get_me are off by
    default. HOME is empty so a developer's ~/.datahubenv cannot point it elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATAHUB_", "FASTMCP_"))}
    env.update(
        {
            "DATAHUB_GMS_URL": url,
            "TOOLS_IS_MUTATION_ENABLED": "true",
            "TOOLS_IS_USER_ENABLED": "true",
            "DATAHUB_TELEMETRY_ENABLED": "false",
            "HOME": os.environ["MCP_SESSION_HOME"],
        }
    )
    if token:
        env["DATAHUB_GMS_TOKEN"] = token
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def _session(target: str, url: str, token: str, log_path: str):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamablehttp_client

    with open(log_path, "a") as log:
        if target == "stdio":
            params = StdioServerParameters(
                command=str(BIN / "mcp-server-datahub"), args=["--transport", "stdio"], env=_server_env(url, token)
            )
            async with stdio_client(params, errlog=log) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session
            return
        headers = {"Authorization": f"Bearer {token}"}
        if target == "metaledger":
            async with streamablehttp_client(
                url.rstrip("/") + "/mcp", headers=headers, timeout=60, sse_read_timeout=CALL_TIMEOUT_S
            ) as (read, write, _):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session
            return
        assert target == "datahub-http", target
        port = _free_port()
        env = _server_env(url, None)  # HTTP mode refuses a shared token: each request brings its own
        env.update({"FASTMCP_HOST": "127.0.0.1", "FASTMCP_PORT": str(port)})
        process = subprocess.Popen([str(BIN / "mcp-server-datahub-http")], env=env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                    break
                except OSError:
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise RuntimeError(f"mcp-server-datahub-http did not start; its log: {log_path}") from None
                    await asyncio.sleep(0.2)
            async with streamablehttp_client(
                f"http://127.0.0.1:{port}/mcp", headers=headers, timeout=60, sse_read_timeout=CALL_TIMEOUT_S
            ) as (read, write, _):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session
        finally:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)


def _result(result: Any) -> dict[str, Any]:
    text = "\n".join(getattr(content, "text", "") for content in result.content or [])
    if result.isError:
        return {"ok": False, "error": text or "a tool error without text"}
    value = result.structuredContent
    if value is None:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
    elif isinstance(value, dict) and set(value) == {"result"}:  # FastMCP wraps a non-object result
        value = value["result"]
    return {"ok": True, "value": value}


async def main(target: str, url: str, token: str, log_path: str) -> None:
    from datahub.ingestion.graph.client import DatahubClientConfig, DataHubGraph
    from datahub.metadata import schema_classes

    graph = DataHubGraph(DatahubClientConfig(server=url, token=token))
    loop = asyncio.get_running_loop()
    async with _session(target, url, token, log_path) as session:
        print(json.dumps({"ready": True}), flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            request = json.loads(line)
            try:
                if request["op"] == "list_tools":
                    answer = {"ok": True, "value": sorted(t.name for t in (await session.list_tools()).tools)}
                elif request["op"] == "call":
                    answer = _result(
                        await session.call_tool(
                            request["tool"],
                            request["arguments"],
                            read_timeout_seconds=timedelta(seconds=CALL_TIMEOUT_S),
                        )
                    )
                else:
                    aspect_class = getattr(schema_classes, request["aspect"])
                    aspect = await asyncio.to_thread(graph.get_aspect, request["urn"], aspect_class)
                    answer = {"ok": True, "value": aspect.to_obj() if aspect else None}
            except Exception as error:  # noqa: BLE001 - the test reads what went wrong
                answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
            print(json.dumps(answer, default=str), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
