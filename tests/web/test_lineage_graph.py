"""The Lineage tab as a graph (app.web.lineage_graph): its nodes and edges from the lineage walk, as the signed-in
principal may read them; hops, direction, column-level edges, grouping, the node cap; every parameter from a URL,
a hostile one answered with the defaults. Lineage written through the API, pages read in-process (httpx)."""

from __future__ import annotations

import html
import re

import httpx
import pytest
import pytest_asyncio

from app.web import lineage_graph
from app.web.paths import entity_url
from tests.helpers import ds, mcp, propose
from tests.web.browsing import page_url, sign_in

MAIN = ds("lg.main")
UP1, UP2, UP3 = ds("lg.up1"), ds("lg.up2"), ds("lg.up3")  # a chain: MAIN <- UP1 <- UP2 <- UP3
DOWN1, DOWN2, DOWN3 = ds("lg.down1"), ds("lg.down2"), ds("lg.down3")  # MAIN -> DOWN1 -> DOWN2 -> DOWN3
FANS = [ds(f"lg.fan{i}", platform="kafka") for i in range(3)]  # a fan-out: MAIN -> each, on another platform
GHOST = ds("lg.ghost")  # named as an upstream, never written


def upstreams(*urns: str, fine: list[dict] | None = None) -> dict:
    value: dict = {"upstreams": [{"dataset": u, "type": "TRANSFORMED"} for u in urns]}
    if fine is not None:
        value["fineGrainedLineages"] = fine
    return value


def field_urn(dataset: str, path: str) -> str:
    return f"urn:li:schemaField:({dataset},{path})"


@pytest_asyncio.fixture
async def catalog(client: httpx.AsyncClient) -> None:
    names = {MAIN: "main", UP1: "up1", UP2: "up2", UP3: "up3", DOWN1: "down1", DOWN2: "down2", DOWN3: "down3"}
    names |= {f: f"fan{i}" for i, f in enumerate(FANS)}
    column = {
        "upstreamType": "FIELD_SET",
        "upstreams": [field_urn(UP1, "id")],
        "downstreamType": "FIELD",
        "downstreams": [field_urn(MAIN, "main_id")],
    }
    await propose(
        client,
        *(mcp("datasetProperties", {"name": name}, urn, sync=True) for urn, name in names.items()),
        mcp("upstreamLineage", upstreams(UP1, GHOST, fine=[column]), MAIN, sync=True),
        mcp("upstreamLineage", upstreams(UP2), UP1, sync=True),
        mcp("upstreamLineage", upstreams(UP3), UP2, sync=True),
        mcp("upstreamLineage", upstreams(MAIN), DOWN1, sync=True),
        mcp("upstreamLineage", upstreams(DOWN1), DOWN2, sync=True),
        mcp("upstreamLineage", upstreams(DOWN2), DOWN3, sync=True),
        *(mcp("upstreamLineage", upstreams(MAIN), fan, sync=True) for fan in FANS),
    )


NODE = re.compile(r'<(?:a href="([^"]*)"|g) class="lg-node lg-(\w+)" data-node="(\w+)"')
EDGE = re.compile(r'<path d="[^"]+" data-from="(\w+)" data-to="(\w+)" class="lg-edge([^"]*)"')


class Drawn:
    """The graph of a page: its nodes (by URL: an entity's page, or a cluster's expanding link) and edges."""

    def __init__(self, page: str) -> None:
        self.page = page
        svg = page[page.index("<svg") : page.index("</svg>")] if "<svg" in page else ""
        self.nodes = {html.unescape(url): (kind, node_id) for url, kind, node_id in NODE.findall(svg)}
        url_of = {node_id: url for url, (_, node_id) in self.nodes.items()}
        self.edges = {(url_of[a], url_of[b]) for a, b, kind in EDGE.findall(svg) if "lg-column" not in kind}
        self.column_lines = sum(1 for _, _, kind in EDGE.findall(svg) if "lg-column" in kind)
        self.clusters = [url for url, (kind, _) in self.nodes.items() if kind == "cluster"]

    def has(self, urn: str) -> bool:
        return entity_url(urn) in self.nodes

    def edge(self, upstream: str, downstream: str) -> bool:
        return (entity_url(upstream), entity_url(downstream)) in self.edges


async def drawn(browser: httpx.AsyncClient, query: str = "", urn: str = MAIN) -> Drawn:
    answer = await browser.get(page_url(urn, "Lineage") + query)
    assert answer.status_code == 200, answer.text
    return Drawn(answer.text)


async def test_two_hops_by_default_with_their_edges(app, catalog):
    graph = await drawn(await sign_in(app, role="reader"))
    for urn in (UP1, UP2, DOWN1, DOWN2, *FANS):
        assert graph.has(urn), urn
    assert not graph.has(UP3) and not graph.has(DOWN3)
    assert graph.edge(UP2, UP1) and graph.edge(UP1, MAIN) and graph.edge(MAIN, DOWN1) and graph.edge(DOWN1, DOWN2)
    assert all(graph.edge(MAIN, fan) for fan in FANS)
    assert len(graph.edges) == 4 + len(FANS)
    assert graph.nodes[entity_url(MAIN)][0] == "center"
    assert "5 downstream" in graph.page and "2 upstream" in graph.page
    # the list below the graph, for screen readers: each with its hops and what it is reached through
    listed = graph.page[graph.page.index('id="lineage-list"') :]
    assert "2 hops</span>" in listed and f'<a href="{entity_url(UP2)}">up2</a>' in listed and "via up1" in listed


async def test_three_hops_when_asked_and_a_link_to_each(app, catalog):
    browser = await sign_in(app, role="reader")
    graph = await drawn(browser, "?hops=3")
    assert graph.has(UP3) and graph.has(DOWN3) and graph.edge(UP3, UP2) and graph.edge(DOWN2, DOWN3)
    base = page_url(MAIN, "Lineage")
    assert (
        f'<a href="{base}">Show 2 hops</a>' in graph.page and f'<a href="{base}?hops=4">Show 4 hops</a>' in graph.page
    )
    one = await drawn(browser, "?hops=1")
    assert one.has(UP1) and not one.has(UP2)
    # a node opens its page, which has its own lineage
    assert entity_url(UP3) == page_url(UP3)
    assert (await browser.get(page_url(UP3))).status_code == 200


async def test_direction(app, catalog):
    browser = await sign_in(app, role="reader")
    up = await drawn(browser, "?direction=upstream")
    assert up.has(UP1) and up.has(UP2) and not up.has(DOWN1) and not any(up.has(f) for f in FANS)
    assert 'id="lineage-downstream"' not in up.page
    down = await drawn(browser, "?direction=downstream")
    assert down.has(DOWN1) and down.has(DOWN2) and not down.has(UP1)
    assert 'id="lineage-upstream"' not in down.page


async def test_column_level_edges_only_when_asked(app, catalog):
    browser = await sign_in(app, role="reader")
    plain = await drawn(browser)
    assert plain.column_lines == 0 and "Column-level lineage" not in plain.page and "main_id" not in plain.page
    columns = await drawn(browser, "?columns=1")
    assert columns.column_lines == 1
    assert 'class="lg-field">' in columns.page and ">main_id</text>" in columns.page and ">id</text>" in columns.page
    assert (
        "Column-level lineage" in columns.page and "up1.id</a>" in columns.page and "main.main_id</a>" in columns.page
    )
    assert columns.edges == plain.edges  # the entities' edges are the same


async def test_grouped_by_platform_and_a_group_expands(app, catalog):
    browser = await sign_in(app, role="reader")
    graph = await drawn(browser, "?collapse=platform")
    assert not any(graph.has(f) for f in FANS) and graph.has(DOWN1)  # a platform's single entity is no group
    assert len(graph.clusters) == 1
    cluster = graph.clusters[0]
    assert "3 × kafka" in graph.page and cluster.startswith(page_url(MAIN, "Lineage") + "?collapse=platform&expand=")
    assert (entity_url(MAIN), cluster) in graph.edges  # the group's edges are drawn, once
    expanded = await drawn(browser, cluster[len(page_url(MAIN, "Lineage")) :])
    assert all(expanded.has(f) for f in FANS) and not expanded.clusters
    assert "Group the expanded groups again" in expanded.page


async def test_grouped_by_degree_gathers_the_leaves_of_one_entity(app, catalog):
    graph = await drawn(await sign_in(app, role="reader"), "?collapse=degree")
    # the fans hang off MAIN only; DOWN1 leads on to DOWN2, UP2 is a leaf but alone
    assert not any(graph.has(f) for f in FANS) and graph.has(DOWN1) and graph.has(DOWN2) and graph.has(UP2)
    assert len(graph.clusters) == 1


async def test_a_large_neighbourhood_is_grouped_until_asked_otherwise(app, catalog, monkeypatch):
    monkeypatch.setattr(lineage_graph, "AUTO_COLLAPSE", 3)
    browser = await sign_in(app, role="reader")
    graph = await drawn(browser)
    assert graph.clusters and "Show every entity" in graph.page
    # so is the list below it: closed, one click away
    assert 'id="lineage-list" tabindex="-1">' in graph.page and "As a list: 2 upstream, 5 downstream" in graph.page
    every = await drawn(browser, "?collapse=none")
    assert not every.clusters and all(every.has(f) for f in FANS)
    monkeypatch.setattr(lineage_graph, "AUTO_COLLAPSE", 150)
    assert 'id="lineage-list" tabindex="-1" open>' in (await drawn(browser)).page


async def test_the_node_cap_says_what_it_left_out(app, catalog, monkeypatch):
    monkeypatch.setattr(lineage_graph, "MAX_NODES", 3)
    graph = await drawn(await sign_in(app, role="reader"))
    assert len(graph.nodes) == 4  # the page's entity and the nearest three
    assert "Truncated:" in graph.page and "4 more entities were reached; the nearest 3 are shown" in graph.page
    monkeypatch.setattr(lineage_graph, "MAX_NODES", 100)
    assert "Truncated" not in (await drawn(await sign_in(app, role="reader"))).page


async def test_what_a_lineage_search_would_not_answer_is_not_drawn(app, client, catalog):
    """The graph shows what searchAcrossLineage answers the same principal: an entity never written (GHOST, named
    by MAIN's upstreamLineage) or soft-deleted is left out. The read rule (app.auth.reads: a PERSONAL dataHubView is
    its creator's) restricts no entity a lineage edge reaches; the graph reads through the same scoped search."""
    await propose(client, mcp("status", {"removed": True}, DOWN2, sync=True))
    browser = await sign_in(app, role="reader")
    graph = await drawn(browser)
    assert not graph.has(GHOST) and not graph.has(DOWN2) and graph.has(DOWN1)
    query = """query q($urn: String!) { searchAcrossLineage(input: {urn: $urn, direction: DOWNSTREAM, query: "*",
               orFilters: [{and: [{field: "degree", values: ["1", "2"]}]}]}) { searchResults { entity { urn } } } }"""
    answer = await client.post("/api/graphql", json={"query": query, "variables": {"urn": MAIN}})
    found = {r["entity"]["urn"] for r in answer.json()["data"]["searchAcrossLineage"]["searchResults"]}
    assert {u for u in (DOWN1, DOWN2, *FANS) if graph.has(u)} == found


@pytest.mark.parametrize(
    "query",
    ["?hops=999999", "?hops=abc", "?hops=-1", "?hops=0", "?hops=%C2%B2", "?direction=x", "?collapse=%3Cb%3E", "?columns=yes",
     "?expand=%3Cscript%3E&expand=zz", "?hops=2&hops=9"],
)  # fmt: skip
async def test_hostile_parameters_are_the_defaults(app, catalog, query):
    browser = await sign_in(app, role="reader")
    graph = await drawn(browser, query)
    assert graph.has(UP2) and not graph.has(UP3) and graph.has(DOWN1) and graph.column_lines == 0
    assert '<option value="2" selected>' in graph.page and '<option value="both" selected>' in graph.page
    assert "<script>" not in graph.page.split("</head>", 1)[1]


async def test_the_controls_are_a_plain_form_and_the_page_loads_its_own_assets(app, catalog):
    page = (await drawn(await sign_in(app, role="reader"), "?hops=3&direction=upstream&columns=1")).page
    form = page[page.index('<form class="lineage-controls"') : page.index("</form>", page.index("lineage-controls"))]
    assert 'method="get"' in form and f'action="{page_url(MAIN, "Lineage")}"' in form
    for control in ("lineage-hops", "lineage-direction", "lineage-collapse", "lineage-columns"):
        assert f'<label for="{control}">' in form and f'id="{control}"' in form
    assert '<option value="3" selected>' in form and '<option value="upstream" selected>' in form
    assert 'name="columns" value="1" checked' in form
    assert '/web/static/lineage.js" defer' in page and '/web/static/lineage.css"' in page
    assert 'style="' not in page and " on" + "click=" not in page


async def test_an_entity_without_lineage(app, client):
    lonely = ds("lg.lonely")
    await propose(client, mcp("datasetProperties", {"name": "lonely"}, lonely, sync=True))
    graph = await drawn(await sign_in(app, role="reader"), urn=lonely)
    assert not graph.nodes and "None within 2 hops" in graph.page
