"""The conformance table: one set of access policies, and every (actor, privilege, resource) asked on every write
surface — v1 proposals, the v3 entity routes, Rest.li's ingestProposal and ingestProposalBatch, GraphQL's
mutations and the web view's forms — must get the same decision, the one the table expects and the explain answer
gives. A write surface the table does not cover fails `test_every_write_surface_is_in_the_table`.

The expectations are written out by hand (which datasets each policy's filter selects), not computed by the code
under test."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from app.auth.model import Permission
from tests.helpers import RESTLI_HEADERS, ds, mcp, mint_token, policy_mcp, propose, restli_propose
from tests.integration.test_auth import routes_with_policies
from tests.web.browsing import csrf_of, page_url, sign_in

ALICE, BOB, CAROL, DAVE = (f"urn:li:corpuser:{name}" for name in ("alice", "bob", "carol", "dave"))
STEWARDS = "urn:li:corpGroup:stewards"
PII, FINANCE = "urn:li:tag:pii", "urn:li:domain:finance"
NOBODY = "urn:li:corpuser:nobody"  # an owner the GraphQL and web surfaces add: no policy or actor is about it
H1, H2, S1 = ds("conformance.a", "hive"), ds("conformance.b", "hive"), ds("conformance.c", "snowflake")
TAGS, DOCS, OWNERS = "EDIT_ENTITY_TAGS", "EDIT_ENTITY_DOCS", "EDIT_ENTITY_OWNERS"
TECHNICAL = "urn:li:ownershipType:__system__technical_owner"

# the seeded facts: tags, domain, owners of each dataset
SEEDED = {
    H1: {"tags": [PII], "domain": FINANCE, "owners": [ALICE]},
    H2: {"tags": [], "domain": None, "owners": [BOB]},
    S1: {"tags": [PII], "domain": FINANCE, "owners": [STEWARDS]},
}


def _criteria(field: str, values: list[str], condition: str = "EQUALS") -> dict[str, Any]:
    return {"filter": {"criteria": [{"field": field, "values": values, "condition": condition}]}}


POLICIES = {
    "alice-tags-hive": ({"users": [ALICE]}, [TAGS], _criteria("PLATFORM", ["urn:li:dataPlatform:hive"]), "ACTIVE"),
    "stewards-docs-pii": ({"groups": [STEWARDS]}, [DOCS], _criteria("TAG", [PII]), "ACTIVE"),
    "owners-edit-owners": ({"resourceOwners": True}, [OWNERS], None, "ACTIVE"),
    "everyone-tags-finance": ({"allUsers": True}, [TAGS], _criteria("DOMAIN", [FINANCE]), "INACTIVE"),
    "bob-everything-on-s1": ({"users": [BOB]}, ["EDIT_ENTITY"], _criteria("URN", [S1]), "ACTIVE"),
    "stewards-tags-not-hive": (
        {"groups": [STEWARDS]},
        [TAGS],
        _criteria("PLATFORM", ["urn:li:dataPlatform:hive"], "NOT_EQUALS"),
        "ACTIVE",
    ),
}

# What the policies above grant, by hand: (actor, privilege, dataset)
ALLOWED = {
    (ALICE, TAGS, H1),  # alice-tags-hive
    (ALICE, TAGS, H2),
    (ALICE, OWNERS, H1),  # owners-edit-owners: alice owns H1
    (BOB, OWNERS, H2),  # bob owns H2
    (BOB, TAGS, S1),  # bob-everything-on-s1 (EDIT_ENTITY covers each edit)
    (BOB, DOCS, S1),
    (BOB, OWNERS, S1),
    (CAROL, DOCS, H1),  # stewards-docs-pii: H1 and S1 carry pii
    (CAROL, DOCS, S1),
    (CAROL, OWNERS, S1),  # owners-edit-owners: her group owns S1
    (CAROL, TAGS, S1),  # stewards-tags-not-hive
}
ACTORS, PRIVILEGES, DATASETS = (ALICE, BOB, CAROL, DAVE), (TAGS, DOCS, OWNERS), (H1, H2, S1)
CASES = list(itertools.product(ACTORS, PRIVILEGES, DATASETS))


def _tags(urn: str) -> dict[str, Any]:
    return {"tags": [{"tag": tag} for tag in SEEDED[urn]["tags"]]}


def _owners(urn: str) -> dict[str, Any]:
    return {"owners": [{"owner": owner, "type": "DATAOWNER"} for owner in SEEDED[urn]["owners"]]}


def aspect_of(privilege: str, urn: str) -> tuple[str, dict[str, Any]]:
    """The aspect a write needing `privilege` writes, with a value that leaves the policies' facts as seeded."""
    if privilege == TAGS:
        return "globalTags", _tags(urn)
    if privilege == OWNERS:
        return "ownership", _owners(urn)
    return "editableDatasetProperties", {"description": "conformance"}


Surface = Callable[[Any, str, str, str], Awaitable[int]]  # (the actor's clients, actor, privilege, urn) → status


async def v1_proposals(clients, actor, privilege, urn) -> int:
    aspect, value = aspect_of(privilege, urn)
    return (await clients.api.post("/openapi/v1/proposals", json=[mcp(aspect, value, urn)])).status_code


async def v3_entities(clients, actor, privilege, urn) -> int:
    aspect, value = aspect_of(privilege, urn)
    answer = await clients.api.post(
        "/openapi/v3/entity/dataset?async=false", json=[{"urn": urn, aspect: {"value": value}}]
    )
    return answer.status_code


async def v3_aspect(clients, actor, privilege, urn) -> int:
    aspect, value = aspect_of(privilege, urn)
    return (
        await clients.api.post(
            f"/openapi/v3/entity/dataset/{urn}/{aspect}?async=false&createIfNotExists=false", json={"value": value}
        )
    ).status_code


async def restli_one(clients, actor, privilege, urn) -> int:
    aspect, value = aspect_of(privilege, urn)
    return (await restli_propose(clients.api, mcp(aspect, value, urn, encode=True))).status_code


async def restli_batch(clients, actor, privilege, urn) -> int:
    aspect, value = aspect_of(privilege, urn)
    status = mcp("status", {"removed": False}, urn, encode=True)  # EDIT_ENTITY_STATUS: no one but admins here
    answer = await restli_propose(clients.api, mcp(aspect, value, urn, encode=True), status)
    return 200 if answer.status_code == 403 and _only_status_refused(answer.json()) else answer.status_code


def _only_status_refused(body: dict[str, Any]) -> bool:
    """A batch is refused whole; when only its status write is, the write under test was allowed."""
    return {issue.get("aspect") for issue in body.get("issues", [])} == {"status"}


GRAPHQL = {
    TAGS: (
        "mutation m($input: BatchAddTagsInput!) { batchAddTags(input: $input) }",
        lambda urn: {"tagUrns": ["urn:li:tag:conformance"], "resources": [{"resourceUrn": urn}]},
    ),
    DOCS: (
        "mutation m($input: DescriptionUpdateInput!) { updateDescription(input: $input) }",
        lambda urn: {"description": "conformance", "resourceUrn": urn},
    ),
    OWNERS: (
        "mutation m($input: BatchAddOwnersInput!) { batchAddOwners(input: $input) }",
        lambda urn: {
            "owners": [{"ownerUrn": NOBODY, "ownerEntityType": "CORP_USER", "ownershipTypeUrn": TECHNICAL}],
            "resources": [{"resourceUrn": urn}],
        },
    ),
}


async def graphql(clients, actor, privilege, urn) -> int:
    query, variables = GRAPHQL[privilege]
    answer = await clients.api.post("/api/graphql", json={"query": query, "variables": {"input": variables(urn)}})
    errors = answer.json().get("errors") or []
    if not errors:
        return 200
    return int(errors[0].get("extensions", {}).get("code", 500))


WEB_FORMS = {
    TAGS: ("/web/tags", {"op": "add", "tag": "urn:li:tag:conformance"}),
    DOCS: ("/web/description", {"description": "conformance"}),
    OWNERS: ("/web/owners", {"op": "add", "owner": NOBODY, "type": TECHNICAL}),
}


async def web(clients, actor, privilege, urn) -> int:
    path, form = WEB_FORMS[privilege]
    page = await clients.browser.get(page_url(urn, "Documentation"))
    answer = await clients.browser.post(path, data={"csrf_token": csrf_of(page.text), "urn": urn, **form})
    return 200 if answer.status_code == 303 else answer.status_code


SURFACES: dict[str, Surface] = {
    "v1 proposals": v1_proposals,
    "v3 entities": v3_entities,
    "v3 aspect": v3_aspect,
    "Rest.li ingestProposal": restli_one,
    "Rest.li ingestProposalBatch": restli_batch,
    "GraphQL": graphql,
    "web": web,
}
# Every route whose policy is WRITE, and the surface of the table that covers it (or why none needs to)
COVERED_ROUTES = {
    ("POST", "/openapi/v1/proposals"): "v1 proposals",
    ("POST", "/openapi/v3/entity/dataset"): "v3 entities",
    ("POST", "/openapi/v3/entity/dataset/{urn}/{aspectName}"): "v3 aspect",
    ("POST", "/web/tags"): "web",
    ("POST", "/web/description"): "web",
    ("POST", "/web/owners"): "web",
    ("POST", "/web/terms"): "web",  # the tags form's code (app.web.edits._edit_labels) with glossary terms
    ("POST", "/web/domain"): "web",
}
NOT_IN_THE_TABLE = {  # route → why the table need not ask it
    ("POST", "/settings/tokens"): "creates a token for the caller itself, not a write of metadata",
    ("PATCH", "/openapi/v3/entity/dataset"): "its drafts reach the same gateway decision as POST's (a PATCH draft)",
    ("PATCH", "/openapi/v3/entity/dataset/{urn}/{aspectName}"): "as above",
    ("DELETE", "/openapi/v3/entity/dataset/{urn}"): "DELETE_ENTITY: tests/integration/test_access_policies.py",
    ("DELETE", "/openapi/v3/entity/dataset/{urn}/{aspectName}"): "as the aspect's edit: a DELETE draft",
    (
        "POST",
        "/api/v1/lineage",
    ): "OpenLineage: test_openlineage below (its writes are many aspects of several entities)",
    ("POST", "/openapi/openlineage/api/v1/lineage"): "as above",
}


class Clients:
    def __init__(self, api: httpx.AsyncClient, browser: httpx.AsyncClient) -> None:
        self.api, self.browser = api, browser


@pytest.fixture
async def table(app, client):
    """The seeded catalog and policies, and each actor's clients (a reader's token; a signed-in browser)."""
    await propose(
        client,
        mcp("groupMembership", {"groups": [STEWARDS]}, CAROL, entity="corpuser"),
        mcp("corpUserKey", {"username": "nobody"}, NOBODY, entity="corpuser"),
        mcp("tagProperties", {"name": "conformance"}, "urn:li:tag:conformance", entity="tag"),
        mcp("tagProperties", {"name": "pii"}, PII, entity="tag"),
        mcp("domainProperties", {"name": "finance"}, FINANCE, entity="domain"),
        *(mcp("globalTags", _tags(urn), urn) for urn in DATASETS),
        *(mcp("ownership", _owners(urn), urn) for urn in DATASETS),
        *(mcp("domains", {"domains": [SEEDED[urn]["domain"]]}, urn) for urn in DATASETS if SEEDED[urn]["domain"]),
        *(
            policy_mcp(
                name,
                state=state,
                privileges=privileges,
                actors=actors,
                **({"resources": resources} if resources else {}),
            )
            for name, (actors, privileges, resources, state) in POLICIES.items()
        ),
    )
    clients = {}
    for actor in ACTORS:
        token = await mint_token(app, "reader", actor)
        api = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://metaledger",
            headers={**RESTLI_HEADERS, "Authorization": f"Bearer {token}"},
        )
        clients[actor] = Clients(api, await sign_in(app, "reader", actor))
    yield clients
    for pair in clients.values():
        await pair.api.aclose()
        await pair.browser.aclose()


@pytest.mark.parametrize("surface", list(SURFACES))
async def test_every_surface_decides_as_the_table_says(table, surface):
    wrong = []
    for actor, privilege, urn in CASES:
        status = await SURFACES[surface](table[actor], actor, privilege, urn)
        expected = (actor, privilege, urn) in ALLOWED
        if (status == 200) != expected or status not in (200, 403):
            wrong.append(f"{actor} {privilege} {urn}: {status}, expected {'allowed' if expected else 'denied'}")
    assert not wrong, f"{surface}: {len(wrong)} of {len(CASES)} cases\n" + "\n".join(wrong)


async def test_explain_gives_every_decision_of_the_table(table, client):
    for actor, privilege, urn in CASES:
        answer = await client.get(
            "/openapi/v1/authz/explain", params={"actor": actor, "privilege": privilege, "resource": urn}
        )
        assert answer.json()["allowed"] is ((actor, privilege, urn) in ALLOWED), (actor, privilege, urn, answer.text)


async def test_every_write_surface_is_in_the_table(app):
    writes = set()
    for method, path, permission in routes_with_policies(app):
        if permission is not Permission.WRITE:
            continue
        if path.startswith("/openapi/v3/entity/") and not path.startswith("/openapi/v3/entity/dataset"):
            continue  # one declaration per entity type: the dataset's stands for them all
        writes.add((method, path))
    uncovered = writes - set(COVERED_ROUTES) - set(NOT_IN_THE_TABLE)
    assert not uncovered, f"write routes the conformance table does not cover: {sorted(uncovered)}"
    assert set(COVERED_ROUTES.values()) <= set(SURFACES)


async def test_openlineage(app, client, anonymous):
    """An OpenLineage event maps to writes of the job, its flow and its datasets: each is decided as any write is (a
    policy for the spark platform's entities allows it; one for another platform, or for lineage alone, does not)."""
    from tests.integration.test_openlineage import PATH, orders, report, run_event

    event = run_event("COMPLETE", "0190b3a0-0000-7000-8000-000000000001", inputs=[orders()], outputs=[report()])
    alice = {"Authorization": f"Bearer {await mint_token(app, 'reader', ALICE)}"}
    assert (await anonymous.post(PATH, json=event, headers=alice)).status_code == 403
    for name, privileges in (("lineage-only", ["EDIT_LINEAGE"]), ("everything", ["EDIT_ENTITY"])):
        await propose(client, policy_mcp(name, privileges=privileges, actors={"users": [ALICE]}))
        answer = await anonymous.post(PATH, json=event, headers=alice)
        if name == "lineage-only":  # the job's and datasets' other aspects need EDIT_ENTITY
            assert answer.status_code == 403, answer.text
            assert "EDIT_ENTITY" in answer.text
        else:
            assert answer.status_code in (200, 201), answer.text
