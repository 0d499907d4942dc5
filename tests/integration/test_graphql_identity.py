"""DataHub's identity and generic reads over GraphQL: `me` (the bearer token's actor, its CorpUser's info, editable
properties, settings and groups, and its platform privileges), `globalViewsSettings`, `entities(urns:)` (one answer
per URN, null where there is no such entity or the caller may not see it) and the fields DataHub's MCP server's
search selects (`subTypes`, `DataProduct.properties`, `GlossaryNode.properties`). The operations DataHub's MCP server
sends are sent as it sends them (its text, its variables). Data is written over HTTP, as a client writes it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import bearer, ds, mcp, propose

pytestmark = pytest.mark.asyncio

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
ALICE, BOB = "urn:li:corpuser:alice", "urn:li:corpuser:bob"
ANALYSTS, ADMINS = "urn:li:corpGroup:analysts", "urn:li:corpGroup:admins"
ALICE_VIEW = "urn:li:dataHubView:alice_default"  # alice's PERSONAL view: hers (and an admin's) to see
GLOBAL_VIEW = "urn:li:dataHubView:everyone"

# mcp-server-datahub 0.8.0, tools/get_me.py and __main__.py (HTTP mode's token check), verbatim
GET_ME = """
        query getMe {
            me {
                corpUser {
                    type
                    urn
                    username
                    exists
                    info {
                        active
                        displayName
                        title
                        firstName
                        lastName
                        fullName
                        email
                    }
                    editableProperties {
                        displayName
                        title
                        pictureLink
                        teams
                        skills
                    }
                    groups: relationships(
                        input: { types: ["IsMemberOfGroup", "IsMemberOfNativeGroup"], direction: OUTGOING, start: 0, count: 50 }
                    ) {
                        relationships {
                            entity {
                                ... on CorpGroup {
                                    urn
                                    name
                                    properties {
                                        displayName
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
"""
GET_ME_HTTP_MODE = "query getMe { me { corpUser { urn username exists } } }"
# view_helpers.py
GET_USER_DEFAULT_VIEW = """
    query getUserDefaultView {
        me {
            corpUser {
                settings {
                    views {
                        defaultView {
                            urn
                        }
                    }
                }
            }
        }
    }
"""
GET_GLOBAL_VIEWS_SETTINGS = """
    query getGlobalViewsSettings {
        globalViewsSettings {
            defaultView
        }
    }
"""
# tools/tags.py, tools/terms.py, tools/owners.py
GET_TAGS = """
        query getTags($urns: [String!]!) {
            entities(urns: $urns) {
                urn
                type
                ... on Tag {
                    properties {
                        name
                    }
                }
            }
        }
"""
GET_GLOSSARY_TERMS = """
        query getGlossaryTerms($urns: [String!]!) {
            entities(urns: $urns) {
                urn
                type
                ... on GlossaryTerm {
                    name
                }
            }
        }
"""
GET_OWNERS = """
        query getOwners($urns: [String!]!) {
            entities(urns: $urns) {
                urn
                type
                ... on CorpUser {
                    username
                }
                ... on CorpGroup {
                    name
                }
            }
        }
"""


async def gql(client, query: str, variables: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    response = await client.post("/api/graphql", json={"query": query, "variables": variables or {}}, **kw)
    assert response.status_code == 200, response.text
    return response.json()


async def data(client, query: str, variables: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    body = await gql(client, query, variables, **kw)
    assert "errors" not in body, body
    return body["data"]


def view(urn: str, personal_of: str | None = None) -> dict[str, Any]:
    actor = personal_of or "urn:li:corpuser:datahub"
    info = {
        "name": urn.rsplit(":", 1)[1],
        "type": "PERSONAL" if personal_of else "GLOBAL",
        "definition": {"entityTypes": [], "filter": {"or": []}},
        "created": {"time": 1, "actor": actor},
        "lastModified": {"time": 1, "actor": actor},
    }
    return mcp("dataHubViewInfo", info, urn=urn, entity="dataHubView")


def user(urn: str, aspect: str, value: dict[str, Any]) -> dict[str, Any]:
    return mcp(aspect, value, urn=urn, entity="corpuser")


def group(urn: str, display_name: str) -> dict[str, Any]:
    info = {"displayName": display_name, "admins": [], "members": [], "groups": []}
    return mcp("corpGroupInfo", info, urn=urn, entity="corpGroup")


ALICE_INFO = {
    "active": True,
    "displayName": "Alice Liddell",
    "email": "alice@example.com",
    "title": "Analyst",
    "firstName": "Alice",
    "lastName": "Liddell",
    "fullName": "Alice Liddell",
    "managerUrn": BOB,
    "departmentId": 7,
    "customProperties": {"site": "oxford"},
}
ALICE_EDITABLE = {
    "displayName": "Ali",
    "title": "Lead analyst",
    "aboutMe": "curious",
    "teams": ["data"],
    "skills": ["sql", "python"],
    "pictureLink": "https://example.com/alice.png",
    "slack": "@alice",
    "platforms": ["urn:li:dataPlatform:hive"],
}


async def write_alice(client) -> None:
    await propose(
        client,
        user(ALICE, "corpUserInfo", ALICE_INFO),
        user(ALICE, "corpUserEditableInfo", ALICE_EDITABLE),
        user(
            ALICE,
            "corpUserSettings",
            {"appearance": {"showSimplifiedHomepage": True}, "views": {"defaultView": ALICE_VIEW}},
        ),
        user(ALICE, "groupMembership", {"groups": [ANALYSTS]}),
        user(ALICE, "nativeGroupMembership", {"nativeGroups": [ADMINS]}),
        user(BOB, "corpUserInfo", {"active": False, "displayName": "Bob"}),
        group(ANALYSTS, "Analysts"),
        group(ADMINS, "Admins"),
        view(ALICE_VIEW, personal_of=ALICE),
        view(GLOBAL_VIEW),
        headers=SYNC,
    )


async def test_me_is_the_tokens_actor_with_its_user_and_groups(app, client):
    await write_alice(client)
    alice = await bearer(app, "reader", actor=ALICE)

    me = (await data(client, GET_ME, headers=alice))["me"]["corpUser"]
    groups = me.pop("groups")["relationships"]
    assert me == {
        "type": "CORP_USER",
        "urn": ALICE,
        "username": "alice",
        "exists": True,
        "info": {
            "active": True,
            "displayName": "Alice Liddell",
            "title": "Analyst",
            "firstName": "Alice",
            "lastName": "Liddell",
            "fullName": "Alice Liddell",
            "email": "alice@example.com",
        },
        "editableProperties": {
            "displayName": "Ali",
            "title": "Lead analyst",
            "pictureLink": "https://example.com/alice.png",
            "teams": ["data"],
            "skills": ["sql", "python"],
        },
    }
    assert sorted(groups, key=lambda r: r["entity"]["urn"]) == [
        {"entity": {"urn": ADMINS, "name": "admins", "properties": {"displayName": "Admins"}}},
        {"entity": {"urn": ANALYSTS, "name": "analysts", "properties": {"displayName": "Analysts"}}},
    ]
    assert (await data(client, GET_ME_HTTP_MODE, headers=alice))["me"] == {
        "corpUser": {"urn": ALICE, "username": "alice", "exists": True}
    }
    # her default view: hers to see
    assert (await data(client, GET_USER_DEFAULT_VIEW, headers=alice))["me"]["corpUser"]["settings"] == {
        "views": {"defaultView": {"urn": ALICE_VIEW}}
    }

    # the fields DataHub declares beside them (deprecated info/editableInfo, the whole of each)
    full = await data(
        client,
        """{ me { corpUser {
             info { manager { urn username } departmentId countryCode customProperties { key value } }
             editableInfo { displayName aboutMe }
             editableProperties { aboutMe slack phone email platforms { urn name } }
             settings { appearance { showSimplifiedHomepage showThemeV2 } }
           } platformPrivileges { viewAnalytics createTags manageTags manageGlossaries managePolicies } } }""",
        headers=alice,
    )
    assert full["me"]["corpUser"] == {
        "info": {
            "manager": {"urn": BOB, "username": "bob"},
            "departmentId": 7,
            "countryCode": None,
            "customProperties": [{"key": "site", "value": "oxford"}],
        },
        "editableInfo": {"displayName": "Ali", "aboutMe": "curious"},
        "editableProperties": {
            "aboutMe": "curious",
            "slack": "@alice",
            "phone": None,
            "email": None,
            "platforms": [{"urn": "urn:li:dataPlatform:hive", "name": "hive"}],
        },
        "settings": {"appearance": {"showSimplifiedHomepage": True, "showThemeV2": None}},
    }
    # a reader holds no platform privilege
    assert not any(full["me"]["platformPrivileges"].values())


async def test_me_of_a_user_never_written_and_the_privileges_by_role(app, client):
    await write_alice(client)
    # bob's user exists but has no settings; a token's actor need not have been written at all
    nobody = await bearer(app, "writer", actor="urn:li:corpuser:nobody")
    me = await data(
        client,
        """{ me { corpUser { urn username exists info { displayName } editableProperties { displayName }
                  settings { appearance { showSimplifiedHomepage } views { defaultView { urn } } } }
                  platformPrivileges { createTags manageGlossaries manageDocuments manageTags managePolicies
                                       manageTokens viewAnalytics } } }""",
        headers=nobody,
    )
    assert me["me"] == {
        "corpUser": {
            "urn": "urn:li:corpuser:nobody",
            "username": "nobody",
            "exists": False,
            "info": None,
            "editableProperties": None,
            "settings": {"appearance": {"showSimplifiedHomepage": False}, "views": None},
        },
        # a writer: creating and editing metadata; an admin's alone: administration and deletes
        "platformPrivileges": {
            "createTags": True,
            "manageGlossaries": True,
            "manageDocuments": True,
            "manageTags": False,
            "managePolicies": False,
            "manageTokens": False,
            "viewAnalytics": False,
        },
    }
    privileges = await data(client, "{ me { platformPrivileges { manageTags managePolicies manageServiceAccounts } } }")
    assert privileges["me"]["platformPrivileges"] == {
        "manageTags": True,
        "managePolicies": True,
        "manageServiceAccounts": True,
    }

    # another user's default view that the caller may not see is no view (bob reads alice's settings)
    bob = await bearer(app, "reader", actor=BOB)
    other = await data(
        client,
        "query($u: String!) { entity(urn: $u) { ... on CorpUser { settings { views { defaultView { urn } } } } } }",
        {"u": ALICE},
        headers=bob,
    )
    assert other["entity"]["settings"]["views"] == {"defaultView": None}
    assert (await data(client, GET_USER_DEFAULT_VIEW, headers=bob))["me"]["corpUser"]["settings"]["views"] is None


async def test_global_views_settings(app, client):
    reader = await bearer(app, "reader", actor=BOB)
    assert await data(client, GET_GLOBAL_VIEWS_SETTINGS, headers=reader) == {
        "globalViewsSettings": {"defaultView": None}
    }
    await propose(
        client,
        view(GLOBAL_VIEW),
        mcp(
            "globalSettingsInfo",
            {"views": {"defaultView": GLOBAL_VIEW}},
            urn="urn:li:globalSettings:0",
            entity="globalSettings",
        ),
        headers=SYNC,
    )
    assert await data(client, GET_GLOBAL_VIEWS_SETTINGS, headers=reader) == {
        "globalViewsSettings": {"defaultView": GLOBAL_VIEW}
    }


async def test_entities_by_urn_one_answer_each_null_where_absent_or_hidden(app, client):
    await write_alice(client)
    await propose(
        client,
        mcp("tagProperties", {"name": "PII"}, urn="urn:li:tag:pii", entity="tag"),
        mcp(
            "glossaryTermInfo",
            {"definition": "money in", "termSource": "INTERNAL"},
            urn="urn:li:glossaryTerm:revenue",
            entity="glossaryTerm",
        ),
        headers=SYNC,
    )
    bob = await bearer(app, "reader", actor=BOB)
    alice = await bearer(app, "reader", actor=ALICE)
    urns = [
        "urn:li:tag:pii",
        "urn:li:tag:never_written",
        "urn:li:glossaryTerm:revenue",
        ALICE,
        ANALYSTS,
        "urn:li:tag:pii",  # twice: answered twice
        ALICE_VIEW,  # alice's PERSONAL view: absent to bob
        "urn:li:globalSettings:0",  # no GraphQL type in DataHub's schema
    ]
    query = "query($urns: [String!]!) { entities(urns: $urns) { urn type } }"
    answered = (await data(client, query, {"urns": urns}, headers=bob))["entities"]
    assert answered == [
        {"urn": "urn:li:tag:pii", "type": "TAG"},
        None,
        {"urn": "urn:li:glossaryTerm:revenue", "type": "GLOSSARY_TERM"},
        {"urn": ALICE, "type": "CORP_USER"},
        {"urn": ANALYSTS, "type": "CORP_GROUP"},
        {"urn": "urn:li:tag:pii", "type": "TAG"},
        None,
        None,
    ]
    assert (await data(client, query, {"urns": [ALICE_VIEW]}, headers=alice))["entities"] == [
        {"urn": ALICE_VIEW, "type": "DATAHUB_VIEW"}
    ]
    assert (await data(client, query, {"urns": []}, headers=bob))["entities"] == []
    assert (await data(client, query, {"urns": [ALICE_VIEW]}, headers=bob))["entities"] == [None]

    # the MCP server's own checks, as it sends them
    tags = await data(client, GET_TAGS, {"urns": ["urn:li:tag:pii", "urn:li:tag:never_written"]}, headers=bob)
    assert tags["entities"] == [{"urn": "urn:li:tag:pii", "type": "TAG", "properties": {"name": "PII"}}, None]
    terms = await data(client, GET_GLOSSARY_TERMS, {"urns": ["urn:li:glossaryTerm:revenue"]}, headers=bob)
    assert terms["entities"] == [{"urn": "urn:li:glossaryTerm:revenue", "type": "GLOSSARY_TERM", "name": "revenue"}]
    owners = await data(client, GET_OWNERS, {"urns": [ALICE, ANALYSTS, "urn:li:corpuser:ghost"]}, headers=bob)
    assert owners["entities"] == [
        {"urn": ALICE, "type": "CORP_USER", "username": "alice"},
        {"urn": ANALYSTS, "type": "CORP_GROUP", "name": "analysts"},
        None,
    ]

    # a string that is no URN: a 400 naming its place
    refused = await gql(client, query, {"urns": ["urn:li:tag:pii", "not a urn"]}, headers=bob)
    assert refused["errors"][0]["extensions"]["code"] == 400
    assert refused["errors"][0]["extensions"]["issues"][0]["path"] == "$urns[1]"


async def test_sub_types_data_product_and_glossary_node_properties(client):
    container = "urn:li:container:db1"
    product = "urn:li:dataProduct:orders_product"
    node, bare_node = "urn:li:glossaryNode:finance", "urn:li:glossaryNode:bare"
    table = ds("sub.orders")
    await propose(
        client,
        mcp("containerProperties", {"name": "db1"}, urn=container, entity="container"),
        mcp("subTypes", {"typeNames": ["Database"]}, urn=container, entity="container"),
        mcp("subTypes", {"typeNames": ["View", "Materialized"]}, urn=table),
        mcp(
            "dataProductProperties",
            {
                "name": "Orders",
                "description": "all about orders",
                "externalUrl": "https://example.com/orders",
                "assets": [{"destinationUrn": table}, {"destinationUrn": ds("sub.lines")}],
                "customProperties": {"tier": "gold"},
            },
            urn=product,
            entity="dataProduct",
        ),
        mcp("glossaryNodeInfo", {"name": "Finance", "definition": "money matters"}, urn=node, entity="glossaryNode"),
        mcp("glossaryNodeInfo", {"definition": "no name of its own"}, urn=bare_node, entity="glossaryNode"),
        headers=SYNC,
    )
    got = await data(
        client,
        """query($c: String!, $p: String!, $n: String!, $b: String!, $t: String!) {
             c: entity(urn: $c) { ... on Container { subTypes { typeNames } properties { name } } }
             p: entity(urn: $p) { ... on DataProduct { properties { name description externalUrl numAssets
                                                                    customProperties { key value } } } }
             n: entity(urn: $n) { ... on GlossaryNode { properties { name description } } }
             b: entity(urn: $b) { ... on GlossaryNode { properties { name description customProperties { key } } } }
             t: entity(urn: $t) { ... on Dataset { subTypes { typeNames } } }
           }""",
        {"c": container, "p": product, "n": node, "b": bare_node, "t": table},
    )
    assert got == {
        "c": {"subTypes": {"typeNames": ["Database"]}, "properties": {"name": "db1"}},
        "p": {
            "properties": {
                "name": "Orders",
                "description": "all about orders",
                "externalUrl": "https://example.com/orders",
                "numAssets": 2,
                "customProperties": [{"key": "tier", "value": "gold"}],
            }
        },
        "n": {"properties": {"name": "Finance", "description": "money matters"}},
        "b": {"properties": {"name": "bare", "description": "no name of its own", "customProperties": []}},
        "t": {"subTypes": {"typeNames": ["View", "Materialized"]}},
    }
    # without the aspects: null, as DataHub answers an aspect not written
    none = await data(
        client,
        "query($t: String!) { entity(urn: $t) { ... on Dataset { subTypes { typeNames } } } }",
        {"t": ds("sub.lines")},
    )
    assert none == {"entity": None}  # never written: no entity
    await propose(
        client,
        mcp(
            "datasetKey",
            {"platform": "urn:li:dataPlatform:hive", "name": "sub.lines", "origin": "PROD"},
            urn=ds("sub.lines"),
        ),
        headers=SYNC,
    )
    none = await data(
        client,
        "query($t: String!) { entity(urn: $t) { ... on Dataset { subTypes { typeNames } } } }",
        {"t": ds("sub.lines")},
    )
    assert none == {"entity": {"subTypes": None}}
