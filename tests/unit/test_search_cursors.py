"""app.search.cursors: every cursor layout round-trips, and whatever a client could send instead (garbage, truncated,
tampered with, another search's) is an InvalidCursor, answered as a 400 naming the caller's parameter."""

from __future__ import annotations

import base64

import orjson
import pytest

from app.limits import MAX_LONG
from app.search.cursors import (
    MAX_CURSOR_CHARS,
    AcrossCursor,
    InvalidCursor,
    Keyset,
    across_cursor,
    decode_across,
    decode_edge,
    decode_keyset,
    decode_offset,
    edge_cursor,
    keyset_cursor,
    offset_cursor,
)

DS = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"


def b64(value: object, *, padded: bool = False) -> str:
    text = base64.urlsafe_b64encode(orjson.dumps(value)).decode()
    return text if padded else text.rstrip("=")


@pytest.mark.parametrize("keys", [[1.5], ["orders"], [None], [{"a": [1, 2]}], ["x", 3, -(2**63)]])
def test_keyset_round_trip(keys):
    cursor = keyset_cursor(keys, DS)
    assert "=" not in cursor
    assert decode_keyset(cursor, keys=len(keys), by_relevance=False) == Keyset(tuple(keys), DS)


def test_keyset_is_read_padded_or_not():
    padded = b64([2.0, DS], padded=True)
    assert padded.endswith("=")
    assert decode_keyset(padded, keys=1, by_relevance=True) == decode_keyset(
        padded.rstrip("="), keys=1, by_relevance=True
    )


@pytest.mark.parametrize(
    ("cursor", "reason"),
    [
        ("!!!notbase64", "not URL-safe base64"),
        ("a" * (MAX_CURSOR_CHARS + 1), "too long"),
        (b64("x")[:-1] + "===", "not URL-safe base64"),
        (base64.urlsafe_b64encode(b"not json").decode(), "not base64 of JSON"),
        (b64({}), "sort key"),
        (b64([1]), "sort key"),
        (b64([1, 2, DS]), "sort key"),  # two keys for a backend sorting on one
        (b64([1.0, "not a urn"]), "not a URN"),
        (b64([1.0, 7]), "not a URN"),
        (b64([1.0, DS + "\x00"]), "not a cursor of this service"),
        (b64(["a\x00", DS]), "not a cursor of this service"),
        (b64([[[[[[[[[[1]]]]]]]]], DS]), "not a cursor of this service"),
        (b64([True, DS]), "not a sort key"),
        (b64([MAX_LONG + 1, DS]), "not a sort key"),
    ],
)
def test_keyset_garbage_is_refused(cursor, reason):
    with pytest.raises(InvalidCursor, match=reason) as caught:
        decode_keyset(cursor, keys=1, by_relevance=False)
    assert caught.value.cursor == cursor


def test_a_relevance_ordered_page_has_a_numeric_key():
    cursor = keyset_cursor(["orders"], DS)
    assert decode_keyset(cursor, keys=1, by_relevance=False).keys == ("orders",)
    with pytest.raises(InvalidCursor, match="relevance"):
        decode_keyset(cursor, keys=1, by_relevance=True)


def test_across_round_trip_and_fingerprint():
    cursor = AcrossCursor(1, keyset_cursor([1.0], DS), 42, "f" * 16)
    text = across_cursor(cursor)
    assert decode_across(text, fingerprint="f" * 16, types=2) == cursor
    assert decode_across(across_cursor(AcrossCursor(0, None, 0, "x")), fingerprint="x", types=1).after is None
    with pytest.raises(InvalidCursor, match="another search"):
        decode_across(text, fingerprint="0" * 16, types=2)


@pytest.mark.parametrize(
    "value",
    [
        [1, None, 0, "f"],
        {"p": 0, "a": None, "n": 0},  # a member missing
        {"p": 0, "a": None, "n": 0, "f": "f", "x": 1},  # one too many
        {"p": 2, "a": None, "n": 0, "f": "f"},  # past the types searched
        {"p": -1, "a": None, "n": 0, "f": "f"},
        {"p": True, "a": None, "n": 0, "f": "f"},
        {"p": 0, "a": None, "n": -1, "f": "f"},
        {"p": 0, "a": None, "n": MAX_LONG + 1, "f": "f"},
        {"p": 0, "a": 5, "n": 0, "f": "f"},
    ],
)
def test_across_tampered_is_refused(value):
    with pytest.raises(InvalidCursor, match="not a cursor of this service"):
        decode_across(b64(value), fingerprint="f", types=2)


def test_a_truncated_cursor_is_refused():
    text = across_cursor(AcrossCursor(1, keyset_cursor([1.0], DS), 42, "f"))
    with pytest.raises(InvalidCursor):
        decode_across(text[:-4], fingerprint="f", types=2)


def test_edge_round_trip_and_garbage():
    key = (DS, "upstreamLineage", "DownstreamOf", "urn:li:dataset:(urn:li:dataPlatform:hive,db.raw,PROD)")
    assert decode_edge(edge_cursor(key)) == key
    for bad in [b64(["a"]), b64(["a", "b", "c", 4]), b64({"a": 1}), "%%%", b64(["a", "b", "c", "d\x00"])]:
        with pytest.raises(InvalidCursor):
            decode_edge(bad)


def test_offsets():
    assert decode_offset(offset_cursor(0)) == 0
    assert decode_offset(offset_cursor(MAX_LONG)) == MAX_LONG
    for bad in [str(MAX_LONG + 1), "-1", "1.5", "\u00b2", "", "0x10", "1" * 20]:
        with pytest.raises(InvalidCursor):
            decode_offset(bad)


def test_the_400_names_the_callers_parameter():
    with pytest.raises(InvalidCursor) as caught:
        decode_offset("x" * 300)
    answer = caught.value.at("$input.scrollId").to_json()
    issue = answer["issues"][0]
    assert issue["path"] == "$input.scrollId" and len(issue["found"]) < 300  # clipped
    assert "scrollId is not one this search returned" in answer["message"]
