"""Write combining (app.write.combiner): concurrent HTTP writes share transactions, and each keeps its own outcome.

Bursts of concurrent requests against the in-process app and the real test Postgres: fewer transactions than
writes; a refused write in a group (a stale If-Version-Match, a CREATE of what exists) is refused alone while the
others commit; writes to one aspect in one group are versioned one after the other as if committed in turn.
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote

import asyncpg

from app.errors import PreconditionFailed
from app.write.combiner import WriteCombiner
from app.write.proposal import AuditStamp, Draft


def dataset(name: str) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:hive,combine.{name},PROD)"


def aspect_path(urn: str, aspect: str = "datasetProperties") -> str:
    return f"/openapi/v3/entity/dataset/{quote(urn, safe='')}/{aspect}"


async def test_concurrent_writes_share_transactions(app, client, db: asyncpg.Connection):
    combiner = app.state.gateway.combiner
    groups_before, writes_before = combiner.groups, combiner.writes
    urns = [dataset(f"t{i}") for i in range(60)]
    responses = await asyncio.gather(
        *(
            client.post(aspect_path(u), json={"value": {"name": u[-12:]}}, params={"createIfNotExists": "false"})
            for u in urns
        )
    )
    assert [r.status_code for r in responses] == [200] * 60, [r.text for r in responses if r.status_code != 200]
    assert combiner.writes - writes_before == 60
    assert combiner.groups - groups_before < 60  # some transactions carried several writes
    # every write committed with its key aspect and its own change log
    assert (
        await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn LIKE '%combine.t%' AND version = 0") == 120
    )
    assert (
        await db.fetchval(
            "SELECT count(DISTINCT urn) FROM change_log_outbox WHERE urn LIKE '%combine.t%' AND aspect = 'datasetProperties'"
        )
        == 60
    )


async def test_a_refused_write_does_not_refuse_its_group(app, client, db: asyncpg.Connection):
    urn = dataset("conditional")
    assert (await client.post(aspect_path(urn), json={"value": {"name": "v1"}})).status_code in (200, 201)

    async def write(i: int):
        headers = {"If-Version-Match": "999"} if i == 7 else {}
        return await client.post(
            aspect_path(urn), json={"value": {"name": f"w{i}"}}, headers=headers, params={"createIfNotExists": "false"}
        )

    responses = await asyncio.gather(*(write(i) for i in range(20)))
    statuses = [r.status_code for r in responses]
    assert statuses[7] == 412, responses[7].text
    assert "999" in responses[7].text
    assert statuses[:7] + statuses[8:] == [200] * 19
    # 1 + 19 versions, one after the other, each with a change log of its own
    assert (
        await db.fetchval(
            "SELECT systemmetadata::jsonb ->> 'version' FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'datasetProperties' "
            "AND version = 0",
            urn,
        )
        == "20"
    )
    versions = [
        r["version"]
        for r in await db.fetch(
            "SELECT version FROM change_log_outbox WHERE urn = $1 AND aspect = 'datasetProperties' "
            "AND topic = 'MetadataChangeLog_Versioned_v1' ORDER BY version",
            urn,
        )
    ]
    assert versions == list(range(1, 21))


async def test_one_group_refused_is_applied_one_by_one(app, db: asyncpg.Connection):
    """Deterministic grouping: one flusher, five writes queued before it runs, so they form one group; the stale
    precondition of the third refuses the group, which is then applied write by write."""
    writer = app.state.write_service
    combiner = WriteCombiner(writer, app.state.sessionmaker, flushers=1)
    urn = dataset("grouped")

    def proposals(i: int):
        headers = {"If-Version-Match": "7"} if i == 2 else None
        return writer.prepare(
            [Draft(0, "dataset", "datasetProperties", "UPSERT", urn=urn, value={"name": f"g{i}"}, headers=headers)]
        )

    outcomes = await asyncio.gather(
        *(combiner.commit(proposals(i), AuditStamp.now()) for i in range(5)), return_exceptions=True
    )
    assert combiner.groups == 1 and combiner.writes == 5 and combiner.fallbacks == 1  # then one by one
    assert isinstance(outcomes[2], PreconditionFailed), outcomes[2]
    committed = [o for i, o in enumerate(outcomes) if i != 2]
    assert [o.items[0].version for o in committed] == ["1", "2", "3", "4"]
    assert (
        await db.fetchval("SELECT count(*) FROM change_log_outbox WHERE urn = $1 AND aspect = 'datasetProperties'", urn)
        == 4
    )


async def test_concurrent_creates_of_one_aspect_one_wins(client, db: asyncpg.Connection):
    urn = dataset("created-once")
    responses = await asyncio.gather(
        *(
            client.post(aspect_path(urn), json={"value": {"name": f"c{i}"}})
            for i in range(10)  # CREATE by default
        )
    )
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(409) == 9, [r.text for r in responses]
    assert (
        await db.fetchval("SELECT count(*) FROM change_log_outbox WHERE urn = $1 AND aspect = 'datasetProperties'", urn)
        == 1
    )


async def test_concurrent_create_entity_one_wins(client, db: asyncpg.Connection):
    urn = dataset("entity-once")
    aspects = {
        "datasetProperties": {"name": "x"},
        "status": {"removed": False},
        "globalTags": {"tags": []},
        "ownership": {"owners": []},
        "institutionalMemory": {"elements": []},
    }
    responses = await asyncio.gather(
        *(
            client.post(aspect_path(urn, aspect), json={"value": value}, params={"createIfEntityNotExists": "true"})
            for aspect, value in aspects.items()
        )
    )
    statuses = [r.status_code for r in responses]
    assert sum(s in (200, 201) for s in statuses) == 1 and statuses.count(409) == 4, [r.text for r in responses]


async def test_a_database_error_of_one_write_stays_its_own(app, db: asyncpg.Connection):
    """A write the database itself refuses (here a trigger of the test's, as a stand-in for any data error Postgres
    raises) fails alone; the writes it was grouped with are committed."""
    refused = dataset("refused-by-postgres")
    await db.execute(f"""
        CREATE FUNCTION refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.urn = '{refused}' THEN RAISE EXCEPTION 'refused by the test''s trigger'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_one BEFORE INSERT ON metadata_aspect_v2 FOR EACH ROW EXECUTE FUNCTION refuse_one();
    """)
    writer = app.state.write_service
    combiner = WriteCombiner(writer, app.state.sessionmaker, flushers=1)
    urns = [dataset(f"neighbour{i}") for i in range(2)] + [refused] + [dataset(f"neighbour{i}") for i in range(2, 4)]
    outcomes = await asyncio.gather(
        *(
            combiner.commit(
                writer.prepare([Draft(0, "dataset", "datasetProperties", "UPSERT", urn=u, value={"name": "n"})]),
                AuditStamp.now(),
            )
            for u in urns
        ),
        return_exceptions=True,
    )
    assert combiner.groups == 1 and combiner.fallbacks == 1
    assert isinstance(outcomes[2], asyncpg.exceptions.RaiseError), outcomes[2]
    assert all(o.items[0].version == "1" for i, o in enumerate(outcomes) if i != 2), outcomes
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn LIKE '%combine.neighbour%'") == 8
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", refused) == 0


async def test_a_large_write_has_its_own_transaction_and_holds_up_no_small_one(
    app, client, db: asyncpg.Connection, database_url
):
    from app.write.combiner import SHARED_MAX_PROPOSALS
    from tests.helpers import eventually, mcp, propose

    combiner = app.state.gateway.combiner
    held = [dataset(f"held{i}") for i in range(combiner.flushers)]
    await propose(client, *(mcp("status", {"removed": False}, urn) for urn in held))
    writes_before = combiner.writes
    # each large write blocks on a row another transaction holds: as many of them as the combiner has flushers
    async with db.transaction():
        await db.execute("SELECT 1 FROM metadata_aspect_v2 WHERE urn = ANY($1::text[]) FOR UPDATE", held)
        large = [
            asyncio.create_task(
                client.post(
                    "/openapi/v1/proposals",
                    json=[
                        mcp("status", {"removed": True}, urn),
                        *(
                            mcp("datasetProperties", {"name": f"l{i}.{j}"}, dataset(f"large{i}.{j}"))
                            for j in range(SHARED_MAX_PROPOSALS)
                        ),
                    ],
                )
            )
            for i, urn in enumerate(held)
        ]
        watcher = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:

            async def all_blocked() -> bool:  # every large write waits for a row this transaction holds
                return await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", db.get_server_pid()
                ) == len(held) or any(task.done() for task in large)

            await eventually(all_blocked, timeout=20, what=f"{len(held)} large writes blocked on the held rows")
        finally:
            await watcher.close()
        assert not any(task.done() for task in large), [task.result().text for task in large if task.done()]
        single = await asyncio.wait_for(
            client.post(
                aspect_path(dataset("small")), json={"value": {"name": "small"}}, params={"createIfNotExists": "false"}
            ),
            10,
        )
        assert single.status_code == 200, single.text
        assert not any(task.done() for task in large)
    assert [r.status_code for r in await asyncio.gather(*large)] == [200] * len(held)
    assert combiner.writes - writes_before == 1  # the single write only
