"""DataHub's entity read model over GraphQL (issue 41 step 6, app.graphql.read_model): the fields mcp-server-datahub's
`GetEntity` selects that are read from aspects — `editableProperties`, `deprecation`, `structuredProperties` (with the
property's `definition` and `settings`), `subTypes`, `health` (empty: metaledger computes none), `ownership` on tags,
terms, nodes and domains, `GlossaryTerm.parentNodes`, `Domain.parentDomains`, `editableSchemaMetadata`, the schema
fields' own tags, terms and partitioning flag, `SchemaFieldEntity`, `viewProperties`, `displayProperties`,
`browsePathV2`. The selections are the MCP server's own (0.8.0, gql/entity_details.gql: its fragments verbatim);
data is written over HTTP as a client writes it. An entity the caller may not see is left out."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.client.conftest import MCP_REQUIREMENT, MCP_VENV, _ensure_venv
from tests.helpers import bearer, ds, mcp, propose

pytestmark = pytest.mark.asyncio

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
ALICE, BOB = "urn:li:corpuser:alice", "urn:li:corpuser:bob"
ORDERS = ds("rm.orders")
ORDERS_V2 = ds("rm.orders_v2")
TIER = "urn:li:structuredProperty:io.metaledger.tier"
STEWARD = "urn:li:structuredProperty:io.metaledger.steward"
PII, TAG_GOLD = "urn:li:tag:pii", "urn:li:tag:gold"
ROOT_NODE, NODE, TERM = "urn:li:glossaryNode:finance", "urn:li:glossaryNode:revenue", "urn:li:glossaryTerm:net"
PARENT_DOMAIN, DOMAIN = "urn:li:domain:company", "urn:li:domain:sales"
PRIVATE = "urn:li:dataHubView:alice_private"  # alice's PERSONAL view: bob may not see it

# mcp-server-datahub 0.8.0, gql/entity_details.gql: its fragments verbatim (the parts of GetEntity these fields are in)
FRAGMENTS = """
fragment displayPropertiesFields on DisplayProperties {
    icon {
        name
        style
        iconLibrary
        __typename
    }
    __typename
}

fragment parentNodesFields on ParentNodesResult {
    count
    nodes {
        urn
        properties {
            name
            __typename
        }
        displayProperties {
            ...displayPropertiesFields
            __typename
        }
        __typename
    }
    __typename
}

fragment parentDomainsFields on ParentDomainsResult {
    count
    domains {
        urn
        type
        ... on Domain {
            displayProperties {
                ...displayPropertiesFields
                __typename
            }
            properties {
                name
                description
                __typename
            }
            __typename
        }
        __typename
    }
    __typename
}

fragment deprecationFields on Deprecation {
    actor
    deprecated
    note
    decommissionTime
    actorEntity {
        urn
        type
        __typename
    }
    __typename
}

fragment entityHealth on Health {
    type
    status
    message
    causes
    __typename
}

fragment structuredPropertyFields on StructuredPropertyEntity {
    urn
    definition {
        displayName
        qualifiedName
    }
    __typename
}

fragment structuredPropertiesFields on StructuredPropertiesEntry {
    structuredProperty {
        ...structuredPropertyFields
    }
    values {
        ... on StringValue {
            stringValue
        }
        ... on NumberValue {
            numberValue
        }
    }
    valueEntities {
        urn
        type
    }
}

fragment globalTagsFields on GlobalTags {
    tags {
        tag {
            urn
            properties {
                name
                description
                __typename
            }
            __typename
        }
        __typename
    }
    __typename
}
"""

GET_ENTITY = (
    FRAGMENTS
    + """
query GetEntity($urn: String!) {
    entity(urn: $urn) {
        urn
        ... on Dataset {
            editableProperties {
                name
                description
            }
            structuredProperties {
                properties {
                    ...structuredPropertiesFields
                }
            }
            subTypes {
                typeNames
            }
            domain {
                domain {
                    urn
                    parentDomains {
                        ...parentDomainsFields
                    }
                }
            }
            deprecation {
                ...deprecationFields
            }
            health {
                ...entityHealth
            }
            glossaryTerms {
                terms {
                    term {
                        urn
                        ownership { owners { owner { ... on CorpUser { urn } } } }
                        parentNodes {
                            ...parentNodesFields
                        }
                    }
                }
            }
            schemaMetadata(version: 0) {
                fields {
                    fieldPath
                    isPartitioningKey
                    tags {
                        ...globalTagsFields
                    }
                    schemaFieldEntity {
                        urn
                        fieldPath
                        parent { urn type }
                        deprecation { deprecated note }
                    }
                }
            }
            editableSchemaMetadata {
                editableSchemaFieldInfo {
                    fieldPath
                    description
                    tags {
                        ...globalTagsFields
                    }
                    glossaryTerms {
                        terms { term { urn } }
                    }
                }
            }
            viewProperties {
                materialized
                logic
                language
            }
            browsePathV2 { path { name entity { urn } } }
        }
    }
}
"""
)

# tools/structured_properties.py's getStructuredProperty, in the fields it selects of the definition
GET_PROPERTY = """
query getStructuredProperty($urn: String!) {
  entity(urn: $urn) {
    ... on StructuredPropertyEntity {
      urn
      definition {
        qualifiedName displayName description cardinality immutable
        valueType { urn info { type qualifiedName displayName } }
        entityTypes { urn info { type qualifiedName } }
        allowedValues { value { ... on StringValue { stringValue } ... on NumberValue { numberValue } } description }
        created { time actor { urn } }
      }
      settings { isHidden showInSearchFilters showAsAssetBadge showInAssetSummary showInColumnsTable }
    }
  }
}"""


async def data(client, query: str, variables: dict[str, Any], **kw: Any) -> dict[str, Any]:
    response = await client.post("/api/graphql", json={"query": query, "variables": variables}, **kw)
    assert response.status_code == 200, response.text
    body = response.json()
    assert "errors" not in body, body
    return body["data"]


def schema_metadata() -> dict[str, Any]:
    return {
        "schemaName": "orders",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.OtherSchema": {"rawSchema": ""}},
        "fields": [
            {
                "fieldPath": "id",
                "nativeDataType": "int",
                "type": {"type": {"com.linkedin.schema.NumberType": {}}},
                "globalTags": {"tags": [{"tag": TAG_GOLD}]},
                "isPartitioningKey": True,
            },
            {
                "fieldPath": "email",
                "nativeDataType": "string",
                "type": {"type": {"com.linkedin.schema.StringType": {}}},
            },
        ],
    }


async def write(client) -> None:
    stamp = {"time": 1700000000000, "actor": ALICE}
    private_view = {
        "name": "private",
        "type": "PERSONAL",
        "definition": {"entityTypes": [], "filter": {"or": []}},
        "created": {"time": 1, "actor": ALICE},
        "lastModified": {"time": 1, "actor": ALICE},
    }
    await propose(
        client,
        mcp("dataHubViewInfo", private_view, urn=PRIVATE, entity="dataHubView"),
        mcp("corpUserInfo", {"active": True, "displayName": "Alice"}, urn=ALICE, entity="corpuser"),
        mcp("tagProperties", {"name": "PII", "description": "personal"}, urn=PII, entity="tag"),
        mcp("tagProperties", {"name": "Gold"}, urn=TAG_GOLD, entity="tag"),
        # glossary: net <- revenue <- finance; domains: sales <- company
        mcp("glossaryNodeInfo", {"definition": "money", "name": "Finance"}, urn=ROOT_NODE, entity="glossaryNode"),
        mcp(
            "glossaryNodeInfo",
            {"definition": "money in", "name": "Revenue", "parentNode": ROOT_NODE},
            urn=NODE,
            entity="glossaryNode",
        ),
        mcp(
            "displayProperties",
            {"colorHex": "#00ff00", "icon": {"iconLibrary": "MATERIAL", "name": "Paid", "style": "outlined"}},
            urn=NODE,
            entity="glossaryNode",
        ),
        mcp(
            "glossaryTermInfo",
            {"definition": "net revenue", "termSource": "INTERNAL", "parentNode": NODE},
            urn=TERM,
            entity="glossaryTerm",
        ),
        mcp(
            "ownership",
            {"owners": [{"owner": ALICE, "type": "TECHNICAL_OWNER"}], "lastModified": stamp},
            urn=TERM,
            entity="glossaryTerm",
        ),
        mcp("domainProperties", {"name": "Company"}, urn=PARENT_DOMAIN, entity="domain"),
        mcp(
            "domainProperties",
            {"name": "Sales", "description": "selling", "parentDomain": PARENT_DOMAIN},
            urn=DOMAIN,
            entity="domain",
        ),
        # the structured properties and their definitions
        mcp(
            "propertyDefinition",
            {
                "qualifiedName": "io.metaledger.tier",
                "displayName": "Tier",
                "description": "how good",
                "valueType": "urn:li:dataType:datahub.string",
                "cardinality": "SINGLE",
                "entityTypes": ["urn:li:entityType:datahub.dataset"],
                "allowedValues": [
                    {"value": {"string": "gold"}, "description": "the best"},
                    {"value": {"string": "silver"}},
                ],
                "created": stamp,
            },
            urn=TIER,
            entity="structuredProperty",
        ),
        mcp(
            "structuredPropertySettings",
            {"isHidden": False, "showInSearchFilters": True, "showAsAssetBadge": True},
            urn=TIER,
            entity="structuredProperty",
        ),
        mcp(
            "propertyDefinition",
            {
                "qualifiedName": "io.metaledger.steward",
                "valueType": "urn:li:dataType:datahub.urn",
                "cardinality": "MULTIPLE",
                "entityTypes": ["urn:li:entityType:datahub.dataset"],
            },
            urn=STEWARD,
            entity="structuredProperty",
        ),
        # the dataset
        mcp("datasetProperties", {"name": "orders", "description": "from the source"}, urn=ORDERS),
        mcp("editableDatasetProperties", {"description": "edited in the UI", "name": "Orders"}, urn=ORDERS),
        mcp(
            "deprecation",
            {"deprecated": True, "note": "use orders_v2", "actor": ALICE, "decommissionTime": 1800000000000},
            urn=ORDERS,
        ),
        mcp(
            "structuredProperties",
            {
                "properties": [
                    {"propertyUrn": TIER, "values": [{"string": "gold"}]},
                    {"propertyUrn": STEWARD, "values": [{"string": ALICE}, {"string": PRIVATE}]},
                ]
            },
            urn=ORDERS,
        ),
        mcp("subTypes", {"typeNames": ["View"]}, urn=ORDERS),
        mcp("domains", {"domains": [DOMAIN]}, urn=ORDERS),
        mcp("glossaryTerms", {"terms": [{"urn": TERM}], "auditStamp": stamp}, urn=ORDERS),
        mcp("schemaMetadata", schema_metadata(), urn=ORDERS),
        mcp(
            "editableSchemaMetadata",
            {
                "created": stamp,
                "lastModified": stamp,
                "editableSchemaFieldInfo": [
                    {
                        "fieldPath": "email",
                        "description": "the customer's address",
                        "globalTags": {"tags": [{"tag": PII}]},
                        "glossaryTerms": {"terms": [{"urn": TERM}], "auditStamp": stamp},
                    }
                ],
            },
            urn=ORDERS,
        ),
        mcp(
            "viewProperties",
            {"materialized": False, "viewLogic": "select * from raw.orders", "viewLanguage": "SQL"},
            urn=ORDERS,
        ),
        mcp("browsePathsV2", {"path": [{"id": "prod"}, {"id": "Sales", "urn": DOMAIN}]}, urn=ORDERS),
        mcp(
            "deprecation",
            {"deprecated": True, "note": "gone", "actor": ALICE},
            urn=f"urn:li:schemaField:({ORDERS},email)",
            entity="schemaField",
        ),
        headers=SYNC,
    )


async def test_get_entity_reads_the_read_model_from_aspects(client):
    await write(client)
    entity = (await data(client, GET_ENTITY, {"urn": ORDERS}))["entity"]
    assert entity["editableProperties"] == {"name": "Orders", "description": "edited in the UI"}
    assert entity["deprecation"] == {
        "actor": ALICE,
        "deprecated": True,
        "note": "use orders_v2",
        "decommissionTime": 1800000000000,
        "actorEntity": {"urn": ALICE, "type": "CORP_USER", "__typename": "CorpUser"},
        "__typename": "Deprecation",
    }
    assert entity["health"] == []  # metaledger computes no health
    assert entity["subTypes"] == {"typeNames": ["View"]}
    tier, steward = entity["structuredProperties"]["properties"]
    assert tier == {
        "structuredProperty": {
            "urn": TIER,
            "definition": {"displayName": "Tier", "qualifiedName": "io.metaledger.tier"},
            "__typename": "StructuredPropertyEntity",
        },
        "values": [{"stringValue": "gold"}],
        "valueEntities": [],
    }
    assert steward["values"] == [{"stringValue": ALICE}, {"stringValue": PRIVATE}]
    assert steward["structuredProperty"]["definition"] == {
        "displayName": None,
        "qualifiedName": "io.metaledger.steward",
    }
    assert steward["valueEntities"] == [{"urn": ALICE, "type": "CORP_USER"}, {"urn": PRIVATE, "type": "DATAHUB_VIEW"}]

    parents = entity["domain"]["domain"]["parentDomains"]
    assert parents["count"] == 1
    assert parents["domains"] == [
        {
            "urn": PARENT_DOMAIN,
            "type": "DOMAIN",
            "displayProperties": None,
            "properties": {"name": "Company", "description": None, "__typename": "DomainProperties"},
            "__typename": "Domain",
        }
    ]
    (term,) = entity["glossaryTerms"]["terms"]
    assert term["term"]["ownership"] == {"owners": [{"owner": {"urn": ALICE}}]}
    nodes = term["term"]["parentNodes"]
    assert nodes["count"] == 2
    assert [(n["urn"], n["properties"]["name"]) for n in nodes["nodes"]] == [(NODE, "Revenue"), (ROOT_NODE, "Finance")]
    assert nodes["nodes"][0]["displayProperties"] == {
        "icon": {"name": "Paid", "style": "outlined", "iconLibrary": "MATERIAL", "__typename": "IconProperties"},
        "__typename": "DisplayProperties",
    }

    id_field, email = entity["schemaMetadata"]["fields"]
    assert id_field["isPartitioningKey"] is True
    assert [t["tag"]["urn"] for t in id_field["tags"]["tags"]] == [TAG_GOLD]
    assert id_field["schemaFieldEntity"] == {
        "urn": f"urn:li:schemaField:({ORDERS},id)",
        "fieldPath": "id",
        "parent": {"urn": ORDERS, "type": "DATASET"},
        "deprecation": None,
    }
    # DataHub's SchemaField answers the schema's own tags; the editable ones are editableSchemaMetadata's
    assert email["tags"] is None and email["isPartitioningKey"] is None
    assert email["schemaFieldEntity"]["deprecation"] == {"deprecated": True, "note": "gone"}
    (edited,) = entity["editableSchemaMetadata"]["editableSchemaFieldInfo"]
    assert edited["fieldPath"] == "email" and edited["description"] == "the customer's address"
    assert edited["tags"]["tags"][0]["tag"] == {
        "urn": PII,
        "properties": {"name": "PII", "description": "personal", "__typename": "TagProperties"},
        "__typename": "Tag",
    }
    assert edited["glossaryTerms"] == {"terms": [{"term": {"urn": TERM}}]}
    assert entity["viewProperties"] == {"materialized": False, "logic": "select * from raw.orders", "language": "SQL"}
    assert entity["browsePathV2"] == {
        "path": [{"name": "prod", "entity": None}, {"name": "Sales", "entity": {"urn": DOMAIN}}]
    }


async def test_what_an_aspect_lacks_answers_null(client):
    await propose(client, mcp("datasetProperties", {"name": "orders_v2"}, urn=ORDERS_V2), headers=SYNC)
    entity = (await data(client, GET_ENTITY, {"urn": ORDERS_V2}))["entity"]
    for field in ("editableProperties", "structuredProperties", "deprecation", "subTypes", "domain", "glossaryTerms"):
        assert entity[field] is None, field
    for field in ("schemaMetadata", "editableSchemaMetadata", "viewProperties", "browsePathV2"):
        assert entity[field] is None, field
    assert entity["health"] == []


async def test_the_property_definition_and_settings(client):
    await write(client)
    prop = (await data(client, GET_PROPERTY, {"urn": TIER}))["entity"]
    assert prop == {
        "urn": TIER,
        "definition": {
            "qualifiedName": "io.metaledger.tier",
            "displayName": "Tier",
            "description": "how good",
            "cardinality": "SINGLE",
            "immutable": False,
            "valueType": {
                "urn": "urn:li:dataType:datahub.string",
                "info": {"type": "STRING", "qualifiedName": "datahub.string", "displayName": None},
            },
            "entityTypes": [
                {
                    "urn": "urn:li:entityType:datahub.dataset",
                    "info": {"type": "DATASET", "qualifiedName": "datahub.dataset"},
                }
            ],
            "allowedValues": [
                {"value": {"stringValue": "gold"}, "description": "the best"},
                {"value": {"stringValue": "silver"}, "description": None},
            ],
            "created": {"time": 1700000000000, "actor": {"urn": ALICE}},
        },
        "settings": {
            "isHidden": False,
            "showInSearchFilters": True,
            "showAsAssetBadge": True,
            "showInAssetSummary": False,
            "showInColumnsTable": False,
        },
    }


async def test_an_entity_the_reader_may_not_see_is_left_out(app, client):
    await write(client)
    bob = await bearer(app, "reader", actor=BOB)
    alice = await bearer(app, "reader", actor=ALICE)
    (_, as_bob) = (await data(client, GET_ENTITY, {"urn": ORDERS}, headers=bob))["entity"]["structuredProperties"][
        "properties"
    ]
    # the value is the value; the entity it names is answered only to whom may see it
    assert as_bob["values"] == [{"stringValue": ALICE}, {"stringValue": PRIVATE}]
    assert as_bob["valueEntities"] == [{"urn": ALICE, "type": "CORP_USER"}]
    (_, as_alice) = (await data(client, GET_ENTITY, {"urn": ORDERS}, headers=alice))["entity"]["structuredProperties"][
        "properties"
    ]
    assert [e["urn"] for e in as_alice["valueEntities"]] == [ALICE, PRIVATE]
    assert (await data(client, GET_ENTITY, {"urn": PRIVATE}, headers=bob))["entity"] is None


# gql/entity_details.gql's domainEntitiesFields, verbatim, and the data product's assets
DOMAIN_ENTITIES = """
fragment domainEntitiesFields on Domain {
    entities(
        input: {
            start: 0
            count: 0
            filters: [
                {
                    field: "_entityType"
                    negated: true
                    values: ["DATA_PRODUCT", "DOMAIN"]
                }
            ]
        }
    ) {
        total
        __typename
    }
    dataProducts: entities(
        input: {
            start: 0
            count: 0
            filters: [{ field: "_entityType", values: ["DATA_PRODUCT"] }]
        }
    ) {
        total
        __typename
    }
    __typename
}

query domain($urn: String!, $product: String!, $dataset: String!) {
    domain: entity(urn: $urn) { ...domainEntitiesFields }
    product: entity(urn: $product) {
        ... on DataProduct {
            entities(input: {query: "*", start: 0, count: 10}) { total searchResults { entity { urn } } }
            domain { domain { urn } }
        }
    }
    dataset: entity(urn: $dataset) {
        ... on Dataset {
            schemaMetadata(version: 0) {
                createdAt datasetUrn cluster
                platformSchema { ... on TableSchema { schema } ... on KeyValueSchema { keySchema valueSchema } }
                foreignKeys { name }
            }
            glossaryTerms { terms { term { urn } actor { urn } } }
        }
    }
}
"""


async def test_domain_and_data_product_entities_and_schema_extras(client):
    await write(client)
    product = "urn:li:dataProduct:orders_product"
    await propose(
        client,
        mcp(
            "dataProductProperties",
            {"name": "Orders product", "assets": [{"destinationUrn": ORDERS}]},
            urn=product,
            entity="dataProduct",
        ),
        mcp("domains", {"domains": [DOMAIN]}, urn=product, entity="dataProduct"),
        mcp(
            "glossaryTerms",
            {"terms": [{"urn": TERM, "actor": ALICE}], "auditStamp": {"time": 1, "actor": ALICE}},
            urn=ORDERS,
        ),
        headers=SYNC,
    )
    answer = await data(client, DOMAIN_ENTITIES, {"urn": DOMAIN, "product": product, "dataset": ORDERS})
    assert answer["domain"]["entities"]["total"] == 1  # the dataset; the data product is left out by the filter
    assert answer["domain"]["dataProducts"]["total"] == 1
    assert answer["product"]["entities"] == {"total": 1, "searchResults": [{"entity": {"urn": ORDERS}}]}
    assert answer["product"]["domain"] == {"domain": {"urn": DOMAIN}}
    assert answer["dataset"]["schemaMetadata"] == {
        "createdAt": 0,  # schemaMetadata.created defaults to time 0
        "datasetUrn": ORDERS,
        "cluster": None,
        "platformSchema": {"schema": ""},
        "foreignKeys": None,
    }
    assert answer["dataset"]["glossaryTerms"] == {"terms": [{"term": {"urn": TERM}, "actor": {"urn": ALICE}}]}


def as_sent(text: str) -> str:
    return re.sub(r"^(.*#\[(?:CLOUD|NEWER_GMS)\].*)$", r"# \1", text, flags=re.M)


@pytest.fixture(scope="module")
def entity_details() -> str:
    """The MCP server's whole document, as it sends it to a core server (its `#[CLOUD]` and `#[NEWER_GMS]` lines
    commented out), from its own virtualenv (`.venv-mcp`, made here when absent, as tests/client makes it)."""
    python = _ensure_venv(MCP_VENV, *MCP_REQUIREMENT)
    (path,) = python.parent.parent.glob("lib/python*/site-packages/mcp_server_datahub/gql/entity_details.gql")
    return as_sent(path.read_text())


async def test_the_mcp_servers_own_get_entity_answers_every_entity_without_errors(client, entity_details):
    await write(client)
    document = entity_details
    for urn in (ORDERS, TERM, NODE, DOMAIN, TIER, PII, ALICE):
        response = await client.post(
            "/api/graphql", json={"query": document, "variables": {"urn": urn}, "operationName": "GetEntity"}
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert "errors" not in body, (urn, body["errors"][:3])
        assert body["data"]["entity"]["urn"] == urn
    response = await client.post(
        "/api/graphql", json={"query": document, "variables": {"urn": ORDERS}, "operationName": "GetEntity"}
    )
    entity = response.json()["data"]["entity"]
    assert entity["editableProperties"] == {"name": "Orders", "description": "edited in the UI"}
    assert entity["deprecation"]["note"] == "use orders_v2" and entity["health"] == []
    assert [p["structuredProperty"]["urn"] for p in entity["structuredProperties"]["properties"]] == [TIER, STEWARD]
    assert entity["domain"]["domain"]["parentDomains"]["domains"][0]["urn"] == PARENT_DOMAIN
    (term,) = entity["glossaryTerms"]["terms"]
    assert [n["urn"] for n in term["term"]["parentNodes"]["nodes"]] == [NODE, ROOT_NODE]
    fields = {f["fieldPath"]: f for f in entity["schemaMetadata"]["fields"]}
    assert fields["id"]["isPartitioningKey"] is True
    assert fields["email"]["schemaFieldEntity"]["deprecation"]["note"] == "gone"
    (edited,) = entity["editableSchemaMetadata"]["editableSchemaFieldInfo"]
    assert [t["tag"]["urn"] for t in edited["tags"]["tags"]] == [PII]
    assert entity["viewProperties"] == {"materialized": False, "logic": "select * from raw.orders", "language": "SQL"}
