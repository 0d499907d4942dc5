"""DataHub's OpenAPI v3 entity endpoints: v3 bodies ↔ drafts, outcomes ↔ v3 responses. One set of routes per
entity type of the registry (`/openapi/v3/entity/dataset/{urn}` ...), declared here with their parameters, bodies and
answers: the OpenAPI document is generated from these declarations, the body and answer schemas are the registry's
components (app.openapi_spec). Issues name paths in the body the client sent (`$[0].datasetProperties.value.name`)."""

# No `from __future__ import annotations`: the parameter types of each entity's routes (its URN pattern, its
# aspect names) are built per entity (`EntityType`), and FastAPI reads them from the handlers' signatures when they
# are registered.

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Annotated, Any, Self

import orjson
from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import AfterValidator, WithJsonSchema
from starlette._utils import get_route_path
from starlette.datastructures import URLPath
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Receive, Scope, Send

from app.api.deps import (
    ALLOW_READ,
    DeclaredBody,
    Gateway,
    PrimaryEntities,
    Session,
    StoredEntities,
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
    stored_envelope_v3,
)
from app.api.urn_paths import restore_slashes
from app.errors import Issue, Location, NotFound, ValidationFailed
from app.idempotency import idempotent
from app.ingest.gateway import Submission
from app.limits import MAX_LONG, check_long, clip
from app.openapi_spec import (
    API_PREFIX,
    URN_MAX_CHARS,
    aspect_name_component,
    entity_component,
    json_body,
    schema_ref,
    upper_first,
)
from app.registry import EntityRegistry
from app.registry.registry import EntitySpec
from app.urns import InvalidUrnError, entity_type_of
from app.write.decision import ItemResult
from app.write.proposal import CONDITIONAL_HEADERS, IF_VERSION_MATCH, PRECONDITION_HEADERS, ChangeType, Draft

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
CreateIfNotExists = Annotated[
    Flag | None,
    WithJsonSchema({"type": "boolean"}),
    Query(
        alias="createIfNotExists",
        description="Create the aspect only if it does not exist (a 409 otherwise). Default: true, as DataHub's, "
        "unless the request carries a precondition (If-Version-Match, If-Modified-Since, "
        "If-Unmodified-Since): then false, so that the precondition decides",
    ),
]
CreateIfEntityNotExists = Annotated[
    Flag, Query(alias="createIfEntityNotExists", description="Create the entity only if it does not exist")
]
ClearFlag = Annotated[Flag, Query(description="Delete every aspect except the key aspect")]


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
        # The one rule for an entity name in a path, as every `{entityName}` route reads it (EntityRegistry.entity):
        # the registry's name in any case (`dataflow`, DataHub's lowercase path form, is `dataFlow`). The routes are
        # declared, and documented, once, in the registry's spelling.
        self._folded = self.prefix.lower()
        self._by_method: dict[str, list[BaseRoute]] = {}  # method -> the routes serving it, in the routes' order

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
            named = path[: len(self.prefix)]
            if named.lower() != self._folded or (len(path) > len(named) and path[len(named)] != "/"):
                return Match.NONE, {}
            # another spelling of the name: its routes match the path in the registry's spelling
            full = scope["path"]
            at = len(full) - len(path)  # where the route path starts (after the root path)
            scope = {**scope, "path": full[:at] + self.prefix + full[at + len(self.prefix) :]}
        # Only a route that serves the request's method can match it fully: those are asked first, in the routes'
        # order (a v3 GET asks 2 of the 11); the others only when none does, for the partial match that answers 405.
        for route in self._serving(scope["method"]):
            match, child_scope = route.matches(scope)
            if match is Match.FULL:
                return Match.FULL, {**child_scope, _MATCHED: route}
        for route in self.routes:
            match, child_scope = route.matches(scope)
            if match is Match.PARTIAL:
                return Match.PARTIAL, {**child_scope, _MATCHED: route}
        return Match.NONE, {}

    def _serving(self, method: str) -> list[BaseRoute]:
        serving = self._by_method.get(method)
        if serving is None:
            serving = [r for r in self.routes if method in (getattr(r, "methods", None) or (method,))]
            if method in _METHODS:  # kept for the methods HTTP has; another (any token a caller sends) is not
                self._by_method[method] = serving
        return serving

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await scope.pop(_MATCHED).handle(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> URLPath:
        for route in self.routes:
            try:
                return route.url_path_for(name, **path_params)
            except NoMatchFound:
                pass
        raise NoMatchFound(name, path_params)


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# The entity types' routes of a registry, kept for the process: an app made again with the same registry (the tests
# make one per test) takes them with the routes they have made.
_ROUTES: dict[int, tuple[EntityRegistry, list[EntityRoutes]]] = {}


def entity_routes(registry: EntityRegistry) -> list[EntityRoutes]:
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


# --- the routes of one entity type ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EntityType:
    """What the routes of one entity type are declared with: its names and the metadata of its parameters (its URN
    pattern, its aspect names), which each handler spells into its signature, `urn: Annotated[str, *e.urn]`: FastAPI
    reads them there, a type checker reads the `str`."""

    spec: EntitySpec
    urn: tuple[Any, ...]  # {urn}
    aspect_name: tuple[Any, ...]  # {aspectName}
    aspects_to_read: tuple[Any, ...]  # ?aspects= of a read
    aspects_to_delete: tuple[Any, ...]  # ?aspects= of a delete

    @classmethod
    def of(cls, spec: EntitySpec) -> Self:
        urn_schema: dict[str, Any] = {"type": "string", "pattern": f"^urn:li:{spec.name}:."}
        if spec.name != "schemaField":  # DataHub exempts schemaField URNs from its length limit
            urn_schema["maxLength"] = URN_MAX_CHARS
        # The handlers check URNs and aspect names themselves (a 400 naming the parameter and the reason, or a 404 for
        # an aspect the entity does not have): the schemas document those checks.
        aspect_names = schema_ref(aspect_name_component(spec.name))
        some_aspects = WithJsonSchema({"type": "array", "items": aspect_names})
        return cls(
            spec,
            urn=(
                AfterValidator(restore_slashes),
                WithJsonSchema(urn_schema),
                Path(description=f"URN of the {spec.name} (URL-encoded)"),
            ),
            aspect_name=(WithJsonSchema(aspect_names), Path(alias="aspectName", description="Name of the aspect")),
            aspects_to_read=(some_aspects, Query(description="Aspects to return (default: all)")),
            aspects_to_delete=(some_aspects, Query(description="Aspects to delete (default: the whole entity)")),
        )

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def title(self) -> str:  # in operation ids: `getDataset`
        return upper_first(self.spec.name)

    @property
    def tags(self) -> list[str | Enum]:
        return [self.spec.name]

    def component(self, suffix: str) -> dict[str, str]:
        """A reference to the entity type's component of the registry's: `DatasetEntityResponse`."""
        return schema_ref(entity_component(self.spec.name, suffix))


def _add_entity_routes(router: APIRouter, spec: EntitySpec) -> None:
    """The routes of one entity type, in the document's order; each function adds one, declared with its handler."""
    e = EntityType.of(spec)
    # /{entity}: several entities
    _upsert_entities(router, e)  # POST
    _patch_entities(router, e)  # PATCH
    _batch_get(router, e)  # POST /batchGet
    # /{entity}/{urn}: one entity
    _get_entity(router, e)  # GET
    _entity_exists(router, e)  # HEAD
    _delete_entity(router, e)  # DELETE
    # /{entity}/{urn}/{aspectName}: one aspect of an entity
    _upsert_aspect(router, e)  # POST
    _patch_aspect(router, e)  # PATCH
    _get_aspect(router, e)  # GET
    _aspect_exists(router, e)  # HEAD
    _delete_aspect(router, e)  # DELETE


def _upsert_entities(router: APIRouter, e: EntityType) -> None:
    @router.post(
        f"/{e.name}",
        operation_id=f"create{e.title}",
        tags=e.tags,
        summary=f"Create or upsert {e.name} entities",
        responses=_answers("Written", _array_of(e.component("EntityResponse")), accepted=True),
    )
    @idempotent
    async def upsert_entities(
        caller: Writer,
        drafts: Annotated[list[Draft], Depends(EntityBatch(e.name, ChangeType.UPSERT, "EntityRequest"))],
        request: Request,
        session: Session,
        gateway: Gateway,
        system_metadata: SystemMetadataFlag = True,
        async_: AsyncFlag = True,
    ) -> Response:
        # `async` defaults to true, as DataHub's: validated now, queued on the proposal topic, 202 with the echo.
        outcome = await gateway.submit(session, drafts, caller, queue=async_, request_headers=request.headers)
        return _entities_response(outcome, system_metadata, echo_limit=gateway.settings.max_echo_value_bytes)


def _patch_entities(router: APIRouter, e: EntityType) -> None:
    @router.patch(
        f"/{e.name}",
        operation_id=f"patch{e.title}",
        tags=e.tags,
        summary=f"Patch aspects of {e.name} entities (applied to the locked latest values)",
        description='Each aspect\'s `value` is DataHub\'s `{"patch": [...], "arrayPrimaryKeys"?, '
        '"forceGenericPatch"?}`, applied inside the transaction to the locked latest value.',
        responses=_answers("Written", _array_of(e.component("EntityResponse")), accepted=True),
    )
    @idempotent
    async def patch_entities(
        caller: Writer,
        drafts: Annotated[list[Draft], Depends(EntityBatch(e.name, ChangeType.PATCH, "EntityPatchRequest"))],
        request: Request,
        session: Session,
        gateway: Gateway,
        system_metadata: SystemMetadataFlag = True,
        async_: AsyncFlag = True,
    ) -> Response:
        outcome = await gateway.submit(session, drafts, caller, queue=async_, request_headers=request.headers)
        return _entities_response(outcome, system_metadata, echo_limit=gateway.settings.max_echo_value_bytes)


def _batch_get(router: APIRouter, e: EntityType) -> None:
    @router.post(
        f"/{e.name}/batchGet",
        operation_id=f"batchGet{e.title}",
        dependencies=[ALLOW_READ],  # before its body is read (the body's dependency comes before the reader's)
        tags=e.tags,
        summary=f"Get several {e.name} entities",
        responses=_answers("Found entities (absent ones left out)", _array_of(e.component("EntityResponse"))),
    )
    async def batch_get(
        wanted: Annotated[list[WantedVersions], Depends(BatchGet(e.name))],
        reader: StoredEntities,
        system_metadata: SystemMetadataFlag = False,
    ) -> Response:
        # the latest of what no If-Version-Match asks an older version of: one query for the whole batch
        latest: list[Wanted] = []
        for urn, aspects, versions in wanted:
            if aspects is None or any(a not in versions for a in aspects):
                latest.append((urn, None if aspects is None else [a for a in aspects if a not in versions]))
        found = await reader.latest_of_many(latest)
        out = []
        for urn, aspects, versions in wanted:
            rows = [
                r for r in found.get(urn, ()) if aspects is None or (r.aspect in aspects and r.aspect not in versions)
            ]
            envelopes = {row.aspect: stored_envelope_v3(row, system_metadata) for row in rows}
            for aspect, version in versions.items():  # DataHub's batchGet: that version, left out when there is none
                try:
                    row = await reader.aspect(e.name, urn, aspect, version)
                except NotFound:
                    continue
                envelopes[aspect] = stored_envelope_v3(row, system_metadata)
            if envelopes:
                out.append({"urn": urn, **envelopes})
        return json_response(out)


def _get_entity(router: APIRouter, e: EntityType) -> None:
    @router.get(
        f"/{e.name}/{{urn}}",
        operation_id=f"get{e.title}",
        tags=e.tags,
        summary=f"Get a {e.name} entity",
        responses=_answers("The entity", e.component("EntityResponse")),
    )
    async def get_entity(
        urn: Annotated[str, *e.urn],
        reader: StoredEntities,
        aspects: Annotated[list[str] | None, *e.aspects_to_read] = None,
        system_metadata: SystemMetadataFlag = False,
    ) -> Response:
        rows = await reader.entity(e.name, checked_urn(urn), aspects)
        return json_response({"urn": urn, **{row.aspect: stored_envelope_v3(row, system_metadata) for row in rows}})


def _entity_exists(router: APIRouter, e: EntityType) -> None:
    @router.head(
        f"/{e.name}/{{urn}}",
        operation_id=f"head{e.title}",
        tags=e.tags,
        summary=f"Check that a {e.name} entity exists",
        status_code=204,
        response_description="Exists",
        responses=_EXISTS_ANSWERS,
    )
    async def entity_exists(urn: Annotated[str, *e.urn], reader: StoredEntities) -> Response:
        return Response(status_code=204 if await reader.exists(checked_urn(urn)) else 404)


def _delete_entity(router: APIRouter, e: EntityType) -> None:
    # Deleting the whole entity (its key aspect) needs ADMIN: the gateway checks each draft.
    @router.delete(
        f"/{e.name}/{{urn}}",
        operation_id=f"delete{e.title}",
        tags=e.tags,
        summary=f"Delete a {e.name} entity or some of its aspects",
        responses=_answers("Deleted", _DELETED_ASPECTS),
    )
    async def delete_entity(
        caller: Writer,
        urn: Annotated[str, *e.urn],
        request: Request,
        session: Session,
        gateway: Gateway,
        reader: PrimaryEntities,
        aspects: Annotated[list[str] | None, *e.aspects_to_delete] = None,
        clear: ClearFlag = False,
    ) -> Response:
        key_aspect = e.spec.key_aspect
        if clear:
            rows = await reader.entity(e.name, checked_urn(urn), None)
            targets = [row.aspect for row in rows if row.aspect != key_aspect]
        elif aspects and key_aspect not in aspects:
            targets = aspects
        else:
            targets = [key_aspect]  # no aspects, or the key aspect: a hard delete of the entity
        drafts = [Draft(i, e.name, aspect, ChangeType.DELETE.value, urn=urn) for i, aspect in enumerate(targets)]
        if not drafts:  # `clear` of an entity that has only its key aspect
            return json_response({"urn": urn, "deleted": []})
        outcome = await gateway.submit(session, drafts, caller, request_headers=request.headers)
        assert outcome.result is not None
        deleted = [r.aspect for r in outcome.result.items if r.status.value == "DELETED"]
        return json_response({"urn": urn, "deleted": deleted}, headers=outcome.response_headers)


def _upsert_aspect(router: APIRouter, e: EntityType) -> None:
    @router.post(
        f"/{e.name}/{{urn}}/{{aspectName}}",
        operation_id=f"create{e.title}Aspect",
        tags=e.tags,
        summary=f"Create or upsert one aspect of a {e.name} entity",
        responses=_answers("Written", e.component("EntityResponse"), accepted=True),
    )
    async def upsert_aspect(
        caller: Writer,
        urn: Annotated[str, *e.urn],
        aspect_name: Annotated[str, *e.aspect_name],
        body: Annotated[dict[str, Any], Depends(AspectWrite(e.name))],
        request: Request,
        session: Session,
        gateway: Gateway,
        create_if_not_exists: CreateIfNotExists = None,
        create_if_entity_not_exists: CreateIfEntityNotExists = False,
        system_metadata: SystemMetadataFlag = True,
        async_: AsyncFlag = False,
    ) -> Response:
        headers = {**_http_conditional_headers(request), **(body.get("headers") or {})}
        change_type = _aspect_change_type(create_if_not_exists, create_if_entity_not_exists, headers)
        draft = Draft(
            0,
            e.name,
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


def _patch_aspect(router: APIRouter, e: EntityType) -> None:
    @router.patch(
        f"/{e.name}/{{urn}}/{{aspectName}}",
        operation_id=f"patch{e.title}Aspect",
        tags=e.tags,
        summary=f"Patch one aspect of a {e.name} entity",
        description='Body: an RFC 6902 array or DataHub\'s GenericJsonPatch `{"patch": [...], "arrayPrimaryKeys"?}`.',
        responses=_answers("Written", e.component("EntityResponse")),
    )
    async def patch_aspect(
        caller: Writer,
        urn: Annotated[str, *e.urn],
        aspect_name: Annotated[str, *e.aspect_name],
        patch: Annotated[Any, Depends(AspectPatch())],
        request: Request,
        session: Session,
        gateway: Gateway,
        system_metadata: SystemMetadataFlag = True,
    ) -> Response:
        headers = _http_conditional_headers(request)
        draft = Draft(
            0, e.name, aspect_name, ChangeType.PATCH.value, urn=urn, value=patch, headers=headers, location=SINGLE_PATCH
        )
        outcome = await gateway.submit(session, [draft], caller, request_headers=request.headers)
        return _entities_response(
            outcome, system_metadata, single=True, echo_limit=gateway.settings.max_echo_value_bytes
        )


def _get_aspect(router: APIRouter, e: EntityType) -> None:
    @router.get(
        f"/{e.name}/{{urn}}/{{aspectName}}",
        operation_id=f"get{e.title}Aspect",
        tags=e.tags,
        summary=f"Get one aspect of a {e.name} entity",
        responses=_answers("The aspect", e.component("EntityAspectResponse")),
    )
    async def get_aspect(
        urn: Annotated[str, *e.urn],
        aspect_name: Annotated[str, *e.aspect_name],
        reader: StoredEntities,
        version: Version = 0,
        system_metadata: SystemMetadataFlag = False,
    ) -> Response:
        check_long(version, "version", minimum=0)
        row = await reader.aspect(e.name, checked_urn(urn), aspect_name, version)
        envelope = stored_envelope_v3(row, system_metadata)
        envelope["version"] = row.system_metadata.get("version", str(row.version))
        return json_response(envelope)


def _aspect_exists(router: APIRouter, e: EntityType) -> None:
    @router.head(
        f"/{e.name}/{{urn}}/{{aspectName}}",
        operation_id=f"head{e.title}Aspect",
        tags=e.tags,
        summary=f"Check that an aspect of a {e.name} entity exists",
        status_code=204,
        response_description="Exists",
        responses=_EXISTS_ANSWERS,
    )
    async def aspect_exists(
        urn: Annotated[str, *e.urn], aspect_name: Annotated[str, *e.aspect_name], reader: StoredEntities
    ) -> Response:
        exists = await reader.has_aspect(e.name, checked_urn(urn), aspect_name)
        return Response(status_code=204 if exists else 404)


def _delete_aspect(router: APIRouter, e: EntityType) -> None:
    @router.delete(
        f"/{e.name}/{{urn}}/{{aspectName}}",
        operation_id=f"delete{e.title}Aspect",
        tags=e.tags,
        summary=f"Delete one aspect of a {e.name} entity",
        responses=_answers("Deleted (or already absent: status ABSENT)", _DELETED_ASPECT),
    )
    async def delete_aspect(
        caller: Writer,
        urn: Annotated[str, *e.urn],
        aspect_name: Annotated[str, *e.aspect_name],
        request: Request,
        session: Session,
        gateway: Gateway,
    ) -> Response:
        headers = _http_conditional_headers(request)
        draft = Draft(0, e.name, aspect_name, ChangeType.DELETE.value, urn=urn, headers=headers)
        outcome = await gateway.submit(session, [draft], caller, request_headers=request.headers)
        assert outcome.result is not None
        item = outcome.result.items[0]
        return json_response(
            {"urn": urn, "aspect": aspect_name, "status": item.status.value}, headers=outcome.response_headers
        )


def _array_of(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": schema}


def _answers(description: str, schema: dict[str, Any], *, accepted: bool = False) -> dict[int | str, Any]:
    out: dict[int | str, Any] = {200: {"description": description, **json_body(schema)}}
    if accepted:
        out[202] = {"description": "Accepted: validated and queued (async=true)", **json_body(schema)}
    return out


_EXISTS_ANSWERS: dict[int | str, Any] = {404: {"description": "Not found"}}
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


def _aspect_change_type(
    create_if_not_exists: bool | None, create_if_entity_not_exists: bool, headers: dict[str, str]
) -> ChangeType:
    """The change type of a single-aspect write, from its flags and its conditional-write headers."""
    # DataHub defaults createIfNotExists to true, which silently turns every write into CREATE and defeats
    # If-Version-Match (DataHub #19127): an explicit precondition header makes the default false.
    if create_if_not_exists is None:
        create_if_not_exists = not any(h.lower() in PRECONDITION_HEADERS for h in headers)
    if create_if_entity_not_exists:
        return ChangeType.CREATE_ENTITY
    return ChangeType.CREATE if create_if_not_exists else ChangeType.UPSERT


def _http_conditional_headers(request: Request) -> dict[str, str]:
    """Documented extension: the conditional-write headers may also come as HTTP headers on single-aspect writes."""
    return {name: request.headers[name] for name in CONDITIONAL_HEADERS if name in request.headers}


# --- the v3 bodies: each route's one declaration of its body (app.api.deps.DeclaredBody) ---------------------------

Wanted = tuple[str, list[str] | None]  # a URN a batch get asks for, and its aspects (None: all)
# ... and the older version of each aspect an If-Version-Match header asks for (the others: the latest)
WantedVersions = tuple[str, list[str] | None, dict[str, int]]


def _version_asked(envelope: Any, path: str) -> int:
    """The version a batch get's `{"headers": {"If-Version-Match": "<n>"}}` asks for (0, the latest, when none), as
    DataHub's v3 batchGet reads it: a non-negative 64-bit integer, or a 400 naming `path`'s header."""
    if not isinstance(envelope, dict) or envelope.get("headers") is None:
        return 0
    headers = envelope["headers"]
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ValidationFailed(
            "`headers` must be an object of strings", [Issue("expected an object of strings", path=f"{path}.headers")]
        )
    raw = next((v for k, v in headers.items() if k.lower() == IF_VERSION_MATCH), None)
    if raw is None:
        return 0
    digits = raw.strip()
    if not digits.isascii() or not digits.isdigit() or int(digits) > MAX_LONG:
        raise ValidationFailed(
            "If-Version-Match must be an aspect version: a non-negative integer",
            [Issue("not a version", path=f"{path}.headers.If-Version-Match", found=clip(raw, 100))],
        )
    return int(digits)


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


class BatchGet(DeclaredBody[list[WantedVersions]]):
    """`[{"urn", "<aspect>": {"headers"?: {"If-Version-Match"?: "<n>"}}, ...}, ...]`, at most MAX_BATCH_ITEMS (413):
    the URNs and aspects asked for, and the version asked of an aspect (DataHub's batchGet: an `If-Version-Match`
    header in the aspect's object; the latest without one), each checked (a 400 naming every bad one) before anything
    is read."""

    def __init__(self, entity: str) -> None:
        self.entity = entity

    def request_body_schema(self) -> dict[str, Any]:
        return _array_of(schema_ref(entity_component(self.entity, "BatchGetRequest")))

    async def parse(self, document: Any, request: Request) -> list[WantedVersions]:
        if not isinstance(document, list):
            raise ValidationFailed(
                "the body must be a JSON array of {urn, <aspect>: {}}", [Issue("expected an array", path="$")]
            )
        check_batch_size(document, await get_settings(request))
        registry = await get_registry(request)
        wanted: list[WantedVersions] = []
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
            versions: dict[str, int] = {}
            for aspect in aspects or ():
                try:
                    with invalid_at(f"$[{position}]", urn=urn, aspect=aspect):
                        spec = registry.aspect(self.entity, aspect)
                except ValidationFailed as error:
                    issues.extend(Issue(i.message, position, urn, aspect, i.path) for i in error.issues)
                    continue
                try:
                    version = _version_asked(item[aspect], f"$[{position}].{aspect}")
                except ValidationFailed as error:
                    issues.extend(Issue(i.message, position, urn, aspect, i.path, found=i.found) for i in error.issues)
                    continue
                if version and spec.is_timeseries:
                    issues.append(
                        Issue(
                            "a timeseries aspect has no versions to ask for",
                            position,
                            urn,
                            aspect,
                            f"$[{position}].{aspect}.headers.If-Version-Match",
                            found=str(version),
                        )
                    )
                elif version:
                    versions[aspect] = version
            wanted.append((urn, aspects, versions))
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


def _queued_entities(outcome: Submission, with_system_metadata: bool, echo_limit: int | None) -> list[dict[str, Any]]:
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
    outcome: Submission,
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
