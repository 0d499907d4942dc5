"""DataHub's MCP server (`mcp-server-datahub`, pinned in tests/client/conftest.py), unchanged, against metaledger —
over stdio and as its own streamable-HTTP process — and metaledger's own MCP endpoint (`/mcp`) with the same tools.

The catalog is written by DataHub's SDK (acryl-datahub, in the client's virtualenv): users and a group, tags, a
glossary node with terms, domains, structured properties, three datasets with schemas, owners, tags, terms, a domain, a
sub-type and a structured property value, column-level lineage raw_orders -> orders -> orders_summary, a query the
lineage's SQL made and one an analyst wrote, and a document. Each test calls the tools as an agent would and checks
the answer; each curation is read back through the SDK and undone by its remove tool, leaving the catalog as it was
for the next test. The sessions run in the MCP server's virtualenv (tests/client/mcp_session.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import DataHubClient, Metaledger, _client_env, metaledger_process
from tests.client.test_reported_version import GATED, UNGATED
from tests.processes import service_token

pytestmark = pytest.mark.client

SESSION = Path(__file__).resolve().parent / "mcp_session.py"
RUN = "mcpcat"  # one search token, in every seeded name (the document's: in its text)

# Every tool DataHub's MCP server lists on an OSS server of DataHub >= 1.4.0 with mutations and get_me turned on and a
# document in the catalog (get_dataset_assertions is DataHub Cloud's only).
DATAHUB_TOOLS = UNGATED | GATED | {"search_documents", "grep_documents"}


def ds(name: str) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:snowflake,{RUN}.shop.{name},PROD)"


RAW, ORDERS, SUMMARY = ds("raw_orders"), ds("orders"), ds("orders_summary")
ALICE, BOB, GROUP = f"urn:li:corpuser:{RUN}-alice", f"urn:li:corpuser:{RUN}-bob", f"urn:li:corpGroup:{RUN}-analysts"
PII, GOLD, CURATED = (f"urn:li:tag:{RUN}-{name}" for name in ("pii", "gold", "curated"))
NODE, REVENUE, MARGIN = (
    f"urn:li:glossaryNode:{RUN}-finance",
    *(f"urn:li:glossaryTerm:{RUN}.{n}" for n in ("Revenue", "Margin")),
)
SALES, MARKETING = f"urn:li:domain:{RUN}-sales", f"urn:li:domain:{RUN}-marketing"
TIER, SCORE = (f"urn:li:structuredProperty:io.{RUN}.{name}" for name in ("tier", "score"))
MANUAL_QUERY, SYSTEM_QUERY = f"urn:li:query:{RUN}-manual", f"urn:li:query:{RUN}-system"
DOCUMENT = f"urn:li:document:{RUN}-runbook"
DOC_WORD = f"zebra{RUN}"  # only the document's text has it
LINEAGE_SQL = f"INSERT INTO {RUN}.shop.orders SELECT order_id, customer_email, amount FROM {RUN}.shop.raw_orders"
MANUAL_SQL = f"SELECT customer_email, SUM(amount) FROM {RUN}.shop.orders GROUP BY customer_email"

SEED = """
import time
from datahub.emitter.mcp import MetadataChangeProposalWrapper as MCPW
from datahub.metadata import schema_classes as m
from datahub.sdk import DataHubClient, Dataset, Document, GlossaryNode, GlossaryTerm, Tag

client = DataHubClient(server=GMS, token=TOKEN)
emit = client._graph.emit_mcp
stamp = m.AuditStampClass(time=int(time.time() * 1000), actor="urn:li:corpuser:datahub")
emit(MCPW(entityUrn=ALICE, aspect=m.CorpUserInfoClass(active=True, displayName="Alice Analyst", fullName="Alice Analyst",
                                                      email="alice@example.com", title="Analyst")))
emit(MCPW(entityUrn=BOB, aspect=m.CorpUserInfoClass(active=True, displayName="Bob Steward", email="bob@example.com")))
emit(MCPW(entityUrn=GROUP, aspect=m.CorpGroupInfoClass(admins=[ALICE], members=[ALICE, BOB], groups=[],
                                                       displayName="Analysts")))
for name in ("pii", "gold", "curated"):
    client.entities.upsert(Tag(name=f"{RUN}-{name}", display_name=name.upper(), description=f"{name} tag"))
client.entities.upsert(GlossaryNode(id=f"{RUN}-finance", display_name="Finance", definition="Money"))
for term, definition in (("Revenue", "Income"), ("Margin", "Profit share")):
    client.entities.upsert(GlossaryTerm(id=f"{RUN}.{term}", display_name=term, definition=definition, parent_node=NODE))
emit(MCPW(entityUrn=SALES, aspect=m.DomainPropertiesClass(name="Sales", description="Sales data")))
emit(MCPW(entityUrn=MARKETING, aspect=m.DomainPropertiesClass(name="Marketing")))
for urn, value_type in ((TIER, "string"), (SCORE, "number")):
    emit(MCPW(entityUrn=urn, aspect=m.StructuredPropertyDefinitionClass(
        qualifiedName=urn.split(":", 3)[3], displayName=urn.rsplit(".", 1)[1].title(),
        valueType=f"urn:li:dataType:datahub.{value_type}", entityTypes=["urn:li:entityType:datahub.dataset"],
        cardinality="SINGLE")))

def fields(tagged):
    email = m.SchemaFieldClass(
        fieldPath="customer_email", type=m.SchemaFieldDataTypeClass(type=m.StringTypeClass()),
        nativeDataType="VARCHAR", description="The customer's e-mail address", nullable=True,
        globalTags=m.GlobalTagsClass(tags=[m.TagAssociationClass(tag=PII)]) if tagged else None,
        glossaryTerms=m.GlossaryTermsClass(terms=[m.GlossaryTermAssociationClass(urn=REVENUE)], auditStamp=stamp)
        if tagged else None)
    order_id = m.SchemaFieldClass(fieldPath="order_id", type=m.SchemaFieldDataTypeClass(type=m.NumberTypeClass()),
                                  nativeDataType="NUMBER", description="Order identifier", isPartOfKey=True)
    return [order_id, email, ("amount", "NUMBER", "Order amount in EUR")]

client.entities.upsert(Dataset(platform="snowflake", name=f"{RUN}.shop.raw_orders", description="Raw orders",
                               subtype="Table", schema=fields(False)))
client.entities.upsert(Dataset(
    platform="snowflake", name=f"{RUN}.shop.orders", display_name="orders", description="Cleaned customer orders",
    subtype="Table", schema=fields(True), owners=[(ALICE, "TECHNICAL_OWNER"), (GROUP, "BUSINESS_OWNER")],
    tags=[PII, GOLD], terms=[REVENUE], domain=SALES, structured_properties={TIER: ["gold"]},
    custom_properties={"team": "shop"}))
client.entities.upsert(Dataset(platform="snowflake", name=f"{RUN}.shop.orders_summary", subtype="View",
                               description="Revenue per customer",
                               schema=[("customer_email", "VARCHAR"), ("amount", "NUMBER")]))
client.lineage.add_lineage(upstream=RAW, downstream=ORDERS,
                           column_lineage={c: [c] for c in ("order_id", "customer_email", "amount")})
client.lineage.add_lineage(upstream=ORDERS, downstream=SUMMARY,
                           column_lineage={c: [c] for c in ("customer_email", "amount")})
for urn, source, sql, subjects, extra in (
    (SYSTEM_QUERY, "SYSTEM", LINEAGE_SQL, [RAW, ORDERS], {}),
    (MANUAL_QUERY, "MANUAL", MANUAL_SQL, [ORDERS, f"urn:li:schemaField:({ORDERS},customer_email)"],
     {"name": "Revenue per customer", "description": "Written by an analyst"}),
):
    emit(MCPW(entityUrn=urn, aspect=m.QueryPropertiesClass(
        statement=m.QueryStatementClass(value=sql, language="SQL"), source=source, created=stamp, lastModified=stamp,
        **extra)))
    emit(MCPW(entityUrn=urn, aspect=m.QuerySubjectsClass(subjects=[m.QuerySubjectClass(entity=s) for s in subjects])))
client.entities.upsert(Document.create_document(
    id=f"{RUN}-runbook", title="Orders runbook", subtype="Runbook", related_assets=[ORDERS],
    text=f"# Deploying the orders pipeline\\n\\nRun the kubernetes job `orders-etl`. Token {DOC_WORD}, {RUN}.\\n",
    show_in_global_context=True))
"""


class ToolError(AssertionError):
    """A tool answered an error (its text is the message)."""


@dataclass
class Agent:
    """One MCP session (tests/client/mcp_session.py) as an agent uses it; one request at a time."""

    target: str
    process: subprocess.Popen
    log_path: Path
    _lock: threading.Lock

    def _ask(self, request: dict[str, Any]) -> Any:
        with self._lock:
            assert self.process.stdin and self.process.stdout
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        assert line, f"the MCP session ended; its log:\n{self.log_tail()}"
        answer = json.loads(line)
        if not answer["ok"]:
            raise ToolError(answer["error"])
        return answer["value"]

    def call(self, tool: str, **arguments: Any) -> Any:
        return self._ask({"op": "call", "tool": tool, "arguments": arguments})

    def tools(self) -> set[str]:
        return set(self._ask({"op": "list_tools"}))

    def aspect(self, urn: str, aspect_class: str) -> dict[str, Any] | None:
        """The aspect as DataHub's SDK reads it back."""
        return self._ask({"op": "aspect", "urn": urn, "aspect": aspect_class})

    def log_tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:]) if self.log_path.exists() else ""


def urns_in(value: Any) -> set[str]:
    """Every `urn` anywhere in a tool's answer."""
    if isinstance(value, dict):
        return {v for k, v in value.items() if k == "urn" and isinstance(v, str)}.union(
            *(urns_in(v) for v in value.values())
        )
    if isinstance(value, list):
        return set().union(*(urns_in(v) for v in value))
    return set()


@pytest.fixture(scope="module")
def service(make_database: Callable[..., str], migrated_template: str) -> Iterator[Metaledger]:
    yield from metaledger_process(make_database(template=migrated_template))


@pytest.fixture(scope="module")
def catalog(service: Metaledger, client_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Metaledger:
    """The catalog above, written through DataHub's SDK, once searchable."""
    home = tmp_path_factory.mktemp("sdk-home")
    sdk = DataHubClient(client_python, _client_env(client_python, home, service.url, service.token), home)
    names = {k: v for k, v in globals().items() if re.fullmatch(r"[A-Z][A-Z_]+", k) and isinstance(v, str)}
    try:
        sdk.script(SEED, **names)
    finally:
        sdk.close()
    query = "query q($q: String!) { searchAcrossEntities(input: {query: $q, count: 50}) { searchResults { entity { urn } } } }"
    deadline = time.monotonic() + 60
    with service.http() as http:
        while True:
            answer = http.post("/api/graphql", json={"query": query, "variables": {"q": RUN}}).json()
            found = {r["entity"]["urn"] for r in answer["data"]["searchAcrossEntities"]["searchResults"]}
            if {ORDERS, SUMMARY, RAW, PII, REVENUE, SALES, ALICE, DOCUMENT} <= found:
                return service
            assert time.monotonic() < deadline, f"the seeded catalog is not searchable; found {sorted(found)}"
            time.sleep(0.5)


# DataHub's server answers every tool the same over stdio and over streamable HTTP (one server, two transports): each
# tool is checked against it over HTTP and against metaledger's /mcp, and these are checked over stdio too (the tool
# list, a read, a search and a curation round trip cross the transport both ways).
OVER_STDIO_TOO = {
    "test_every_tool_of_an_oss_server_is_listed",
    "test_search_filters_by_tag",
    "test_get_entities_reads_what_the_sdk_wrote",
    "test_add_and_remove_tags",
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "agent" in metafunc.fixturenames:
        targets = ["datahub-http", "metaledger"]
        if metafunc.function.__name__ in OVER_STDIO_TOO:
            targets.insert(0, "stdio")
        metafunc.parametrize("agent", targets, indirect=True, scope="module")


@pytest.fixture(scope="module")
def agent(request: pytest.FixtureRequest, catalog: Metaledger, mcp_python: Path, tmp_path_factory) -> Iterator[Agent]:
    """A session with `admin` rights, per target: DataHub's MCP server over stdio, DataHub's MCP server over HTTP,
    metaledger's /mcp."""
    yield from _agent(request.param, catalog, catalog.token, mcp_python, tmp_path_factory)


def _agent(target: str, service: Metaledger, token: str, mcp_python: Path, tmp_path_factory) -> Iterator[Agent]:
    home = tmp_path_factory.mktemp(f"mcp-{target}")
    log_path = home / "server.log"
    process = subprocess.Popen(
        [str(mcp_python), str(SESSION), target, service.url, token, str(log_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=open(log_path, "a"),  # noqa: SIM115 - the process owns it until it ends
        text=True,
        env={**os.environ, "MCP_SESSION_HOME": str(home)},
    )
    agent = Agent(target, process, log_path, threading.Lock())
    try:
        assert process.stdout and process.stdout.readline(), f"the session did not start:\n{agent.log_tail()}"
        yield agent
    finally:
        if process.stdin:
            process.stdin.close()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- the tool list ----------------------------------------------------------------------------------------------


def test_every_tool_of_an_oss_server_is_listed(agent: Agent):
    """DataHub's server hides curation, get_me, history and document tools from a server older than DataHub 1.4.0
    (/config's version) and the document tools from a catalog where `documentSearch` finds nothing."""
    assert DATAHUB_TOOLS <= agent.tools()


# --- search --------------------------------------------------------------------------------------------------------


def test_search_finds_by_name_with_the_structured_query_prefix(agent: Agent):
    answer = agent.call("search", query=f"/q {RUN}+orders", num_results=10)
    assert ORDERS in urns_in(answer["searchResults"])


def test_search_finds_by_keywords(agent: Agent):
    answer = agent.call("search", query=f"{RUN} customer orders", num_results=10)
    assert ORDERS in urns_in(answer["searchResults"])


def test_search_filters_by_tag(agent: Agent):
    found = urns_in(agent.call("search", query="*", filter=f"tag = {PII}", num_results=20)["searchResults"])
    assert ORDERS in found and RAW not in found  # raw_orders has no tag


def test_search_without_results_explores_facets(agent: Agent):
    answer = agent.call("search", query=RUN, filter="entity_type = dataset", num_results=0)
    values = {a["value"] for facet in answer["facets"] for a in facet.get("aggregations") or []}
    assert {PII, SALES} <= values
    assert "searchResults" not in answer


# --- entities and fields -------------------------------------------------------------------------------------------


def test_get_entities_reads_what_the_sdk_wrote(agent: Agent):
    entity = agent.call("get_entities", urns=ORDERS)
    text = json.dumps(entity)
    assert entity["urn"] == ORDERS
    assert "Cleaned customer orders" in text
    assert {ALICE, GROUP, PII, GOLD, REVENUE, NODE, SALES} <= urns_in(entity)  # NODE: the term's parent node
    assert [f["fieldPath"] for f in entity["schemaMetadata"]["fields"]] == ["order_id", "customer_email", "amount"]
    assert '"Table"' in text and '"gold"' in text  # its sub-type, its structured property's value


def test_get_entities_reads_several_types_at_once(agent: Agent):
    urns = [RAW, ORDERS, PII, REVENUE, SALES, ALICE]
    answers = agent.call("get_entities", urns=urns)
    assert [a["urn"] for a in answers] == urns and not [a for a in answers if "error" in a]


def test_get_entities_reads_a_query(agent: Agent):
    text = json.dumps(agent.call("get_entities", urns=MANUAL_QUERY))
    assert "GROUP BY customer_email" in text and "MANUAL" in text


def test_list_schema_fields_filters_by_keyword(agent: Agent):
    answer = agent.call("list_schema_fields", urn=ORDERS, keywords=["email"])
    assert (answer["totalFields"], answer["matchingCount"]) == (3, 1)
    assert answer["fields"][0]["fieldPath"] == "customer_email"
    assert (answer["fields"][0]["tags"], answer["fields"][0]["glossaryTerms"]) == (["PII"], ["Revenue"])  # names


def test_list_schema_fields_pages_by_offset(agent: Agent):
    first = agent.call("list_schema_fields", urn=ORDERS, limit=2)
    rest = agent.call("list_schema_fields", urn=ORDERS, limit=2, offset=first["offset"] + first["returned"])
    assert (first["returned"], first["remainingCount"], rest["returned"], rest["remainingCount"]) == (2, 1, 1, 0)
    assert {f["fieldPath"] for f in first["fields"] + rest["fields"]} == {"order_id", "customer_email", "amount"}


def test_get_entities_answers_schema_fields_with_tag_and_term_names(agent: Agent):
    """DataHub's tool keeps what SQL needs of a field: its tags and terms by name, the editable metadata merged."""
    entity = agent.call("get_entities", urns=ORDERS)
    email = next(f for f in entity["schemaMetadata"]["fields"] if f["fieldPath"] == "customer_email")
    assert (email["tags"], email["glossaryTerms"]) == (["PII"], ["Revenue"])
    assert "editableSchemaMetadata" not in entity


def test_get_entities_attaches_the_related_documents(agent: Agent):
    entity = agent.call("get_entities", urns=ORDERS)
    assert DOCUMENT in urns_in(entity["relatedDocuments"]["documents"])


# --- lineage -------------------------------------------------------------------------------------------------------


def test_get_lineage_upstream(agent: Agent):
    answer = agent.call("get_lineage", urn=ORDERS, upstream=True, max_hops=1)
    assert [r["entity"]["urn"] for r in answer["upstreams"]["searchResults"]] == [RAW]


def test_get_lineage_downstream_over_hops(agent: Agent):
    answer = agent.call("get_lineage", urn=RAW, upstream=False, max_hops=3)
    assert {ORDERS, SUMMARY} <= urns_in(answer["downstreams"]["searchResults"])


def test_get_lineage_of_a_column(agent: Agent):
    answer = agent.call("get_lineage", urn=ORDERS, column="customer_email", upstream=True)
    results = answer["upstreams"]["searchResults"]
    assert [(r["entity"]["urn"], r["lineageColumns"]) for r in results] == [(RAW, ["customer_email"])]


def test_get_lineage_of_a_column_says_its_results_are_datasets(agent: Agent):
    answer = agent.call("get_lineage", urn=ORDERS, column="customer_email", upstream=False)
    assert answer["metadata"]["queryType"] == "column-level-lineage" and answer["metadata"]["groupedBy"] == "dataset"
    assert [(r["entity"]["urn"], r["lineageColumns"]) for r in answer["downstreams"]["searchResults"]] == [
        (SUMMARY, ["customer_email"])
    ]


def test_a_column_without_column_lineage_has_none(agent: Agent):
    answer = agent.call("get_lineage", urn=SUMMARY, column="customer_email", upstream=False)
    assert not answer["downstreams"].get("searchResults")


def test_lineage_path_between_datasets(agent: Agent):
    answer = agent.call("get_lineage_paths_between", source_urn=RAW, target_urn=SUMMARY)
    assert answer["pathCount"] >= 1 and ORDERS in urns_in(answer["paths"])


def test_lineage_path_between_columns_reads_from_the_source_to_the_target(agent: Agent):
    answer = agent.call(
        "get_lineage_paths_between",
        source_urn=RAW,
        target_urn=SUMMARY,
        source_column="customer_email",
        target_column="customer_email",
        direction="downstream",
    )
    assert answer["pathCount"] >= 1
    steps = [s["urn"] for s in answer["paths"][0]["path"] if s.get("type") == "SCHEMA_FIELD"]
    assert steps == [f"urn:li:schemaField:({dataset},customer_email)" for dataset in (RAW, ORDERS, SUMMARY)]
    assert answer["metadata"]["pathType"] == "column-level" and answer["target"]["column"] == "customer_email"


# --- queries -------------------------------------------------------------------------------------------------------


def test_dataset_queries(agent: Agent):
    answer = agent.call("get_dataset_queries", urn=ORDERS, count=10)
    assert answer["total"] == 2 and urns_in(answer["queries"]) >= {MANUAL_QUERY, SYSTEM_QUERY}


def test_dataset_queries_by_source(agent: Agent):
    answer = agent.call("get_dataset_queries", urn=ORDERS, source="MANUAL")
    assert answer["total"] == 1 and MANUAL_QUERY in urns_in(answer["queries"])


def test_dataset_queries_of_a_column(agent: Agent):
    answer = agent.call("get_dataset_queries", urn=ORDERS, column="customer_email")
    assert MANUAL_QUERY in urns_in(answer["queries"]) and SYSTEM_QUERY not in urns_in(answer["queries"])


# --- who the agent is ------------------------------------------------------------------------------------------------


def test_get_me_names_the_tokens_actor(agent: Agent):
    assert agent.call("get_me")["data"]["corpUser"]["urn"] == "urn:li:corpuser:datahub"


# --- curation: each change read back through DataHub's SDK, then undone -----------------------------------------------


def test_add_and_remove_tags(agent: Agent):
    assert agent.call("add_tags", tag_urns=[CURATED], entity_urns=[RAW])["success"]
    assert CURATED in [t["tag"] for t in agent.aspect(RAW, "GlobalTagsClass")["tags"]]
    assert agent.call("remove_tags", tag_urns=[CURATED], entity_urns=[RAW])["success"]
    assert CURATED not in [t["tag"] for t in (agent.aspect(RAW, "GlobalTagsClass") or {"tags": []})["tags"]]


def _field_info(agent: Agent, urn: str, field_path: str) -> dict[str, Any]:
    aspect = agent.aspect(urn, "EditableSchemaMetadataClass") or {"editableSchemaFieldInfo": []}
    return next((f for f in aspect["editableSchemaFieldInfo"] if f["fieldPath"] == field_path), {})


def test_add_and_remove_a_columns_tags(agent: Agent):
    assert agent.call("add_tags", tag_urns=[PII], entity_urns=[RAW], column_paths=["customer_email"])["success"]
    assert [t["tag"] for t in _field_info(agent, RAW, "customer_email")["globalTags"]["tags"]] == [PII]
    assert agent.call("remove_tags", tag_urns=[PII], entity_urns=[RAW], column_paths=["customer_email"])["success"]
    assert not _field_info(agent, RAW, "customer_email").get("globalTags", {}).get("tags")


def test_add_and_remove_terms(agent: Agent):
    assert agent.call("add_terms", term_urns=[MARGIN], entity_urns=[RAW])["success"]
    assert MARGIN in [t["urn"] for t in agent.aspect(RAW, "GlossaryTermsClass")["terms"]]
    assert agent.call("remove_terms", term_urns=[MARGIN], entity_urns=[RAW])["success"]
    assert MARGIN not in [t["urn"] for t in (agent.aspect(RAW, "GlossaryTermsClass") or {"terms": []})["terms"]]


def test_add_and_remove_owners(agent: Agent):
    assert agent.call("add_owners", owner_urns=[BOB], entity_urns=[RAW], ownership_type="DATA_STEWARD")["success"]
    owners = agent.aspect(RAW, "OwnershipClass")["owners"]
    assert [(o["owner"], o["type"]) for o in owners if o["owner"] == BOB] == [(BOB, "DATA_STEWARD")]
    assert agent.call("remove_owners", owner_urns=[BOB], entity_urns=[RAW])["success"]
    assert BOB not in [o["owner"] for o in (agent.aspect(RAW, "OwnershipClass") or {"owners": []})["owners"]]


def test_set_and_remove_a_domain(agent: Agent):
    assert agent.call("set_domains", domain_urn=MARKETING, entity_urns=[RAW])["success"]
    assert agent.aspect(RAW, "DomainsClass")["domains"] == [MARKETING]
    assert agent.call("remove_domains", entity_urns=[RAW])["success"]
    assert not (agent.aspect(RAW, "DomainsClass") or {"domains": []})["domains"]


def test_replace_append_and_remove_a_description(agent: Agent):
    """`append` reads the description first (through DataHub's getEntity query): it must find the replaced one."""
    assert agent.call("update_description", entity_urn=RAW, operation="replace", description="Orders as loaded")[
        "success"
    ]
    assert agent.call("update_description", entity_urn=RAW, operation="append", description=" (nightly)")["success"]
    assert agent.aspect(RAW, "EditableDatasetPropertiesClass")["description"] == "Orders as loaded (nightly)"
    assert agent.call("update_description", entity_urn=RAW, operation="remove")["success"]
    assert not (agent.aspect(RAW, "EditableDatasetPropertiesClass") or {}).get("description")


def test_replace_and_remove_a_columns_description(agent: Agent):
    arguments = {"entity_urn": RAW, "column_path": "customer_email"}
    assert agent.call("update_description", operation="replace", description="Hashed e-mail", **arguments)["success"]
    assert _field_info(agent, RAW, "customer_email")["description"] == "Hashed e-mail"
    assert agent.call("update_description", operation="remove", **arguments)["success"]
    assert not _field_info(agent, RAW, "customer_email").get("description")


def test_add_and_remove_structured_properties(agent: Agent):
    values = {TIER: ["silver"], SCORE: ["4.5"]}
    assert agent.call("add_structured_properties", property_values=values, entity_urns=[RAW])["success"]
    stored = agent.aspect(RAW, "StructuredPropertiesClass")["properties"]
    assert {p["propertyUrn"]: p["values"] for p in stored} == {TIER: [{"string": "silver"}], SCORE: [{"double": 4.5}]}
    assert agent.call("remove_structured_properties", property_urns=[TIER, SCORE], entity_urns=[RAW])["success"]
    assert not (agent.aspect(RAW, "StructuredPropertiesClass") or {"properties": []})["properties"]


def test_aspect_history_shows_each_version(agent: Agent):
    """get_aspect_history reads each version with a per-aspect If-Version-Match on the v3 batchGet."""
    agent.call("add_tags", tag_urns=[CURATED], entity_urns=[SUMMARY])
    agent.call("remove_tags", tag_urns=[CURATED], entity_urns=[SUMMARY])
    history = json.dumps(agent.call("get_aspect_history", urns=[SUMMARY], aspect_names=["globalTags"], limit=5))
    assert CURATED in history  # in the version that added it, though the latest has it no more


def test_aspect_history_answers_the_current_value_and_pages_of_history(agent: Agent):
    answer = agent.call("get_aspect_history", urns=[ORDERS], aspect_names=["globalTags"], limit=5)
    [pair] = answer["results"]
    assert (pair["urn"], pair["aspectName"], pair["error"]) == (ORDERS, "globalTags", None)
    assert pair["current"]["version"] == 0 and PII in json.dumps(pair["current"]["value"])
    assert {"hasMore", "nextFromVersion", "returned", "anchorSource"} <= set(pair["page"])


# --- documents -----------------------------------------------------------------------------------------------------


def test_save_a_document_then_find_and_grep_it(agent: Agent):
    word = f"{DOC_WORD}{agent.target.replace('-', '')}"  # one per target: each finds its own
    saved = agent.call(
        "save_document",
        document_type="Insight",
        title="Null e-mails",
        topics=[f"{RUN}-quality"],
        content=f"## Finding\n\n23% of orders have a null customer_email. {word}",
        related_assets=[ORDERS],
    )
    assert saved["success"]
    assert word in agent.aspect(saved["urn"], "DocumentInfoClass")["contents"]["text"]
    deadline = time.monotonic() + 30
    while saved["urn"] not in urns_in(agent.call("search_documents", query=word).get("searchResults")):
        assert time.monotonic() < deadline, "the saved document is not found by a word of its text"
        time.sleep(0.5)
    found = agent.call("grep_documents", urns=[DOCUMENT, saved["urn"]], pattern="(?i)kubernetes|null customer_email")
    assert {r["urn"] for r in found["results"]} == {DOCUMENT, saved["urn"]}


def test_search_documents_by_a_word_of_the_text(agent: Agent):
    assert DOCUMENT in urns_in(agent.call("search_documents", query=DOC_WORD)["searchResults"])


def test_grep_documents_counts_the_matches(agent: Agent):
    answer = agent.call("grep_documents", urns=[DOCUMENT], pattern="orders", context_chars=10)
    [found] = answer["results"]
    assert (found["urn"], found["title"], answer["documents_with_matches"]) == (DOCUMENT, "Orders runbook", 1)
    assert found["total_matches"] == answer["total_matches"] >= 2 and found["matches"][0]["position"] >= 0


def test_search_documents_answers_the_documents_title_and_sub_type(agent: Agent):
    [result] = [
        r for r in agent.call("search_documents", query=DOC_WORD)["searchResults"] if r["entity"]["urn"] == DOCUMENT
    ]
    assert (result["entity"]["info"]["title"], result["entity"]["subType"]) == ("Orders runbook", "Runbook")


def test_search_documents_by_sub_type(agent: Agent):
    assert DOCUMENT in urns_in(agent.call("search_documents", query="*", filter="subtype = Runbook")["searchResults"])
    assert DOCUMENT not in urns_in(
        agent.call("search_documents", query="*", filter="subtype = Insight")["searchResults"]
    )


# --- what a reader's agent may do ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reader_agent(catalog: Metaledger, mcp_python: Path, tmp_path_factory) -> Iterator[Agent]:
    """metaledger's /mcp with a reader's token."""
    env = {"METALEDGER_DATABASE_URL": catalog.database_url, "METALEDGER_KAFKA_BOOTSTRAP_SERVERS": ""}
    token = service_token(env, actor=f"urn:li:corpuser:{RUN}-reader", role="reader")
    yield from _agent("metaledger", catalog, token, mcp_python, tmp_path_factory)


def test_a_readers_agent_reads(reader_agent: Agent):
    assert reader_agent.call("get_entities", urns=ORDERS)["urn"] == ORDERS


def test_a_readers_agent_cannot_curate_and_is_told_why(reader_agent: Agent, catalog: Metaledger):
    with pytest.raises(ToolError, match=r"needs the WRITE permission"):
        reader_agent.call("add_tags", tag_urns=[CURATED], entity_urns=[RAW])
    with catalog.http() as http:
        tags = http.get(f"/openapi/v3/entity/dataset/{urllib.parse.quote(RAW, safe='')}/globalTags")
    assert tags.status_code == 404 or CURATED not in tags.text
