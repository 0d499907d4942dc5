"""The GraphQL request's aspect loader: reads asked for together are one read, and each aspect is read once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from app.graphql.loader import AspectLoader

STORE = {
    "urn:li:tag:a": {"tagProperties": {"name": "A"}, "tagKey": {"name": "a"}},
    "urn:li:tag:b": {"tagProperties": {"name": "B"}},
}


class Store:
    def __init__(self, fail: bool = False) -> None:
        self.reads: list[list[tuple[str, tuple[str, ...] | None]]] = []
        self.fail = fail

    async def read(self, wanted: Sequence[tuple[str, Sequence[str] | None]]) -> dict[str, dict[str, Any]]:
        self.reads.append([(urn, None if names is None else tuple(names)) for urn, names in wanted])
        await asyncio.sleep(0.001)  # a round trip: other resolvers run meanwhile
        if self.fail:
            raise ConnectionError("database gone")
        out: dict[str, dict[str, Any]] = {}
        for urn, names in wanted:
            aspects = STORE.get(urn, {})
            out[urn] = {n: v for n, v in aspects.items() if names is None or n in names}
        return out


def loader(store: Store) -> AspectLoader:
    return AspectLoader(store.read, asyncio.Lock())


async def test_reads_asked_for_together_are_one_read():
    store = Store()
    load = loader(store)
    values = await asyncio.gather(
        load.aspect("urn:li:tag:a", "tagProperties"),
        load.aspect("urn:li:tag:b", "tagProperties"),
        load.aspect("urn:li:tag:a", "tagKey"),
        load.aspect("urn:li:tag:missing", "tagProperties"),
    )
    assert values == [{"name": "A"}, {"name": "B"}, {"name": "a"}, None]
    assert store.reads == [
        [
            ("urn:li:tag:a", ("tagKey", "tagProperties")),
            ("urn:li:tag:b", ("tagProperties",)),
            ("urn:li:tag:missing", ("tagProperties",)),
        ]
    ]
    # read once: known values and known absences are not asked for again
    assert await load.aspect("urn:li:tag:a", "tagKey") == {"name": "a"}
    assert await load.aspect("urn:li:tag:missing", "tagProperties") is None
    assert len(store.reads) == 1


async def test_a_whole_entity_read_answers_its_aspects():
    store = Store()
    load = loader(store)
    whole, one = await asyncio.gather(load.entity("urn:li:tag:a"), load.aspect("urn:li:tag:a", "tagProperties"))
    assert whole == STORE["urn:li:tag:a"] and one == {"name": "A"}
    assert store.reads == [[("urn:li:tag:a", None)]]  # the aspect is not asked for apart
    assert await load.aspect("urn:li:tag:a", "globalTags") is None  # absent: the whole entity was read
    assert await load.entity("urn:li:tag:missing") == {}
    assert len(store.reads) == 2


async def test_nested_reads_are_one_read_per_level():
    store = Store()
    load = loader(store)

    async def tag_then_key(urn: str) -> tuple[Any, Any]:
        first = await load.aspect(urn, "tagProperties")
        return first, await load.aspect(urn, "tagKey")

    await asyncio.gather(*(tag_then_key(f"urn:li:tag:{i}") for i in range(10)))
    assert [len(batch) for batch in store.reads] == [10, 10]


async def test_forget_reads_again_and_a_failed_read_fails_every_waiter():
    store = Store()
    load = loader(store)
    await load.aspect("urn:li:tag:a", "tagProperties")
    load.forget()
    await load.aspect("urn:li:tag:a", "tagProperties")
    assert len(store.reads) == 2

    store.fail = True
    results = await asyncio.gather(
        load.aspect("urn:li:tag:x", "tagKey"), load.entity("urn:li:tag:y"), return_exceptions=True
    )
    assert [type(r) for r in results] == [ConnectionError, ConnectionError]
    store.fail = False
    assert await load.aspect("urn:li:tag:b", "tagProperties") == {"name": "B"}  # the next batch is read anew
