"""DataHub's access policies (`dataHubPolicyInfo`), written through the ordinary write path and enforced by the one
decision (app.auth.decision): each rule alone, including where it must not fire, and the explain answer."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import bearer, ds, mcp, policy_mcp, propose

ALICE = "urn:li:corpuser:alice"
BOB = "urn:li:corpuser:bob"
STEWARDS = "urn:li:corpGroup:stewards"
HIVE = ds("access.orders", "hive")
SNOW = ds("access.orders", "snowflake")
TAGS = {"tags": [{"tag": "urn:li:tag:pii"}]}


def platform_filter(platform: str) -> dict[str, Any]:
    return {
        "filter": {
            "criteria": [{"field": "PLATFORM", "values": [f"urn:li:dataPlatform:{platform}"], "condition": "EQUALS"}]
        }
    }


async def grant(client, name: str, **overrides: Any) -> str:
    await propose(client, policy_mcp(name, **overrides))
    return f"urn:li:dataHubPolicy:{name}"


async def tag(anonymous, headers, urn: str = HIVE):
    return await anonymous.post("/openapi/v1/proposals", json=[mcp("globalTags", TAGS, urn)], headers=headers)


async def test_a_group_member_gets_what_the_groups_policy_grants_on_the_resources_it_selects(app, client, anonymous):
    await propose(client, mcp("groupMembership", {"groups": [STEWARDS]}, ALICE, entity="corpuser"))
    await grant(client, "stewards", actors={"groups": [STEWARDS]}, resources=platform_filter("hive"))
    alice, bob = await bearer(app, "reader", ALICE), await bearer(app, "reader", BOB)

    assert (await tag(anonymous, alice)).status_code == 200
    refused = await tag(anonymous, alice, SNOW)  # the filter selects hive datasets only
    assert refused.status_code == 403
    assert "resource filter does not select it (PLATFORM EQUALS" in refused.json()["issues"][0]["message"]
    owners = await anonymous.post(
        "/openapi/v1/proposals",
        json=[mcp("ownership", {"owners": [{"owner": ALICE, "type": "DATAOWNER"}]}, HIVE)],
        headers=alice,
    )
    assert owners.status_code == 403  # the policy grants tags, not owners
    assert "no policy grants EDIT_ENTITY_OWNERS" in owners.json()["issues"][0]["message"]
    not_member = await tag(anonymous, bob)
    assert not_member.status_code == 403  # no policy grants bob anything: the write gate says so
    assert "no policy grants it an edit" in not_member.json()["message"]


async def test_a_policy_for_owners_grants_only_on_what_the_actor_or_its_group_owns(app, client, anonymous):
    await grant(client, "owners", actors={"resourceOwners": True}, privileges=["EDIT_ENTITY_DOCS"])
    await propose(client, mcp("groupMembership", {"groups": [STEWARDS]}, BOB, entity="corpuser"))
    await propose(client, mcp("ownership", {"owners": [{"owner": ALICE, "type": "DATAOWNER"}]}, HIVE))
    await propose(client, mcp("ownership", {"owners": [{"owner": STEWARDS, "type": "DATAOWNER"}]}, SNOW))
    docs = mcp("editableDatasetProperties", {"description": "owned"}, HIVE)
    alice, bob = await bearer(app, "reader", ALICE), await bearer(app, "reader", BOB)

    assert (await anonymous.post("/openapi/v1/proposals", json=[docs], headers=alice)).status_code == 200
    refused = await anonymous.post("/openapi/v1/proposals", json=[docs], headers=bob)
    assert refused.status_code == 403
    assert "the resource's owners" in refused.json()["issues"][0]["message"]
    through_group = mcp("editableDatasetProperties", {"description": "ours"}, SNOW)
    assert (await anonymous.post("/openapi/v1/proposals", json=[through_group], headers=bob)).status_code == 200


async def test_an_inactive_policy_grants_nothing_and_a_reactivated_one_at_once(app, client, anonymous):
    await grant(client, "sleeping", actors={"users": [ALICE]}, state="INACTIVE")
    alice = await bearer(app, "reader", ALICE)
    refused = await tag(anonymous, alice)
    assert refused.status_code == 403
    assert "no policy grants it an edit" in refused.json()["message"]
    await grant(client, "sleeping", actors={"users": [ALICE]}, state="ACTIVE")
    assert (await tag(anonymous, alice)).status_code == 200  # this process forgot the policies it had read


async def test_a_writer_edits_without_a_policy_but_deletes_no_entity(app, client, anonymous):
    writer = await bearer(app, "writer", ALICE)
    assert (await tag(anonymous, writer)).status_code == 200
    key = mcp("datasetKey", None, HIVE, change_type="DELETE")
    refused = await anonymous.post("/openapi/v1/proposals", json=[key], headers=writer)
    assert refused.status_code == 403
    assert "DELETE_ENTITY" in refused.json()["issues"][0]["message"]
    await grant(client, "deleters", actors={"users": [ALICE]}, privileges=["DELETE_ENTITY"])
    assert (await anonymous.post("/openapi/v1/proposals", json=[key], headers=writer)).status_code == 200


async def test_writing_a_policy_needs_manage_policies_and_grants_nothing_its_author_lacks(app, client, anonymous):
    writer = await bearer(app, "writer", ALICE)
    mine = policy_mcp("mine", actors={"users": [ALICE]})
    refused = await anonymous.post("/openapi/v1/proposals", json=[mine], headers=writer)
    assert refused.status_code == 403
    assert "MANAGE_POLICIES" in refused.json()["issues"][0]["message"]

    await grant(client, "policy-admins", type="PLATFORM", privileges=["MANAGE_POLICIES"], actors={"users": [BOB]})
    bob = await bearer(app, "reader", BOB)
    # bob may manage policies, but holds no edit: a policy granting one is an escalation
    escalation = await anonymous.post("/openapi/v1/proposals", json=[mine], headers=bob)
    assert escalation.status_code == 403
    assert "lacks EDIT_ENTITY_TAGS" in escalation.json()["issues"][0]["message"]
    harmless = policy_mcp("co-admin", type="PLATFORM", privileges=["MANAGE_POLICIES"], actors={"users": [ALICE]})
    assert (await anonymous.post("/openapi/v1/proposals", json=[harmless], headers=bob)).status_code == 200


async def test_a_policy_that_does_not_make_sense_is_refused_naming_the_field(client):
    bad = policy_mcp(
        "bad",
        type="SOMETIMES",
        privileges=["EDIT_ENTITY_TAGS", "MANAGE_POLICIES"],
        resources={"filter": {"criteria": [{"field": "COLOUR", "values": ["red"], "condition": "EQUALS"}]}},
    )
    answer = await propose(client, bad, expect=400)
    paths = {issue.get("path") for issue in answer["issues"]}
    assert "$[0].aspect.type" in paths
    assert "$[0].aspect.resources.filter.criteria[0].field" in paths
    answer = await propose(client, policy_mcp("mixed", privileges=["EDIT_ENTITY_TAGS", "MANAGE_POLICIES"]), expect=400)
    assert [issue["path"] for issue in answer["issues"]] == ["$[0].aspect.privileges[1]"]


async def test_explain_names_what_allowed_and_why_not(app, client, anonymous):
    policy = await grant(client, "taggers", actors={"users": [ALICE]}, resources=platform_filter("hive"))
    alice = await bearer(app, "reader", ALICE)

    allowed = await anonymous.get(
        "/openapi/v1/authz/explain", params={"privilege": "EDIT_ENTITY_TAGS", "resource": HIVE}, headers=alice
    )
    assert allowed.status_code == 200
    assert allowed.json()["allowed"] is True and allowed.json()["grantedBy"] == policy
    denied = await anonymous.get(
        "/openapi/v1/authz/explain", params={"privilege": "EDIT_ENTITY_TAGS", "resource": SNOW}, headers=alice
    )
    assert denied.json()["allowed"] is False
    assert "PLATFORM EQUALS" in denied.json()["reason"]
    # the 403 of the same write carries the same reason
    refused = await tag(anonymous, alice, SNOW)
    assert refused.json()["issues"][0]["message"] == denied.json()["reason"]

    about_bob = {"privilege": "EDIT_ENTITY_TAGS", "resource": HIVE, "actor": BOB}
    assert (await anonymous.get("/openapi/v1/authz/explain", params=about_bob, headers=alice)).status_code == 403
    by_admin = await client.get("/openapi/v1/authz/explain", params=about_bob)
    assert by_admin.json()["allowed"] is False and "users [urn:li:corpuser:alice]" in by_admin.json()["reason"]
    unknown = await client.get("/openapi/v1/authz/explain", params={"privilege": "FLY"})
    assert unknown.status_code == 400 and unknown.json()["issues"][0]["path"] == "$.query.privilege"


async def test_explain_does_not_say_whether_a_resource_exists(app, client, anonymous):
    await grant(client, "taggers", actors={"users": [ALICE]}, resources=platform_filter("snowflake"))
    alice = await bearer(app, "reader", ALICE)
    await propose(client, mcp("status", {"removed": False}, HIVE))
    never = ds("access.never_written", "hive")
    answers = [
        (
            await anonymous.get(
                "/openapi/v1/authz/explain", params={"privilege": "EDIT_ENTITY_TAGS", "resource": urn}, headers=alice
            )
        ).json()["reason"]
        for urn in (HIVE, never)
    ]
    assert answers[0] == answers[1]


PLATFORM_ROUTES = [  # each platform route, and the privilege a PLATFORM policy grants for it
    ("MANAGE_ACCESS_TOKENS", "GET", "/openapi/v1/auth/tokens"),
    ("MANAGE_POLICIES", "GET", "/openapi/v1/auth/policies"),
    ("MANAGE_INGESTION", "POST", "/runs?action=list"),
    ("MANAGE_SYSTEM_OPERATIONS", "GET", "/openapi/v1/audit/verify"),
    ("MANAGE_SYSTEM_OPERATIONS", "GET", f"/openapi/v1/audit?actor={BOB}"),
]


@pytest.mark.parametrize(("privilege", "method", "path"), PLATFORM_ROUTES)
async def test_a_platform_policy_opens_its_routes_to_a_reader(app, client, anonymous, privilege, method, path):
    alice = await bearer(app, "reader", ALICE)
    body = {} if method == "POST" else None
    refused = await anonymous.request(method, path, json=body, headers=alice)
    assert refused.status_code == 403
    assert privilege in refused.json()["message"]
    await grant(client, "platform", type="PLATFORM", privileges=[privilege], actors={"users": [ALICE]})
    other = "MANAGE_TESTS"  # a policy for another privilege opens nothing
    await grant(client, "other", type="PLATFORM", privileges=[other], actors={"users": [BOB]})
    allowed = await anonymous.request(method, path, json=body, headers=alice)
    assert allowed.status_code == 200, allowed.text
