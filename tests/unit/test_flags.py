"""The one boolean parser (app.flags) that query parameters, Rest.li body flags and the sync-index header share."""

from __future__ import annotations

import pytest

from app.errors import ValidationFailed
from app.flags import parse_bool
from app.search.service import SYNC_INDEX_HEADER, wants_sync_index


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (True, True),
        (False, False),
        ("true", True),
        ("FALSE", False),
        (" yes ", True),
        ("no", False),
        ("1", True),
        ("0", False),
        (None, None),
        ("", None),
    ],
)
def test_each_spelling_of_a_boolean_and_the_default(raw, expected):
    assert parse_bool(raw, default=None, name=".async") is expected  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", ["maybe", "on", "t", 2, {"x": 1}])
def test_anything_else_is_a_400_naming_where(raw):
    with pytest.raises(ValidationFailed) as refused:
        parse_bool(raw, False, ".async")
    assert refused.value.issues[0].path == "$.async"
    assert "must be true or false" in str(refused.value)


def test_the_sync_index_header_is_read_by_it():
    assert wants_sync_index({SYNC_INDEX_HEADER: "yes"}, []) is True  # `== "true"` took it for false
    assert wants_sync_index({SYNC_INDEX_HEADER: "false"}, []) is False
    assert wants_sync_index({}, [type("P", (), {"headers": {"X-DataHub-Sync-Index-Update": "1"}})()]) is True
    with pytest.raises(ValidationFailed) as refused:
        wants_sync_index({SYNC_INDEX_HEADER: "maybe"}, [])
    assert refused.value.issues[0].path == f"${SYNC_INDEX_HEADER}"
