"""DataHub's documents over GraphQL (app/graphql/documents.py), on both search backends, as DataHub's MCP server reads
them: `search_documents` (its documentSearch: a document found by a word of its title or of its text only, its
fields, `total`, the sub-type filter), `grep_documents` (documentContent: the text), getRelatedDocuments (the
documents whose documentInfo.relatedAssets name an asset: only those, DataHub's visibility of UNPUBLISHED documents,
its filters, newest first), and semanticSearchAcrossEntities answered with DataHub's error for a deployment without
semantic search. The operations are the installed server's own documents, as it sends them to a core server. Data is
written over HTTP, as a client writes it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.client.conftest import MCP_REQUIREMENT, MCP_VENV, _ensure_venv
from tests.helpers import TEST_ACTOR, bearer, ds, mcp, propose
from tests.integration.search_indices import (  # noqa: F401 - the module runs on both backends, on shared indices
    backend_name,
    opensearch_overrides,
    settings_overrides,
)

pytestmark = pytest.mark.asyncio

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
ALICE, BOB, CAROL = "urn:li:corpuser:alice", "urn:li:corpuser:bob", "urn:li:corpuser:carol"
SALES = "urn:li:corpGroup:sales"
ORDERS, USERS, NOTHING = ds("docs.orders"), ds("docs.users"), ds("docs.nothing")
PII = "urn:li:glossaryTerm:pii"
ENGINEERING, CRITICAL = "urn:li:domain:engineering", "urn:li:tag:critical"
GUIDE = "urn:li:document:guides"  # root, native, related to ORDERS
RUNBOOK = "urn:li:document:deploy-runbook"  # child of GUIDE, from Notion, related to ORDERS
FAQ = "urn:li:document:users-faq"  # related to USERS and PII only
DRAFT = "urn:li:document:alice-draft"  # UNPUBLISHED, alice's, related to ORDERS
TEAM_DRAFT = "urn:li:document:sales-draft"  # UNPUBLISHED, the sales group's (carol is a member), related to ORDERS
GONE = "urn:li:document:gone"  # soft-deleted, related to ORDERS
RUNBOOK_TEXT = "Roll out with kubectl. The zephyrine cluster needs a drain first."
SEMANTIC_SEARCH_DISABLED = "Semantic search is disabled in this environment"


def document(
    urn: str,
    title: str,
    text: str,
    modified: int,
    *,
    state: str = "PUBLISHED",
    assets: tuple[str, ...] = (ORDERS,),
    sub_type: str | None = None,
    **info: Any,
) -> list[dict[str, Any]]:
    value = {
        "title": title,
        "contents": {"text": text},
        "status": {"state": state},
        "created": {"time": 1_000, "actor": ALICE},
        "lastModified": {"time": modified, "actor": BOB},
        "relatedAssets": [{"asset": a} for a in assets],
        **info,
    }
    written = [mcp("documentInfo", value, urn=urn, entity="document")]
    if sub_type:
        written.append(mcp("subTypes", {"typeNames": [sub_type]}, urn=urn, entity="document"))
    return written


def owned_by(urn: str, owner: str) -> dict[str, Any]:
    return mcp("ownership", {"owners": [{"owner": owner, "type": "TECHNICAL_OWNER"}]}, urn=urn, entity="document")


async def write_documents(client) -> None:
    await propose(
        client,
        mcp("datasetProperties", {"name": "orders"}, urn=ORDERS),
        mcp("datasetProperties", {"name": "users"}, urn=USERS),
        mcp("datasetProperties", {"name": "nothing"}, urn=NOTHING),
        mcp("glossaryTermInfo", {"definition": "personal", "termSource": "INTERNAL"}, urn=PII, entity="glossaryTerm"),
        mcp("domainProperties", {"name": "Engineering"}, urn=ENGINEERING, entity="domain"),
        mcp("tagProperties", {"name": "critical"}, urn=CRITICAL, entity="tag"),
        mcp("groupMembership", {"groups": [SALES]}, urn=CAROL, entity="corpuser"),
        *document(GUIDE, "Service guides", "Everything about our services.", 3_000, sub_type="Reference"),
        *document(
            RUNBOOK,
            "Deploying the orders service",
            RUNBOOK_TEXT,
            5_000,
            sub_type="Runbook",
            source={"sourceType": "EXTERNAL", "externalUrl": "https://notion.so/deploy", "externalId": "n-1"},
            parentDocument={"document": GUIDE},
            relatedDocuments=[{"document": FAQ}],
            customProperties={"team": "sales"},
        ),
        mcp("dataPlatformInstance", {"platform": "urn:li:dataPlatform:notion"}, urn=RUNBOOK, entity="document"),
        mcp("domains", {"domains": [ENGINEERING]}, urn=RUNBOOK, entity="document"),
        mcp("globalTags", {"tags": [{"tag": CRITICAL}]}, urn=RUNBOOK, entity="document"),
        *document(FAQ, "Users FAQ", "Questions people ask about accounts.", 4_000, assets=(USERS, PII), sub_type="FAQ"),
        *document(DRAFT, "Alice's notes", "Half-written thoughts.", 6_000, state="UNPUBLISHED"),
        owned_by(DRAFT, ALICE),
        *document(TEAM_DRAFT, "Sales plan", "Numbers for next quarter.", 7_000, state="UNPUBLISHED"),
        owned_by(TEAM_DRAFT, SALES),
        *document(GONE, "Old runbook", "Superseded.", 8_000),
        mcp("status", {"removed": True}, urn=GONE, entity="document"),
        headers=SYNC,
    )


async def gql(
    client,
    text: str,
    variables: dict[str, Any] | None = None,
    operationName: str | None = None,  # noqa: N803 - the request's own key
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    body = {"query": text, "variables": variables or {}, "operationName": operationName}
    response = await client.post("/api/graphql", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def data(client, text: str, variables: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    body = await gql(client, text, variables, **kw)
    assert "errors" not in body, body
    return body["data"]


def as_sent(text: str) -> str:
    """The document as the MCP server sends it to a core server: its `#[CLOUD]` and `#[NEWER_GMS]` lines commented."""
    return re.sub(r"^(.*#\[(?:CLOUD|NEWER_GMS)\].*)$", r"# \1", text, flags=re.M)


@pytest.fixture(scope="module")
def mcp_gql() -> dict[str, str]:
    """The MCP server's document operations (0.8.0, gql/*.gql), from its own virtualenv (`.venv-mcp`, made here when
    absent, as tests/client makes it)."""
    python = _ensure_venv(MCP_VENV, *MCP_REQUIREMENT)
    (gql_dir,) = python.parent.parent.glob("lib/python*/site-packages/mcp_server_datahub/gql")
    names = ("document_search", "document_content", "related_documents", "document_semantic_search", "semantic_search")
    return {name: as_sent((gql_dir / f"{name}.gql").read_text()) for name in names}


def compiled(*criteria: dict[str, Any]) -> list[dict[str, Any]]:
    """What the MCP server's search_documents sends for its `filter` (datahub SDK compile_filters): the criteria and
    `removed` not true."""
    return [{"and": [*criteria, {"field": "removed", "condition": "EQUAL", "values": ["true"], "negated": True}]}]


async def search_documents(client, mcp_gql, query: str, *criteria: dict[str, Any], **kw: Any) -> dict[str, Any]:
    variables = {"query": query, "orFilters": compiled(*criteria), "count": 10, "start": 0, "viewUrn": None}
    answer = await data(client, mcp_gql["document_search"], variables, operationName="documentSearch", **kw)
    return answer["searchAcrossEntities"]


def urns(results: dict[str, Any]) -> list[str]:
    return [r["entity"]["urn"] for r in results["searchResults"]]


RUNBOOK_ANSWER = {
    "urn": RUNBOOK,
    "subType": "Runbook",
    "platform": {"urn": "urn:li:dataPlatform:notion", "name": "notion"},
    "info": {
        "title": "Deploying the orders service",
        "source": {"sourceType": "EXTERNAL", "externalUrl": "https://notion.so/deploy"},
        "lastModified": {"time": 5_000, "actor": {"urn": BOB}},
        "created": {"time": 1_000, "actor": {"urn": ALICE}},
    },
    "domain": {"domain": {"urn": ENGINEERING, "properties": {"name": "Engineering"}}},
    "tags": {"tags": [{"tag": {"urn": CRITICAL, "properties": {"name": "critical"}}}]},
    "glossaryTerms": None,
}


async def test_search_documents_finds_a_document_by_its_title_as_the_mcp_server_asks(client, mcp_gql):
    await write_documents(client)
    found = await search_documents(client, mcp_gql, "deploying")
    assert (found["start"], found["count"], found["total"]) == (0, 1, 1)
    assert found["searchResults"] == [{"entity": RUNBOOK_ANSWER}]
    # a document without a platform instance is DataHub's own; one never given a source is first-party (no source)
    guide = (await search_documents(client, mcp_gql, "guides"))["searchResults"][0]["entity"]
    assert guide["urn"] == GUIDE and guide["platform"] == {"urn": "urn:li:dataPlatform:datahub", "name": "datahub"}
    assert guide["info"]["source"] is None and guide["subType"] == "Reference"


async def test_search_documents_finds_a_word_that_is_only_in_the_text(client, mcp_gql):
    await write_documents(client)
    found = await search_documents(client, mcp_gql, "zephyrine")
    assert found["total"] == 1 and urns(found) == [RUNBOOK]
    # a word in no document's title nor text finds none; the soft-deleted document's text is not searched
    assert (await search_documents(client, mcp_gql, "xylophone"))["total"] == 0
    assert (await search_documents(client, mcp_gql, "superseded"))["total"] == 0
    # the structured query the MCP server suggests (/q), over the text as over the title
    found = await search_documents(client, mcp_gql, "/q zephyrine AND drain")
    assert urns(found) == [RUNBOOK]


async def test_search_documents_total_and_sub_type_filter(client, mcp_gql):
    await write_documents(client)
    everything = await search_documents(client, mcp_gql, "*")
    # every document not soft-deleted (searchAcrossEntities applies no visibility rule, as DataHub's)
    assert everything["total"] == 5 and sorted(urns(everything)) == sorted([GUIDE, RUNBOOK, FAQ, DRAFT, TEAM_DRAFT])
    # filter="subtype = FAQ"
    faq = {"field": "typeNames", "condition": "EQUAL", "values": ["FAQ"]}
    assert urns(await search_documents(client, mcp_gql, "*", faq)) == [FAQ]
    # the sub-type filter holds with a word: the runbook's word among FAQs finds nothing
    assert (await search_documents(client, mcp_gql, "zephyrine", faq))["total"] == 0
    # filter="platform = notion" (the SDK's `.keyword` field)
    notion = {"field": "platform.keyword", "condition": "EQUAL", "values": ["urn:li:dataPlatform:notion"]}
    assert urns(await search_documents(client, mcp_gql, "*", notion)) == [RUNBOOK]


async def test_grep_documents_reads_the_text(client, mcp_gql):
    await write_documents(client)
    variables = {"urns": [RUNBOOK, "urn:li:document:never", GUIDE]}
    answer = await data(client, mcp_gql["document_content"], variables, operationName="documentContent")
    assert answer["entities"] == [
        {"urn": RUNBOOK, "info": {"title": "Deploying the orders service", "contents": {"text": RUNBOOK_TEXT}}},
        None,
        {"urn": GUIDE, "info": {"title": "Service guides", "contents": {"text": "Everything about our services."}}},
    ]


DOCUMENT_INFO = """query($urn: String!) { entity(urn: $urn) { urn ... on Document {
  info {
    title status { state } contents { text } customProperties { key value }
    source { sourceType externalUrl externalId }
    created { time actor { urn } } lastModified { time actor { urn } }
    relatedAssets { asset { urn type } }
    relatedDocuments { document { urn info { title } } }
    parentDocument { document { urn info { title } } }
  }
  settings { showInGlobalContext }
} } }"""


async def test_a_documents_info_as_datahub_maps_it(client):
    await write_documents(client)
    runbook = (await data(client, DOCUMENT_INFO, {"urn": RUNBOOK}))["entity"]
    assert runbook == {
        "urn": RUNBOOK,
        "info": {
            "title": "Deploying the orders service",
            "status": {"state": "PUBLISHED"},
            "contents": {"text": RUNBOOK_TEXT},
            "customProperties": [{"key": "team", "value": "sales"}],
            "source": {"sourceType": "EXTERNAL", "externalUrl": "https://notion.so/deploy", "externalId": "n-1"},
            "created": {"time": 1_000, "actor": {"urn": ALICE}},
            "lastModified": {"time": 5_000, "actor": {"urn": BOB}},
            "relatedAssets": [{"asset": {"urn": ORDERS, "type": "DATASET"}}],
            "relatedDocuments": [{"document": {"urn": FAQ, "info": {"title": "Users FAQ"}}}],
            "parentDocument": {"document": {"urn": GUIDE, "info": {"title": "Service guides"}}},
        },
        "settings": None,
    }
    # what the document does not hold is null (no custom properties: null, as DataHub's mapper leaves them unset)
    guide = (await data(client, DOCUMENT_INFO, {"urn": GUIDE}))["entity"]["info"]
    assert (guide["source"], guide["relatedDocuments"], guide["parentDocument"], guide["customProperties"]) == (
        None,
        None,
        None,
        None,
    )
    # documentSettings; a document without documentInfo has no info
    await propose(
        client,
        mcp("documentSettings", {"showInGlobalContext": False}, urn=GUIDE, entity="document"),
        mcp("documentSettings", {"showInGlobalContext": True}, urn="urn:li:document:bare", entity="document"),
        headers=SYNC,
    )
    assert (await data(client, DOCUMENT_INFO, {"urn": GUIDE}))["entity"]["settings"] == {"showInGlobalContext": False}
    bare = (await data(client, DOCUMENT_INFO, {"urn": "urn:li:document:bare"}))["entity"]
    assert bare == {"urn": "urn:li:document:bare", "info": None, "settings": {"showInGlobalContext": True}}


async def test_document_by_urn(client):
    """`document(urn:)`: the document; null for a URN that is no document's or names nothing written."""
    await write_documents(client)
    text = "query($urn: String!) { document(urn: $urn) { urn type info { title } } }"
    found = (await data(client, text, {"urn": GUIDE}))["document"]
    assert found == {"urn": GUIDE, "type": "DOCUMENT", "info": {"title": "Service guides"}}
    assert (await data(client, text, {"urn": ORDERS}))["document"] is None
    assert (await data(client, text, {"urn": "urn:li:document:never"}))["document"] is None


async def related(client, mcp_gql, urn: str, headers: dict[str, str] | None = None, **input: Any) -> dict[str, Any]:
    answer = await data(
        client,
        mcp_gql["related_documents"],
        {"urn": urn, "input": {"start": 0, "count": 10, **input}},
        operationName="getRelatedDocuments",
        headers=headers,
    )
    return answer["entity"]["relatedDocuments"]


def titled(found: dict[str, Any]) -> list[str]:
    return [d["urn"] for d in found["documents"]]


async def test_related_documents_of_a_dataset_as_the_mcp_server_asks(app, client, mcp_gql):
    await write_documents(client)
    bob = await bearer(app, "reader", actor=BOB)
    found = await related(client, mcp_gql, ORDERS, bob)
    # newest first; FAQ (related to another dataset), the drafts (UNPUBLISHED, not bob's) and the soft-deleted one
    # are not listed
    assert (found["start"], found["count"], found["total"]) == (0, 2, 2)
    assert found["documents"] == [
        {"urn": RUNBOOK, "type": "DOCUMENT", "info": {"title": "Deploying the orders service"}},
        {"urn": GUIDE, "type": "DOCUMENT", "info": {"title": "Service guides"}},
    ]
    # the other dataset's document is its own; a dataset no document names has none
    assert titled(await related(client, mcp_gql, USERS, bob)) == [FAQ]
    assert await related(client, mcp_gql, NOTHING, bob) == {"start": 0, "count": 0, "total": 0, "documents": []}
    # another asset type: a glossary term a document names
    assert titled(await related(client, mcp_gql, PII, bob)) == [FAQ]
    # paging
    page = await related(client, mcp_gql, ORDERS, bob, start=1, count=1)
    assert (page["start"], page["count"], page["total"], titled(page)) == (1, 1, 2, [GUIDE])


async def test_an_unpublished_document_is_listed_to_its_owners_only(app, client, mcp_gql):
    await write_documents(client)
    alice = await bearer(app, "reader", actor=ALICE)
    carol = await bearer(app, "reader", actor=CAROL)
    # alice owns DRAFT; carol is a member of the group owning TEAM_DRAFT; neither sees the other's
    assert titled(await related(client, mcp_gql, ORDERS, alice)) == [DRAFT, RUNBOOK, GUIDE]
    assert titled(await related(client, mcp_gql, ORDERS, carol)) == [TEAM_DRAFT, RUNBOOK, GUIDE]
    # an admin is no owner: DataHub applies the rule to every caller
    admin = await bearer(app, "admin", actor=TEST_ACTOR)
    assert titled(await related(client, mcp_gql, ORDERS, admin)) == [RUNBOOK, GUIDE]


async def test_related_documents_filters(client, mcp_gql):
    await write_documents(client)
    assert titled(await related(client, mcp_gql, ORDERS, types=["Runbook"])) == [RUNBOOK]
    assert titled(await related(client, mcp_gql, ORDERS, types=["FAQ"])) == []
    assert titled(await related(client, mcp_gql, ORDERS, rootOnly=True)) == [GUIDE]
    assert titled(await related(client, mcp_gql, ORDERS, parentDocuments=[GUIDE])) == [RUNBOOK]
    assert titled(await related(client, mcp_gql, ORDERS, parentDocuments=[RUNBOOK])) == []
    assert titled(await related(client, mcp_gql, ORDERS, sourceType="EXTERNAL")) == [RUNBOOK]
    assert titled(await related(client, mcp_gql, ORDERS, domains=[ENGINEERING])) == [RUNBOOK]
    assert titled(await related(client, mcp_gql, ORDERS, domains=["urn:li:domain:other"])) == []
    # a filter value with a NUL character is a 400 naming it
    refused = await gql(
        client,
        mcp_gql["related_documents"],
        {"urn": ORDERS, "input": {"types": ["a\x00b"]}},
        operationName="getRelatedDocuments",
    )
    assert refused["errors"][0]["extensions"]["code"] == 400
    assert refused["errors"][0]["extensions"]["issues"][0]["path"] == "$input.types[0]"


async def test_semantic_search_is_datahubs_disabled_error(client, mcp_gql):
    """The MCP server's search_documents(semantic_query=...) and search(search_strategy="semantic") send these; the
    error makes it fall back to keyword search."""
    await write_documents(client)
    for name, operation, variables in (
        ("document_semantic_search", "documentSemanticSearch", {}),
        ("semantic_search", "semanticSearch", {"types": ["DOCUMENT", "DATASET"]}),
    ):
        body = await gql(
            client,
            mcp_gql[name],
            {"query": "how do I deploy", "orFilters": compiled(), "count": 10, "viewUrn": None, **variables},
            operationName=operation,
        )
        assert body["data"] == {"semanticSearchAcrossEntities": None}
        (error,) = body["errors"]
        assert error["message"] == SEMANTIC_SEARCH_DISABLED
        assert error["extensions"]["code"] == 400 and error["extensions"]["type"] == "BAD_REQUEST"
        assert error["path"] == ["semanticSearchAcrossEntities"]


async def test_fields_datahub_does_not_declare_there_are_refused(client):
    await write_documents(client)
    for text, wrong in (
        # newer DataHub's draftOf; metaledger's model (acryl-datahub's) has none
        ("{ entity(urn: $urn) { ... on Document { info { draftOf { document { urn } } } } } }", "draftOf"),
        # DataHub declares relatedDocuments on 17 asset types; a tag is none of them
        ("{ entity(urn: $urn) { ... on Tag { relatedDocuments(input: {}) { total } } } }", "relatedDocuments"),
        # DataHub's input has no `query`
        ('{ entity(urn: $urn) { ... on Dataset { relatedDocuments(input: {query: "x"}) { total } } } }', "query"),
    ):
        body = await gql(client, f"query($urn: String!) {text}", {"urn": RUNBOOK})
        assert "data" not in body, body
        assert wrong in body["errors"][0]["message"]
        assert body["errors"][0]["extensions"]["classification"] == "ValidationError"
