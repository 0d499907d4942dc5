"""The ingestion-run trigger on the aspect store (migrations 0011, 0024): which runs a statement registers in
`ingestion_run`, and when it lowers a run's `first_change` (the earliest value the run created or changed, which
rollback reads). Each rule alone, with the statements the write path makes: rows 0 inserted, history rows inserted,
rows 0 updated (a new value: `createdon` moves; a re-observed one: it stays)."""

from __future__ import annotations

from datetime import datetime

import orjson
import pytest

T0 = datetime(2026, 11, 29, 10, 0, 0)
T1 = datetime(2026, 11, 29, 11, 0, 0)
T2 = datetime(2026, 11, 29, 12, 0, 0)


def sm(run: str | None) -> str:
    return orjson.dumps({"lastObserved": 1} | ({"runId": run} if run else {})).decode()


async def insert(db, urn: str, run: str | None, created: datetime, version: int = 0) -> None:
    await db.execute(
        "INSERT INTO metadata_aspect_v2 (urn, aspect, version, metadata, systemmetadata, createdon, createdby) "
        "VALUES ($1, 'status', $2, '{}', $3, $4, 'urn:li:corpuser:t')",
        urn,
        version,
        sm(run),
        created,
    )


async def update(db, urns: list[str], runs: list[str | None], created: list[datetime]) -> None:
    """One statement updating each URN's row 0 (as the write path's upsert does)."""
    await db.execute(
        "UPDATE metadata_aspect_v2 m SET systemmetadata = u.sm, createdon = u.created "
        "FROM unnest($1::text[], $2::text[], $3::timestamp[]) AS u(urn, sm, created) "
        "WHERE m.urn = u.urn AND m.aspect = 'status' AND m.version = 0",
        urns,
        [sm(r) for r in runs],
        created,
    )


async def runs(db) -> dict[str, datetime | None]:
    return {r["run_id"]: r["first_change"] for r in await db.fetch("SELECT run_id, first_change FROM ingestion_run")}


async def test_a_row_0_inserted_registers_its_run_at_its_createdon(db):
    await insert(db, "urn:li:corpuser:a", "r1", T1)
    assert await runs(db) == {"r1": T1}


async def test_a_history_row_registers_nothing(db):
    await insert(db, "urn:li:corpuser:a", "r1", T1, version=3)
    assert await runs(db) == {}


@pytest.mark.parametrize("run", [None, "no-run-id-provided"])
async def test_a_row_without_a_run_registers_nothing(db, run):
    await insert(db, "urn:li:corpuser:a", run, T1)
    assert await runs(db) == {}


async def test_an_insert_of_an_earlier_value_lowers_first_change_and_a_later_one_does_not(db):
    await insert(db, "urn:li:corpuser:a", "r1", T1)
    await insert(db, "urn:li:corpuser:b", "r1", T2)
    assert await runs(db) == {"r1": T1}
    await insert(db, "urn:li:corpuser:c", "r1", T0)
    assert await runs(db) == {"r1": T0}


async def test_an_update_that_changes_the_value_registers_the_run_at_the_new_createdon(db):
    await insert(db, "urn:li:corpuser:a", None, T0)
    await update(db, ["urn:li:corpuser:a"], ["r2"], [T1])
    assert await runs(db) == {"r2": T1}


async def test_an_update_that_reobserves_the_value_registers_the_run_with_no_change(db):
    await insert(db, "urn:li:corpuser:a", None, T0)
    await update(db, ["urn:li:corpuser:a"], ["r2"], [T0])  # createdon kept: the value was only observed again
    assert await runs(db) == {"r2": None}


async def test_a_later_change_fills_a_run_that_had_none_and_an_earlier_one_lowers_it(db):
    await insert(db, "urn:li:corpuser:a", None, T0)
    await insert(db, "urn:li:corpuser:b", None, T0)
    await update(db, ["urn:li:corpuser:a"], ["r2"], [T0])
    await update(db, ["urn:li:corpuser:a"], ["r2"], [T2])
    assert await runs(db) == {"r2": T2}
    await update(db, ["urn:li:corpuser:b"], ["r2"], [T1])
    assert await runs(db) == {"r2": T1}
    await update(db, ["urn:li:corpuser:b"], ["r2"], [T2])  # later: kept
    assert await runs(db) == {"r2": T1}


async def test_one_statement_of_many_rows_and_runs(db):
    urns = [f"urn:li:corpuser:u{i}" for i in range(300)]
    for urn in urns:
        await insert(db, urn, None, T0)
    # 300 rows in one statement: every third re-observed, the runs alternating
    await update(
        db,
        urns,
        ["r-even" if i % 2 == 0 else "r-odd" for i in range(300)],
        [T0 if i % 3 == 0 else (T2 if i < 150 else T1) for i in range(300)],
    )
    assert await runs(db) == {"r-even": T1, "r-odd": T1}
    await update(db, urns[:3], [None, None, None], [T2, T2, T2])  # no run: nothing registered, nothing lowered
    assert await runs(db) == {"r-even": T1, "r-odd": T1}
