"""The web view against the app (httpx, real Postgres, no mocks): sign-in sessions and their end, CSRF on every
state-changing form, cookies that never authorize the JSON APIs, DataHub's paths and query parameters, the pages'
404s, and the policies, each rule alone and where it must not fire."""

from __future__ import annotations

import re
from urllib.parse import quote, urlencode

import httpx
import pytest
import pytest_asyncio

from app.main import create_app
from app.settings import Settings
from app.web.sessions import (
    ADDRESS_FAILURES,
    LOGIN_COOKIE,
    SESSION_COOKIE,
    SIGN_IN_WINDOW,
    TOKEN_FAILURES,
    client_address,
    sign_in_keys,
)
from tests.helpers import ds, mcp, mint_token, propose
from tests.web.browsing import csrf_of, page_url, sign_in

ALICE = "urn:li:corpuser:alice"
ORDERS = ds("web.orders")
CUSTOMERS = ds("web.customers", platform="snowflake")
PII = "urn:li:tag:pii"


def field(name: str, description: str, native: str = "VARCHAR") -> dict:
    return {
        "fieldPath": name,
        "nativeDataType": native,
        "type": {"type": {"com.linkedin.schema.StringType": {}}},
        "description": description,
    }


@pytest_asyncio.fixture
async def catalog(client: httpx.AsyncClient) -> None:
    schema = {
        "schemaName": "orders",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.MySqlDDL": {"tableSchema": ""}},
        "fields": [
            field("order_id", "Order id", "NUMBER"),
            {**field("customer", "The buyer", "STRUCT")},
            field("customer.email", "The buyer's <b>e-mail</b>"),
        ],
    }
    await propose(  # indexed before the answer (DataHub's sync-index header): searched at once
        client,
        mcp(
            "datasetProperties",
            {"name": "orders", "description": "All orders", "customProperties": {"tier": "1"}},
            ORDERS,
            sync=True,
        ),
        mcp("schemaMetadata", schema, ORDERS, sync=True),
        mcp("ownership", {"owners": [{"owner": ALICE, "type": "DATAOWNER"}]}, ORDERS, sync=True),
        mcp("globalTags", {"tags": [{"tag": PII}]}, ORDERS, sync=True),
        mcp("datasetProperties", {"name": "customers", "description": "Who buys"}, CUSTOMERS, sync=True),
        mcp(
            "upstreamLineage",
            {"upstreams": [{"dataset": CUSTOMERS, "type": "TRANSFORMED", "auditStamp": {"time": 0, "actor": ALICE}}]},
            ORDERS,
            sync=True,
        ),
    )


# --- sign-in and sessions


async def test_a_page_without_a_session_redirects_to_the_sign_in_form_with_a_local_next(anonymous):
    answer = await anonymous.get("/search?query=orders")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/login?next=/search%3Fquery%3Dorders"
    form = await anonymous.get("/login", params={"next": "//evil.example/x"})
    assert 'name="next" value="/search"' in form.text  # another host is never a `next`
    form = await anonymous.get("/login", params={"next": "/dataset/x"})
    assert 'name="next" value="/dataset/x"' in form.text


async def test_sign_in_sets_a_strict_http_only_cookie_secure_only_over_tls(app):
    plain = await sign_in(app)
    cookie = plain.cookies.jar
    header = [c for c in cookie if c.name == SESSION_COOKIE][0]
    assert header.has_nonstandard_attr("HttpOnly") and header._rest.get("SameSite", "").lower() == "strict"
    assert not header.secure
    tls = await sign_in(app, base_url="https://metaledger")
    assert [c for c in tls.cookies.jar if c.name == SESSION_COOKIE][0].secure
    page = await plain.get("/search")
    assert page.status_code == 200 and "alice" in page.text and "Sign out" in page.text


async def test_a_wrong_token_is_refused_and_opens_no_session(app, anonymous):
    form = await anonymous.get("/login")
    answer = await anonymous.post("/login", data={"token": "nope", "csrf_token": csrf_of(form.text)})
    assert answer.status_code == 401 and "not valid" in answer.text
    assert SESSION_COOKIE not in anonymous.cookies


async def test_sign_in_without_the_forms_own_csrf_token_is_403(app, anonymous):
    token = await mint_token(app, "reader", ALICE)
    await anonymous.get("/login")  # sets the login cookie
    for data in ({"token": token}, {"token": token, "csrf_token": "forged"}):
        answer = await anonymous.post("/login", data=data)
        assert answer.status_code == 403
    assert SESSION_COOKIE not in anonymous.cookies
    fresh = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://metaledger")
    answer = await fresh.post("/login", data={"token": token, "csrf_token": "x"})  # no login cookie at all
    assert answer.status_code == 403


async def test_sign_out_needs_the_csrf_token_and_ends_the_session(app):
    browser = await sign_in(app)
    assert (await browser.post("/logout", data={})).status_code == 403
    assert (await browser.post("/logout", data={"csrf_token": "forged"})).status_code == 403
    assert (await browser.get("/search")).status_code == 200  # still signed in
    page = await browser.get("/search")
    cookie = browser.cookies[SESSION_COOKIE]
    answer = await browser.post("/logout", data={"csrf_token": csrf_of(page.text)})
    assert answer.status_code == 303 and answer.headers["location"] == "/login"
    browser.cookies.set(SESSION_COOKIE, cookie)  # the old cookie, replayed: the session is gone
    assert (await browser.get("/search")).status_code == 303


async def test_another_sessions_csrf_token_is_refused(app, catalog):
    alice, bob = await sign_in(app), await sign_in(app, actor="urn:li:corpuser:bob")
    bobs = csrf_of((await bob.get("/search")).text)
    answer = await alice.post("/web/description", data={"csrf_token": bobs, "urn": ORDERS, "description": "x"})
    assert answer.status_code == 403
    assert (await alice.post("/logout", data={"csrf_token": bobs})).status_code == 403


async def test_a_revoked_token_ends_its_session(app, client):
    browser = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://metaledger")
    issued = (await client.post("/openapi/v1/auth/tokens", json={"actor": ALICE, "role": "reader"})).json()
    form = await browser.get("/login")
    await browser.post("/login", data={"token": issued["token"], "csrf_token": csrf_of(form.text)})
    assert (await browser.get("/search")).status_code == 200
    assert (await client.delete(f"/openapi/v1/auth/tokens/{issued['id']}")).status_code == 200
    assert (await browser.get("/search")).status_code == 303  # at once, not after the token cache's seconds


async def test_an_expired_token_ends_its_session(app, db):
    browser = await sign_in(app, role="reader")
    await db.execute("UPDATE auth_token SET expires_at = now() - interval '1 second' WHERE actor = $1", ALICE)
    assert (await browser.get("/search")).status_code == 303


# --- cookies never authorize the JSON APIs


async def test_the_session_cookie_never_authorizes_the_json_apis(app):
    browser = await sign_in(app, role="admin")
    assert (await browser.get("/search")).status_code == 200
    for method, path, body in (
        ("GET", f"/openapi/v3/entity/dataset/{quote(ORDERS, safe='')}", None),
        ("GET", "/openapi/v1/auth/me", None),
        ("POST", "/api/graphql", {"query": "{ me { corpUser { urn } } }"}),
        ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    ):
        answer = await browser.request(
            method, path, json=body, headers={"Accept": "application/json, text/event-stream"}
        )
        assert answer.status_code == 401, (path, answer.status_code, answer.text[:200])


async def test_a_bearer_token_opens_no_page(app):
    token = await mint_token(app, "admin")
    anonymous = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://metaledger")
    answer = await anonymous.get("/search", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 303


# --- search


async def test_search_with_datahubs_filter_parameters_and_facets(app, catalog):
    browser = await sign_in(app, role="reader")
    page = await browser.get("/search", params={"query": "orders"})
    assert page.status_code == 200
    assert "orders" in page.text and "All orders" in page.text and "alice" in page.text
    assert "Platform" in page.text and "hive" in page.text
    # a facet's link adds DataHub's filter parameter; following it narrows the results
    platform = "urn:li:dataPlatform:snowflake"
    link = re.search(r'href="(/search\?[^"]*filter_platform___false___EQUAL___0=[^"]*snowflake[^"]*)"', page.text)
    everything = await browser.get("/search", params={"query": "*"})
    link = link or re.search(
        r'href="(/search\?[^"]*filter_platform___false___EQUAL___0=[^"]*snowflake[^"]*)"', everything.text
    )
    assert link, everything.text
    narrowed = await browser.get("/search", params={"query": "*", "filter_platform___false___EQUAL___0": platform})
    assert "customers" in narrowed.text and ">orders<" not in narrowed.text
    older = await browser.get("/search", params={"query": "*", "filter_platform": platform})  # DataHub's older form
    assert "customers" in older.text and ">orders<" not in older.text
    negated = await browser.get("/search", params={"query": "*", "filter_platform___true___EQUAL___0": platform})
    assert ">orders<" in negated.text and ">customers<" not in negated.text


# --- entity pages


async def test_entity_page_tabs_at_datahubs_paths(app, catalog):
    browser = await sign_in(app, role="reader")
    schema = await browser.get(page_url(ORDERS, "Schema"))
    assert schema.status_code == 200
    assert "order_id" in schema.text and 'class="depth-1"' in schema.text  # customer.email, nested
    assert "&lt;b&gt;e-mail&lt;/b&gt;" in schema.text  # escaped, never markup
    assert "alice" in schema.text and "pii" in schema.text
    default = await browser.get(page_url(ORDERS))
    assert 'aria-current="page" class="active">Schema' in default.text
    unknown_tab = await browser.get(page_url(ORDERS, "NoSuchTab"))
    assert unknown_tab.status_code == 200 and 'class="active">Schema' in unknown_tab.text
    props = await browser.get(page_url(ORDERS, "Properties"))
    assert "tier" in props.text
    docs = await browser.get(page_url(ORDERS, "Documentation"))
    assert "All orders" in docs.text
    aspects = await browser.get(page_url(ORDERS, "Aspects"))
    assert "schemaMetadata" in aspects.text and "runId" in aspects.text
    lineage = await browser.get(page_url(ORDERS, "Lineage"))
    assert lineage.status_code == 200 and "customers" in lineage.text
    tag = await browser.get(f"/tag/{quote(PII, safe='')}")
    assert tag.status_code == 404 and "There is no tag" in tag.text  # a tag only referenced has no page yet


async def test_unknown_urns_and_types_are_404_pages(app, catalog):
    browser = await sign_in(app, role="reader")
    missing = await browser.get(page_url(ds("web.nothing")))
    assert missing.status_code == 404 and "There is no dataset" in missing.text
    assert missing.headers["content-type"].startswith("text/html")
    wrong_type = await browser.get(f"/dataset/{quote('urn:li:tag:pii', safe='')}")
    assert wrong_type.status_code == 404 and "/tag/" in wrong_type.text
    unknown = await browser.get(f"/dataset/{quote('urn:li:nosuchtype:x', safe='')}")
    assert unknown.status_code == 404
    not_urn = await browser.get("/chart/nothing")
    assert not_urn.status_code == 404


# --- edits and the policies


async def test_a_writer_edits_a_description_through_graphql_as_the_person(app, client, catalog, db):
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS, "Documentation"))
    assert 'action="/web/description"' in page.text
    answer = await browser.post(
        "/web/description", data={"csrf_token": csrf_of(page.text), "urn": ORDERS, "description": "Every order"}
    )
    assert answer.status_code == 303 and answer.headers["location"] == page_url(ORDERS, "Documentation")
    stored = await client.get(f"/openapi/v3/entity/dataset/{quote(ORDERS, safe='')}/editableDatasetProperties")
    assert stored.json()["value"]["description"] == "Every order"
    actor = await db.fetchval(
        "SELECT createdby FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'editableDatasetProperties'", ORDERS
    )
    assert actor == ALICE
    assert "Every order" in (await browser.get(page_url(ORDERS, "Documentation"))).text
    field_answer = await browser.post(
        "/web/description",
        data={"csrf_token": csrf_of(page.text), "urn": ORDERS, "field": "order_id", "description": "The key"},
    )
    assert field_answer.status_code == 303
    assert "The key" in (await browser.get(page_url(ORDERS, "Schema"))).text


async def test_a_reader_sees_no_edit_control_and_its_forged_post_is_403(app, client, catalog):
    browser = await sign_in(app, role="reader")
    for tab in ("Documentation", "Schema"):
        page = await browser.get(page_url(ORDERS, tab))
        assert 'action="/web/description"' not in page.text
    forged = await browser.post(
        "/web/description", data={"csrf_token": csrf_of(page.text), "urn": ORDERS, "description": "forged"}
    )
    assert forged.status_code == 403 and "WRITE" in forged.text
    stored = await client.get(f"/openapi/v3/entity/dataset/{quote(ORDERS, safe='')}/editableDatasetProperties")
    assert stored.status_code == 404


async def test_a_writers_policies_still_apply_to_its_edits(app, client, catalog):
    created = await client.post(
        "/openapi/v1/auth/policies", json={"actor": ALICE, "entityTypes": ["dataset"], "aspects": ["globalTags"]}
    )
    assert created.status_code == 201, created.text
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS, "Documentation"))
    refused = await browser.post(
        "/web/description", data={"csrf_token": csrf_of(page.text), "urn": ORDERS, "description": "narrowed"}
    )
    assert refused.status_code == 403


async def test_a_form_without_a_session_is_403_and_a_form_is_bounded(app, anonymous, catalog):
    answer = await anonymous.post("/web/description", data={"csrf_token": "x", "urn": ORDERS, "description": "x"})
    assert answer.status_code == 403
    browser = await sign_in(app)
    big = await browser.post(
        "/web/description", content=b"a" * 100_000, headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert big.status_code == 413
    json_body = await browser.post("/web/description", json={"csrf_token": "x"})
    assert json_body.status_code == 415


async def test_pages_carry_no_store_and_deny_framing(app):
    browser = await sign_in(app, role="reader")
    page = await browser.get("/search")
    assert page.headers["cache-control"] == "no-store" and page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    css = await browser.get("/web/static/app.css")
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]


@pytest.mark.parametrize("path", ["/openapi.json", "/health"])
async def test_the_api_routes_are_untouched(anonymous, path):
    assert (await anonymous.get(path)).headers["content-type"].startswith("application/json")


async def test_a_urn_with_a_slash_opens_encoded_or_not(app, client):
    s3 = "urn:li:dataset:(urn:li:dataPlatform:s3,bucket/orders/2026.csv,PROD)"
    await propose(client, mcp("datasetProperties", {"name": "2026.csv", "description": "On s3"}, s3))
    browser = await sign_in(app, role="reader")
    for url in (page_url(s3, "Documentation"), f"/dataset/{quote(s3, safe='/')}/Documentation"):
        answer = await browser.get(url)
        assert answer.status_code == 200, url
        assert "On s3" in answer.text and 'class="active">Documentation' in answer.text


async def test_signing_in_again_ends_the_previous_session(app):
    browser = await sign_in(app, role="reader")
    first = browser.cookies[SESSION_COOKIE]
    token = await mint_token(app, "writer", ALICE)
    form = await httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://metaledger").get("/login")
    browser.cookies.set(LOGIN_COOKIE, form.cookies[LOGIN_COOKIE])
    answer = await browser.post("/login", data={"token": token, "csrf_token": csrf_of(form.text)})
    assert answer.status_code == 303 and browser.cookies[SESSION_COOKIE] != first
    assert "role-writer" in (await browser.get("/search")).text
    browser.cookies.set(SESSION_COOKIE, first)
    assert (await browser.get("/search")).status_code == 303


# --- search: structured properties' facets, and paging by cursor

TIER = "urn:li:structuredProperty:io.acryl.tier"
COST_CENTER = "urn:li:structuredProperty:io.acryl.costCenter"


async def test_a_structured_property_shown_in_search_filters_is_a_facet(app, client, catalog):
    definition = {"valueType": "urn:li:dataType:datahub.string", "entityTypes": ["urn:li:entityType:datahub.dataset"]}
    await propose(
        client,
        mcp(
            "propertyDefinition",
            {**definition, "qualifiedName": "io.acryl.tier", "displayName": "Tier"},
            TIER,
            entity="structuredProperty",
            sync=True,
        ),
        mcp("structuredPropertySettings", {"showInSearchFilters": True}, TIER, entity="structuredProperty", sync=True),
        # a property whose settings do not show it in the filters: no facet
        mcp(
            "propertyDefinition",
            {**definition, "qualifiedName": "io.acryl.costCenter"},
            COST_CENTER,
            entity="structuredProperty",
            sync=True,
        ),
        *(
            mcp(
                "structuredProperties",
                {
                    "properties": [
                        {"propertyUrn": TIER, "values": [{"string": tier}]},
                        {"propertyUrn": COST_CENTER, "values": [{"string": "cc-1"}]},
                    ]
                },
                urn,
                sync=True,
            )
            for urn, tier in ((ORDERS, "gold"), (CUSTOMERS, "silver"))
        ),
    )
    browser = await sign_in(app, role="reader")
    page = await browser.get("/search", params={"query": "*", "filter__entityType": "DATASET"})
    facets = re.findall(r"<h3>([^<]+)</h3>", page.text)
    assert "Tier" in facets and "io.acryl.costCenter" not in facets and "cc-1" not in page.text
    link = re.search(
        r'href="(/search\?[^"]*filter_structuredProperties\.io\.acryl\.tier___false___EQUAL___1=gold)"', page.text
    )
    assert link, page.text
    narrowed = await browser.get(link.group(1).replace("&amp;", "&"))
    assert ">orders<" in narrowed.text and ">customers<" not in narrowed.text
    assert 'class="selected"' in narrowed.text  # the chosen value, with its link to remove it
    older = await browser.get("/search", params={"query": "*", "filter_structuredProperties.io.acryl.tier": "silver"})
    assert ">customers<" in older.text and ">orders<" not in older.text


async def test_facet_values_are_shown_by_their_entities_names(app, client, catalog):
    await propose(
        client,
        mcp("tagProperties", {"name": "Personal data"}, PII, entity="tag", sync=True),
        mcp("corpUserInfo", {"active": True, "displayName": "Alice Liddell"}, ALICE, entity="corpuser", sync=True),
    )
    browser = await sign_in(app, role="reader")
    page = await browser.get("/search", params={"query": "orders"})
    facets = dict(re.findall(r"<h3>([^<]+)</h3>\s*<ul>(.*?)</ul>", page.text, re.S))
    assert "<span>Personal data</span>" in facets["Tags"] and "<span>Alice Liddell</span>" in facets["Owners"]
    assert "<span>hive</span>" in facets["Platform"] and "<span>dataset</span>" in facets["Type"]


@pytest.mark.parametrize("settings_overrides", [{"graphql_max_count": 30}])
async def test_paging_by_cursor_goes_past_the_search_window_and_datahubs_page_stays_within_it(app, client):
    names = [f"paged.t{i:02d}" for i in range(45)]
    await propose(client, *(mcp("datasetProperties", {"name": n}, ds(n), sync=True) for n in names))
    browser = await sign_in(app, role="reader")
    seen: list[str] = []
    url = "/search?" + urlencode({"query": "paged"})
    headings = []
    while url:
        page = await browser.get(url)
        assert page.status_code == 200, page.text
        seen += re.findall(r'class="hit-name" href="[^"]*">(paged\.t\d\d)<', page.text)
        headings.append(re.search(r"(\d+)–(\d+) of (\d+) results", page.text).groups())
        following = re.search(r'rel="next" href="([^"]+)"', page.text)
        url = following.group(1).replace("&amp;", "&") if following else ""
        assert not url or "cursor=" in url
    assert sorted(seen) == names  # 45 results through a window of 30, each once
    assert headings == [("1", "20", "45"), ("21", "40", "45"), ("41", "45", "45")]
    assert "First page" in page.text
    second = await browser.get("/search", params={"query": "paged", "page": "2"})  # DataHub's link
    assert "21–30 of 45 results" in second.text and "Page 2 of 1" not in second.text
    assert 'rel="prev"' in second.text and 'rel="next"' not in second.text  # the window ends at 30
    beyond = await browser.get("/search", params={"query": "paged", "page": "9"})
    assert "21–30 of 45" in beyond.text  # a page past the window is its last page


async def test_datahubs_page_parameter_pages_within_the_window(app, client):
    names = [f"pages.t{i:02d}" for i in range(25)]
    await propose(client, *(mcp("datasetProperties", {"name": n}, ds(n), sync=True) for n in names))
    browser = await sign_in(app, role="reader")
    second = await browser.get("/search", params={"query": "pages", "page": "2"})
    assert "21–25 of 25 results" in second.text and "Page 2 of 2" in second.text
    assert re.search(r'rel="prev" href="/search\?query=pages&amp;page=1"', second.text)
    first = await browser.get("/search", params={"query": "pages"})
    assert "1–20 of 25 results" in first.text and "cursor=" in first.text and "Page " not in first.text


async def test_a_cursor_that_is_not_a_search_s_is_a_400_page(app):
    browser = await sign_in(app, role="reader")
    answer = await browser.get("/search", params={"query": "*", "cursor": "not-a-cursor!"})
    assert answer.status_code == 400 and "scrollId is not one this search returned" in answer.text


# --- the top navigation and the home page


async def test_the_top_navigation_shows_operations_to_admins_only(app):
    reader = await sign_in(app, role="reader")
    page = await reader.get("/search")
    nav = re.search(r'<nav class="top-nav" aria-label="Main">(.*?)</nav>', page.text, re.S).group(1)
    assert re.findall(r'href="([^"]+)"', nav) == ["/search", "/runs", "/settings/tokens"]
    assert 'href="/search" aria-current="page"' in nav
    admin = await sign_in(app, role="admin")
    nav = re.search(r'<nav class="top-nav" aria-label="Main">(.*?)</nav>', (await admin.get("/search")).text, re.S)
    assert re.findall(r'href="([^"]+)"', nav.group(1)) == ["/search", "/runs", "/operations", "/settings/tokens"]


async def test_the_home_page_is_search(app, anonymous):
    browser = await sign_in(app, role="reader")
    answer = await browser.get("/")
    assert answer.status_code == 303 and answer.headers["location"] == "/search"
    assert (await anonymous.get("/")).headers["location"] == "/login?next=/"


# --- a path nothing serves

HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}  # what a browser sends


async def test_a_browser_opening_an_unknown_path_gets_a_404_page(app, anonymous):
    browser = await sign_in(app, role="reader")
    for client in (browser, anonymous):
        answer = await client.get("/nosuchpage", headers=HTML)
        assert answer.status_code == 404 and answer.headers["content-type"].startswith("text/html")
        assert "There is no page at /nosuchpage" in answer.text
        assert answer.headers["cache-control"] == "no-store"
    assert 'class="top-nav"' in (await browser.get("/nosuchpage", headers=HTML)).text  # the signed-in layout
    head = await browser.head("/nosuchpage", headers=HTML)
    assert head.status_code == 404


async def test_the_404_page_suggests_datahubs_path(app):
    browser = await sign_in(app, role="reader")
    encoded = quote(ORDERS, safe="")
    answer = await browser.get(f"/datasets/{encoded}/Schema?x=1", headers=HTML)
    assert answer.status_code == 404 and "There is no page at /datasets/" in answer.text
    assert f'href="/dataset/{encoded}/Schema?x=1"' in answer.text and "Did you mean /dataset/" in answer.text
    unlike = await browser.get("/zzzzzz", headers=HTML)
    assert "Did you mean" not in unlike.text


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/openapi/v3/nosuch", HTML),  # under an API: its JSON 404, whoever asks
        ("/api/nosuch", HTML),
        ("/nosuchpage", {"Accept": "application/json"}),
        ("/nosuchpage", {"Accept": "*/*"}),  # what API clients send
        ("/nosuchpage", {"Accept": "text/html;q=0"}),
    ],
)
async def test_the_json_apis_keep_their_json_404(anonymous, path, headers):
    answer = await anonymous.get(path, headers=headers)
    assert answer.status_code == 404 and answer.headers["content-type"].startswith("application/json")
    assert answer.json()["error"] == "Not Found"


async def test_a_post_to_an_unknown_path_keeps_the_json_404(anonymous):
    answer = await anonymous.post("/nosuchpage", headers=HTML, json={})
    assert answer.status_code == 404 and answer.headers["content-type"].startswith("application/json")


# --- sign-in throttling


def browser_at(app, host: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(host, 50000)), base_url="http://metaledger")


async def try_sign_in(browser: httpx.AsyncClient, token: str) -> httpx.Response:
    form = await browser.get("/login")
    return await browser.post("/login", data={"token": token, "csrf_token": csrf_of(form.text)})


async def test_repeated_wrong_tokens_from_one_address_are_refused_with_retry_after(app):
    token = await mint_token(app, "reader", ALICE)
    attacker = browser_at(app, "192.0.2.7")
    for guess in range(ADDRESS_FAILURES):
        assert (await try_sign_in(attacker, f"wrong-{guess}")).status_code == 401
    refused = await try_sign_in(attacker, token)  # even the right token, while the window lasts
    assert refused.status_code == 429 and "Too many failed sign-ins" in refused.text
    assert 0 < int(refused.headers["retry-after"]) <= SIGN_IN_WINDOW.total_seconds()
    assert SESSION_COOKIE not in attacker.cookies
    assert (await try_sign_in(browser_at(app, "192.0.2.8"), token)).status_code == 303  # another address: signed in


async def test_a_correct_token_after_a_few_failures_signs_in(app):
    token = await mint_token(app, "reader", ALICE)
    person = browser_at(app, "192.0.2.9")
    for guess in range(TOKEN_FAILURES - 1):
        assert (await try_sign_in(person, token[:-2] + f"x{guess}")).status_code == 401  # its signature mistyped
    assert (await try_sign_in(person, token)).status_code == 303


async def test_guesses_at_one_tokens_signature_are_refused_from_any_address(app):
    token = await mint_token(app, "reader", ALICE)
    signed, _, signature = token.rpartition(".")
    for n in range(TOKEN_FAILURES):  # each guess from another address: the address's counter never fires
        assert (
            await try_sign_in(browser_at(app, f"198.51.100.{n}"), f"{signed}.{signature[::-1]}{n}")
        ).status_code == 401
    assert (await try_sign_in(browser_at(app, "198.51.100.200"), token)).status_code == 429
    other = await mint_token(app, "reader", "urn:li:corpuser:bob")
    assert (await try_sign_in(browser_at(app, "198.51.100.201"), other)).status_code == 303  # another token


async def test_an_attacker_cannot_cheaply_lock_out_others(app):
    """Garbage and forged tokens from many addresses count against those addresses and those tokens only."""
    bob = await mint_token(app, "reader", "urn:li:corpuser:bob")
    header = bob.split(".")[0]
    for n in range(3 * ADDRESS_FAILURES):
        forged = f"{header}.{n:040d}.sig"  # claims of its own each time
        assert (await try_sign_in(browser_at(app, f"203.0.113.{n % 20}"), forged)).status_code in (401, 429)
    assert (await try_sign_in(browser_at(app, "192.0.2.50"), bob)).status_code == 303


async def test_an_attackers_own_valid_token_does_not_reset_its_addresss_count(app):
    own = await mint_token(app, "reader", "urn:li:corpuser:mallory")
    attacker = browser_at(app, "192.0.2.66")
    for guess in range(ADDRESS_FAILURES - 1):
        await try_sign_in(attacker, f"wrong-{guess}")
    assert (await try_sign_in(attacker, own)).status_code == 303
    attacker.cookies.clear()  # signed out, back at the form
    assert (await try_sign_in(attacker, "wrong-again")).status_code == 401
    assert (await try_sign_in(attacker, own)).status_code == 429


async def test_the_window_ends(app, db):
    token = await mint_token(app, "reader", ALICE)
    browser = browser_at(app, "192.0.2.70")
    for guess in range(ADDRESS_FAILURES):
        await try_sign_in(browser, f"wrong-{guess}")
    assert (await try_sign_in(browser, token)).status_code == 429
    await db.execute("UPDATE web_sign_in_failure SET window_start = window_start - interval '11 minutes'")
    assert (await try_sign_in(browser, token)).status_code == 303


async def test_every_process_on_the_database_counts_the_same_failures(app, database_url, registry):
    """Two apps on one database, as the workers of a `serve --workers 2`: failures made on one refuse on the
    other."""
    token = await mint_token(app, "reader", ALICE)
    second = create_app(
        Settings(database_url=database_url, apply_migrations_on_start=False, auth_bootstrap_admin_token=False),
        registry,
    )
    async with second.router.lifespan_context(second):
        for guess in range(ADDRESS_FAILURES):
            worker = app if guess % 2 else second
            assert (await try_sign_in(browser_at(worker, "192.0.2.80"), f"wrong-{guess}")).status_code == 401
        for worker in (app, second):
            assert (await try_sign_in(browser_at(worker, "192.0.2.80"), token)).status_code == 429


def test_an_ipv6_clients_addresses_count_as_its_64():
    assert client_address("2001:db8:1:2::1") == client_address("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert client_address("2001:db8:1:3::1") != client_address("2001:db8:1:2::1")
    assert client_address("192.0.2.1") != client_address("192.0.2.2")
    address, token = sign_in_keys("192.0.2.1", "a.b.signature")
    assert token == sign_in_keys("192.0.2.9", "a.b.other")[1] and address != sign_in_keys("192.0.2.9", "x")[0]
