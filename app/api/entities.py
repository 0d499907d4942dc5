"""DataHub's OpenAPI v3 entity endpoints: v3 bodies ↔ drafts, outcomes ↔ v3 responses. One set of routes per
entity type of the registry (`/openapi/v3/entity/dataset/{urn}` ...), declared here with their parameters, bodies and
answers: the OpenAPI document is generated from these declarations, the body and answer schemas are the registry's
components (app.openapi_spec). Issues name paths in the body the client sent (`$[0].datasetProperties.value.name`)."""

# No `from __future__ import annotations`: the parameter types of each entity's routes (its URN pattern, its
# aspect names) are built per entity, and FastAPI reads them from the handlers' signatures when they are registered.

from collections.abc import Iterable
from functools import cached_property
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import AfterValidator, WithJsonSchema
from starlette._utils import get_route_path
from starlette.datastructures import URLPath
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Receive, Scope, Send

from app.api.deps import (
    ALLOW_READ,
    Caller,
    DeclaredBody,
    Gateway,
    Registry,
    Session,
    Writer,
    get_registry,
    get_settings,
)
from app.api.http import (
    Flag,
    aspect_envelope,
    check_batch_size,
    checked_urn,
    invalid_at,
    json_response,
    stored_envelope,
)
from app.api.urn_paths import restore_slashes
from app.auth.model import Principal
from app.errors import Issue, Location, ValidationFailed
from app.ingest.gateway import SubmitOutcome
from app.limits import check_long
from app.openapi_spec import (
    API_PREFIX,
    URN_MAX_CHARS,
    aspect_name_component,
    entity_component,
    json_body,
    schema_ref,
    upper_first,
)
from app.registry.registry import EntitySpec
from app.urns import InvalidUrnError, entity_type_of
from app.write.decision import ItemResult
from app.write.proposal import CONDITIONAL_HEADERS, PRECONDITION_HEADERS, ChangeType, Draft
from app.write.reader import EntityReader

ENVELOPE_KEYS = frozenset({"value", "systemMetadata", "headers"})

SystemMetadataFlag = Annotated[
    Flag, Query(alias="systemMetadata", description="Include the system metadata of each aspect")
]
AsyncFlag = Annotated[
    Flag,
    Query(
        alias="async",
        description="Accept the write asynchronously (202: validated, queued on "
        "the proposal topic) instead of committing it; without Kafka it is committed (200)",
    ),
]
Version = Annotated[int, Query(description="Aspect version (0: latest)", ge=0, le=2**63 - 1)]


# The scope key of the route an `EntityRoutes` matched, for its `handle` (that route's own child scope names it as
# FastAPI's `route`, which the access log and the metrics read).
_MATCHED = "metaledger.entity_route"


class EntityRoutes(BaseRoute):
    """The v3 routes of one entity type, where they stand in the app's routes. FastAPI analyses each handler's
    signature when its route is made (2-4 s of CPU for every entity type's routes, which each process paid at its
    start): they are made the first time a request reaches the entity type's paths or something reads them
    (`routes`: the OpenAPI document, `url_path_for`), then kept. A request for another entity type passes at the cost
    of a string comparison."""

    def __init__(self, spec: EntitySpec) -> None:
        self.spec = spec
        self.prefix = f"{API_PREFIX}/{spec.name}"  # every path of its routes is this one or one below it
        self._below = self.prefix + "/"

    @cached_property
    def routes(self) -> list[BaseRoute]:
        router = APIRouter(prefix=API_PREFIX)
        _add_entity_routes(router, self.spec)
        return list(router.routes)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """As the router's scan of the entity type's routes: the first full match, else the first partial one (a
        method the path does not serve: its route answers the 405)."""
        if scope["type"] != "http":
            return Match.NONE, {}
        path = get_route_path(scope)
        if path != self.prefix and not path.startswith(self._below):
            return Match.NONE, {}
        partial: Scope | None = None
        for route in self.routes:
            match, child_scope = route.matches(scope)
            if match is Match.FULL:
                return Match.FULL, {**child_scope, _MATCHED: route}
            if match is Match.PARTIAL and partial is None:
                partial = {**child_scope, _MATCHED: route}
        return (Match.NONE, {}) if partial is None else (Match.PARTIAL, partial)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await scope.pop(_MATCHED).handle(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> URLPath:
        for route in self.routes:
            try:
                return route.url_path_for(name, **path_params)
            except NoMatchFound:
                pass
        raise NoMatchFound(name, path_params)


# The entity types' routes of a registry, kept for the process: an app made again with the same registry (the tests
# make one per test) takes them with the routes they have made.
_ROUTES: dict[int, tuple[Any, list[EntityRoutes]]] = {}


def entity_routes(registry: Any) -> list[EntityRoutes]:
    """The v3 routes of every entity type of `registry`, for the app's own router (not an included router: FastAPI
    would build every route for the inclusion)."""
    cached = _ROUTES.get(id(registry))
    if cached is None or cached[0] is not registry:
        routes = [EntityRoutes(registry.entities[name]) for name in sorted(registry.entities)]
        cached = _ROUTES[id(registry)] = (registry, routes)
    return cached[1]


def expanded(routes: Iterable[BaseRoute]) -> list[BaseRoute]:
    """`routes` with the routes of each entity type in place of its `EntityRoutes` (made now if they were not): every
    route's declaration, in the order the router asks them (the OpenAPI document's order)."""
    return [inner for route in routes for inner in (route.routes if isinstance(route, EntityRoutes) else (route,))]


def _add_entity_routes(router: APIRouter, spec: EntitySpec) -> None:
    entity = spec.name
    p = upper_first(entity)
    tags: list[str | Any] = [entity]
    urn_schema: dict[str, Any] = {"type": "string", "pattern": f"^urn:li:{entity}:."}
    if entity != "schemaField":  # DataHub exempts schemaField URNs from its length limit
        urn_schema["maxLength"] = URN_MAX_CHARS
    # The handlers check URNs and aspect names themselves (a 400 naming the parameter and the reason, or a 404 for
    # an aspect the entity does not have): the schemas document those checks.
    Urn = Annotated[
        str,
        AfterValidator(restore_slashes),
        WithJsonSchema(urn_schema),
        Path(description=f"URN of the {entity} (URL-encoded)"),
    ]
    aspect_names = schema_ref(aspect_name_component(entity))
    AspectName = Annotated[
        str, WithJsonSchema(aspect_names), Path(alias="aspectName", description="Name of the aspect")
    ]

    # Spelled out (not made by a helper function) so that type checkers take them as type aliases.
    AspectsToRead = Annotated[
        list[str] | None,
        WithJsonSchema({"type": "array", "items": aspect_names}),
        Query(description="Aspects to return (default: all)"),
    ]
    AspectsToDelete = Annotated[
        list[str] | None,
        WithJsonSchema({"type": "array", "items": aspect_names}),
        Query(description="Aspects to delete (default: the whole entity)"),
    ]

    def component(suffix: str) -> dict[str, str]:
        return schema_ref(entity_component(entity, suffix))

    entity_response = component("EntityResponse")
    entities_response = _array_of(entity_response)
    aspect_response = component("EntityAspectResponse")

    def answers(description: str, schema: dict[str, Any], *, accepted: bool = False) -> dict[int | str, Any]:
        out: dict[int | str, Any] = {200: {"description": description, **json_body(schema)}}
        if accepted:
            out[202] = {"description": "Accepted: validated and queued (async=true)", **json_body(schema)}
        return out

    exists_answers: dict[int | str, Any] = {404: {"description": "Not found"}}

    @router.post(
        f"/{entity}",
        operation_id=f"create{p}",
        tags=tags,
        summary=f"Create or upsert {entity} entities",
        responses=answers("Written", entities_response, accepted=True),
    )
    async def upsert_entities(
        caller: Writer,
        drafts: Annotated[list[Draft], Depends(EntityBatch(entity, ChangeType.UPSERT, "EntityRequest"))],
        request: Request,
        session: Session,
        gateway: Gateway,
        system_metadata: SystemMetadataFlag = True,
        async_: AsyncFlag = True,
    ) -> Response:
        # `async` defaults to true, as DataHub's: validated now, queued on the proposal topic, 202 with the echo.
        return await _write_entities(drafts, request, session, gateway, caller, system_metadata, async_)

    @router.patch(
        f"/{entity}",
        operation_id=f"patch{p}",
        tags=tags,
        summary=f"Patch aspects of {entity} entities (applied to the locked latest values)",
        description='Each aspect\'s `value` is DataHub\'s `{"patch": [...], "arrayPrimaryKeys"?, '
        '"forceGenericPatch"?}`, applied inside the transaction to the locked latest value.',
        responses=answers("Written", entities_response, accepted=True),
    )
    async def patch_entities(
        caller: Writer,
        drafts: Annotated[list[Draft], Depends(EntityBatch(entity, ChangeType.PATCH, "EntityPatchRequest"))],
        request: Request,
        session: Session,
        gateway: Gateway,
        system_metadata: SystemMetadataFlag = True,
        async_: AsyncFlag = True,
    ) -> Response:
        return await _write_entities(drafts, request, session, gateway, caller, system_metadata, async_)

    @router.post(
        f"/{entity}/batchGet",
        dependencies=[ALLOW_READ],
        operation_id=f"batchGet{p}",
        tags=tags,
        summary=f"Get several {entity} entities",
        responses=answers("Found entities (absent ones left out)", entities_response),
    )
    async def batch_get(
        wanted: Annotated[list[Wanted], Depends(BatchGet(entity))],
        session: Session,
        registry: Registry,
        caller: Caller,
        system_metadata: SystemMetadataFlag = False,
    ) -> Response:
        return await _batch_get(wanted, session, registry, system_metadata, caller)

    @router.get(
        f"/{entity}/{{urn}}",
        dependencies=[ALLOW_READ],
        operation_id=f"get{p}",
        tags=tags,
        summary=f"Get a {entity} entity",
        responses=answers("The entity", entity_response),
    )
    async def get_entity(
        urn: Urn,
        session: Session,
        registry: Registry,
        caller: Caller,
        aspects: AspectsToRead = None,
        system_metadata: SystemMetadataFlag = False,
    ) -> Response:
        rows = await EntityReader(session, registry, caller).entity(entity, checked_urn(urn), aspects)
        found: dict[str, Any] = {"urn": urn}
        for row in rows:
            found[row.aspect] = stored_envelope(row, system_metadata)
        return json_response(found)

    @router.head(
        f"/{entity}/{{urn}}",
        dependencies=[ALLOW_READ],
        operation_id=f"head{p}",
        tags=tags,
        summary=f"Check that a {entity} entity exists",
        status_code=204,
        response_description="Exists",
        responses=exists_answers,
    )
    async def entity_exists(urn: Urn, session: Session, registry: Registry, caller: Caller) -> Response:
        exists = await EntityReader(session, registry, caller).exists(checked_urn(urn))
        return Response(status_code=204 if exists else 404)

    # Deleting the whole entity (its key aspect) needs ADMIN: the gateway checks each draft.
    @router.delete(
        f"/{entity}/{{urn}}",
        operation_id=f"delete{p}",
        tags=tags,
        summary=f"Delete a {entity} entity or some of its aspects",
        responses=answers("Deleted", _DELETED_ASPECTS),
    )
    async def delete_entity(
        caller: Writer,
        urn: Urn,
        request: Request,
        session: Session,
        gateway: Gateway,
        aspects: AspectsToDelete = None,
        clear: Annotated[Flag, Query(description="Delete every aspect except the key aspect")] = False,
    ) -> Response:
        if clear:
            rows = await EntityReader(session, gateway.registry, caller).entity(entity, checked_urn(urn), None)
            targets = [row.aspect for row in rows if row.aspect != spec.key_aspect]
        elif aspects and spec.key_aspect not in aspects:
            targets = aspects
        else:
            targets = [spec.key_aspect]  # no aspects, or the key aspect: a hard delete of the entity
        drafts = [Draft(i, entity, aspect, ChangeType.DELETE.value, urn=urn) for i, aspect in enumerate(targets)]
        if not drafts:  # `clear` of an entity that has only its key aspect
            return json_response({"urn": urn, "deleted": []})
        outcome = await gateway.submit(session, drafts, caller, request_headers=request.headers)
        assert outcome.result is not None
        deleted = [r.aspect for r in outcome.result.items if r.status.value == "DELETED"]
        return json_response({"urn": urn, "deleted": deleted}, headers=outcome.response_headers)

    @router.post(
        f"/{entity}/{{urn}}/{{aspectName}}",
        operation_id=f"create{p}Aspect",
        tags=tags,
        summary=f"Create or upsert one aspect of a {entity} entity",
        responses=answers("Written", entity_response, accepted=True),
    )
    async def upsert_aspect(
        caller: Writer,
        urn: Urn,
        aspect_name: AspectName,
        body: Annotated[dict[str, Any], Depends(AspectWrite(entity))],
        request: Request,
        session: Session,
        gateway: Gateway,
        create_if_not_exists: Annotated[
            Flag | None,
            WithJsonSchema({"type": "boolean"}),
            Query(
                alias="createIfNotExists",
                description="Create the aspect only if it does not exist (a 409 otherwise). Default: true, as DataHub's, "
                "unless the request carries a precondition (If-Version-Match, If-Modified-Since, "
                "If-Unmodified-Since): then false, so that the precondition decides",
            ),
        ] = None,
        create_if_entity_not_exists: Annotated[
            Flag, Query(alias="createIfEntityNotExists", description="Create the entity only if it does not exist")
        ] = False,
        system_metadata: SystemMetadataFlag = True,
        async_: AsyncFlag = False,
    ) -> Response:
        headers = {**_http_conditional_headers(request), **(body.get("headers") or {})}
        # DataHub defaults createIfNotExists to true, which silently turns every write into CREATE and defeats
        # If-Version-Match (DataHub #19127): an explicit precondition header makes the default false.
        if create_if_not_exists is None:
            create_if_not_exists = not any(h.lower() in PRECONDITION_HEADERS for h in headers)
        if create_if_entity_not_exists:
            change_type = ChangeType.CREATE_ENTITY
        elif create_if_not_exists:
            change_type = ChangeType.CREATE
        else:
            change_type = ChangeType.UPSERT
        draft = Draft(
            0,
            entity,
            aspect_name,
            change_type.value,
            urn=urn,
            value=body["value"],
            system_metadata=body.get("systemMetadata"),
            headers=headers,
            location=SINGLE_ASPECT,
        )
        outcome = await gateway.submit(session, [draft], caller, queue=async_, request_headers=request.headers)
        return _entities_response(
            outcome, system_metadata, single=True, echo_limit=gateway.settings.max_echo_value_bytes
        )

    @router.patch(
        f"/{entity}/{{urn}}/{{aspectName}}",
        operation_id=f"patch{p}Aspect",
        tags=tags,
        summary=f"Patch one aspect of a {entity} entity",
        description='Body: an RFC 6902 array or DataHub\'s GenericJsonPatch `{"patch": [...], "arrayPrimaryKeys"?}`.',
        responses=answers("Written", entity_response),
    )
    async def patch_aspect(
        caller: Writer,
        urn: Urn,
        aspect_name: AspectName,
        patch: Annotated[Any, Depends(AspectPatch())],
        request: Request,
        session: Session,
        gateway: Gateway,
        system_metadata: SystemMetadataFlag = True,
    ) -> Response:
        draft = Draft(
            0,
            entity,
            aspect_name,
            ChangeType.PATCH.value,
            urn=urn,
            value=patch,
            headers=_http_conditional_headers(request),
            location=SINGLE_PATCH,
        )
        outcome = await gateway.submit(session, [draft], caller, request_headers=request.headers)
        return _entities_response(
            outcome, system_metadata, single=True, echo_limit=gateway.settings.max_echo_value_bytes
        )

    @router.get(
        f"/{entity}/{{urn}}/{{aspectName}}",
        dependencies=[ALLOW_READ],
        operation_id=f"get{p}Aspect",
        tags=tags,
        summary=f"Get one aspect of a {entity} entity",
        responses=answers("The aspect", aspect_response),
    )
    async def get_aspect(
        urn: Urn,
        aspect_name: AspectName,
        session: Session,
        registry: Registry,
        caller: Caller,
        version: Version = 0,
        system_metadata: SystemMetadataFlag = False,
    ) -> Response:
        check_long(version, "version", minimum=0)
        row = await EntityReader(session, registry, caller).aspect(entity, checked_urn(urn), aspect_name, version)
        envelope = stored_envelope(row, system_metadata)
        envelope["version"] = row.system_metadata.get("version", str(row.version))
        return json_response(envelope)

    @router.head(
        f"/{entity}/{{urn}}/{{aspectName}}",
        dependencies=[ALLOW_READ],
        operation_id=f"head{p}Aspect",
        tags=tags,
        summary=f"Check that an aspect of a {entity} entity exists",
        status_code=204,
        response_description="Exists",
        responses=exists_answers,
    )
    async def aspect_exists(
        urn: Urn, aspect_name: AspectName, session: Session, registry: Registry, caller: Caller
    ) -> Response:
        exists = await EntityReader(session, registry, caller).has_aspect(entity, checked_urn(urn), aspect_name)
        return Response(status_code=204 if exists else 404)

    @router.delete(
        f"/{entity}/{{urn}}/{{aspectName}}",
        operation_id=f"delete{p}Aspect",
        tags=tags,
        summary=f"Delete one aspect of a {entity} entity",
        responses=answers("Deleted (or already absent: status ABSENT)", _DELETED_ASPECT),
    )
    async def delete_aspect(
        caller: Writer, urn: Urn, aspect_name: AspectName, request: Request, session: Session, gateway: Gateway
    ) -> Response:
        draft = Draft(
            0, entity, aspect_name, ChangeType.DELETE.value, urn=urn, headers=_http_conditional_headers(request)
        )
        outcome = await gateway.submit(session, [draft], caller, request_headers=request.headers)
        assert outcome.result is not None
        item = outcome.result.items[0]
        return json_response(
            {"urn": urn, "aspect": aspect_name, "status": item.status.value}, headers=outcome.response_headers
        )


_DELETED_ASPECTS = {
    "type": "object",
    "properties": {"urn": {"type": "string"}, "deleted": {"type": "array", "items": {"type": "string"}}},
    "required": ["urn", "deleted"],
}
_DELETED_ASPECT = {
    "type": "object",
    "properties": {"urn": {"type": "string"}, "aspect": {"type": "string"}, "status": {"type": "string"}},
    "required": ["urn", "aspect", "status"],
}


# --- the v3 bodies: each route's one declaration of its body (app.api.deps.DeclaredBody) ---------------------------

Wanted = tuple[str, list[str] | None]  # a URN a batch get asks for, and its aspects (None: all)


class EntityBatch(DeclaredBody[list[Draft]]):
    """A v3 batch of entities, `[{"urn", "<aspect>": {"value", "systemMetadata"?, "headers"?}}, ...]`, at most
    MAX_BATCH_ITEMS entities and as many aspects (413): one draft per aspect (`drafts_from_entity_batch`)."""

    def __init__(self, entity: str, change_type: ChangeType, component: str) -> None:
        self.entity, self.change_type, self.component = entity, change_type, component

    def request_body_schema(self) -> dict[str, Any]:
        return _array_of(schema_ref(entity_component(self.entity, self.component)))

    async def parse(self, document: Any, request: Request) -> list[Draft]:
        settings = await get_settings(request)
        check_batch_size(document, settings)
        if isinstance(document, list):  # and its aspects, before a draft is made of each
            aspects = sum(len(item) - ("urn" in item) for item in document if isinstance(item, dict))
            check_batch_size(document, settings, count=aspects, what="aspects")
        return drafts_from_entity_batch(self.entity, document, self.change_type)


class BatchGet(DeclaredBody[list[Wanted]]):
    """`[{"urn", "<aspect>": {}, ...}, ...]`, at most MAX_BATCH_ITEMS (413): the URNs and aspects asked for, each
    checked (a 400 naming every bad one) before anything is read."""

    def __init__(self, entity: str) -> None:
        self.entity = entity

    def request_body_schema(self) -> dict[str, Any]:
        return _array_of(schema_ref(entity_component(self.entity, "BatchGetRequest")))

    async def parse(self, document: Any, request: Request) -> list[Wanted]:
        if not isinstance(document, list):
            raise ValidationFailed(
                "the body must be a JSON array of {urn, <aspect>: {}}", [Issue("expected an array", path="$")]
            )
        check_batch_size(document, await get_settings(request))
        registry = await get_registry(request)
        wanted: list[Wanted] = []
        issues: list[Issue] = []
        for position, item in enumerate(document):
            if not isinstance(item, dict) or not isinstance(item.get("urn"), str):
                raise ValidationFailed(
                    "each item needs a `urn`", [Issue("Missing `urn` field", position, path=f"$[{position}].urn")]
                )
            urn = item["urn"]
            try:
                entity_type_of(urn)  # too long, a NUL, not a URN: never sent to the database
            except InvalidUrnError as error:
                issues.append(Issue(str(error), position, urn, path=f"$[{position}].urn"))
                continue
            aspects = [a for a in item if a != "urn"] or None
            for aspect in aspects or ():
                try:
                    with invalid_at(f"$[{position}]", urn=urn, aspect=aspect):
                        registry.aspect(self.entity, aspect)
                except ValidationFailed as error:
                    issues.extend(Issue(i.message, position, urn, aspect, i.path) for i in error.issues)
            wanted.append((urn, aspects))
        if issues:
            raise ValidationFailed(f"{len({i.index for i in issues})} of {len(document)} items are invalid", issues)
        return wanted


class AspectWrite(DeclaredBody[dict[str, Any]]):
    """One aspect's write, `{"value": {...}, "systemMetadata"?, "headers"?}`."""

    def __init__(self, entity: str) -> None:
        self.entity = entity

    def request_body_schema(self) -> dict[str, Any]:
        return schema_ref(entity_component(self.entity, "EntityAspectRequest"))

    async def parse(self, document: Any, request: Request) -> dict[str, Any]:
        if not isinstance(document, dict) or "value" not in document:
            raise ValidationFailed(
                'the body must be {"value": {...}, "systemMetadata"?, "headers"?}',
                [Issue("missing value", path="$.value")],
            )
        envelope_issues = _envelope_issues(document, "$")
        if envelope_issues:
            raise ValidationFailed(envelope_issues[0].message, envelope_issues)
        return document


class AspectPatch(DeclaredBody[Any]):
    """One aspect's patch, as sent: the write checks it (app.write.patch)."""

    def request_body_schema(self) -> dict[str, Any]:
        return schema_ref("GenericJsonPatch")

    async def parse(self, document: Any, request: Request) -> Any:
        return document


async def _write_entities(
    drafts: list[Draft],
    request: Request,
    session: Session,
    gateway: Gateway,
    caller: Writer,
    system_metadata: bool,
    queue: bool,
) -> Response:
    outcome = await gateway.submit(session, drafts, caller, queue=queue, request_headers=request.headers)
    return _entities_response(outcome, system_metadata, echo_limit=gateway.settings.max_echo_value_bytes)


async def _batch_get(
    wanted: list[Wanted], session: Session, registry: Registry, system_metadata: bool, caller: Principal
) -> Response:
    found = await EntityReader(session, registry, caller).latest_of_many(wanted)  # one query for the whole batch
    out = []
    for urn, aspects in wanted:
        rows = [r for r in found.get(urn, ()) if aspects is None or r.aspect in aspects]
        if not rows:
            continue
        entity_out: dict[str, Any] = {"urn": urn}
        for row in rows:
            entity_out[row.aspect] = stored_envelope(row, system_metadata)
        out.append(entity_out)
    return json_response(out)


def _array_of(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": schema}


def _http_conditional_headers(request: Request) -> dict[str, str]:
    """Documented extension: the conditional-write headers may also come as HTTP headers on single-aspect writes."""
    return {name: request.headers[name] for name in CONDITIONAL_HEADERS if name in request.headers}


# --- v3 bodies ↔ drafts, outcomes ↔ v3 responses ----------------------------------------------------------------

# Where a single-aspect write's issues point: its body is `{"value", "systemMetadata"?, "headers"?}` (a patch body
# is the patch itself); the URN is a path parameter.
SINGLE_ASPECT = Location(0, "$", value="$.value", urn="$urn", fields="$")
SINGLE_PATCH = Location(0, "$", value="$", urn="$urn", fields="$")


def drafts_from_entity_batch(entity_type: str, body: Any, change_type: ChangeType) -> list[Draft]:
    """`[{"urn": ..., "<aspect>": {"value": {...}, "systemMetadata"?, "headers"?}}, ...]` → one draft per aspect,
    located at its aspect in the body."""
    if not isinstance(body, list):
        raise ValidationFailed("the body must be a JSON array of entities", [Issue("expected an array", path="$")])
    if not body:
        raise ValidationFailed("the body is an empty array: send at least one entity", [Issue("empty batch", path="$")])
    drafts: list[Draft] = []
    issues: list[Issue] = []
    for position, item in enumerate(body):
        path = f"$[{position}]"
        if not isinstance(item, dict):
            issues.append(Issue("each entity must be an object with a `urn` field", position, path=path))
            continue
        urn = item.get("urn")
        if not isinstance(urn, str):
            issues.append(Issue("Missing `urn` field", position, path=f"{path}.urn"))
            continue
        for aspect_name, envelope in item.items():
            if aspect_name == "urn":
                continue
            aspect_path = f"{path}.{aspect_name}"
            if not isinstance(envelope, dict) or "value" not in envelope:
                issues.append(
                    Issue(
                        'an aspect must be {"value": {...}, "systemMetadata"?, "headers"?}',
                        position,
                        urn,
                        aspect_name,
                        aspect_path,
                    )
                )
                continue
            unknown = set(envelope) - ENVELOPE_KEYS
            if unknown:
                issues.append(
                    Issue(
                        f"unknown aspect envelope field(s) {sorted(unknown)}", position, urn, aspect_name, aspect_path
                    )
                )
                continue
            envelope_issues = _envelope_issues(envelope, aspect_path, position, urn, aspect_name)
            if envelope_issues:
                issues.extend(envelope_issues)
                continue
            drafts.append(
                Draft(
                    index=len(drafts),
                    entity_type=entity_type,
                    aspect_name=aspect_name,
                    change_type=change_type.value,
                    urn=urn,
                    value=envelope["value"],
                    system_metadata=envelope.get("systemMetadata"),
                    headers=envelope.get("headers"),
                    location=Location(
                        position, aspect_path, value=f"{aspect_path}.value", urn=f"{path}.urn", fields=aspect_path
                    ),
                )
            )
    if issues:
        raise ValidationFailed(f"{len(issues)} entities of the batch are malformed; nothing was written", issues)
    return drafts


def _envelope_issues(
    envelope: dict[str, Any],
    path: str,
    index: int | None = None,
    urn: str | None = None,
    aspect: str | None = None,
) -> list[Issue]:
    """An aspect envelope's `systemMetadata` must be an object, its `headers` an object of strings."""
    issues = []
    system_metadata = envelope.get("systemMetadata")
    if system_metadata is not None and not isinstance(system_metadata, dict):
        issues.append(Issue("`systemMetadata` must be an object", index, urn, aspect, f"{path}.systemMetadata"))
    headers = envelope.get("headers")
    if headers is not None and not (isinstance(headers, dict) and all(isinstance(v, str) for v in headers.values())):
        issues.append(
            Issue(
                "`headers` must be an object of strings",
                index,
                urn,
                aspect,
                f"{path}.headers",
                expected="{name: value}",
            )
        )
    return issues


def _echoed(value: Any, envelope: dict[str, Any], limit: int) -> None:
    """Put `value` in a write's answer, as DataHub echoes written aspects, unless it is larger than `limit` bytes
    (METALEDGER_MAX_ECHO_VALUE_BYTES): then the envelope says so instead. Serialized once, here."""
    raw = orjson.dumps(value)
    if len(raw) <= limit:
        envelope["value"] = orjson.Fragment(raw)
    else:
        del envelope["value"]
        envelope["message"] = (
            f"value not echoed: {len(raw)} bytes, over the {limit} bytes a response echoes "
            "(METALEDGER_MAX_ECHO_VALUE_BYTES); read it back with GET"
        )


def entities_from_results(
    results: list[ItemResult],
    with_system_metadata: bool = True,
    echo_limit: int | None = None,
) -> list[dict[str, Any]]:
    """Group written aspects back into the v3 entity shape, in request order (values larger than `echo_limit`
    bytes left out)."""
    entities: dict[str, dict[str, Any]] = {}
    for result in results:
        entity = entities.setdefault(result.urn, {"urn": result.urn})
        envelope = aspect_envelope(result.value, result.system_metadata, with_system_metadata)
        if echo_limit is not None and result.value is not None:
            _echoed(result.value, envelope, echo_limit)
        envelope["status"] = result.status.value
        if result.message:
            envelope["message"] = result.message
        envelope.update(result.processing())
        entity[result.aspect] = envelope
    return list(entities.values())


def _queued_entities(
    outcome: SubmitOutcome, with_system_metadata: bool, echo_limit: int | None
) -> list[dict[str, Any]]:
    """The echo of an accepted asynchronous write: the entities as sent, one per URN, each aspect QUEUED."""
    entities: dict[str, dict[str, Any]] = {}
    for draft, proposal in outcome.queued:
        entity = entities.setdefault(proposal.urn, {"urn": proposal.urn})
        envelope = aspect_envelope(draft.value, draft.system_metadata, with_system_metadata)
        if echo_limit is not None and draft.value is not None:
            _echoed(draft.value, envelope, echo_limit)
        envelope["status"] = "QUEUED"
        entity[proposal.aspect_name] = envelope
    return list(entities.values())


def _entities_response(
    outcome: SubmitOutcome,
    with_system_metadata: bool,
    *,
    single: bool = False,
    echo_limit: int | None = None,
) -> Response:
    """202 with the queued echo, or the written entities (and the sync index status header)."""
    if outcome.result is None:
        entities = _queued_entities(outcome, with_system_metadata, echo_limit)
        return json_response(entities[0] if single else entities, 202)
    entities = entities_from_results(outcome.result.items, with_system_metadata, echo_limit)
    return json_response(entities[0] if single else entities, headers=outcome.response_headers)
