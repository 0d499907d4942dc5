"""Array parameters after app.db's `_builtin_containers_as_arrays`: asyncpg takes the builtin containers metaledger
passes (nested lists as arrays of arrays) and refuses any other container loudly, never as one scalar."""

from __future__ import annotations

import collections

import asyncpg
import pytest
from asyncpg.protocol import protocol

from app.db import ARRAY_CONTAINERS


def test_the_checks_are_the_builtin_containers():
    assert protocol.IterableABC is ARRAY_CONTAINERS and protocol.SizedABC is ARRAY_CONTAINERS


@pytest.mark.parametrize(
    "container",
    [["a", "b"], ("a", "b"), {"a": 1, "b": 2}.keys(), {1: "a", 2: "b"}.values()],
    ids=["list", "tuple", "dict keys", "dict values"],
)
async def test_builtin_containers_are_arrays(db, container):
    assert await db.fetchval("SELECT $1::text[]", container) == ["a", "b"]


async def test_sets_ranges_and_nested_lists(db):
    assert sorted(await db.fetchval("SELECT $1::text[]", {"b", "a"})) == ["a", "b"]
    assert await db.fetchval("SELECT $1::int[]", frozenset({3})) == [3]
    assert await db.fetchval("SELECT $1::bigint[]", range(3)) == [0, 1, 2]
    assert await db.fetchval("SELECT $1::int[]", [[1, 2], [3, 4]]) == [[1, 2], [3, 4]]
    assert await db.fetchval("SELECT $1::text[]", ["x", None]) == ["x", None]


async def test_another_container_is_refused_not_read_as_a_scalar(db):
    with pytest.raises(asyncpg.DataError, match="sized iterable container expected"):
        await db.fetchval("SELECT $1::text[]", collections.deque(["a"]))
    with pytest.raises(asyncpg.DataError):  # a string is an element, never an array of its characters
        await db.fetchval("SELECT $1::text[]", "ab")
