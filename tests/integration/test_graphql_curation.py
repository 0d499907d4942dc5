"""DataHub's curation mutations over HTTP (app/graphql/curation.py), each sent as mcp-server-datahub 0.8.0 sends it
(its tools' operation text, verbatim): the change read back through the v3 entity API, then undone by the remove
mutation; field-level tags, terms and descriptions (editableSchemaMetadata); idempotency (nothing is written twice);
unknown resources, fields and labels refused naming them; a reader's token refused naming the permission; the change
log naming the actor."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import pytest

from tests.helpers import bearer, ds, mcp, propose, wait_sequenced

pytestmark = pytest.mark.asyncio

# mcp_server_datahub 0.8.0: tools/tags.py, terms.py, owners.py, domains.py, descriptions.py, structured_properties.py
BATCH_ADD_TAGS = """
            mutation batchAddTags($input: BatchAddTagsInput!) {
                batchAddTags(input: $input)
            }
        """
BATCH_REMOVE_TAGS = """
            mutation batchRemoveTags($input: BatchRemoveTagsInput!) {
                batchRemoveTags(input: $input)
            }
        """
BATCH_ADD_TERMS = """
            mutation batchAddTerms($input: BatchAddTermsInput!) {
                batchAddTerms(input: $input)
            }
        """
BATCH_REMOVE_TERMS = """
            mutation batchRemoveTerms($input: BatchRemoveTermsInput!) {
                batchRemoveTerms(input: $input)
            }
        """
BATCH_ADD_OWNERS = """
            mutation batchAddOwners($input: BatchAddOwnersInput!) {
                batchAddOwners(input: $input)
            }
        """
BATCH_REMOVE_OWNERS = """
            mutation batchRemoveOwners($input: BatchRemoveOwnersInput!) {
                batchRemoveOwners(input: $input)
            }
        """
LIST_OWNERSHIP_TYPES = """
        query listOwnershipTypes($input: ListOwnershipTypesInput!) {
            listOwnershipTypes(input: $input) {
                ownershipTypes {
                    urn
                    info {
                        name
                    }
                }
            }
        }
    """
BATCH_SET_DOMAIN = """
        mutation batchSetDomain($input: BatchSetDomainInput!) {
            batchSetDomain(input: $input)
        }
    """
UPDATE_DESCRIPTION = """
        mutation updateDescription($input: DescriptionUpdateInput!) {
            updateDescription(input: $input)
        }
    """
UPSERT_STRUCTURED_PROPERTIES = """
        mutation upsertStructuredProperties($input: UpsertStructuredPropertiesInput!) {
            upsertStructuredProperties(input: $input) {
                properties {
                    structuredProperty {
                        urn
                    }
                }
            }
        }
    """
REMOVE_STRUCTURED_PROPERTIES = """
        mutation removeStructuredProperties($input: RemoveStructuredPropertiesInput!) {
            removeStructuredProperties(input: $input) {
                properties {
                    structuredProperty {
                        urn
                    }
                }
            }
        }
    """

PII, GOLD = "urn:li:tag:pii", "urn:li:tag:gold"
TERM = "urn:li:glossaryTerm:Classification.Sensitive"
ALICE, ENG = "urn:li:corpuser:alice", "urn:li:corpGroup:eng"
TECHNICAL = "urn:li:ownershipType:__system__technical_owner"
FINANCE = "urn:li:domain:finance"
TIER = "urn:li:structuredProperty:io.acryl.tier"


async def gql(client, query: str, variables: dict[str, Any], operation: str, **kw: Any) -> dict[str, Any]:
    body = {"query": query, "variables": variables, "operationName": operation}
    response = await client.post("/api/graphql", json=body, **kw)
    assert response.status_code == 200, response.text
    return response.json()


async def aspect(client, urn: str, name: str, entity: str = "dataset") -> Any:
    response = await client.get(f"/openapi/v3/entity/{entity}/{quote(urn, safe='')}/{name}")
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    return response.json()["value"]


def field(path: str) -> dict[str, Any]:
    return {"fieldPath": path, "nativeDataType": "string", "type": {"type": {"com.linkedin.schema.StringType": {}}}}


async def world(client, name: str) -> str:
    """A dataset with two fields, and the tags, term, owners, domain and structured property the tools name."""
    urn = ds(name)
    schema = {
        "schemaName": name,
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.OtherSchema": {"rawSchema": ""}},
        "fields": [field("id"), field("email")],
    }
    await propose(
        client,
        mcp("datasetProperties", {"name": name, "description": "from ingestion", "customProperties": {}}, urn=urn),
        mcp("schemaMetadata", schema, urn=urn),
        mcp("tagProperties", {"name": "PII"}, urn=PII, entity="tag"),
        mcp("tagProperties", {"name": "Gold"}, urn=GOLD, entity="tag"),
        mcp("glossaryTermInfo", {"definition": "sensitive", "termSource": "INTERNAL"}, urn=TERM, entity="glossaryTerm"),
        mcp("corpUserInfo", {"active": True, "displayName": "Alice"}, urn=ALICE, entity="corpuser"),
        mcp("corpGroupInfo", {"admins": [], "members": [], "groups": []}, urn=ENG, entity="corpGroup"),
        mcp("domainProperties", {"name": "Finance"}, urn=FINANCE, entity="domain"),
        mcp(
            "propertyDefinition",
            {
                "qualifiedName": "io.acryl.tier",
                "valueType": "urn:li:dataType:datahub.string",
                "entityTypes": ["urn:li:entityType:datahub.dataset"],
                "allowedValues": [{"value": {"string": "gold"}}, {"value": {"string": "silver"}}],
            },
            urn=TIER,
            entity="structuredProperty",
        ),
    )
    return urn


def resources(*urns: str) -> list[dict[str, Any]]:
    return [{"resourceUrn": urn} for urn in urns]


async def versions(client, urn: str, name: str) -> int:
    """How many versions of the aspect were written (its systemMetadata's version)."""
    response = await client.get(f"/openapi/v3/entity/dataset/{quote(urn, safe='')}/{name}?systemMetadata=true")
    assert response.status_code == 200, response.text
    return int(response.json()["systemMetadata"]["version"])


async def test_tags_terms_owners_domain_round_trip(app, client, db):
    writer = await bearer(app, "writer", actor="urn:li:corpuser:curator")
    urn = await world(client, "curated")
    other = ds("curated_too")
    await propose(client, mcp("datasetProperties", {"name": "curated_too", "customProperties": {}}, urn=other))

    # tags, on two datasets in one mutation; again: nothing changes
    add = {"input": {"tagUrns": [PII, GOLD], "resources": resources(urn, other)}}
    assert await gql(client, BATCH_ADD_TAGS, add, "batchAddTags", headers=writer) == {"data": {"batchAddTags": True}}
    assert await aspect(client, urn, "globalTags") == {"tags": [{"tag": PII}, {"tag": GOLD}]}
    assert await aspect(client, other, "globalTags") == {"tags": [{"tag": PII}, {"tag": GOLD}]}
    written = await versions(client, urn, "globalTags")
    assert await gql(client, BATCH_ADD_TAGS, add, "batchAddTags", headers=writer) == {"data": {"batchAddTags": True}}
    assert await versions(client, urn, "globalTags") == written  # idempotent: no new version
    remove = {"input": {"tagUrns": [PII], "resources": resources(urn, other)}}
    assert await gql(client, BATCH_REMOVE_TAGS, remove, "batchRemoveTags", headers=writer) == {
        "data": {"batchRemoveTags": True}
    }
    assert await aspect(client, urn, "globalTags") == {"tags": [{"tag": GOLD}]}
    assert await aspect(client, other, "globalTags") == {"tags": [{"tag": GOLD}]}

    # the change log names the actor of the token (the feed holds a change log once the sequencer has placed it)
    await wait_sequenced(db)
    feed = (await client.get("/openapi/v1/events/mcl", params={"limit": 1000})).json()
    tagged = [e for e in feed["events"] if e["urn"] == urn and e["aspect"] == "globalTags"]
    assert tagged and all(e["mcl"]["created"]["actor"] == "urn:li:corpuser:curator" for e in tagged)

    # terms
    terms = {"input": {"termUrns": [TERM], "resources": resources(urn)}}
    assert await gql(client, BATCH_ADD_TERMS, terms, "batchAddTerms", headers=writer) == {
        "data": {"batchAddTerms": True}
    }
    stored = await aspect(client, urn, "glossaryTerms")
    assert stored["terms"] == [{"urn": TERM}]
    assert stored["auditStamp"]["actor"] == "urn:li:corpuser:curator"
    assert await gql(client, BATCH_REMOVE_TERMS, terms, "batchRemoveTerms", headers=writer) == {
        "data": {"batchRemoveTerms": True}
    }
    assert (await aspect(client, urn, "glossaryTerms"))["terms"] == []

    # owners: the ownership type as the tool looks it up by name, then the owners with it
    listed = await gql(
        client,
        LIST_OWNERSHIP_TYPES,
        {"input": {"start": 0, "count": 1000, "query": "Technical Owner"}},
        "listOwnershipTypes",
        headers=writer,
    )
    assert listed == {
        "data": {"listOwnershipTypes": {"ownershipTypes": [{"urn": TECHNICAL, "info": {"name": "Technical Owner"}}]}}
    }
    owners = [
        {"ownerUrn": ALICE, "ownerEntityType": "CORP_USER", "ownershipTypeUrn": TECHNICAL},
        {"ownerUrn": ENG, "ownerEntityType": "CORP_GROUP", "ownershipTypeUrn": TECHNICAL},
    ]
    add_owners = {"input": {"owners": owners, "resources": resources(urn), "ownershipTypeUrn": TECHNICAL}}
    for _ in range(2):  # the second: no change
        assert await gql(client, BATCH_ADD_OWNERS, add_owners, "batchAddOwners", headers=writer) == {
            "data": {"batchAddOwners": True}
        }
    stored = await aspect(client, urn, "ownership")
    assert [(o["owner"], o["type"], o["typeUrn"]) for o in stored["owners"]] == [
        (ALICE, "TECHNICAL_OWNER", TECHNICAL),
        (ENG, "TECHNICAL_OWNER", TECHNICAL),
    ]
    remove_owners = {"input": {"ownerUrns": [ALICE], "resources": resources(urn), "ownershipTypeUrn": TECHNICAL}}
    assert await gql(client, BATCH_REMOVE_OWNERS, remove_owners, "batchRemoveOwners", headers=writer) == {
        "data": {"batchRemoveOwners": True}
    }
    assert [o["owner"] for o in (await aspect(client, urn, "ownership"))["owners"]] == [ENG]

    # the owners read back through GraphQL as get_entities reads them
    read = await client.post(
        "/api/graphql",
        json={
            "query": "query($u: String!) { dataset(urn: $u) { ownership { owners { owner { ... on CorpGroup { urn } }"
            " ownershipType { urn info { name } } } } } }",
            "variables": {"u": urn},
        },
    )
    assert read.json()["data"]["dataset"]["ownership"]["owners"] == [
        {"owner": {"urn": ENG}, "ownershipType": {"urn": TECHNICAL, "info": {"name": "Technical Owner"}}}
    ]

    # domain: set, then unset (a null domainUrn)
    domain = {"input": {"domainUrn": FINANCE, "resources": resources(urn)}}
    assert await gql(client, BATCH_SET_DOMAIN, domain, "batchSetDomain", headers=writer) == {
        "data": {"batchSetDomain": True}
    }
    assert await aspect(client, urn, "domains") == {"domains": [FINANCE]}
    unset = {"input": {"domainUrn": None, "resources": resources(urn)}}
    assert await gql(client, BATCH_SET_DOMAIN, unset, "batchSetDomain", headers=writer) == {
        "data": {"batchSetDomain": True}
    }
    assert await aspect(client, urn, "domains") == {"domains": []}


async def test_field_level_tags_terms_and_descriptions(app, client):
    writer = await bearer(app, "writer")
    urn = await world(client, "fields")
    email = {"resourceUrn": urn, "subResourceType": "DATASET_FIELD", "subResource": "email"}
    tags = {"input": {"tagUrns": [PII], "resources": [email]}}
    assert await gql(client, BATCH_ADD_TAGS, tags, "batchAddTags", headers=writer) == {"data": {"batchAddTags": True}}
    terms = {"input": {"termUrns": [TERM], "resources": [email]}}
    assert await gql(client, BATCH_ADD_TERMS, terms, "batchAddTerms", headers=writer) == {
        "data": {"batchAddTerms": True}
    }
    described = {"input": {"description": "the customer's address", **email}}
    assert await gql(client, UPDATE_DESCRIPTION, described, "updateDescription", headers=writer) == {
        "data": {"updateDescription": True}
    }
    (info,) = (await aspect(client, urn, "editableSchemaMetadata"))["editableSchemaFieldInfo"]
    assert info["fieldPath"] == "email"
    assert info["globalTags"] == {"tags": [{"tag": PII}]}
    assert info["glossaryTerms"]["terms"] == [{"urn": TERM}]
    assert info["description"] == "the customer's address"
    assert await aspect(client, urn, "globalTags") is None  # the entity's own tags are untouched

    assert await gql(client, BATCH_REMOVE_TAGS, tags, "batchRemoveTags", headers=writer) == {
        "data": {"batchRemoveTags": True}
    }
    (info,) = (await aspect(client, urn, "editableSchemaMetadata"))["editableSchemaFieldInfo"]
    assert info["globalTags"] == {"tags": []}

    # the entity's description: its editable properties (the ingested one stays)
    entity = {"input": {"description": "curated", "resourceUrn": urn}}
    assert await gql(client, UPDATE_DESCRIPTION, entity, "updateDescription", headers=writer) == {
        "data": {"updateDescription": True}
    }
    assert (await aspect(client, urn, "editableDatasetProperties"))["description"] == "curated"
    assert (await aspect(client, urn, "datasetProperties"))["description"] == "from ingestion"
    stored = await aspect(client, urn, "editableDatasetProperties")
    assert stored["lastModified"]["actor"] == stored["created"]["actor"] == "urn:li:corpuser:datahub"

    # other entity types: where DataHub's DescriptionUtils writes them (a tag's properties, a term's definition)
    for resource, entity, name, key in (
        (PII, "tag", "tagProperties", "description"),
        (TERM, "glossaryTerm", "glossaryTermInfo", "definition"),
    ):
        changed = {"input": {"description": f"about {entity}", "resourceUrn": resource}}
        assert await gql(client, UPDATE_DESCRIPTION, changed, "updateDescription", headers=writer) == {
            "data": {"updateDescription": True}
        }
        stored = await aspect(client, resource, name, entity)
        assert stored[key] == f"about {entity}"
    assert (await aspect(client, PII, "tagProperties", "tag"))["name"] == "PII"  # the rest of the aspect stays

    # a field the schema does not have
    missing = {"input": {"tagUrns": [PII], "resources": [{**email, "subResource": "nope"}]}}
    refused = await gql(client, BATCH_ADD_TAGS, missing, "batchAddTags", headers=writer)
    assert refused["data"] == {"batchAddTags": None}
    assert "Field nope does not exist" in refused["errors"][0]["message"]


async def test_structured_properties_upsert_and_remove(app, client):
    writer = await bearer(app, "writer")
    urn = await world(client, "tiered")
    upsert = {
        "input": {
            "assetUrn": urn,
            "structuredPropertyInputParams": [{"structuredPropertyUrn": TIER, "values": [{"stringValue": "gold"}]}],
        }
    }
    body = await gql(client, UPSERT_STRUCTURED_PROPERTIES, upsert, "upsertStructuredProperties", headers=writer)
    assert body == {"data": {"upsertStructuredProperties": {"properties": [{"structuredProperty": {"urn": TIER}}]}}}
    (assigned,) = (await aspect(client, urn, "structuredProperties"))["properties"]
    assert assigned["propertyUrn"] == TIER and assigned["values"] == [{"string": "gold"}]

    # a value the definition does not allow: the gateway's validation refuses it
    bad = {
        "input": {
            **upsert["input"],
            "structuredPropertyInputParams": [{"structuredPropertyUrn": TIER, "values": [{"stringValue": "bronze"}]}],
        }
    }
    refused = await gql(client, UPSERT_STRUCTURED_PROPERTIES, bad, "upsertStructuredProperties", headers=writer)
    assert refused.get("errors") and refused["data"] is None
    assert (await aspect(client, urn, "structuredProperties"))["properties"][0]["values"] == [{"string": "gold"}]

    remove = {"input": {"assetUrn": urn, "structuredPropertyUrns": [TIER]}}
    body = await gql(client, REMOVE_STRUCTURED_PROPERTIES, remove, "removeStructuredProperties", headers=writer)
    assert body == {"data": {"removeStructuredProperties": {"properties": []}}}
    assert (await aspect(client, urn, "structuredProperties"))["properties"] == []


async def test_refusals_name_why(app, client):
    reader, writer = await bearer(app, "reader"), await bearer(app, "writer")
    urn = await world(client, "guarded")
    add = {"input": {"tagUrns": [PII], "resources": resources(urn)}}
    refused = await gql(client, BATCH_ADD_TAGS, add, "batchAddTags", headers=reader)
    assert refused["data"] == {"batchAddTags": None}
    assert refused["errors"][0]["extensions"]["code"] == 403
    assert "needs the WRITE permission" in refused["errors"][0]["message"]
    described = {"input": {"description": "x", "resourceUrn": urn}}
    refused = await gql(client, UPDATE_DESCRIPTION, described, "updateDescription", headers=reader)
    assert refused["errors"][0]["extensions"]["code"] == 403
    assert await aspect(client, urn, "globalTags") is None

    unknown_tag = {"input": {"tagUrns": ["urn:li:tag:nope"], "resources": resources(urn)}}
    refused = await gql(client, BATCH_ADD_TAGS, unknown_tag, "batchAddTags", headers=writer)
    assert "urn:li:tag:nope does not exist" in refused["errors"][0]["message"]
    unknown_urn = {"input": {"tagUrns": [PII], "resources": resources(ds("never_written"))}}
    refused = await gql(client, BATCH_ADD_TAGS, unknown_urn, "batchAddTags", headers=writer)
    assert "Entity does not exist" in refused["errors"][0]["message"]
    not_a_tag = {"input": {"tagUrns": [TERM], "resources": resources(urn)}}
    refused = await gql(client, BATCH_ADD_TAGS, not_a_tag, "batchAddTags", headers=writer)
    assert "is not a tag urn" in refused["errors"][0]["message"]
    owner = {
        "input": {
            "owners": [{"ownerUrn": "urn:li:corpuser:ghost", "ownerEntityType": "CORP_USER"}],
            "resources": resources(urn),
        }
    }
    refused = await gql(client, BATCH_ADD_OWNERS, owner, "batchAddOwners", headers=writer)
    assert "urn:li:corpuser:ghost does not exist" in refused["errors"][0]["message"]
    domain = {"input": {"domainUrn": "urn:li:domain:nope", "resources": resources(urn)}}
    refused = await gql(client, BATCH_SET_DOMAIN, domain, "batchSetDomain", headers=writer)
    assert "urn:li:domain:nope does not exist" in refused["errors"][0]["message"]
    # removing what is not there: nothing to do, nothing written
    remove = {"input": {"tagUrns": [GOLD], "resources": resources(urn)}}
    assert await gql(client, BATCH_REMOVE_TAGS, remove, "batchRemoveTags", headers=writer) == {
        "data": {"batchRemoveTags": True}
    }
    assert await aspect(client, urn, "globalTags") is None
    # nothing was written by any refusal
    assert await aspect(client, urn, "ownership") is None and await aspect(client, urn, "domains") is None


async def test_concurrent_curations_of_one_aspect_lose_nothing(app, client):
    """Each mutation writes on the version it read (If-Version-Match) and reads again when another came between: the
    tags of eight concurrent batchAddTags all end up in globalTags (an unconditional read-modify-write keeps only
    some, each overwriting what the others added)."""
    writer = await bearer(app, "writer", actor="urn:li:corpuser:curator")
    urn = await world(client, "raced")
    tags = [f"urn:li:tag:race{i}" for i in range(8)]
    await propose(
        client, *(mcp("tagProperties", {"name": tag.rsplit(":", 1)[1]}, urn=tag, entity="tag") for tag in tags)
    )

    async def add(tag: str) -> dict[str, Any]:
        variables = {"input": {"tagUrns": [tag], "resources": resources(urn)}}
        return await gql(client, BATCH_ADD_TAGS, variables, "batchAddTags", headers=writer)

    answers = await asyncio.gather(*(add(tag) for tag in tags))
    assert answers == [{"data": {"batchAddTags": True}}] * len(tags)
    assert sorted(t["tag"] for t in (await aspect(client, urn, "globalTags"))["tags"]) == sorted(tags)
    assert await versions(client, urn, "globalTags") == len(tags)  # one version per mutation, none overwritten


async def test_list_ownership_types_finds_custom_types_by_name(app, client):
    """The MCP server's add_owners looks a type given by name up here: a custom ownershipType written like any entity
    is found by the words of its name, beside DataHub's system types; a system type that was written is listed once."""
    stamp = {"time": 1, "actor": "urn:li:corpuser:datahub"}
    custodian, steward = "urn:li:ownershipType:custodian", "urn:li:ownershipType:__system__data_steward"
    await propose(
        client,
        mcp(
            "ownershipTypeInfo",
            {"name": "Data Custodian", "created": stamp, "lastModified": stamp},
            urn=custodian,
            entity="ownershipType",
            sync=True,
        ),
        mcp(
            "ownershipTypeInfo",
            {"name": "Data Steward", "created": stamp, "lastModified": stamp},
            urn=steward,
            entity="ownershipType",
            sync=True,
        ),
    )

    async def listed(query: str) -> list[str]:
        variables = {"input": {"start": 0, "count": 100, "query": query}}
        answer = await gql(client, LIST_OWNERSHIP_TYPES, variables, "listOwnershipTypes")
        return [t["urn"] for t in answer["data"]["listOwnershipTypes"]["ownershipTypes"]]

    assert await listed("Custodian") == [custodian]
    assert await listed("Steward") == [steward]  # written: found by the search, not listed again as a system type
    assert await listed("Technical Owner") == ["urn:li:ownershipType:__system__technical_owner"]
    everything = await listed("*")
    assert set(everything) >= {custodian, steward, "urn:li:ownershipType:__system__business_owner"}
    assert len(everything) == len(set(everything))
