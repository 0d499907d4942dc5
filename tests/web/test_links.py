"""Every link form DataHub's tools print for an entity opens that entity's page here: the SDK's
`make_url_for_urn` (DataHubGraph.url_for; the type's own name where the SDK knows no other path, a trailing slash, a
tab) and DataHub's MCP server's links to a sub-entity on its parent's page (`…/Quality/List?assertion_urn=…`),
each computed by the packages themselves, in the MCP server's virtualenv (which holds the SDK it pins)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.client.conftest import mcp_python  # noqa: F401 - the MCP server's virtualenv (a session fixture)
from tests.helpers import mcp, propose
from tests.web.browsing import sign_in

pytestmark = pytest.mark.client

FRONTEND = "http://metaledger"
URNS = {
    "dataset": "urn:li:dataset:(urn:li:dataPlatform:s3,bucket/key/orders.csv,PROD)",
    "container": "urn:li:container:b41c14bc5cb3ccfbb0433c8cbdef2992",
    "chart": "urn:li:chart:(looker,dashboard_elements.1)",
    "dashboard": "urn:li:dashboard:(looker,dashboards.1)",
    "dataFlow": "urn:li:dataFlow:(airflow,shop_daily,prod)",
    "dataJob": "urn:li:dataJob:(urn:li:dataFlow:(airflow,shop_daily,prod),load_orders)",
    "corpuser": "urn:li:corpuser:jdoe@example.com",
    "corpGroup": "urn:li:corpGroup:analysts",
    "tag": "urn:li:tag:pii",
    "glossaryTerm": "urn:li:glossaryTerm:Finance.Revenue",
    "glossaryNode": "urn:li:glossaryNode:Finance",
    "domain": "urn:li:domain:marketing",
    "dataProduct": "urn:li:dataProduct:orders",
    "mlModel": "urn:li:mlModel:(urn:li:dataPlatform:sagemaker,churn,PROD)",
    "mlModelGroup": "urn:li:mlModelGroup:(urn:li:dataPlatform:sagemaker,churn-group,PROD)",
    "mlFeatureTable": "urn:li:mlFeatureTable:(urn:li:dataPlatform:feast,users)",
    "mlFeature": "urn:li:mlFeature:(users,age)",
    "mlPrimaryKey": "urn:li:mlPrimaryKey:(users,user_id)",
    "notebook": "urn:li:notebook:(querybook,773)",
    "dataPlatform": "urn:li:dataPlatform:snowflake",
}

LINKS = """
import json, sys
from datahub.ingestion.graph.links import make_url_for_urn
from mcp_server_datahub.sub_entity_urls import SUB_ENTITY_CONFIGS, make_sub_entity_url
wanted = json.loads(sys.argv[1])
print(json.dumps({
    "entities": [[make_url_for_urn(FRONTEND, urn, tab=tab) for tab in (None, "Documentation", "Contents")]
                 for urn in wanted["entities"]],
    "sub_entities": [make_sub_entity_url(FRONTEND, sub, parent, SUB_ENTITY_CONFIGS[kind])
                     for kind, sub, parent in wanted["sub_entities"]],
}))
""".replace("FRONTEND", repr(FRONTEND))


@pytest.fixture
async def entities(app, client) -> dict[str, str]:
    registry = app.state.registry
    written = {kind: urn for kind, urn in URNS.items() if "status" in registry.entity(kind).aspect_names}
    await propose(client, *(mcp("status", {"removed": False}, urn, entity=kind) for kind, urn in written.items()))
    return written


def _printed_links(python: Path, wanted: dict) -> dict:
    printed = subprocess.run(
        [str(python), "-c", LINKS, json.dumps(wanted)], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(printed.stdout)


def _path(url: str) -> str:
    assert url.startswith(FRONTEND)
    return url[len(FRONTEND) :]


async def _opens(browser, path: str, urn: str) -> None:
    page = await browser.get(path)
    assert page.status_code == 200, (path, page.status_code, page.text[:300])
    assert f'<p class="urn">{urn}</p>' in page.text.replace("&#39;", "'"), path


async def test_every_link_datahubs_tools_print_opens_its_entitys_page(app, entities, mcp_python: Path):
    assert len(entities) >= 15  # every type above that has a status aspect in the registry
    sub_entities = [
        ["assertion", "urn:li:assertion:freshness-1", entities["dataset"]],
        ["incident", "urn:li:incident:late-load", entities["dataFlow"]],
    ]
    links = _printed_links(mcp_python, {"entities": list(entities.values()), "sub_entities": sub_entities})
    browser = await sign_in(app, "reader")
    # the SDK's: its own path names (`/tasks/`, `/mlModel/`), a trailing slash, a tab, a tab not shown here
    for urn, forms in zip(entities.values(), links["entities"], strict=True):
        for link in forms:
            await _opens(browser, _path(link), urn)
    # the MCP server's: a sub-entity's link opens its parent's page (`…/Quality/List?assertion_urn=…`)
    assert "/Quality/List?assertion_urn=" in links["sub_entities"][0]
    for link, (_, _, parent) in zip(links["sub_entities"], sub_entities, strict=True):
        await _opens(browser, _path(link), parent)
