"""DataHub's frontend paths and search parameters, and the `next` of the sign-in form (app.web.paths, app.web.policy):
pure functions, each rule alone and where it must not fire."""

from __future__ import annotations

import pytest

from app.web.paths import Filter, entity_url, filter_params, parse_filters, split_entity_path
from app.web.policy import local_path

ORDERS = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"
S3 = "urn:li:dataset:(urn:li:dataPlatform:s3,bucket/key/file.csv,PROD)"


@pytest.mark.parametrize(
    ("rest", "urn", "tab"),
    [
        (ORDERS, ORDERS, None),
        (f"{ORDERS}/Schema", ORDERS, "Schema"),
        (f"{ORDERS}/Schema/", ORDERS, "Schema"),
        (f"{ORDERS}/Column Stats", ORDERS, "Column Stats"),
        (S3, S3, None),  # a URN's own `/`, unencoded: its last part is no tab
        (f"{S3}/Lineage", S3, "Lineage"),
        ("urn:li:tag:pii", "urn:li:tag:pii", None),
        ("urn:li:tag:pii/Documentation", "urn:li:tag:pii", "Documentation"),
        ("urn:li:corpuser:jdoe@example.com/Ownership", "urn:li:corpuser:jdoe@example.com", "Ownership"),
        ("urn:li:glossaryTerm:a/b", "urn:li:glossaryTerm:a", "b"),  # a word after a whole URN is a tab name
        (f"{ORDERS}/Quality/List", ORDERS, "Quality/List"),  # a tab and its sub-tab (the MCP server's links)
        (f"{S3}/Quality/List", S3, "Quality/List"),
        ("urn:li:container:abc/Quality/List", "urn:li:container:abc", "Quality/List"),
        (f"{ORDERS}/Schema/List", f"{ORDERS}/Schema/List", None),  # only a tab with sub-tabs has one: not found
        (f"{ORDERS}/", ORDERS, None),  # the SDK's links end with a slash
    ],
)
def test_an_entity_path_is_a_urn_and_a_tab(rest, urn, tab):
    wanted = split_entity_path(rest)
    assert (wanted.urn, wanted.tab) == (urn, tab)


def test_entity_urls_are_datahubs_paths_with_the_urn_encoded():
    assert entity_url(ORDERS, "Schema") == (
        "/dataset/urn%3Ali%3Adataset%3A%28urn%3Ali%3AdataPlatform%3Ahive%2Cdb.orders%2CPROD%29/Schema"
    )
    assert entity_url("urn:li:dataFlow:(airflow,etl,prod)").startswith("/pipelines/")
    assert entity_url("urn:li:dataJob:(urn:li:dataFlow:(airflow,etl,prod),load)").startswith("/tasks/")
    assert entity_url("urn:li:corpuser:jdoe").startswith("/user/")
    assert entity_url("urn:li:corpGroup:eng").startswith("/group/")
    assert entity_url("urn:li:mlModel:(urn:li:dataPlatform:sagemaker,m,PROD)").startswith("/mlModels/")
    assert entity_url("urn:li:schemaField:(x,y)") is None  # DataHub has no page of its own for it
    assert entity_url("not a urn") is None


def test_datahubs_filter_parameters_both_forms():
    params = [
        ("query", "orders"),
        ("filter_platform___false___EQUAL___0", "urn:li:dataPlatform:hive"),
        ("filter_platform___false___EQUAL___0", "urn:li:dataPlatform:kafka"),
        ("filter_tags___true___EQUAL___1", "urn:li:tag:a%2Cb"),  # DataHub's encodeComma
        ("filter_domains", "urn:li:domain:sales"),  # the older form: no negation, EQUAL
        ("filter_origin___false___GREATER_THAN_OR_EQUAL_TO___2", "x"),
        ("filter_evil___false___DROP TABLE___3", "x"),  # not a condition: EQUAL
        ("filter_", "nothing"),
        ("filter_empty", ""),
        ("page", "2"),
    ]
    assert parse_filters(params) == [
        Filter("platform", ("urn:li:dataPlatform:hive", "urn:li:dataPlatform:kafka")),
        Filter("tags", ("urn:li:tag:a,b",), negated=True),
        Filter("domains", ("urn:li:domain:sales",)),
        Filter("origin", ("x",), condition="GREATER_THAN_OR_EQUAL_TO"),
        Filter("evil", ("x",)),
    ]


def test_filters_are_written_as_datahubs_search_page_writes_them():
    filters = [Filter("platform", ("urn:li:dataPlatform:hive",)), Filter("tags", ("urn:li:tag:a,b",), negated=True)]
    assert filter_params(filters) == [
        ("filter_platform___false___EQUAL___0", "urn:li:dataPlatform:hive"),
        ("filter_tags___true___EQUAL___1", "urn:li:tag:a%2Cb"),
    ]
    assert parse_filters(filter_params(filters)) == filters


@pytest.mark.parametrize(
    ("raw", "kept"),
    [
        ("/dataset/x/Schema", "/dataset/x/Schema"),
        ("/search?query=a&filter_platform=b", "/search?query=a&filter_platform=b"),
        (None, "/search"),
        ("", "/search"),
        ("https://evil.example/", "/search"),
        ("//evil.example/", "/search"),
        ("/\\evil.example", "/search"),
        ("/x\r\nSet-Cookie: a=b", "/search"),
        ("javascript:alert(1)", "/search"),
    ],
)
def test_next_is_only_ever_a_local_path(raw, kept):
    assert local_path(raw) == kept
