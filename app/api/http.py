"""Request/response helpers shared by the protocol modules."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import orjson
from fastapi import Path, Query, Request, Response
from pydantic import AfterValidator, BeforeValidator

from app.api.urn_paths import restore_slashes
from app.errors import Issue, PayloadTooLarge, UnsupportedMediaType, ValidationFailed
from app.flags import strict_flag
from app.limits import check_depth, clip
from app.registry import EntityRegistry
from app.registry.errors import RegistryError
from app.settings import Settings
from app.urns import InvalidUrnError, entity_type_of
from app.write.repository import StoredAspect

# What a URN looks like, for the OpenAPI document: the handlers check URNs themselves (answering 400 naming the
# parameter), so the pattern documents the check rather than adding a second one.
URN_PATTERN = r"^urn:li:[A-Za-z][A-Za-z0-9_]*:."
_URN_SCHEMA = {"pattern": URN_PATTERN, "examples": ["urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"]}
UrnPath = Annotated[
    str, AfterValidator(restore_slashes), Path(description="An entity URN (URL-encoded)", json_schema_extra=_URN_SCHEMA)
]
UrnQuery = Annotated[str, Query(description="An entity URN", json_schema_extra=_URN_SCHEMA)]


def is_json_media_type(content_type: str | None) -> bool:
    """`application/json` or any `application/*+json` (`application/json-patch+json`, Confluent's
    `application/vnd.schemaregistry.v1+json`, ...), parameters such as `charset` ignored."""
    if not content_type:
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))


def require_json_content_type(request: Request) -> None:
    """415 unless the request says its body is JSON. A browser may send `text/plain`, a form or a body without a
    content type to any origin without asking first (a CORS "simple" request); it must never be acted upon."""
    content_type = request.headers.get("content-type")
    if not is_json_media_type(content_type):
        found = "no Content-Type" if not content_type else clip(content_type, 100)
        raise UnsupportedMediaType(
            f"the request body must be JSON (Content-Type: application/json), found {found}",
            [Issue("unsupported content type", path="$", expected="application/json", found=found)],
        )


async def read_json(request: Request, settings: Settings) -> Any:
    """The request body as JSON: 415 unless its content type is JSON, 413 past `MAX_REQUEST_BYTES` (the body is
    streamed: a chunked body is refused as soon as it passes the limit, without buffering more), 400 when it is
    not JSON or nests deeper than `MAX_JSON_DEPTH`. The JSON is parsed here (orjson) with these limits for every body;
    what checks its shape is the body's one declaration: a pydantic model's `model_validate` (the scroll bodies) or the
    registry's compiled validators (aspects), which the OpenAPI document also describes."""
    require_json_content_type(request)
    max_bytes = settings.max_request_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(
            f"request body is {clip(declared, 40)} bytes; the limit is {max_bytes} (METALEDGER_MAX_REQUEST_BYTES)"
        )
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > max_bytes:
            raise PayloadTooLarge(f"request body is over the limit of {max_bytes} bytes (METALEDGER_MAX_REQUEST_BYTES)")
        body += chunk
    if not body:
        raise ValidationFailed(
            "the request body is empty; a JSON document is required", [Issue("empty body", path="$")]
        )
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise ValidationFailed(f"the request body is not valid JSON: {error}", [Issue(str(error), path="$")]) from None
    del body
    check_depth(document, settings.max_json_depth, what="the request body")
    return document


def check_batch_size(
    items: Any, settings: Settings, path: str = "$", *, count: int | None = None, what: str = "items"
) -> None:
    """413 naming the limit when a batch (a JSON array, or `count` things of one request: the aspects of a v3 batch
    or of an MCE) has more than `MAX_BATCH_ITEMS` items."""
    n = count if count is not None else (len(items) if isinstance(items, list) else 0)
    if n > settings.max_batch_items:
        message = (
            f"the batch at {path} has {n} {what}; the limit is {settings.max_batch_items} "
            "(METALEDGER_MAX_BATCH_ITEMS): send it in smaller batches"
        )
        raise PayloadTooLarge(
            message,
            [
                Issue(
                    f"too many {what}",
                    path=path,
                    expected=f"at most {settings.max_batch_items} {what}",
                    found=f"{n} {what}",
                )
            ],
        )


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code=status_code, headers=headers, media_type="application/json")


# The one boolean of query parameters and body flags. Declared once: FastAPI parses with it (a 400 naming the
# parameter otherwise) and the document says `boolean`.
Flag = Annotated[bool, BeforeValidator(strict_flag)]


def parameter_path(loc: tuple[Any, ...]) -> str:
    """Where a framework validation error points, in the convention of every hand-made issue: a parameter is
    `$name` (query, path, header: the name the caller sent), a body field the JSON path `$.a[0].b`."""
    if len(loc) >= 2 and loc[0] in ("query", "path", "header", "cookie"):
        return "$" + str(loc[1]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[2:])
    rest = loc[1:] if loc and loc[0] == "body" else loc
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in rest)


@contextmanager
def invalid_at(path: str, *, urn: str | None = None, aspect: str | None = None) -> Iterator[None]:
    """A registry or URN error about something the request names (an entity, an aspect, a URN): 400 naming it."""
    try:
        yield
    except (RegistryError, InvalidUrnError) as error:
        raise ValidationFailed(str(error), [Issue(str(error), urn=urn, aspect=aspect, path=path)]) from None


def checked_urn(urn: str, path: str = "$urn") -> str:
    """A URN the request names (to read it), checked before it reaches a query: 400 naming `path` when it is too
    long, holds a NUL or is not `urn:li:<entityType>:<id>`."""
    with invalid_at(path, urn=urn):
        entity_type_of(urn)
    return urn


def entity_of_urn(registry: EntityRegistry, urn: str, path: str = "$urn") -> str:
    """The registry's entity name of an URN (400 naming `path` when the URN is malformed or its type unknown)."""
    with invalid_at(path, urn=urn):
        return registry.entity(entity_type_of(urn)).name


def aspect_envelope(
    value: Any, system_metadata: dict[str, Any] | None, with_system_metadata: bool = True
) -> dict[str, Any]:
    envelope: dict[str, Any] = {"value": value}
    if with_system_metadata and system_metadata is not None:
        envelope["systemMetadata"] = system_metadata
    return envelope


def stored_envelope(row: StoredAspect, with_system_metadata: bool) -> dict[str, Any]:
    # the row's system metadata is parsed only when it is answered
    return aspect_envelope(row.value, row.system_metadata if with_system_metadata else None, with_system_metadata)


def stored_envelope_v3(row: StoredAspect, with_system_metadata: bool) -> dict[str, Any]:
    """The v3 read's aspect: with its system metadata, DataHub's `auditStamp` too — who wrote this version, and when
    (the row's `createdby`/`createdon`; DataHub's EnvelopedAspect `created`). The value goes into the answer as the
    JSON text it is stored as (`orjson.Fragment`: a dataset's six aspects, a schema of 50 fields among them, 266 µs
    parsed and encoded again, 20 µs spliced); the reader (app.write.reader) has left a soft-deleted structured
    property's values out of that text already."""
    if not with_system_metadata:
        return {"value": orjson.Fragment(row.metadata)}  # the system metadata left unparsed
    envelope = aspect_envelope(orjson.Fragment(row.metadata), row.system_metadata)
    envelope["auditStamp"] = {"time": row.created_ms, "actor": row.created_by}
    return envelope
