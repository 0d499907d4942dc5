"""DataHub's real Python client (acryl-datahub, its own virtualenv: tests/client/conftest.py) managing access policies
on a metaledger process: `DataHubGraph.execute_graphql` creates, lists and deletes a policy with the operations
DataHub's UI sends, and a policy the SDK emits as an MCP (`DataHubPolicyInfoClass` through `graph.emit_mcp`) is
listed by listPolicies at once."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.client.conftest import DataHubClient, Metaledger, _client_env, _ensure_client_venv, metaledger_process

pytestmark = pytest.mark.client

# Run in the client venv: each step's answer printed as one JSON line `STEP <name> <json>`.
SCRIPT = """
import json

from datahub.emitter.mcp import MetadataChangeProposalWrapper
from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
from datahub.metadata.schema_classes import (
    DataHubActorFilterClass,
    DataHubPolicyInfoClass,
    DataHubResourceFilterClass,
    PolicyMatchCriterionClass,
    PolicyMatchFilterClass,
)

CREATE = "mutation createPolicy($input: PolicyUpdateInput!) { createPolicy(input: $input) }"
DELETE = "mutation deletePolicy($urn: String!) { deletePolicy(urn: $urn) }"
LIST = '''query listPolicies($input: ListPoliciesInput!) {
    listPolicies(input: $input) {
        start count total
        policies { urn type name state description privileges editable
            actors { users groups allUsers allGroups resourceOwners }
            resources { filter { criteria { field condition values { value } } } } }
    }
}'''


def step(name, value):
    print("STEP", name, json.dumps(value))


graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
created = graph.execute_graphql(CREATE, variables={"input": POLICY})
step("created", created)
step("listed", graph.execute_graphql(LIST, variables={"input": {"start": 0, "count": 20, "query": ""}}))

graph.emit_mcp(
    MetadataChangeProposalWrapper(
        entityUrn=EMITTED,
        aspect=DataHubPolicyInfoClass(
            displayName="Emitted by the SDK",
            description="written as an MCP",
            type="METADATA",
            state="ACTIVE",
            privileges=["EDIT_ENTITY_DOCS"],
            actors=DataHubActorFilterClass(groups=["urn:li:corpGroup:writers"]),
            resources=DataHubResourceFilterClass(
                filter=PolicyMatchFilterClass(
                    criteria=[PolicyMatchCriterionClass(field="TYPE", values=["dataset"], condition="EQUALS")]
                )
            ),
        ),
    )
)
step("emitted", graph.execute_graphql(LIST, variables={"input": {"query": "sdk"}}))
step("deleted", graph.execute_graphql(DELETE, variables={"urn": created["createPolicy"]}))
step("after", graph.execute_graphql(LIST, variables={"input": {}}))
"""
POLICY = {
    "type": "METADATA",
    "name": "Docs editors",
    "state": "ACTIVE",
    "description": "may edit documentation",
    "resources": {"filter": {"criteria": [{"field": "TYPE", "values": ["dataset"], "condition": "EQUALS"}]}},
    "privileges": ["EDIT_ENTITY_DOCS"],
    "actors": {
        "users": ["urn:li:corpuser:alice"],
        "resourceOwners": False,
        "allUsers": False,
        "allGroups": False,
    },
}
EMITTED = "urn:li:dataHubPolicy:emitted-by-sdk"


@pytest.fixture(scope="module")
def service(make_database: Callable[..., str], migrated_template: str) -> Iterator[Metaledger]:
    yield from metaledger_process(make_database(template=migrated_template))  # its own: the policies are all listed


@pytest.fixture(scope="module")
def datahub(service: Metaledger, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataHubClient]:
    python = _ensure_client_venv()
    home = tmp_path_factory.mktemp("datahub-policies-home")
    client = DataHubClient(python, _client_env(python, home, service.url, service.token), home)
    yield client
    client.close()


def steps(output: str) -> dict[str, Any]:
    found = {}
    for line in output.splitlines():
        if line.startswith("STEP "):
            _, name, value = line.split(" ", 2)
            found[name] = json.loads(value)
    return found


def test_the_sdk_creates_lists_and_deletes_policies(datahub: DataHubClient, service: Metaledger):
    out = steps(datahub.script(SCRIPT, POLICY=POLICY, EMITTED=EMITTED).stdout)
    urn = out["created"]["createPolicy"]
    assert urn.startswith("urn:li:dataHubPolicy:")

    listed = out["listed"]["listPolicies"]
    assert (listed["start"], listed["count"], listed["total"]) == (0, 1, 1)
    assert listed["policies"] == [
        {
            "urn": urn,
            "type": "METADATA",
            "name": "Docs editors",
            "state": "ACTIVE",
            "description": "may edit documentation",
            "privileges": ["EDIT_ENTITY_DOCS"],
            "editable": True,
            "actors": {
                "users": ["urn:li:corpuser:alice"],
                "groups": None,
                "allUsers": False,
                "allGroups": False,
                "resourceOwners": False,
            },
            "resources": {
                "filter": {"criteria": [{"field": "TYPE", "condition": "EQUALS", "values": [{"value": "dataset"}]}]}
            },
        }
    ]

    # the MCP the SDK emitted is a policy like any other: found by the words of its name
    emitted = out["emitted"]["listPolicies"]
    assert emitted["total"] == 1
    [policy] = emitted["policies"]
    assert (policy["urn"], policy["name"], policy["actors"]["groups"]) == (
        EMITTED,
        "Emitted by the SDK",
        ["urn:li:corpGroup:writers"],
    )

    assert out["deleted"] == {"deletePolicy": urn}
    after = out["after"]["listPolicies"]
    assert [p["urn"] for p in after["policies"]] == [EMITTED] and after["total"] == 1
    with service.http() as http:  # gone from reads too
        assert http.get(f"/openapi/v3/entity/dataHubPolicy/{urn.replace(':', '%3A')}").status_code == 404
