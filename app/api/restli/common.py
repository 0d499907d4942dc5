"""Helpers shared by the Rest.li endpoints."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from app.errors import Issue, ValidationFailed
from app.limits import MAX_LONG, MIN_LONG, clip

# The request body of every Rest.li action is a JSON object; documented per action in the route's description.
ACTION_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}}


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValidationFailed(
            "the body of a Rest.li action must be a JSON object", [Issue("expected an object", path="$")]
        )
    return body


def require_urn(body: dict[str, Any], key: str = "urn") -> str:
    urn = body.get(key)
    if not isinstance(urn, str) or not urn:
        raise ValidationFailed(
            f"`{key}` is required", [Issue(f"missing required string field {key!r}", path=f"$.{key}")]
        )
    return urn


def optional_int(body: dict[str, Any], key: str) -> int | None:
    """An integer field (Rest.li longs may come as strings), within 64 bits; 400 naming it otherwise."""
    raw = body.get(key)
    if raw is None:
        return None
    digits = raw.removeprefix("-") if isinstance(raw, str) else ""
    if (
        isinstance(raw, bool)
        or not isinstance(raw, (int, str))
        or (isinstance(raw, str) and not (digits.isascii() and digits.isdigit() and len(digits) <= 20))
    ):
        raise ValidationFailed(
            f"`{key}` must be an integer", [Issue("expected an integer", path=f"$.{key}", found=clip(repr(raw), 100))]
        )
    value = int(raw)
    if not MIN_LONG <= value <= MAX_LONG:
        raise ValidationFailed(
            f"`{key}` must be between {MIN_LONG} and {MAX_LONG}",
            [Issue(f"{key} is out of range", path=f"$.{key}", expected="a 64-bit integer", found=clip(str(value), 40))],
        )
    return value


def parse_restli_list(raw: str | None) -> list[str] | None:
    """Rest.li 2.0 list syntax in a query parameter: `List(a,b,c)` (items percent-encoded); a bare `a,b` too."""
    if raw is None or raw == "":
        return None
    text = raw.strip()
    if text.startswith("List(") and text.endswith(")"):
        text = text[5:-1]
    return [unquote(item) for item in text.split(",") if item]
