"""The parts of the OpenAPI document that come from the registry rather than from a route's declaration: the v3
bodies and answers of every entity and aspect (built on app.openapi_spec.avro's aspect components), the error body,
and the statuses every operation declares.

Components written besides the Avro types (``A`` = aspect name, ``E`` = entity name, first letter upper-cased):
``{A}AspectRequest`` / ``{A}AspectResponse`` (``value`` + ``systemMetadata`` + ``headers`` / ``version``),
``{E}EntityRequest`` / ``{E}EntityResponse`` (``urn`` + one property per aspect), ``{E}EntityAspectRequest`` /
``{E}EntityAspectResponse`` (single-aspect bodies, ``value`` is a ``oneOf`` of E's aspects), ``{E}BatchGetRequest``,
``{E}AspectName`` (enum), ``BatchGetAspectRequest``, ``AspectHeaders``, ``ErrorResponse``, ``ErrorIssue``; plus
``components/responses`` (the error answers, by status).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from app.idempotency import HEADER as IDEMPOTENCY_HEADER
from app.openapi_spec.avro import (
    ASPECT_HEADERS,
    ASPECT_PATCH_REQUEST,
    BATCH_GET_ASPECT_REQUEST,
    ERROR_ISSUE,
    ERROR_RESPONSE,
    GENERIC_JSON_PATCH,
    RegistryModel,
    build_model,
    detached,
    schema_ref,
    upper_first,
)
from app.registry import EntityRegistry

_JSON = "application/json"
RESPONSE_PREFIX = "#/components/responses/"


def _json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {_JSON: {"schema": schema}}


# Shared error responses (components/responses), by status code.
_ERROR_RESPONSES: dict[str, tuple[str, str]] = {
    "400": ("BadRequest", "Bad Request: invalid payload, unknown aspect or parameter (the issues name the field)"),
    "401": ("Unauthorized", "Unauthorized: no credentials, or a token that is not valid, expired or revoked"),
    "403": ("Forbidden", "Forbidden: the caller's role or policies do not grant the permission named"),
    "404": ("NotFound", "Not Found"),
    "409": ("Conflict", "Conflict: CREATE of an existing aspect or entity, UPDATE of a missing aspect"),
    "412": ("PreconditionFailed", "Precondition Failed: a conditional-write header did not hold"),
    "413": ("PayloadTooLarge", "Payload Too Large: the body or the batch is over a limit the message names"),
    "415": ("UnsupportedMediaType", "Unsupported Media Type: the body must be application/json"),
    "422": (
        "IdempotencyKeyReused",
        "Unprocessable Content: the Idempotency-Key was used with another request within the idempotency window",
    ),
    "429": ("TooManyRequests", "Too Many Requests: writes are shed under load; retry after Retry-After seconds"),
    "503": (
        "ServiceUnavailable",
        "Service Unavailable: the database or a dependency is unreachable; retry after Retry-After",
    ),
}
_WRITE_METHODS = frozenset({"post", "put", "patch", "delete"})
_METHODS = frozenset({"get", "head", "post", "put", "patch", "delete", "options"})


def _responses_components() -> dict[str, dict[str, Any]]:
    return {
        name: {"description": description, "content": _json_content(schema_ref(ERROR_RESPONSE))}
        for name, description in sorted(_ERROR_RESPONSES.values())
    }


def _one_of_refs(names: list[str]) -> dict[str, Any]:
    refs = [schema_ref(n) for n in sorted(set(names))]
    # anyOf, not oneOf: aspects with no required fields overlap (e.g. {"description": "x"}), which oneOf rejects.
    return refs[0] if len(refs) == 1 else {"anyOf": refs}


def _base_components(model: RegistryModel) -> dict[str, dict[str, Any]]:
    sm = schema_ref(model.system_metadata)
    headers = schema_ref(ASPECT_HEADERS)
    out: dict[str, dict[str, Any]] = {
        ERROR_ISSUE: {
            "type": "object",
            "description": "One problem found in the request",
            "properties": {
                "message": {"type": "string"},
                "index": {
                    "type": "integer",
                    "format": "int32",
                    "description": "Position of the offending item in the request (batch endpoints)",
                },
                "urn": {"type": "string"},
                "aspect": {"type": "string"},
                "path": {"type": "string", "description": "JSON path inside the offending item"},
                "expected": {"type": "string"},
                "found": {"type": "string"},
            },
            "required": ["message"],
        },
        ERROR_RESPONSE: {
            "type": "object",
            "description": "Error body of every 4xx/5xx answer",
            "properties": {
                "error": {"type": "string", "description": "Kind of error, e.g. 'Validation Error'"},
                "message": {"type": "string"},
                "issues": {"type": "array", "items": schema_ref(ERROR_ISSUE)},
                "requestId": {"type": "string", "description": "The request's X-Request-Id (on unexpected errors)"},
            },
            "required": ["error", "message"],
        },
        ASPECT_HEADERS: {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Headers of the change proposal (e.g. If-Version-Match, If-Modified-Since)",
        },
        BATCH_GET_ASPECT_REQUEST: {
            "type": "object",
            "properties": {"headers": headers},
            "additionalProperties": False,
        },
    }
    # Both branches are named components: generated clients then make one model of each (inline branches came out
    # as duplicate models).
    out[GENERIC_JSON_PATCH] = {
        "description": "DataHub's patch document: an RFC 6902 array, or {patch, arrayPrimaryKeys, forceGenericPatch} "
        "(arrays keyed by the listed fields; nested key fields joined with U+241F)",
        "anyOf": [schema_ref("JsonPatch"), schema_ref("GenericJsonPatchDocument")],
    }
    out["JsonPatch"] = {
        "description": "An RFC 6902 JSON Patch",
        "type": "array",
        "items": schema_ref("JsonPatchOperation"),
    }
    out["GenericJsonPatchDocument"] = {
        "type": "object",
        "properties": {
            "patch": schema_ref("JsonPatch"),
            "arrayPrimaryKeys": {
                "type": "object",
                "additionalProperties": {"type": "array", "items": {"type": "string"}},
            },
            "forceGenericPatch": {"type": "boolean"},
        },
        "required": ["patch"],
        "additionalProperties": False,
    }
    out["JsonPatchOperation"] = {
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": ["add", "remove", "replace", "move", "copy", "test"]},
            "path": {"type": "string"},
            "from": {"type": "string"},
            "value": {},
        },
        "required": ["op", "path"],
    }
    out[ASPECT_PATCH_REQUEST] = {
        "type": "object",
        "properties": {"value": schema_ref(GENERIC_JSON_PATCH), "systemMetadata": sm, "headers": headers},
        "required": ["value"],
        "additionalProperties": False,
    }
    for aspect in sorted({a for _, _, aspects in model.entities for a in aspects}):
        value = schema_ref(model.aspect_component[aspect])
        a = upper_first(aspect)
        out[f"{a}AspectRequest"] = {
            "type": "object",
            "properties": {"value": value, "systemMetadata": sm, "headers": headers},
            "required": ["value"],
            "additionalProperties": False,
        }
        out[f"{a}AspectResponse"] = _aspect_response(value, sm)
    for entity, _, aspects in model.entities:
        p = upper_first(entity)
        urn = {"type": "string", "description": f"URN of the {entity} entity"}
        out[f"{p}AspectName"] = {
            "type": "string",
            "enum": aspects,
            "description": f"Name of an aspect of the {entity} entity",
        }
        out[f"{p}EntityRequest"] = {
            "type": "object",
            "properties": {"urn": urn, **{a: schema_ref(f"{upper_first(a)}AspectRequest") for a in aspects}},
            "required": ["urn"],
            "additionalProperties": False,
        }
        out[f"{p}EntityPatchRequest"] = {
            "type": "object",
            "properties": {"urn": urn, **{a: schema_ref(ASPECT_PATCH_REQUEST) for a in aspects}},
            "required": ["urn"],
            "additionalProperties": False,
        }
        out[f"{p}EntityResponse"] = {
            "type": "object",
            "properties": {"urn": urn, **{a: schema_ref(f"{upper_first(a)}AspectResponse") for a in aspects}},
            "required": ["urn"],
            "additionalProperties": False,
        }
        values = _one_of_refs([model.aspect_component[a] for a in aspects])
        out[f"{p}EntityAspectRequest"] = {
            "type": "object",
            "properties": {"value": values, "systemMetadata": sm, "headers": headers},
            "required": ["value"],
            "additionalProperties": False,
        }
        out[f"{p}EntityAspectResponse"] = _aspect_response(values, sm)
        out[f"{p}BatchGetRequest"] = {
            "type": "object",
            "properties": {"urn": urn, **{a: schema_ref(BATCH_GET_ASPECT_REQUEST) for a in aspects}},
            "required": ["urn"],
            "additionalProperties": False,
        }
    return out


def _aspect_response(value: dict[str, Any], sm: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "value": value,
            "systemMetadata": sm,
            "auditStamp": {
                "type": "object",
                "description": "On reads with systemMetadata=true: who wrote this version of the aspect, and when",
                "properties": {
                    "time": {"type": "integer", "format": "int64", "description": "epoch milliseconds"},
                    "actor": {"type": "string", "description": "the actor's urn"},
                },
                "required": ["time", "actor"],
                "additionalProperties": False,
            },
            "version": {"type": "string", "description": "Logical version of the aspect (systemMetadata.version)"},
            "status": {
                "type": "string",
                "enum": ["CREATED", "UPDATED", "UNCHANGED", "DELETED", "ABSENT", "FILTERED", "IGNORED", "APPENDED"],
                "description": "metaledger extension, on writes: what the write did to this aspect",
            },
            "message": {
                "type": "string",
                "description": "metaledger extension: why a write was FILTERED, or why `value` is left out of a write's "
                "echo (larger than METALEDGER_MAX_ECHO_VALUE_BYTES)",
            },
        },
        # `value` is always there on reads; a write's echo leaves out a value over METALEDGER_MAX_ECHO_VALUE_BYTES
        "additionalProperties": False,
    }


# DataHub's limit: 512 bytes URL-encoded (so never more than 512 characters); schemaField URNs are exempt.
URN_MAX_CHARS = 512


def declare_statuses(spec: dict[str, Any]) -> dict[str, Any]:
    """Every operation declares every status it can answer, with the error body: 400 and 503 everywhere; 401 and 403
    unless the operation is open (`security: []`); 404 on the rest; 413 and 415 where there is a body; 409, 412 and
    429 on writes; 422 where an `Idempotency-Key` is taken (the key used with another request: app.idempotency).
    FastAPI's 422 is dropped (malformed requests answer 400). HEAD answers carry no body."""
    for item in spec.get("paths", {}).values():
        for method, op in item.items():
            if method not in _METHODS or not isinstance(op, dict):
                continue
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            codes = ["400", "503"]
            if op.get("security") != []:
                codes += ["401", "403", "404"]
            if "requestBody" in op:
                codes += ["413", "415"]
            if method in _WRITE_METHODS:
                codes += ["409", "412", "429"]
            if any(p.get("in") == "header" and p.get("name") == IDEMPOTENCY_HEADER for p in op.get("parameters", ())):
                codes.append("422")
            for code in codes:
                if code in responses and "content" in responses[code] and method != "head":
                    continue
                name, description = _ERROR_RESPONSES[code]
                responses[code] = {"description": description} if method == "head" else {"$ref": RESPONSE_PREFIX + name}
            op["responses"] = dict(sorted(responses.items()))
    return spec


def _merge(target: dict[str, Any], additions: Mapping[str, Any], what: str) -> None:
    """Add entries; an existing entry must be identical (so calling twice is harmless)."""
    for key, value in additions.items():
        if key in target and target[key] != value:
            raise ValueError(f"{what} {key!r} already exists in the OpenAPI document with a different definition")
        target[key] = value


def add_registry_components(spec: dict[str, Any], registry: EntityRegistry) -> dict[str, Any]:
    """Add the registry's components (every aspect's schema and the v3 bodies and answers built on them, which the
    entity routes of app.api.entities reference by name) and the shared error answers to a FastAPI-generated
    OpenAPI 3.1 document.

    Mutates and returns ``spec``. Components that FastAPI already generated are kept (a converted Avro type whose
    name clashes with one gets a qualified name); an entry that already exists must be identical, so the call is
    idempotent."""
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    model = build_model(registry)
    reserved: set[str] = set()
    while clashes := {k for k, v in model.components.items() if k in schemas and schemas[k] != v}:
        # a converted Avro type is named like a component FastAPI generated: qualify ours
        reserved |= clashes
        model = build_model(registry, extra_reserved=reserved)
    _merge(schemas, detached({**model.components, **_base_components(model)}), "component")
    spec["components"]["schemas"] = dict(sorted(schemas.items()))
    responses = spec["components"].setdefault("responses", {})
    _merge(responses, detached(_responses_components()), "component responses")
    spec["components"]["responses"] = dict(sorted(responses.items()))
    return spec


def entity_tags(registry: EntityRegistry) -> list[dict[str, Any]]:
    """One tag per entity type (its operations are tagged with its name), described by the entity's doc."""
    tags = []
    for name in sorted(registry.entities):
        doc = getattr(registry.entities[name], "doc", None)
        tags.append({"name": name, **({"description": doc} if doc else {})})
    return tags


def aspect_name_component(entity: str) -> str:
    """The component naming the aspects of `entity` (an enum)."""
    return f"{upper_first(entity)}AspectName"


def entity_component(entity: str, suffix: str) -> str:
    """`entity_component("dataset", "EntityRequest")` -> "DatasetEntityRequest": the per-entity components of
    :func:`add_registry_components`."""
    return f"{upper_first(entity)}{suffix}"


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    """`{"content": {"application/json": {"schema": schema}}}`: a request body's or an answer's declaration."""
    return {"content": _json_content(schema)}


def dumps_spec(spec: Mapping[str, Any]) -> str:
    """Canonical serialization for committing the document and diffing it in CI."""
    return json.dumps(spec, indent=2, ensure_ascii=False) + "\n"
