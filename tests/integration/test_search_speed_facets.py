"""The embedded search backend counts facets from each document's facet values (`search_document.facet_values`,
migration 0018), not from its matches' fields: the counts are those of the fields' values (an array's elements, each
value once per document, JSON null left out, numbers and booleans as their JSON text), for soft-deleted documents
only when asked, never for a tombstone; and the migration derives the values of documents indexed before it."""

from __future__ import annotations

import asyncio

import pytest_asyncio
from alembic import command

from app.db import alembic_config, upgrade_database
from app.search.model import AspectFields, EntityRemoval
from app.search.postgres import PostgresBackend
from tests.helpers import ds

TIER = "structuredProperties.io.acryl.tier"


def dataset(name: str, platform: str, **fields: object) -> list[AspectFields]:
    urn = ds(name, platform)
    key = {"platform": f"urn:li:dataPlatform:{platform}", "origin": fields.pop("origin", "PROD")}
    changes = [AspectFields("dataset", urn, "datasetKey", 1, key)]
    if fields:
        changes.append(AspectFields("dataset", urn, "datasetProperties", 1, dict(fields)))
    return changes


CHANGES = [
    *dataset(
        "a",
        "hive",
        owners=["urn:li:corpuser:x", "urn:li:corpuser:y", "urn:li:corpuser:x"],  # x twice: one match
        tags=["urn:li:tag:t"],
        deprecated=True,
        description="not a facet",
        **{"structuredProperties.io_acryl_tier": [30.0]},
    ),
    *dataset(
        "b",
        "hive",
        origin="DEV",
        owners=["urn:li:corpuser:x"],
        tags=[],
        **{"structuredProperties.io_acryl_tier": [30.0, 40]},
    ),
    *dataset("c", "kafka", owners=None),
    *dataset("gone", "kafka", owners=["urn:li:corpuser:x"]),
    *dataset("soft", "kafka", owners=["urn:li:corpuser:x"]),
    AspectFields("dataset", ds("soft", "kafka"), "status", 1, {"removed": True}),
]

EXPECTED = {
    "platform": {"urn:li:dataPlatform:hive": 2, "urn:li:dataPlatform:kafka": 1},
    "origin": {"PROD": 2, "DEV": 1},
    "owners": {"urn:li:corpuser:x": 2, "urn:li:corpuser:y": 1},
    "tags": {"urn:li:tag:t": 1},
    "deprecated": {"true": 1},
    TIER: {"30.0": 2, "40": 1},
}


@pytest_asyncio.fixture
async def backend(backend):
    await backend.apply(CHANGES)
    await backend.apply([EntityRemoval("dataset", ds("gone", "kafka"), 2)])
    return backend


async def facets(backend: PostgresBackend, **filters: list[str]) -> dict[str, dict[str, int]]:
    page = await backend.search("dataset", "*", count=0, filters=filters or None, property_facets=[TIER])
    return {name: counts for name, counts in page.facets.items() if counts}


async def test_facets_count_the_values_of_the_matches(backend):
    assert await facets(backend) == EXPECTED
    with_removed = await facets(backend, removed=[])  # soft-deleted ones too: counted; the tombstone never
    assert with_removed["owners"] == {"urn:li:corpuser:x": 3, "urn:li:corpuser:y": 1}
    assert with_removed["platform"] == {"urn:li:dataPlatform:hive": 2, "urn:li:dataPlatform:kafka": 2}
    kafka = await facets(backend, platform=["urn:li:dataPlatform:kafka"])
    assert kafka == {"platform": {"urn:li:dataPlatform:kafka": 1}, "origin": {"PROD": 1}}
    # a new version of an aspect replaces its values
    await backend.apply(
        [AspectFields("dataset", ds("c", "kafka"), "datasetProperties", 2, {"owners": ["urn:li:corpuser:z"]})]
    )
    owners = (await facets(backend))["owners"]
    assert owners == {"urn:li:corpuser:x": 2, "urn:li:corpuser:y": 1, "urn:li:corpuser:z": 1}


async def test_the_migration_derives_the_values_of_documents_indexed_before_it(backend, database_url):
    config = alembic_config(database_url)
    await asyncio.to_thread(command.downgrade, config, "0017")
    await asyncio.to_thread(upgrade_database, database_url)
    assert await facets(backend) == EXPECTED
