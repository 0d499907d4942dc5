"""Request/response helpers shared by the protocol modules."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from fastapi import Request, Response

from app.errors import Issue, PayloadTooLarge, ValidationFailed
from app.registry import EntityRegistry
from app.registry.errors import RegistryError
from app.urns import InvalidUrnError, entity_type_of
from app.write.repository import StoredAspect


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


@contextmanager
def invalid_at(path: str, *, urn: str | None = None, aspect: str | None = None) -> Iterator[None]:
    """A registry or URN error about something the request names (an entity, an aspect, a URN): 400 naming it."""
    try:
        yield
    except (RegistryError, InvalidUrnError) as error:
        raise ValidationFailed(str(error), [Issue(str(error), urn=urn, aspect=aspect, path=path)]) from None


def entity_of_urn(registry: EntityRegistry, urn: str, path: str = "$urn") -> str:
    """The registry's entity name of an URN (400 naming `path` when the URN is malformed or its type unknown)."""
    with invalid_at(path, urn=urn):
        return registry.entity(entity_type_of(urn)).name


def aspect_envelope(value: Any, system_metadata: dict[str, Any] | None, with_system_metadata: bool = True) -> dict[str, Any]:
    envelope: dict[str, Any] = {"value": value}
    if with_system_metadata and system_metadata is not None:
        envelope["systemMetadata"] = system_metadata
    return envelope


def stored_envelope(row: StoredAspect, with_system_metadata: bool) -> dict[str, Any]:
    return aspect_envelope(row.value, row.system_metadata, with_system_metadata)
