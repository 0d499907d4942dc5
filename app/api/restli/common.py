"""Helpers shared by the Rest.li endpoints."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote

from fastapi import Request

from app.api.deps import DeclaredBody, admit_before_body
from app.errors import Issue, ValidationFailed
from app.limits import MAX_LONG, MIN_LONG, clip

Parsed = TypeVar("Parsed")


class ActionBody(DeclaredBody[Parsed]):
    """The body of a Rest.li action route (`POST /aspects?action=ingestProposal`), read for an action the route
    serves: an unknown one is refused unread, a write's (`writes`) once the write admission is taken, which the route's
    READ policy does not take (a write refused with 429 is never parsed). Documented as a JSON object: each action's
    fields are in the route's description."""

    def __init__(self, route: str, actions: Sequence[str], *, writes: Collection[str] = ()) -> None:
        self.route, self.actions, self.writes = route, actions, writes

    def request_body_schema(self) -> dict[str, Any]:
        return {"type": "object"}

    async def __call__(self, request: Request) -> Parsed:
        action = request.query_params.get("action")  # absent: refused for the handler's `action` parameter, after this
        if action is not None and action not in self.actions:
            raise ValidationFailed(
                f"unknown action {action!r} on {self.route}",
                [Issue(f"supported actions: {', '.join(self.actions)}", path="$action")],
            )
        if action in self.writes:
            await admit_before_body(request)
        return await super().__call__(request)


class ObjectActionBody(ActionBody[dict[str, Any]]):
    """The body of an action route whose every action takes a JSON object."""

    async def parse(self, document: Any, request: Request) -> dict[str, Any]:
        return require_object(document)


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
