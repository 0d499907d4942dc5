"""DataHub's policy operations over HTTP (app/graphql/policies.py), sent as DataHub's UI sends them: createPolicy
stores DataHub's dataHubPolicyInfo and writes its change log (naming the actor), listPolicies finds it at once (query,
orFilters, paging, total), updatePolicy replaces it (and creates a policy URN that has none), deletePolicy removes the
entity; each refusal alone: a reader's or writer's token (403 naming MANAGE_POLICIES), input naming its field, an
URN that is not a policy's."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import pytest

from tests.helpers import bearer, ds, mcp, propose, stored, wait_sequenced

pytestmark = pytest.mark.asyncio

CREATE = """
    mutation createPolicy($input: PolicyUpdateInput!) {
        createPolicy(input: $input)
    }
"""
UPDATE = """
    mutation updatePolicy($urn: String!, $input: PolicyUpdateInput!) {
        updatePolicy(urn: $urn, input: $input)
    }
"""
DELETE = """
    mutation deletePolicy($urn: String!) {
        deletePolicy(urn: $urn)
    }
"""
# DataHub's UI (datahub-web-react src/graphql/policy.graphql: its `...searchResultFields` fragment cut to urn and type;
# the owners' ownership types as entity.graphql names them: resourceOwnersTypes, resolvedOwnershipTypes)
LIST = """
    query listPolicies($input: ListPoliciesInput!) {
        listPolicies(input: $input) {
            start
            count
            total
            policies {
                urn
                type
                name
                description
                state
                resources {
                    type
                    allResources
                    resources
                    filter {
                        criteria {
                            field
                            values {
                                value
                                entity {
                                    urn
                                    type
                                }
                            }
                            condition
                        }
                    }
                }
                privileges
                actors {
                    users
                    groups
                    roles
                    allUsers
                    allGroups
                    resourceOwners
                    resourceOwnersTypes
                    resolvedOwnershipTypes { urn type info { name } }
                    resolvedUsers {
                        username
                        urn
                        properties {
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
                            pictureLink
                            teams
                            title
                            skills
                        }
                    }
                    resolvedGroups {
                        name
                        urn
                        properties {
                            displayName
                            description
                            email
                        }
                        editableProperties {
                            description
                            slack
                            email
                        }
                    }
                    resolvedRoles {
                        urn
                        type
                        name
                        description
                    }
                }
                editable
            }
        }
    }
"""
ALICE = "urn:li:corpuser:alice"
ENGINEERS = "urn:li:corpGroup:engineers"
OWNER_TYPE = "urn:li:ownershipType:__system__technical_owner"


def policy_input(name: str = "Tag editors", **changes: Any) -> dict[str, Any]:
    return {
        "type": "METADATA",
        "name": name,
        "state": "ACTIVE",
        "description": "may edit tags of hive datasets",
        "resources": {
            "type": "dataset",
            "allResources": False,
            "filter": {
                "criteria": [
                    {"field": "TYPE", "values": ["dataset"], "condition": "EQUALS"},
                    {"field": "DOMAIN", "values": ["urn:li:domain:marketing"], "condition": "EQUALS"},
                ]
            },
        },
        "privileges": ["EDIT_ENTITY_TAGS", "VIEW_ENTITY_PAGE"],
        "actors": {
            "users": [ALICE],
            "groups": [ENGINEERS],
            "resourceOwners": True,
            "resourceOwnersTypes": [OWNER_TYPE],
            "allUsers": False,
            "allGroups": False,
        },
        **changes,
    }


async def gql(client, query: str, variables: dict[str, Any], **kw: Any) -> dict[str, Any]:
    response = await client.post("/api/graphql", json={"query": query, "variables": variables}, **kw)
    assert response.status_code == 200, response.text
    return response.json()


async def create(client, **kw: Any) -> str:
    body = await gql(client, CREATE, {"input": policy_input(**kw)})
    assert "errors" not in body, body
    return body["data"]["createPolicy"]


async def listed(client, headers: dict[str, str] | None = None, **input: Any) -> dict[str, Any]:
    body = await gql(client, LIST, {"input": input}, headers=headers)
    assert "errors" not in body, body
    return body["data"]["listPolicies"]


def refusal(body: dict[str, Any]) -> tuple[int, str, list[str]]:
    """The first error's code, message and the paths its issues name."""
    error = body["errors"][0]
    issues = error.get("extensions", {}).get("issues") or []
    return error["extensions"]["code"], error["message"], [i.get("path") for i in issues]


async def test_create_stores_datahub_shape_and_writes_the_change_log(client, db):
    before = int(time.time() * 1000)
    urn = await create(client)
    prefix = "urn:li:dataHubPolicy:"
    assert urn.startswith(prefix) and len(urn.removeprefix(prefix)) == 36  # DataHub's UUID.randomUUID().toString()

    row = await stored(db, urn, "dataHubPolicyInfo")
    assert row is not None
    value = row["value"]
    assert before <= value.pop("lastUpdatedTimestamp") <= int(time.time() * 1000)
    assert value == {  # PolicyUpdateInputInfoMapper's shape (editable: the aspect's default, filled in when written)
        "displayName": "Tag editors",
        "description": "may edit tags of hive datasets",
        "type": "METADATA",
        "state": "ACTIVE",
        "privileges": ["EDIT_ENTITY_TAGS", "VIEW_ENTITY_PAGE"],
        "editable": True,
        "actors": {
            "users": [ALICE],
            "groups": [ENGINEERS],
            "resourceOwners": True,
            "resourceOwnersTypes": [OWNER_TYPE],
            "allUsers": False,
            "allGroups": False,
        },
        "resources": {
            "type": "dataset",
            "allResources": False,
            "filter": {
                "criteria": [
                    {"field": "TYPE", "values": ["dataset"], "condition": "EQUALS"},
                    {"field": "DOMAIN", "values": ["urn:li:domain:marketing"], "condition": "EQUALS"},
                ]
            },
        },
    }
    assert await stored(db, urn, "dataHubPolicyKey") is not None  # the entity's key, as every first write has it

    await wait_sequenced(db)
    feed = (await client.get("/openapi/v1/events/mcl", params={"limit": 1000})).json()
    logged = [e for e in feed["events"] if e["urn"] == urn and e["aspect"] == "dataHubPolicyInfo"]
    assert len(logged) == 1 and logged[0]["mcl"]["created"]["actor"] == "urn:li:corpuser:datahub"

    # listed at once (the search index is not asked), answered as DataHub's PolicyInfoPolicyMapper answers it
    page = await listed(client, start=0, count=20, query="")
    assert page["total"] == 1 and page["count"] == 1
    [policy] = page["policies"]
    assert policy["urn"] == urn and policy["name"] == "Tag editors" and policy["editable"] is True
    assert [u["urn"] for u in policy["actors"]["resolvedUsers"]] == [ALICE] and policy["actors"]["roles"] is None
    criteria = policy["resources"]["filter"]["criteria"]
    assert criteria[1]["values"] == [
        {"value": "urn:li:domain:marketing", "entity": {"urn": "urn:li:domain:marketing", "type": "DOMAIN"}}
    ]
    assert criteria[0]["values"] == [{"value": "dataset", "entity": None}]


async def test_list_selects_by_name_and_filters_and_pages(client):
    names = ["Alpha readers", "beta READERS", "Gamma readers", "Delta owners", "epsilon readers"]
    urns = {
        name: await create(client, name=name, state="INACTIVE" if name.startswith("G") else "ACTIVE") for name in names
    }

    everything = await listed(client)  # no start, count nor query: DataHub's defaults
    assert (everything["start"], everything["count"], everything["total"]) == (0, 5, 5)
    assert [p["name"] for p in everything["policies"]] == sorted(names, key=str.lower)

    readers = await listed(client, query="Readers")  # any case
    assert readers["total"] == 4 and "Delta owners" not in [p["name"] for p in readers["policies"]]
    second = await listed(client, query="readers", start=1, count=2)
    assert (second["start"], second["count"], second["total"]) == (1, 2, 4)
    assert [p["name"] for p in second["policies"]] == ["beta READERS", "epsilon readers"]
    past = await listed(client, query="readers", start=4, count=2)
    assert (past["count"], past["total"], past["policies"]) == (0, 4, [])

    # DataHub's UI filters the page by state
    inactive = await listed(client, orFilters=[{"and": [{"field": "state", "values": ["INACTIVE"]}]}])
    assert [p["urn"] for p in inactive["policies"]] == [urns["Gamma readers"]]
    active = await listed(
        client, query="readers", orFilters=[{"and": [{"field": "state", "values": ["INACTIVE"], "negated": True}]}]
    )
    assert active["total"] == 3
    either = await listed(
        client,
        orFilters=[
            {"and": [{"field": "state", "values": ["INACTIVE"]}]},
            {"and": [{"field": "users", "values": [ALICE]}, {"field": "privileges", "values": ["NOT_GRANTED"]}]},
        ],
    )
    assert either["total"] == 1  # the second group's privileges criterion holds for none


async def test_update_replaces_the_policy(client, db):
    urn = await create(client)
    first = (await stored(db, urn, "dataHubPolicyInfo"))["value"]
    changed = policy_input(
        "Tag editors (all users)",
        state="INACTIVE",
        description=None,
        resources=None,
        actors={"resourceOwners": False, "allUsers": True, "allGroups": False},
    )
    body = await gql(client, UPDATE, {"urn": urn, "input": changed})
    assert body == {"data": {"updatePolicy": urn}}
    value = (await stored(db, urn, "dataHubPolicyInfo"))["value"]
    assert value["lastUpdatedTimestamp"] >= first["lastUpdatedTimestamp"]
    assert {k: v for k, v in value.items() if k != "lastUpdatedTimestamp"} == {
        "displayName": "Tag editors (all users)",
        "description": "",
        "type": "METADATA",
        "state": "INACTIVE",
        "privileges": ["EDIT_ENTITY_TAGS", "VIEW_ENTITY_PAGE"],
        "editable": True,
        "actors": {"resourceOwners": False, "allUsers": True, "allGroups": False},
    }  # replaced whole: no resources, users nor groups are left of the first version
    [policy] = (await listed(client))["policies"]
    assert policy["resources"] is None and policy["actors"]["users"] is None and policy["state"] == "INACTIVE"

    # an upsert, as DataHub's: a policy URN that has no policy yet is created
    fresh = "urn:li:dataHubPolicy:bootstrap-0"
    assert await gql(client, UPDATE, {"urn": fresh, "input": policy_input("Bootstrapped")}) == {
        "data": {"updatePolicy": fresh}
    }
    assert (await listed(client))["total"] == 2


async def test_update_or_delete_of_an_urn_that_is_not_a_policy_is_refused(client, db):
    dataset = ds("policies_not_here")
    await propose(client, mcp("status", {"removed": False}, urn=dataset))
    for query, name in ((UPDATE, "updatePolicy"), (DELETE, "deletePolicy")):
        variables = {"urn": dataset, **({"input": policy_input()} if name == "updatePolicy" else {})}
        body = await gql(client, query, variables)
        code, message, paths = refusal(body)
        assert body["data"] == {name: None}
        assert (code, paths) == (400, ["$urn"]) and "is not a dataHubPolicy urn" in message
        variables["urn"] = "not an urn"
        code, message, paths = refusal(await gql(client, query, variables))
        assert (code, paths) == (400, ["$urn"]) and "is not a valid urn" in message
    assert await stored(db, dataset, "dataHubPolicyInfo") is None
    assert await stored(db, dataset, "status") is not None  # deletePolicy deletes policies only (DataHub: any entity)


async def test_delete_removes_the_entity(client, db):
    kept, deleted = await create(client, name="kept"), await create(client, name="deleted")
    assert await gql(client, DELETE, {"urn": deleted}) == {"data": {"deletePolicy": deleted}}
    assert [p["urn"] for p in (await listed(client))["policies"]] == [kept]
    for aspect in ("dataHubPolicyInfo", "dataHubPolicyKey"):
        assert await stored(db, deleted, aspect) is None
    response = await client.get(f"/openapi/v3/entity/dataHubPolicy/{quote(deleted, safe='')}")
    assert response.status_code == 404
    code, message, paths = refusal(await gql(client, DELETE, {"urn": deleted}))  # gone: nothing to delete
    assert (code, paths) == (404, ["$urn"]) and "does not exist" in message
    assert await stored(db, kept, "dataHubPolicyInfo") is not None


@pytest.mark.parametrize("role", ["reader", "writer"])
async def test_each_operation_needs_manage_policies(app, client, db, role):
    urn = await create(client, name="guarded")
    token = await bearer(app, role, actor="urn:li:corpuser:mallory")
    operations = [
        (CREATE, {"input": policy_input("self-granted", actors={**policy_input()["actors"], "allUsers": True})}),
        (UPDATE, {"urn": urn, "input": policy_input("taken over")}),
        (DELETE, {"urn": urn}),
        (LIST, {"input": {}}),
    ]
    for query, variables in operations:
        body = await gql(client, query, variables, headers=token)
        code, message, _ = refusal(body)
        assert code == 403 and "MANAGE_POLICIES" in message, body
        assert list(body["data"].values()) == [None]
    page = await listed(client)  # the admin's: nothing was written by the refused
    assert [(p["urn"], p["name"]) for p in page["policies"]] == [(urn, "guarded")]


async def test_invalid_input_is_refused_naming_the_field(client, db):
    actors = policy_input()["actors"]
    cases = [
        (policy_input(type="ANYTHING"), "type"),
        (policy_input(state="ON"), "state"),
        (
            policy_input(
                resources={"filter": {"criteria": [{"field": "TYPE", "values": ["dataset"], "condition": "LIKE"}]}}
            ),
            "resources.filter.criteria[0].condition",
        ),
    ]
    for value, field in cases:  # graphql-core's coercion of the schema's enums: the variable's place in the message
        code, message, _ = refusal(await gql(client, CREATE, {"input": value}))
        assert code == 400 and f"at .{field}:" in message, message
    actor_cases = [
        ({**actors, "users": [ALICE, ENGINEERS]}, "$input.actors.users[1]"),
        ({**actors, "groups": [ALICE]}, "$input.actors.groups[0]"),
        ({**actors, "users": ["alice"]}, "$input.actors.users[0]"),
        ({**actors, "resourceOwnersTypes": ["urn:li:tag:owner"]}, "$input.actors.resourceOwnersTypes[0]"),
    ]
    for value, path in actor_cases:
        code, _, paths = refusal(await gql(client, CREATE, {"input": policy_input(actors=value)}))
        assert (code, paths) == (400, [path])
    # what the write path refuses in the aspect (app.auth's checks of a policy) is named by the input's field
    platform = policy_input(type="PLATFORM", resources=None, privileges=["MANAGE_POLICIES", "EDIT_ENTITY_TAGS"])
    code, _, paths = refusal(await gql(client, CREATE, {"input": platform}))
    assert (code, paths) == (400, ["$input.privileges[1]"])
    assert (await listed(client))["total"] == 0  # nothing was written by any refusal

    list_cases = [
        ({"start": -1}, "$input.start"),
        ({"count": -1}, "$input.count"),
        ({"orFilters": [{"and": [{"field": "owner", "values": ["x"]}]}]}, "$input.orFilters[0].and[0].field"),
        (
            {"orFilters": [{"and": [{"field": "state", "values": ["A"], "condition": "CONTAIN"}]}]},
            "$input.orFilters[0].and[0].condition",
        ),
    ]
    for value, path in list_cases:
        code, _, paths = refusal(await gql(client, LIST, {"input": value}))
        assert (code, paths) == (400, [path])


async def test_a_policy_written_through_another_api_is_listed_with_its_actors_resolved(client):
    """A policy proposed as an MCP (as `datahub put` or the SDK write it, roles included, which the GraphQL input
    has no field for) is listed like one created here, with what DataHub's UI selects of its users, groups and roles."""
    policy = "urn:li:dataHubPolicy:editors"
    editor = "urn:li:dataHubRole:Editor"
    info = {
        "displayName": "Editors",
        "description": "what editors may do",
        "type": "METADATA",
        "state": "ACTIVE",
        "privileges": ["EDIT_ENTITY_DOCS"],
        "actors": {"users": [ALICE], "groups": [ENGINEERS], "roles": [editor], "resourceOwners": False},
        "editable": False,
    }
    await propose(
        client,
        mcp("dataHubPolicyInfo", info, urn=policy, entity="dataHubPolicy"),
        mcp(
            "corpUserInfo",
            {"active": True, "displayName": "Alice A.", "email": "alice@example.com"},
            urn=ALICE,
            entity="corpuser",
        ),
        mcp("corpGroupEditableInfo", {"description": "builders", "slack": "#eng"}, urn=ENGINEERS, entity="corpGroup"),
        mcp("dataHubRoleInfo", {"name": "Editor", "description": "can edit"}, urn=editor, entity="dataHubRole"),
    )
    [listed_policy] = (await listed(client, query="editors"))["policies"]
    assert (listed_policy["urn"], listed_policy["editable"], listed_policy["resources"]) == (policy, False, None)
    actors = listed_policy["actors"]
    assert (actors["users"], actors["groups"], actors["roles"]) == ([ALICE], [ENGINEERS], [editor])
    assert (actors["allUsers"], actors["allGroups"], actors["resourceOwners"]) == (False, False, False)
    [user] = actors["resolvedUsers"]
    assert (user["username"], user["properties"]["displayName"]) == ("alice", "Alice A.")
    [group] = actors["resolvedGroups"]
    assert (group["name"], group["editableProperties"]) == (
        "engineers",
        {"description": "builders", "slack": "#eng", "email": None},
    )
    assert actors["resolvedRoles"] == [
        {"urn": editor, "type": "DATAHUB_ROLE", "name": "Editor", "description": "can edit"}
    ]


async def test_a_stored_policy_the_answer_cannot_hold_is_left_out(client, db):
    """A row whose type the answer's enum has no value for (written before the write path checked policies, or in
    SQL) is left out of the list: it would otherwise fail the whole answer, every policy with it."""
    good = await create(client, name="good")
    odd = {"displayName": "odd", "description": "", "type": "CUSTOM", "state": "ACTIVE", "privileges": [], "actors": {}}
    await db.execute(
        "INSERT INTO metadata_aspect_v2 (urn, aspect, version, metadata, systemmetadata, createdon, createdby) "
        "VALUES ($1, 'dataHubPolicyInfo', 0, $2, '{}', now(), 'urn:li:corpuser:datahub')",
        "urn:li:dataHubPolicy:odd",
        json.dumps(odd),
    )
    page = await listed(client)
    assert [p["urn"] for p in page["policies"]] == [good] and page["total"] == 1


async def test_a_policy_granting_manage_policies_lets_a_non_admin_manage_them_but_not_escalate(app, client):
    """MANAGE_POLICIES is the decision's (app.auth): a reader granted it by a policy lists, creates and deletes
    policies here; a policy granting what the reader itself lacks is refused with the reason."""
    bob = "urn:li:corpuser:bob"
    await create(
        client,
        name="policy admins",
        type="PLATFORM",
        resources=None,
        privileges=["MANAGE_POLICIES"],
        actors={"users": [bob], "resourceOwners": False, "allUsers": False, "allGroups": False},
    )
    token = await bearer(app, "reader", actor=bob)
    assert (await listed(client, headers=token))["total"] == 1
    co_admin = policy_input("co-admins", type="PLATFORM", resources=None, privileges=["MANAGE_POLICIES"])
    created = await gql(client, CREATE, {"input": co_admin}, headers=token)
    assert "errors" not in created, created
    escalation = await gql(client, CREATE, {"input": policy_input("bob edits tags")}, headers=token)
    assert refusal(escalation)[0] == 403
    assert "lacks EDIT_ENTITY_TAGS" in escalation["errors"][0]["extensions"]["issues"][0]["message"], escalation
    deleted = created["data"]["createPolicy"]
    assert await gql(client, DELETE, {"urn": deleted}, headers=token) == {"data": {"deletePolicy": deleted}}
    assert [p["name"] for p in (await listed(client))["policies"]] == ["policy admins"]
