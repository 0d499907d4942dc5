"""Batched aspect reads for one GraphQL request.

graphql-core resolves the fields of every item of a list concurrently, so a page of search results asks for the same
aspects of ten entities, and then for the aspects of the tags, owners and domains they name, each from its own
resolver. Each read asked for while those resolvers run joins one batch, read in one query when the event loop
gets back to it: a page costs one query per level of nesting, not one per entity and field.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

# (urn, aspects or None for every aspect) -> urn -> aspect -> value
BatchRead = Callable[[Sequence[tuple[str, Sequence[str] | None]]], Awaitable[dict[str, dict[str, Any]]]]


class AspectLoader:
    def __init__(self, read: BatchRead, lock: asyncio.Lock) -> None:
        self._read = read
        self._lock = lock  # the request's session runs one statement at a time
        self._known: dict[str, dict[str, Any]] = {}  # urn -> aspect -> value (None: read, absent)
        self._whole: set[str] = set()  # urns whose every aspect was read
        self._pairs: dict[str, set[str]] = {}  # waiting for the next batch
        self._wholes: set[str] = set()
        self._batch: asyncio.Future[None] | None = None

    def forget(self) -> None:
        """After a write: what this request read before may have changed."""
        self._known.clear()
        self._whole.clear()

    async def aspect(self, urn: str, aspect: str) -> dict[str, Any] | None:
        known = self._known.get(urn)
        if urn not in self._whole and (known is None or aspect not in known):
            self._pairs.setdefault(urn, set()).add(aspect)
            await self._next_batch()
        return self._known.get(urn, {}).get(aspect)

    async def entity(self, urn: str) -> dict[str, Any]:
        """Every aspect of `urn` (empty: the entity does not exist)."""
        if urn not in self._whole:
            self._wholes.add(urn)
            await self._next_batch()
        return {name: value for name, value in self._known.get(urn, {}).items() if value is not None}

    async def _next_batch(self) -> None:
        if self._batch is None:
            loop = asyncio.get_running_loop()
            self._batch = loop.create_future()
            loop.create_task(self._flush(self._batch))
        await asyncio.shield(self._batch)

    async def _flush(self, batch: asyncio.Future[None]) -> None:
        await asyncio.sleep(0)  # the resolvers started with the first one ask before the batch is taken
        pairs, wholes = self._pairs, self._wholes
        self._pairs, self._wholes, self._batch = {}, set(), None
        wanted: list[tuple[str, Sequence[str] | None]] = [(urn, None) for urn in sorted(wholes)]
        wanted += [(urn, sorted(names)) for urn, names in sorted(pairs.items()) if urn not in wholes]
        try:
            async with self._lock:
                found = await self._read(wanted)
        except BaseException as error:  # every waiter sees it (a 503 when the database is gone)
            batch.set_exception(error)
            return
        for urn, names in wanted:
            known = self._known.setdefault(urn, {})
            values = found.get(urn, {})
            if names is None:
                self._whole.add(urn)
                known.update(values)
            else:
                known.update((name, values.get(name)) for name in names)
        batch.set_result(None)
