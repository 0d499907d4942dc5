"""The cursors searches hand out as `scrollId` and take back: their layouts, and the checks a cursor passes before a
query uses it. A cursor comes back from a client, so it is untrusted text: anything but a cursor of this service
(garbage, truncated, tampered with, another search's) is an `InvalidCursor`, which the protocol layers answer with a
400 naming where their request holds it.

* keyset: one entity type's position, `[sort key..., urn]` (the backends' `SearchBackend.search`)
* across: a search across types (`app.search.across`): which type, that type's keyset cursor, the total, and the
  search's fingerprint
* edge: an edge scroll's position, the last edge's key (`SearchBackend.scroll_edges`)
* lineage: a lineage search's walk continued (`app.search.across`): the walk state's id, the position in its
  answer, the search's fingerprint, when it was issued, and a checksum of these
* offset: the position in a list a request computes whole (relationships of an entity)

The first four are URL-safe base64 of JSON (padding optional: both forms are taken); an offset is its digits.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from app.errors import Issue, ValidationFailed
from app.limits import MAX_LONG, MIN_LONG, clip, too_deep
from app.search.model import EdgeKey
from app.urns import InvalidUrnError, entity_type_of

MAX_CURSOR_CHARS = 65_536
_BASE64 = re.compile(r"[A-Za-z0-9_-]*={0,2}")


class InvalidCursor(ValueError):
    """`cursor` is not one this service gave for the request it came with; `reason` says how."""

    def __init__(self, cursor: str, reason: str) -> None:
        super().__init__(f"scrollId is not one this search returned: {reason}")
        self.cursor = cursor
        self.reason = reason

    def at(self, path: str) -> ValidationFailed:
        """The 400 answering it, naming `path`: where the caller's request holds the cursor (`$scrollId`, ...)."""
        return ValidationFailed(
            str(self),
            [
                Issue(
                    self.reason,
                    path=path,
                    found=clip(self.cursor, 100),
                    expected="the scrollId of a previous page of the same search",
                )
            ],
        )


def _encode(value: Any) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(value)).decode().rstrip("=")


def _decode(cursor: str) -> Any:
    if len(cursor) > MAX_CURSOR_CHARS:
        raise InvalidCursor(cursor, "too long")
    if not _BASE64.fullmatch(cursor):
        raise InvalidCursor(cursor, "not URL-safe base64")
    stripped = cursor.rstrip("=")
    try:
        raw = base64.urlsafe_b64decode(stripped + "=" * (-len(stripped) % 4))
        value = orjson.loads(raw)
    except (binascii.Error, ValueError):
        raise InvalidCursor(cursor, "not base64 of JSON") from None
    # JSON writes a NUL only as \u0000; no key or URN holds one (Postgres cannot store it)
    if b"\\u0000" in raw or too_deep(value, 9) is not None:
        raise InvalidCursor(cursor, "not a cursor of this service")
    return value


# --- keyset -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Keyset:
    """The position after the last hit of a page: its sort keys (one per sort field; by relevance: its score) and
    its URN (the tie-break)."""

    keys: tuple[Any, ...]
    urn: str


def keyset_cursor(keys: Sequence[Any], urn: str) -> str:
    return _encode([*keys, urn])


def decode_keyset(cursor: str, *, keys: int, by_relevance: bool) -> Keyset:
    """A keyset cursor of a backend that sorts on `keys` keys; `by_relevance`: the one key is a score."""
    value = _decode(cursor)
    if not isinstance(value, list) or len(value) != keys + 1:
        raise InvalidCursor(cursor, f"not {keys} sort key{'s' if keys > 1 else ''} and a URN")
    *sort_keys, urn = value
    try:
        entity_type_of(urn)
    except (InvalidUrnError, TypeError):
        raise InvalidCursor(cursor, "its last member is not a URN") from None
    for key in sort_keys:
        if isinstance(key, bool) or (isinstance(key, int) and not MIN_LONG <= key <= MAX_LONG):
            raise InvalidCursor(cursor, "not a sort key a search gives")
    if by_relevance and not isinstance(sort_keys[0], (int, float)):
        raise InvalidCursor(cursor, "a relevance-ordered page's key is a number")
    return Keyset(tuple(sort_keys), urn)


# --- across types -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AcrossCursor:
    position: int  # index of the type the next page starts in
    after: str | None  # that type's keyset cursor (None: from its start)
    total: int  # the matches, counted on the first page
    fingerprint: str  # the search's (app.search.across): a cursor is good for that search only


def across_cursor(cursor: AcrossCursor) -> str:
    return _encode({"p": cursor.position, "a": cursor.after, "n": cursor.total, "f": cursor.fingerprint})


def decode_across(cursor: str, *, fingerprint: str, types: int) -> AcrossCursor:
    """A cursor of the search across `types` types whose fingerprint is `fingerprint`. Its keyset cursor is the
    backend's to check."""
    value = _decode(cursor)
    if not isinstance(value, dict) or set(value) != {"p", "a", "n", "f"}:
        raise InvalidCursor(cursor, "not a cursor of this service")
    if value["f"] != fingerprint:
        raise InvalidCursor(cursor, "it belongs to another search (types, query, filters or sort differ)")
    position, after, total = value["p"], value["a"], value["n"]
    if (
        not isinstance(position, int)
        or isinstance(position, bool)
        or not 0 <= position < types
        or not isinstance(total, int)
        or isinstance(total, bool)
        or not 0 <= total <= MAX_LONG
        or not (after is None or isinstance(after, str))
    ):
        raise InvalidCursor(cursor, "not a cursor of this service")
    return AcrossCursor(position, after, total, fingerprint)


# --- lineage ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LineageCursor:
    walk: str  # the id of the walk state it continues (app.search.across); unknown to a process: walked again
    position: int  # how many results of the walk's answer the pages before it gave
    fingerprint: str  # the search's and its caller's (app.search.across): a cursor is good for that search only
    issued: int  # Unix seconds; past the walk states' lifetime the cursor is expired


def _checksum(walk: str, position: int, fingerprint: str, issued: int) -> str:
    return hashlib.sha256(orjson.dumps([walk, position, fingerprint, issued])).hexdigest()[:16]


def lineage_cursor(cursor: LineageCursor) -> str:
    parts = (cursor.walk, cursor.position, cursor.fingerprint, cursor.issued)
    return _encode({"w": parts[0], "n": parts[1], "f": parts[2], "t": parts[3], "c": _checksum(*parts)})


def decode_lineage(cursor: str, *, fingerprint: str, now: float, lifetime_s: float) -> LineageCursor:
    """A cursor of the lineage search whose fingerprint is `fingerprint`, issued within `lifetime_s` of `now`. Its
    checksum makes an edit of it a refusal, not another position (nothing in it is trusted beyond that: the walk
    state it names answers its own search only, and its position is checked against that state)."""
    value = _decode(cursor)
    if not isinstance(value, dict) or set(value) != {"w", "n", "f", "t", "c"}:
        raise InvalidCursor(cursor, "not a cursor of this service")
    walk, position, found, issued = value["w"], value["n"], value["f"], value["t"]
    if (
        not isinstance(walk, str)
        or not isinstance(found, str)
        or any(not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_LONG for v in (position, issued))
    ):
        raise InvalidCursor(cursor, "not a cursor of this service")
    if value["c"] != _checksum(walk, position, found, issued):
        raise InvalidCursor(cursor, "tampered with: its checksum does not match")
    if found != fingerprint:
        raise InvalidCursor(cursor, "it belongs to another search (start, direction, types, query or filters differ)")
    if not issued - 60 <= now <= issued + lifetime_s:
        raise InvalidCursor(cursor, f"expired: a lineage cursor is good for {lifetime_s:.0f} s")
    return LineageCursor(walk, position, found, issued)


# --- edges --------------------------------------------------------------------------------------------------------


def edge_cursor(after: EdgeKey) -> str:
    return _encode(list(after))


def decode_edge(cursor: str) -> EdgeKey:
    """The key [source, aspect, relationship, destination] of the last edge of the previous page."""
    value = _decode(cursor)
    if not isinstance(value, list) or len(value) != 4 or not all(isinstance(part, str) for part in value):
        raise InvalidCursor(cursor, "not an edge key")
    source, aspect, relationship, destination = value
    return source, aspect, relationship, destination


# --- offsets ------------------------------------------------------------------------------------------------------


def offset_cursor(offset: int) -> str:
    return str(offset)


def decode_offset(cursor: str) -> int:
    """ASCII digits, within 64 bits."""
    if not (cursor.isascii() and cursor.isdigit()) or len(cursor) > 19 or int(cursor) > MAX_LONG:
        raise InvalidCursor(cursor, "not an offset this service gave")
    return int(cursor)
