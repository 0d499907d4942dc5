"""What only the embedded search backend (`app.search.postgres.PostgresBackend`) has, against the real Postgres: text
queries answered by indexes, per-parameter plans, `clear` by entity type, the tsvector's size limit. The
`SearchBackend` behaviour both backends share is test_search_contract.py's. Records are built directly (the model's
dataclasses), as `changes_from_mcl` produces them."""

from __future__ import annotations

from app.search import postgres
from app.search.model import AspectEdges, AspectFields, Edge, IndexedVersion
from tests.helpers import ds


def key(urn: str) -> AspectFields:
    platform = urn.split("dataPlatform:")[1].split(",")[0]
    env = urn.rsplit(",", 1)[1].rstrip(")")
    return AspectFields("dataset", urn, "datasetKey", 1, {"platform": f"urn:li:dataPlatform:{platform}", "origin": env})


def props(urn: str, name: str, description: str = "", version: int = 1) -> AspectFields:
    return AspectFields("dataset", urn, "datasetProperties", version, {"name": name, "description": description})


def owners(urn: str, *users: str) -> AspectEdges:
    return AspectEdges(
        urn, "ownership", 1, tuple(Edge(urn, f"urn:li:corpuser:{u}", "OwnedBy", "dataset", "corpuser") for u in users)
    )


async def urns_of(backend, query: str) -> list[str]:
    page = await backend.search("dataset", query, count=100)
    return [h.urn for h in page.hits]


async def test_a_text_query_is_answered_by_indexes(backend, monkeypatch):
    # Each statement of a text search (the page and its count) can be a BitmapOr of the two GIN indexes, one per arm
    # of the match (the tsvector, the exact names). An arm no index answers (`x = ANY(exact_names)` was one) leaves
    # Postgres nothing but reading every document of the type. On a table this small the planner would read it all
    # anyway: table scans are priced out, and the (entity_type, urn) index, the other way to read every document of
    # a type, is dropped from this test's database.
    orders = ds("db.orders")
    others = [ds(f"db.t{i}") for i in range(200)]
    await backend.apply(
        [key(orders), props(orders, "orders", "one row per order")]
        + [c for u in others for c in (key(u), props(u, u.split(",")[1], "a table"))]
    )
    async with backend._connection(readonly=False) as conn:
        await conn.execute("DROP INDEX ix_search_document_type_urn")
        await conn.execute("ANALYZE search_document")
    plans: list[str] = []
    fetch = postgres._Reads._fetch

    async def explaining(reads, sql, params):  # each statement a search reads (not answered from the cache)
        rows = await fetch(reads, sql, params)
        await reads._conn.execute("SET LOCAL enable_seqscan = off")
        plans.append("\n".join(r[0] for r in await reads._conn.fetch(f"EXPLAIN {sql}", *params)))
        return rows

    monkeypatch.setattr(postgres._Reads, "_fetch", explaining)
    for query in ("orders", "db.orders", '"one row"', orders):
        plans.clear()
        page = await backend.search("dataset", query, facets=False)
        assert [h.urn for h in page.hits] == [orders] and page.total == 1
        assert len(plans) == 2  # the page and the count
        for plan in plans:
            assert "Seq Scan" not in plan, plan
            assert "ix_search_document_vector" in plan and "ix_search_document_exact_names" in plan, plan


async def test_reads_are_planned_for_their_parameters(backend):
    # asyncpg prepares every statement; a generic plan (chosen after five executions) ignores how many documents a
    # filter value matches, so the backend's reads always get a plan for their own parameters
    async with backend._connection() as conn:
        assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
        assert await conn.fetchval("SHOW jit") == "off"
    async with backend._connection(readonly=False) as conn:
        assert await conn.fetchval("SHOW plan_cache_mode") == "auto"


async def test_clear_by_entity_type(backend):
    """restore-indices --clean: every table's rows of those entity types (or of all), as counted."""
    a, b, user = ds("a"), ds("b"), "urn:li:corpuser:u1"
    await backend.apply(
        [
            key(a),
            props(a, "alpha", version=2),
            owners(a, "u1"),
            key(b),
            AspectFields("dataset", b, "status", 3, {}, deleted=True),
            AspectFields("corpuser", user, "corpUserInfo", 4, {"displayName": "User One"}),
        ]
    )
    cleared = await backend.clear(["dataset"])
    assert cleared == {"search_document": 2, "search_aspect_fields": 4, "search_edge": 1, "search_edge_version": 1}
    assert await backend.indexed_versions(["dataset"]) == []
    assert (await backend.search("dataset", "*")).total == 0
    assert await backend.indexed_versions(["corpuser"]) == [IndexedVersion(user, "corpUserInfo", "document", 4, True)]
    assert [h.urn for h in (await backend.search("corpuser", "User")).hits] == [user]

    assert await backend.clear() == {
        "search_document": 1,
        "search_aspect_fields": 1,
        "search_edge": 0,
        "search_edge_version": 0,
    }
    assert await backend.indexed_versions(["corpuser", "dataset"]) == []


async def test_an_entity_with_many_large_aspects_stays_within_the_tsvector_limit(backend, database_url):
    """Every aspect's contribution is bounded (app.search.documents), but an entity has many aspects: the tsvector is
    built from at most `search_max_document_chars` of their text, the heavier weights first, so it never reaches
    Postgres's 1 MB limit ("string is too long for tsvector")."""
    import asyncpg

    urn = ds("tsv.many")
    words = lambda prefix: " ".join(f"{prefix}{i:06d}" for i in range(10_000))  # noqa: E731 - 100k chars of distinct words
    changes = [props(urn, "manyaspects", words("desc"))]
    changes += [AspectFields("dataset", urn, f"extraAspect{n}", 1, {f"notes{n}": words(f"x{n}q")}) for n in range(15)]
    await backend.apply(changes)
    assert await urns_of(backend, "manyaspects") == [urn]  # the name (weight A) is kept whole
    assert await urns_of(backend, "desc000001") == [urn]
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        size = await conn.fetchval("SELECT pg_column_size(search_vector) FROM search_document WHERE urn = $1", urn)
    finally:
        await conn.close()
    assert size < 1_048_575


async def test_a_write_replaces_only_its_aspects_pieces_of_the_document(backend):
    """Each aspect's row keeps its own text pieces (migration 0013): a new version of one aspect replaces its words
    and exact name, the other aspects' stay searchable, a deleted aspect takes its words with it, and the last live
    aspect gone leaves a tombstone."""
    urn = ds("pieces.t1")
    await backend.apply(
        [
            key(urn),
            props(urn, "orders", "placed through the webshop"),
            AspectFields("dataset", urn, "editableDatasetProperties", 1, {"editedDescription": "curated"}),
        ]
    )
    assert await urns_of(backend, "webshop") == [urn]
    assert await urns_of(backend, "curated") == [urn]

    await backend.apply([props(urn, "invoices", "billed monthly", version=2)])
    assert await urns_of(backend, "webshop") == []
    assert await urns_of(backend, "orders") == []
    assert await urns_of(backend, "billed") == [urn]
    assert await urns_of(backend, "curated") == [urn]  # the aspect not written keeps its words
    page = await backend.search("dataset", "invoices")
    assert [(h.urn, h.fields["name"]) for h in page.hits] == [(urn, "invoices")]
    assert page.hits[0].score >= 1000  # still an exact name

    await backend.apply([AspectFields("dataset", urn, "editableDatasetProperties", 2, {}, deleted=True)])
    assert await urns_of(backend, "curated") == []
    assert await urns_of(backend, "billed") == [urn]

    await backend.apply(
        [AspectFields("dataset", urn, a, 3, {}, deleted=True) for a in ("datasetKey", "datasetProperties")]
    )
    assert (await backend.search("dataset", "*")).total == 0
    assert await backend.document_versions(urn) == {}
