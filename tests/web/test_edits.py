"""The edits people make on the web view (app.web.edits): tags, glossary terms, owners, the domain and descriptions,
of an entity and of a dataset's field, through DataHub's curation mutations as the signed-in person — the change log
names that person and the API reads the change back — and the rules around them, each alone and where it must not
fire: a reader sees no control and its forged POST is a 403, a form needs the session's CSRF token, what a form names
must exist, a writer's policies still apply."""

from __future__ import annotations

import re
from urllib.parse import quote, urlencode

import orjson
import pytest
import pytest_asyncio

from app.ingest.gateway import ORIGIN_KEY
from tests.helpers import ds, mcp, propose
from tests.web.browsing import ALICE, csrf_of, page_url, sign_in

ORDERS = ds("edits.orders")
PII, GOLD = "urn:li:tag:pii", "urn:li:tag:gold"
SENSITIVE = "urn:li:glossaryTerm:Sensitive"
BOB, ENG = "urn:li:corpuser:bob", "urn:li:corpGroup:eng"
SALES, FINANCE = "urn:li:domain:sales", "urn:li:domain:finance"
TECHNICAL = "urn:li:ownershipType:__system__technical_owner"
BUSINESS = "urn:li:ownershipType:__system__business_owner"
EDIT_ROUTES = ("/web/description", "/web/tags", "/web/terms", "/web/owners", "/web/domain")


def field(name: str, description: str = "") -> dict:
    return {
        "fieldPath": name,
        "nativeDataType": "VARCHAR",
        "type": {"type": {"com.linkedin.schema.StringType": {}}},
        "description": description,
    }


@pytest_asyncio.fixture
async def catalog(client) -> None:
    schema = {
        "schemaName": "orders",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.OtherSchema": {"rawSchema": ""}},
        "fields": [
            {**field("order_id", "The key"), "globalTags": {"tags": [{"tag": GOLD}]}},  # ingested with a tag
            field("email", "Who to write to"),
        ],
    }
    await propose(
        client,
        mcp("datasetProperties", {"name": "orders", "description": "All orders"}, ORDERS, sync=True),
        mcp("schemaMetadata", schema, ORDERS, sync=True),
        mcp("tagProperties", {"name": "PII"}, PII, entity="tag", sync=True),
        mcp("tagProperties", {"name": "Gold"}, GOLD, entity="tag", sync=True),
        mcp(
            "glossaryTermInfo",
            {"name": "Sensitive", "definition": "handle with care", "termSource": "INTERNAL"},
            SENSITIVE,
            entity="glossaryTerm",
            sync=True,
        ),
        mcp("corpUserInfo", {"active": True, "displayName": "Alice A."}, ALICE, entity="corpuser", sync=True),
        mcp("corpUserInfo", {"active": True, "displayName": "Bob B."}, BOB, entity="corpuser", sync=True),
        mcp("corpGroupInfo", {"admins": [], "members": [], "groups": []}, ENG, entity="corpGroup", sync=True),
        mcp("domainProperties", {"name": "Sales"}, SALES, entity="domain", sync=True),
        mcp("domainProperties", {"name": "Finance"}, FINANCE, entity="domain", sync=True),
    )


async def aspect(client, name: str, urn: str = ORDERS) -> dict | None:
    answer = await client.get(f"/openapi/v3/entity/dataset/{quote(urn, safe='')}/{name}")
    return answer.json()["value"] if answer.status_code == 200 else None


async def post(browser, path: str, page_html: str, **form: str):
    return await browser.post(path, data={"csrf_token": csrf_of(page_html), "urn": ORDERS, **form})


async def written_by(db, aspect_name: str) -> tuple[str, str, str]:
    """The latest row's createdby, its change log's actor and the surface its system metadata names."""
    row = await db.fetchrow(
        "SELECT createdby, systemmetadata FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = $2 AND version = 0",
        ORDERS,
        aspect_name,
    )
    logs = [
        orjson.loads(r["payload"])
        for r in await db.fetch(
            "SELECT payload FROM change_log_outbox WHERE urn = $1 AND aspect = $2 ORDER BY id", ORDERS, aspect_name
        )
    ]
    log = [p for p in logs if "changeType" in p][-1]
    return row["createdby"], log["created"]["actor"], orjson.loads(row["systemmetadata"])["properties"][ORIGIN_KEY]


# --- the entity's tags, terms, owners and domain


async def test_a_writer_adds_and_removes_a_tag_as_the_person(app, client, catalog, db):
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS, "Properties"))
    assert 'action="/web/tags"' in page.text
    added = await post(browser, "/web/tags", page.text, op="add", tag="pii", tab="Properties")
    assert added.status_code == 303 and added.headers["location"] == page_url(ORDERS, "Properties")
    assert await aspect(client, "globalTags") == {"tags": [{"tag": PII}]}  # read back through the API
    assert await written_by(db, "globalTags") == (ALICE, ALICE, "web")
    # the audit log names the surface and the token the session was opened with
    session_token = await db.fetchval("SELECT token_id FROM web_session WHERE actor = $1", ALICE)
    entry = await db.fetchrow(
        "SELECT actor, token_id, surface FROM audit_log WHERE urn = $1 AND aspect = 'globalTags' ORDER BY id", ORDERS
    )
    assert session_token and tuple(entry) == (ALICE, session_token, "web")
    shown = await browser.get(page_url(ORDERS, "Properties"))
    assert f'name="tag" value="{PII}"' in shown.text  # its remove button's form
    assert "Remove tag PII" in shown.text  # by its name
    removed = await post(browser, "/web/tags", shown.text, op="remove", tag=PII, tab="Properties")
    assert removed.status_code == 303
    assert await aspect(client, "globalTags") == {"tags": []}


async def test_an_unknown_tag_is_a_page_saying_so_and_nothing_is_written(app, client, catalog):
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS))
    refused = await post(browser, "/web/tags", page.text, op="add", tag="nosuchtag")
    assert refused.status_code == 400 and refused.headers["content-type"].startswith("text/html")
    assert "urn:li:tag:nosuchtag does not exist" in refused.text
    assert f'href="{page_url(ORDERS, "Documentation")}"' in refused.text  # the way back
    assert await aspect(client, "globalTags") is None
    empty = await post(browser, "/web/tags", page.text, op="add", tag="  ")
    assert empty.status_code == 400 and "Name a tag" in empty.text


async def test_glossary_terms_are_added_and_removed(app, client, catalog, db):
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS, "Documentation"))
    assert (await post(browser, "/web/terms", page.text, op="add", term=SENSITIVE)).status_code == 303
    terms = await aspect(client, "glossaryTerms")
    assert [t["urn"] for t in terms["terms"]] == [SENSITIVE] and terms["auditStamp"]["actor"] == ALICE
    assert (await written_by(db, "glossaryTerms"))[:2] == (ALICE, ALICE)
    assert (await post(browser, "/web/terms", page.text, op="remove", term=SENSITIVE)).status_code == 303
    assert (await aspect(client, "glossaryTerms"))["terms"] == []
    unknown = await post(browser, "/web/terms", page.text, op="add", term="Unheard")
    assert unknown.status_code == 400 and "glossary term urn:li:glossaryTerm:Unheard does not exist" in unknown.text


async def test_owners_are_added_with_their_type_and_removed_by_that_type_only(app, client, catalog, db):
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS, "Documentation"))
    assert 'id="side-owner-type"' in page.text and f'value="{TECHNICAL}"' in page.text
    for owner, kind in (("bob", TECHNICAL), (BOB, BUSINESS), (ENG, TECHNICAL)):
        answer = await post(browser, "/web/owners", page.text, op="add", owner=owner, type=kind)
        assert answer.status_code == 303, answer.text
    owners = (await aspect(client, "ownership"))["owners"]
    assert [(o["owner"], o["typeUrn"]) for o in owners] == [(BOB, TECHNICAL), (BOB, BUSINESS), (ENG, TECHNICAL)]
    assert (await written_by(db, "ownership"))[:2] == (ALICE, ALICE)
    shown = await browser.get(page_url(ORDERS, "Documentation"))
    assert "Technical Owner" in shown.text and "Business Owner" in shown.text
    answer = await post(browser, "/web/owners", shown.text, op="remove", owner=BOB, type=BUSINESS)
    assert answer.status_code == 303
    owners = (await aspect(client, "ownership"))["owners"]
    assert [(o["owner"], o["typeUrn"]) for o in owners] == [(BOB, TECHNICAL), (ENG, TECHNICAL)]


async def test_an_owner_must_be_a_known_user_or_group(app, client, catalog):
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS, "Documentation"))
    nobody = await post(browser, "/web/owners", page.text, op="add", owner="carol", type=TECHNICAL)
    assert nobody.status_code == 400 and "user urn:li:corpuser:carol does not exist" in nobody.text
    not_a_person = await post(browser, "/web/owners", page.text, op="add", owner=PII, type=TECHNICAL)
    assert not_a_person.status_code == 400 and "user (urn:li:corpuser:" in not_a_person.text
    no_type = await post(browser, "/web/owners", page.text, op="add", owner=BOB)
    assert no_type.status_code == 400 and "ownership type" in no_type.text
    assert await aspect(client, "ownership") is None


async def test_the_domain_is_set_changed_and_unset(app, client, catalog, db):
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS, "Documentation"))
    assert (await post(browser, "/web/domain", page.text, op="set", domain="sales")).status_code == 303
    assert await aspect(client, "domains") == {"domains": [SALES]}
    assert (await post(browser, "/web/domain", page.text, op="set", domain=FINANCE)).status_code == 303
    assert await aspect(client, "domains") == {"domains": [FINANCE]}  # an entity has one domain
    assert (await written_by(db, "domains"))[:2] == (ALICE, ALICE)
    assert (await post(browser, "/web/domain", page.text, op="unset")).status_code == 303
    assert await aspect(client, "domains") == {"domains": []}
    unknown = await post(browser, "/web/domain", page.text, op="set", domain="nowhere")
    assert unknown.status_code == 400 and "domain urn:li:domain:nowhere does not exist" in unknown.text


async def test_the_page_names_what_it_references_by_its_name(app, client, catalog):
    await propose(
        client,
        mcp("globalTags", {"tags": [{"tag": PII}, {"tag": "urn:li:tag:unnamed"}]}, ORDERS),
        mcp(
            "ownership", {"owners": [{"owner": BOB, "type": "TECHNICAL_OWNER"}, {"owner": ENG, "type": "NONE"}]}, ORDERS
        ),
        mcp("domains", {"domains": [SALES]}, ORDERS),
    )
    browser = await sign_in(app, role="reader")
    page = await browser.get(page_url(ORDERS, "Documentation"))
    side = page.text[page.text.index('class="entity-side"') :]
    assert f'title="{PII}">PII<' in side and ">unnamed<" in side  # a tag without properties: its id
    assert f'title="{SALES}">Sales<' in side
    assert f'title="{BOB}">Bob B.</a> <span class="meta">bob · Technical Owner</span>' in side  # and who it is
    assert f'title="{ENG}">eng</a> <span class="meta">None</span>' in side


# --- a dataset field's description, tags and terms


async def test_a_fields_edit_panel_edits_its_description_tags_and_terms(app, client, catalog, db):
    browser = await sign_in(app, role="writer")
    table = await browser.get(page_url(ORDERS, "Schema"))
    assert 'id="field-edit"' not in table.text  # one field's panel at a time, when its Edit link asks
    edit_link = page_url(ORDERS, "Schema") + "?" + urlencode({"field": "email"}) + "#field-edit"
    assert f'href="{edit_link.replace("&", "&amp;")}"' in table.text
    panel = await browser.get(edit_link.split("#")[0])
    assert 'id="field-edit"' in panel.text and 'id="field-description-input"' in panel.text
    back = page_url(ORDERS, "Schema") + "?field=email#field-edit"
    for path, form in (
        ("/web/description", {"description": "The buyer's address"}),
        ("/web/tags", {"op": "add", "tag": PII}),
        ("/web/terms", {"op": "add", "term": SENSITIVE}),
    ):
        answer = await post(browser, path, panel.text, field="email", **form)
        assert answer.status_code == 303 and answer.headers["location"] == back, (path, answer.text)
    infos = (await aspect(client, "editableSchemaMetadata"))["editableSchemaFieldInfo"]
    assert infos == [
        {
            "fieldPath": "email",
            "description": "The buyer's address",
            "globalTags": {"tags": [{"tag": PII}]},
            "glossaryTerms": {"terms": [{"urn": SENSITIVE}], "auditStamp": infos[0]["glossaryTerms"]["auditStamp"]},
        }
    ]
    assert (await written_by(db, "editableSchemaMetadata"))[:2] == (ALICE, ALICE)
    assert await aspect(client, "globalTags") is None  # the field's, not the dataset's
    shown = await browser.get(back.split("#")[0])
    assert "The buyer&#39;s address" in shown.text and "Remove tag PII" in shown.text
    removed = await post(browser, "/web/tags", shown.text, field="email", op="remove", tag=PII)
    assert removed.status_code == 303
    infos = (await aspect(client, "editableSchemaMetadata"))["editableSchemaFieldInfo"]
    assert infos[0]["globalTags"] == {"tags": []}


async def test_a_tag_that_came_with_the_schema_has_no_remove_button(app, catalog):
    browser = await sign_in(app, role="writer")
    panel = await browser.get(page_url(ORDERS, "Schema") + "?field=order_id")
    section = panel.text[panel.text.index('id="field-edit"') :]
    assert ">Gold<" in section and "Remove tag Gold" not in section
    assert "came with the schema" in section


async def test_a_field_that_is_not_in_the_schema_is_refused(app, client, catalog):
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS, "Schema"))
    refused = await post(browser, "/web/tags", page.text, field="nosuchfield", op="add", tag=PII)
    assert refused.status_code == 400 and "does not exist in the datasets schema" in refused.text
    owners = await post(browser, "/web/owners", page.text, field="email", op="add", owner=BOB, type=TECHNICAL)
    assert owners.status_code == 400 and "no owners or domain of its own" in owners.text
    assert await aspect(client, "editableSchemaMetadata") is None


# --- the rules around every edit


async def test_a_reader_sees_no_edit_control_and_its_forged_posts_are_403(app, client, catalog):
    browser = await sign_in(app, role="reader")
    for url in (page_url(ORDERS, "Documentation"), page_url(ORDERS, "Schema") + "?field=email"):
        page = await browser.get(url)
        assert page.status_code == 200
        for route in EDIT_ROUTES:
            assert f'action="{route}"' not in page.text
        assert 'class="edit' not in page.text and 'id="field-edit"' not in page.text
    forms = {
        "/web/description": {"description": "forged"},
        "/web/tags": {"op": "add", "tag": PII},
        "/web/terms": {"op": "add", "term": SENSITIVE},
        "/web/owners": {"op": "add", "owner": BOB, "type": TECHNICAL},
        "/web/domain": {"op": "set", "domain": SALES},
    }
    for route, form in forms.items():
        forged = await post(browser, route, page.text, **form)
        assert forged.status_code == 403 and "WRITE" in forged.text, route
    for name in ("editableDatasetProperties", "globalTags", "glossaryTerms", "ownership", "domains"):
        assert await aspect(client, name) is None


async def test_every_edit_needs_the_sessions_csrf_token(app, client, catalog):
    writer = await sign_in(app, role="writer")
    other = await sign_in(app, role="writer", actor=BOB)
    theirs = csrf_of((await other.get("/search")).text)
    for route in EDIT_ROUTES:
        for token in ({}, {"csrf_token": "forged"}, {"csrf_token": theirs}):
            answer = await writer.post(route, data={**token, "urn": ORDERS, "op": "add", "tag": PII})
            assert answer.status_code == 403 and "CSRF" in answer.text, (route, token)
    assert await aspect(client, "globalTags") is None
    page = await writer.get(page_url(ORDERS))  # and with its own token it goes through
    assert (await post(writer, "/web/tags", page.text, op="add", tag=PII)).status_code == 303


async def test_a_form_names_an_entity_with_a_page_and_an_operation_it_knows(app, catalog):
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS))
    for urn in ("", "not-a-urn", "urn:li:nosuchtype:x"):
        answer = await browser.post(
            "/web/tags", data={"csrf_token": csrf_of(page.text), "urn": urn, "op": "add", "tag": PII}
        )
        assert answer.status_code == 400 and "names no entity" in answer.text, urn
    missing = await browser.post(
        "/web/tags", data={"csrf_token": csrf_of(page.text), "urn": ds("edits.none"), "op": "add", "tag": PII}
    )
    assert missing.status_code == 400 and "Entity does not exist" in missing.text
    for route, op in (("/web/tags", "replace"), ("/web/domain", "add")):
        answer = await post(browser, route, page.text, op=op, tag=PII, domain=SALES)
        assert answer.status_code == 400 and "operation is one of" in answer.text


async def test_a_writers_policies_still_apply_to_its_edits(app, client, catalog):
    granted = await client.post(
        "/openapi/v1/auth/policies", json={"actor": ALICE, "entityTypes": ["dataset"], "aspects": ["globalTags"]}
    )
    assert granted.status_code == 201, granted.text
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS))
    assert (await post(browser, "/web/tags", page.text, op="add", tag=PII)).status_code == 303  # granted
    refused = await post(browser, "/web/owners", page.text, op="add", owner=BOB, type=TECHNICAL)
    assert refused.status_code == 403 and "writes are not allowed for urn:li:corpuser:alice" in refused.text
    assert await aspect(client, "ownership") is None


def offered(html: str) -> list[tuple[str, str]]:
    """The chooser's choices: (URN, what its label says)."""
    return [
        (value, re.sub(r"<[^>]+>", "", label).strip())
        for value, label in re.findall(
            r'<input type="radio" id="[^"]+" name="\w+" value="([^"]+)" required>\s*<label[^>]*>(.*?)</label>',
            html,
            re.S,
        )
    ]


async def test_a_chooser_searches_the_existing_tags_terms_people_and_domains(app, catalog):
    browser = await sign_in(app, role="writer")
    plain = await browser.get(page_url(ORDERS, "Documentation"))
    assert offered(plain.text) == [] and "?choose=tag#tags-heading" in plain.text  # searched only when asked
    tags = await browser.get(page_url(ORDERS, "Documentation") + "?choose=tag")
    assert sorted(offered(tags.text)) == [(GOLD, "Gold gold"), (PII, "PII pii")]  # a name, and the id beside it
    narrowed = await browser.get(page_url(ORDERS, "Documentation") + "?" + urlencode({"choose": "tag", "q": "gold"}))
    assert offered(narrowed.text) == [(GOLD, "Gold gold")] and "Found for “gold”" in narrowed.text
    terms = await browser.get(page_url(ORDERS, "Documentation") + "?choose=term")
    assert offered(terms.text) == [(SENSITIVE, "Sensitive")]  # its name is its id: said once
    owners = await browser.get(page_url(ORDERS, "Documentation") + "?choose=owner")
    assert sorted(offered(owners.text)) == [(ENG, "eng"), (ALICE, "Alice A. alice"), (BOB, "Bob B. bob")]
    assert 'id="side-owner-type"' in owners.text
    domains = await browser.get(page_url(ORDERS, "Documentation") + "?choose=domain")
    assert sorted(offered(domains.text)) == [(FINANCE, "Finance finance"), (SALES, "Sales sales")]
    nothing = await browser.get(page_url(ORDERS, "Documentation") + "?" + urlencode({"choose": "tag", "q": "zzz"}))
    assert offered(nothing.text) == [] and "None found" in nothing.text


async def test_a_choice_is_added_through_the_choosers_form(app, client, catalog):
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS, "Properties") + "?choose=domain")
    form = re.search(r'<form class="add" action="/web/domain" method="post">(.*?)</form>', page.text, re.S).group(1)
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', form))
    assert fields == {"csrf_token": csrf_of(page.text), "urn": ORDERS, "tab": "Properties", "op": "set"}
    answer = await browser.post("/web/domain", data={**fields, "domain": SALES})
    assert answer.status_code == 303 and answer.headers["location"] == page_url(ORDERS, "Properties")
    assert await aspect(client, "domains") == {"domains": [SALES]}


async def test_a_fields_chooser_opens_in_its_edit_panel(app, catalog):
    browser = await sign_in(app, role="writer")
    panel = await browser.get(page_url(ORDERS, "Schema") + "?" + urlencode({"field": "email", "choose": "term"}))
    section = panel.text[panel.text.index('id="field-edit"') :]
    assert offered(section) == [(SENSITIVE, "Sensitive")]
    assert 'name="field" value="email"' in section and offered(panel.text[: panel.text.index('id="field-edit"')]) == []
    side = await browser.get(page_url(ORDERS, "Schema") + "?choose=term")  # no field: the side panel's
    assert offered(side.text) == [(SENSITIVE, "Sensitive")] and 'id="field-edit"' not in side.text


async def test_a_readers_page_has_no_chooser(app, catalog):
    browser = await sign_in(app, role="reader")
    page = await browser.get(page_url(ORDERS, "Documentation") + "?choose=tag")
    assert offered(page.text) == [] and "choose=" not in page.text


@pytest.mark.parametrize("tab", ["Documentation", "Schema", "Properties"])
async def test_an_edit_returns_to_the_tab_it_was_made_on(app, catalog, tab):
    browser = await sign_in(app, role="writer")
    page = await browser.get(page_url(ORDERS, tab))
    answer = await post(browser, "/web/tags", page.text, op="add", tag=PII, tab=tab)
    assert answer.headers["location"] == page_url(ORDERS, tab)
    unknown = await post(browser, "/web/tags", page.text, op="add", tag=PII, tab="javascript:alert(1)")
    assert unknown.headers["location"] == page_url(ORDERS, "Documentation")
