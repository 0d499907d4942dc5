"""Scrolling over several entity types with one cursor.

A backend pages one entity type at a time (`SearchBackend.search`, keyset cursors on (sort key, urn)). A scroll
across types visits the types in the order given and pages each to its end before the next; its cursor says
where it stands: the type, that type's own cursor (None: from its start) and the match count of the first page.

Cursors stay exact under concurrent writes: each type's cursor is a keyset position, not an offset, so an entity
that matches throughout the scroll, and whose sort key does not change, is returned exactly once — entities
written, changed or deleted meanwhile never shift it. (An entity created behind the cursor is not seen; one
whose sort key changes may move across it.)
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from app.search.model import SearchBackend, SearchHit

CURSOR_VERSION = 1
MAX_CURSOR_CHARS = 65_536


class BadCursor(ValueError):
    """The scroll id is not one `scroll_across` gave (for these entity types)."""


@dataclass(frozen=True)
class Cursor:
    entity_type: str  # the type the next page starts in
    inner: str | None  # that type's backend cursor; None: its first page
    total: int  # matches over all the types when the scroll began


@dataclass
class AcrossPage:
    hits: list[SearchHit]
    total: int
    cursor: Cursor | None  # None: the scroll is over

    @property
    def scroll_id(self) -> str | None:
        return encode_cursor(self.cursor) if self.cursor else None


def encode_cursor(cursor: Cursor) -> str:
    raw = orjson.dumps({"v": CURSOR_VERSION, "t": cursor.entity_type, "c": cursor.inner, "n": cursor.total})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(scroll_id: str, types: Sequence[str]) -> Cursor:
    """The cursor in `scroll_id`; BadCursor unless it is one `encode_cursor` made for one of `types`."""
    if len(scroll_id) > MAX_CURSOR_CHARS:
        raise BadCursor("too long")
    try:
        data = orjson.loads(base64.urlsafe_b64decode(scroll_id + "=" * (-len(scroll_id) % 4)))
    except (binascii.Error, ValueError):
        raise BadCursor("not base64 of a JSON object") from None
    if not isinstance(data, dict) or data.get("v") != CURSOR_VERSION:
        raise BadCursor("not a scroll cursor")
    entity_type, inner, total = data.get("t"), data.get("c"), data.get("n")
    if entity_type not in types:
        raise BadCursor("its entity type is not one of this scroll's")
    if not (inner is None or isinstance(inner, str)) or not isinstance(total, int) or isinstance(total, bool) or total < 0:
        raise BadCursor("not a scroll cursor")
    return Cursor(entity_type, inner, total)


async def scroll_across(
    backend: SearchBackend, types: Sequence[str], query: str, *, filters: dict[str, list[str]] | None = None,
    count: int = 10, cursor: Cursor | None = None, sort: list[tuple[str, str]] | None = None,
) -> AcrossPage:
    """Up to `count` (at least 1) hits over `types` from `cursor` (None: the start). The first page also counts the
    matches of every type (a search of no hits for each type it does not reach); later pages carry that count."""
    if count < 1:
        raise ValueError("count must be at least 1")
    position = types.index(cursor.entity_type) if cursor else 0
    inner = cursor.inner if cursor else None
    hits: list[SearchHit] = []
    total = 0
    next_cursor: Cursor | None = None
    while position < len(types) and len(hits) < count:
        page = await backend.search(
            types[position], query, filters=filters, count=count - len(hits), scroll_id=inner, sort=sort,
        )
        total += page.total
        hits.extend(page.hits)
        if page.scroll_id:  # more of this type: the next page resumes inside it
            next_cursor = Cursor(types[position], page.scroll_id, 0)
            break
        position, inner = position + 1, None
    else:
        if position < len(types):  # the page is full at the end of a type: the next page starts the next type
            next_cursor = Cursor(types[position], None, 0)
    if cursor is None:
        for entity_type in types[position + 1:] if next_cursor and next_cursor.inner else types[position:]:
            total += (await backend.search(entity_type, query, filters=filters, count=0, sort=sort)).total
    else:
        total = cursor.total
    if next_cursor is not None:
        next_cursor = Cursor(next_cursor.entity_type, next_cursor.inner, total)
    return AcrossPage(hits=hits, total=total, cursor=next_cursor)
