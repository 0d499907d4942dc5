"""The schema registry over HTTP: the subset of Confluent's Schema Registry REST API that Kafka clients call, at
`/schema-registry/api` as GMS serves it (DataHub's "INTERNAL" registry type; the SDK's default
`schema_registry_url` is `http://<gms>/schema-registry/api/`).

    GET  /                                        {}
    GET  /subjects                                ["MetadataChangeProposal_v1-value", ...]
    GET  /subjects/{subject}/versions             [1, 2, 3]
    GET  /subjects/{subject}/versions/{v|latest}  {"subject", "version", "id", "schema"}
    GET  /subjects/{subject}/versions/{v}/schema  the schema itself
    POST /subjects/{subject}/versions             {"schema": "..."} → {"id": N}  (registers; 409 when incompatible)
    POST /subjects/{subject}                      {"schema": "..."} → {"subject", "version", "id", "schema"} (lookup)
    GET  /schemas/ids/{id}[?subject=]             {"schema": "..."}
    GET  /schemas/ids/{id}/schema                 the schema itself
    GET  /schemas/ids/{id}/versions               [{"subject", "version"}]
    GET  /schemas/ids/{id}/subjects               ["..."]
    GET  /schemas/types                           ["AVRO"]
    GET|PUT /config, GET|PUT|DELETE /config/{subject}   {"compatibilityLevel": "BACKWARD"} / {"compatibility": ...}
    POST /compatibility/subjects/{subject}/versions[/{v}]   {"is_compatible": bool, "messages": [...]}
    GET  /mode, /mode/{subject}                   {"mode": "READWRITE"}

Every error is Confluent's body, `{"error_code": <code>, "message": "..."}` (40401 subject, 40402 version, 40403
schema not found; 409 incompatible; 42201 invalid schema; 42202 invalid version; 42203 invalid compatibility
level), never a 5xx for anything a client sends. Bodies must say what Confluent's registry consumes:
`application/vnd.schemaregistry.v1+json`, `application/vnd.schemaregistry+json`, `application/json` (any
`application/*+json`) or `application/octet-stream`; anything else (a form, `text/plain`, no content type) is a 415.
Answers are `application/vnd.schemaregistry.v1+json` unless the client asked for `application/json` only.

Not in metaledger's OpenAPI document: this is Confluent's API, documented by Confluent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute

from app.api.deps import ALLOW_ADMIN, ALLOW_REGISTRY_READ, RegistryCaller, SchemaRegistry
from app.api.http import is_json_media_type
from app.auth.model import Permission
from app.errors import MetaledgerError, Unauthorized
from app.schema_registry.errors import (
    InvalidSchema,
    InvalidSubject,
    InvalidVersion,
    MalformedRequest,
    NotFound,
    RegistryUnavailable,
    RequestTooLarge,
    SchemaRegistryError,
    ServedElsewhere,
    SubjectNotFound,
    UnknownSchema,
    UnprocessableRequest,
    UnsupportedMediaType,
)
from app.schema_registry.internal import InternalRegistry, check_subject

log = logging.getLogger("metaledger.schema_registry")

SCHEMA_REGISTRY_V1 = "application/vnd.schemaregistry.v1+json"
JSON = "application/json"
MAX_SCHEMA_BYTES = 1024 * 1024
MAX_BODY_BYTES = 2 * MAX_SCHEMA_BYTES  # the schema's JSON string, escaped, inside the request's JSON
_MAX_VERSION = 2**31 - 1


def _media_type(request: Request) -> str:
    accept = request.headers.get("accept", "")
    if JSON in accept and "schemaregistry" not in accept:
        return JSON
    return SCHEMA_REGISTRY_V1


def _answer(request: Request, content: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type=_media_type(request))


def _raw_schema(request: Request, schema: str) -> Response:
    return Response(schema.encode(), media_type=_media_type(request))


class _ConfluentRoute(APIRoute):
    """Answers every error of these routes (and of their dependencies) with Confluent's error body."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def confluent_errors(request: Request) -> Response:
            try:
                _check_subject_param(request)
                return await handler(request)
            except MetaledgerError as error:  # authentication and authorization, in Confluent's error shape
                response = _answer(
                    request, {"error_code": error.status_code, "message": error.message}, error.status_code
                )
                response.headers.update(error.headers() or {})
                return response
            except SchemaRegistryError as error:
                if isinstance(error, RegistryUnavailable):
                    log.warning("schema registry unavailable", extra={"path": request.url.path, "error": error.message})
                return _answer(request, error.to_json(), error.status)
            except Exception:  # noqa: BLE001 - a bug must still answer in the registry's terms
                log.exception("schema registry request failed", extra={"path": request.url.path})
                return _answer(request, {"error_code": 50001, "message": "Error in the backend data store"}, 500)

        return confluent_errors


def _check_subject_param(request: Request) -> None:
    """A `{subject}` that no registration could have made (empty, over 500 characters, not printable: a NUL, ...) is
    not looked up: a read or a delete answers 40401 (no such subject), a write 42208 (invalid subject)."""
    subject = request.path_params.get("subject")
    if subject is None:
        return
    try:
        check_subject(subject)
    except InvalidSubject:
        if request.method in ("GET", "HEAD", "DELETE"):
            raise SubjectNotFound(f"Subject {subject[:100]!r} not found.") from None
        raise


# Reads are open when METALEDGER_SCHEMA_REGISTRY_OPEN_READ (the default, as DataHub); changes need ADMIN.
router = APIRouter(
    prefix="/schema-registry/api",
    include_in_schema=False,
    route_class=_ConfluentRoute,
    dependencies=[ALLOW_REGISTRY_READ],
)


def _internal(registry: Any) -> InternalRegistry:
    if isinstance(registry, InternalRegistry):
        return registry
    if registry is None:
        raise RegistryUnavailable("the schema registry is not started")
    url = getattr(registry, "url", "METALEDGER_SCHEMA_REGISTRY_URL")
    raise ServedElsewhere(
        f"this metaledger uses the external schema registry at {url} (METALEDGER_SCHEMA_REGISTRY_URL): ask it there"
    )


async def _read_json(request: Request) -> Any:
    content_type = request.headers.get("content-type")
    if not (
        is_json_media_type(content_type)
        or (content_type or "").split(";", 1)[0].strip().lower() == "application/octet-stream"
    ):
        found = "no Content-Type" if not content_type else content_type[:100]
        raise UnsupportedMediaType(
            f"HTTP 415 Unsupported Media Type: the body must be {SCHEMA_REGISTRY_V1} (or {JSON}), found {found}"
        )
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestTooLarge(f"the request body is {declared[:40]} bytes; the limit is {MAX_BODY_BYTES}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise RequestTooLarge(f"the request body is larger than the limit of {MAX_BODY_BYTES} bytes")
    if not body.strip():
        raise MalformedRequest("the request body is empty; a JSON object with a 'schema' is required")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise MalformedRequest(f"the request body is not valid JSON: {error}") from None


async def _schema_of(request: Request) -> str:
    """The `schema` of a registration or lookup body, checked."""
    body = await _read_json(request)
    if not isinstance(body, dict):
        raise UnprocessableRequest("the request body must be a JSON object with a 'schema'")
    schema_type = body.get("schemaType")
    if schema_type not in (None, "AVRO"):
        raise InvalidSchema(f"Invalid schema type {str(schema_type)[:50]!r}: this registry serves AVRO schemas only")
    if body.get("references"):
        raise InvalidSchema("Schema references are not supported: send the schema with its named types inline")
    schema = body.get("schema")
    if schema is None:
        raise InvalidSchema("Invalid schema: the request has no 'schema'")
    if not isinstance(schema, str):
        raise InvalidSchema("Invalid schema: 'schema' must be a string holding the schema's JSON")
    size = len(schema.encode())
    if size > MAX_SCHEMA_BYTES:
        raise InvalidSchema(f"Invalid schema: it is {size} bytes; the limit is {MAX_SCHEMA_BYTES}")
    return schema


def _version(raw: str) -> int | Literal["latest"]:
    if raw == "latest" or raw == "-1":
        return "latest"
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= _MAX_VERSION:
        return int(raw)
    raise InvalidVersion(
        f"The specified version '{raw[:50]}' is not a valid version id. "
        f'Allowed values are between [1, 2^31-1] and the string "latest"'
    )


def _schema_id(raw: str) -> int:
    if raw.isascii() and raw.isdigit() and int(raw) <= _MAX_VERSION:
        return int(raw)
    raise UnknownSchema(f"Schema {raw[:50]!r} not found: a schema id is a non-negative integer")


# --- root, types, mode ---------------------------------------------------------------------------------------------


@router.get("")
@router.get("/")
async def root(request: Request, registry: SchemaRegistry):
    _internal(registry)
    return _answer(request, {})


@router.get("/schemas/types")
async def schema_types(request: Request, registry: SchemaRegistry):
    _internal(registry)
    return _answer(request, ["AVRO"])


@router.get("/mode")
@router.get("/mode/{subject}")
async def mode(request: Request, registry: SchemaRegistry):
    _internal(registry)
    return _answer(request, {"mode": "READWRITE"})


# --- subjects --------------------------------------------------------------------------------------------------------


@router.get("/subjects")
async def subjects(request: Request, registry: SchemaRegistry):
    found = await _internal(registry).subjects()
    prefix = request.query_params.get("subjectPrefix")
    if prefix:
        found = [subject for subject in found if subject.startswith(prefix)]
    return _answer(request, found)


@router.get("/subjects/{subject}/versions")
async def subject_versions(request: Request, subject: str, registry: SchemaRegistry):
    return _answer(request, await _internal(registry).versions(subject))


@router.get("/subjects/{subject}/versions/{version}")
async def subject_version(request: Request, subject: str, version: str, registry: SchemaRegistry):
    registry = _internal(registry)
    found = await registry.version(subject, _version(version))
    return _answer(request, found.to_json())


@router.get("/subjects/{subject}/versions/{version}/schema")
async def subject_version_schema(request: Request, subject: str, version: str, registry: SchemaRegistry):
    registry = _internal(registry)
    found = await registry.version(subject, _version(version))
    return _raw_schema(request, found.schema)


@router.post("/subjects/{subject}/versions")
async def register(request: Request, subject: str, registry: SchemaRegistry, caller: RegistryCaller):
    """Register a schema (Confluent's AvroSerializer calls this once per process with auto-registration on).
    Re-registering what the subject already has is a lookup anyone who may read can make (serializers of DataHub's
    own schemas do it); a new schema or version needs ADMIN."""
    registry = _internal(registry)
    check_subject(subject)
    schema = await _schema_of(request)
    if caller is None or not caller.allows(Permission.ADMIN):
        try:
            return _answer(request, {"id": (await registry.lookup(subject, schema)).id})
        except LookupError:
            if caller is None:
                raise Unauthorized("registering a new schema needs an admin token") from None
            caller.require(Permission.ADMIN)
    return _answer(request, {"id": await registry.register(subject, schema)})


@router.post("/subjects/{subject}")
async def lookup(request: Request, subject: str, registry: SchemaRegistry):
    registry = _internal(registry)
    schema = await _schema_of(request)
    found = await registry.lookup(subject, schema)
    return _answer(request, found.to_json())


# --- schemas by id ---------------------------------------------------------------------------------------------------


@router.get("/schemas/ids/{schema_id}")
async def schema_by_id(request: Request, schema_id: str, registry: SchemaRegistry):
    """`?subject=` (sent by consumers) is accepted: ids are global here."""
    schema = await _internal(registry).schema_by_id(_schema_id(schema_id))
    return _answer(request, {"schema": schema})


@router.get("/schemas/ids/{schema_id}/schema")
async def schema_only(request: Request, schema_id: str, registry: SchemaRegistry):
    return _raw_schema(request, await _internal(registry).schema_by_id(_schema_id(schema_id)))


@router.get("/schemas/ids/{schema_id}/versions")
async def schema_versions(request: Request, schema_id: str, registry: SchemaRegistry):
    found = await _internal(registry).versions_of_id(_schema_id(schema_id))
    return _answer(request, [{"subject": subject, "version": version} for subject, version in found])


@router.get("/schemas/ids/{schema_id}/subjects")
async def schema_subjects(request: Request, schema_id: str, registry: SchemaRegistry):
    found = await _internal(registry).versions_of_id(_schema_id(schema_id))
    return _answer(request, list(dict.fromkeys(subject for subject, _ in found)))


# --- compatibility -------------------------------------------------------------------------------------------------


async def _level_of(request: Request) -> str:
    body = await _read_json(request)
    if not isinstance(body, dict) or "compatibility" not in body:
        raise UnprocessableRequest('the request body must be a JSON object {"compatibility": "<level>"}')
    return body["compatibility"]


@router.get("/config")
async def global_config(request: Request, registry: SchemaRegistry):
    return _answer(request, {"compatibilityLevel": await _internal(registry).compatibility_level()})


@router.put("/config", dependencies=[ALLOW_ADMIN])
async def set_global_config(request: Request, registry: SchemaRegistry):
    registry = _internal(registry)
    level = await registry.set_compatibility_level(await _level_of(request))
    return _answer(request, {"compatibility": level})


@router.get("/config/{subject}")
async def subject_config(request: Request, subject: str, registry: SchemaRegistry):
    """The level in force for the subject: its own, else the global one (as `?defaultToGlobal=true`)."""
    return _answer(request, {"compatibilityLevel": await _internal(registry).compatibility_level(subject)})


@router.put("/config/{subject}", dependencies=[ALLOW_ADMIN])
async def set_subject_config(request: Request, subject: str, registry: SchemaRegistry):
    registry = _internal(registry)
    level = await registry.set_compatibility_level(await _level_of(request), subject)
    return _answer(request, {"compatibility": level})


@router.delete("/config/{subject}", dependencies=[ALLOW_ADMIN])
async def delete_subject_config(request: Request, subject: str, registry: SchemaRegistry):
    return _answer(request, {"compatibilityLevel": await _internal(registry).delete_compatibility_level(subject)})


@router.post("/compatibility/subjects/{subject}/versions")
async def test_compatibility_all(request: Request, subject: str, registry: SchemaRegistry):
    registry = _internal(registry)
    reasons = await registry.test_compatibility(subject, None, await _schema_of(request))
    return _answer(request, {"is_compatible": not reasons, "messages": reasons})


@router.post("/compatibility/subjects/{subject}/versions/{version}")
async def test_compatibility(request: Request, subject: str, version: str, registry: SchemaRegistry):
    registry = _internal(registry)
    parsed = _version(version)
    reasons = await registry.test_compatibility(subject, parsed, await _schema_of(request))
    return _answer(request, {"is_compatible": not reasons, "messages": reasons})


# --- anything else -------------------------------------------------------------------------------------------------


@router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
async def not_found(request: Request, rest: str):
    raise NotFound(f"HTTP 404 Not Found: {request.method} /schema-registry/api/{rest[:200]} is not served")
