"""Request/response helpers shared by the endpoint modules."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request, Response

from app.errors import Issue, PayloadTooLarge, ValidationFailed


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request body as JSON. Bodies are parsed here (orjson) rather than by pydantic: the registry's compiled
    validators check aspects, and the declared OpenAPI schemas document the shapes."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {max_bytes}")
    body = await request.body()
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"request body is {len(body)} bytes; the limit is {max_bytes}")
    if not body:
        raise ValidationFailed("the request body is empty; a JSON document is required", [Issue("empty body", path="$")])
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise ValidationFailed(f"the request body is not valid JSON: {error}", [Issue(str(error), path="$")]) from None


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code=status_code, headers=headers, media_type="application/json")


def parse_bool(raw: str | None, default: bool) -> bool:
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in ("true", "1", "yes")
