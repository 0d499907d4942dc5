"""What DataHub's clients make of the DataHub version metaledger's `/config` reports (app.api.system,
REPORTED_DATAHUB_VERSION, `serverEnv: core`, no `baseUrl`), asked of the clients themselves:

* acryl-datahub 1.7.0.17 (`.venv-client`): a core server (not DataHub Cloud, no frontend URL) at 1.5.0, so the SDK
  v2 writes through the OpenAPI v3 endpoints (>= 1.0.1) and neither sends `status` as a PATCH (>= 1.7.0) nor the
  `assertionNote` aspect (>= 1.7.0.1), which metaledger's client tests do not cover yet;
* mcp-server-datahub 0.8.0 (`.venv-mcp`, over stdio as an assistant runs it): it lists the tools it gates on
  DataHub >= 1.4.0 (user, document, history and curation tools) beside the ungated ones."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.client.conftest import DataHubClient, Metaledger

pytestmark = pytest.mark.client

# Listed whatever the version
UNGATED = {
    "search",
    "get_entities",
    "get_lineage",
    "get_lineage_paths_between",
    "list_schema_fields",
    "get_dataset_queries",
}
# @min_version(cloud="0.3.16", oss="1.4.0"), with TOOLS_IS_MUTATION_ENABLED and TOOLS_IS_USER_ENABLED; the two
# document search tools also need documents (DocumentToolsMiddleware), and are switched off here
GATED = {
    "get_me",
    "save_document",
    "get_aspect_history",
    "add_tags",
    "remove_tags",
    "add_terms",
    "remove_terms",
    "add_owners",
    "remove_owners",
    "set_domains",
    "remove_domains",
    "update_description",
    "add_structured_properties",
    "remove_structured_properties",
}


def test_the_sdk_sees_a_core_server_of_the_version_served(datahub: DataHubClient):
    out = datahub.script(
        """
        import json
        from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
        from datahub.ingestion.workunit_processors.auto_status_aspect import _gms_supports_status_patch
        from datahub.sdk import DataHubClient
        from datahub.utilities.server_config_util import ServiceFeature, set_gms_config

        graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
        config = graph.server_config
        set_gms_config(config)  # as the REST sink does before a pipeline's work units are processed
        try:
            frontend = graph.frontend_base_url
        except ValueError:
            frontend = None
        print(json.dumps({
            "version": config.service_version,
            "parsed": config.parsed_version,
            "cloud": config.is_datahub_cloud,
            "frontend": frontend,
            "openapi_sdk": config.supports_feature(ServiceFeature.OPEN_API_SDK),
            "status_patch": _gms_supports_status_patch(),
            "assertion_note": config.supports_feature(ServiceFeature.ASSERTION_NOTE_ASPECT),
            "sdk_v2_openapi": bool(DataHubClient.from_env()._graph._openapi_ingestion),
        }))
        """
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "version": "v1.5.0",
        "parsed": [1, 5, 0, 0],
        "cloud": False,
        "frontend": None,
        "openapi_sdk": True,
        "status_patch": False,
        "assertion_note": False,
        "sdk_v2_openapi": True,
    }


LIST_TOOLS = """
import asyncio, json
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main():
    server = StdioServerParameters(command=SERVER, args=[], env=ENV)
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            listed = await session.list_tools()
    print(json.dumps(sorted(tool.name for tool in listed.tools)))

asyncio.run(main())
"""


def test_the_mcp_server_lists_the_tools_it_gates_on_the_version(
    mcp_python: Path, metaledger: Metaledger, tmp_path: Path
):
    env = {
        "PATH": f"{mcp_python.parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),  # no ~/.datahubenv
        "DATAHUB_GMS_URL": metaledger.url,
        "DATAHUB_GMS_TOKEN": metaledger.token,
        "DATAHUB_TELEMETRY_ENABLED": "false",
        "TOOLS_IS_MUTATION_ENABLED": "true",
        "TOOLS_IS_USER_ENABLED": "true",
        "DATAHUB_MCP_DOCUMENT_TOOLS_DISABLED": "true",
    }
    prelude = f"SERVER = {str(mcp_python.parent / 'mcp-server-datahub')!r}\nENV = {env!r}\n"
    listed = subprocess.run(
        [str(mcp_python), "-c", prelude + textwrap.dedent(LIST_TOOLS)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert set(json.loads(listed.stdout.strip().splitlines()[-1])) == UNGATED | GATED, listed.stderr[-3000:]
