"""Array parameters after app.db's `_builtin_containers_as_arrays`: asyncpg takes the lists and tuples metaledger
passes (nested lists as arrays of arrays) and refuses any other container loudly, never as one scalar."""

from __future__ import annotations

import collections

import asyncpg
import pytest
from asyncpg.protocol import protocol

from app.db import ARRAY_CONTAINERS


@pytest.fixture(autouse=True)
def engine_made(app):
    """The process made an engine (app.db.create_engine), as every metaledger process does."""


def test_the_checks_are_the_builtin_containers():
    assert protocol.IterableABC is ARRAY_CONTAINERS and protocol.SizedABC is ARRAY_CONTAINERS


@pytest.mark.parametrize("container", [["a", "b"], ("a", "b")], ids=["list", "tuple"])
async def test_lists_and_tuples_are_arrays(db, container):
    assert await db.fetchval("SELECT $1::text[]", container) == ["a", "b"]


async def test_nested_lists_and_nulls(db):
    assert await db.fetchval("SELECT $1::int[]", [[1, 2], [3, 4]]) == [[1, 2], [3, 4]]
    assert await db.fetchval("SELECT $1::text[]", ["x", None]) == ["x", None]
    assert await db.fetchval("SELECT $1::bigint[]", []) == []


@pytest.mark.parametrize(
    "container",
    [{"a"}, frozenset({"a"}), {"a": 1}.keys(), {1: "a"}.values(), collections.deque(["a"])],
    ids=["set", "frozenset", "dict keys", "dict values", "deque"],
)
async def test_another_container_is_refused_not_read_as_a_scalar(db, container):
    with pytest.raises(asyncpg.DataError, match="sized iterable container expected"):
        await db.fetchval("SELECT $1::text[]", container)


async def test_a_string_is_never_an_array_of_its_characters(db):
    with pytest.raises(asyncpg.DataError):
        await db.fetchval("SELECT $1::text[]", "ab")
