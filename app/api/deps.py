"""FastAPI dependencies, declared once as `Annotated` aliases: the request-owned session and the process's shared
services (built by app.main at start-up and kept on `app.state`, which only this module reads).

Every dependency is a flat `async def` of the request: FastAPI runs a plain `def` in its thread pool (a costly hop
per call), solves each dependency's own dependencies on every request even when the result is cached, and wraps each
`yield` dependency in context managers and a cancel scope (about 50 µs a request each). So the caller is
authenticated once per request and kept on its scope (`authenticate`), and what must be undone after the response
(the session, the write admission) is put on the request's exit stack (`_on_exit`), where FastAPI would put a `yield`
dependency's end."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from functools import partial
from typing import Annotated, Any, Generic, TypeVar, cast

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.api.http import read_json
from app.audit.model import attribute_request
from app.auth.model import Permission, Principal
from app.auth.privileges import MANAGE_ACCESS_TOKENS, MANAGE_INGESTION, MANAGE_POLICIES, MANAGE_SYSTEM_OPERATIONS
from app.auth.reads import scoped_backend
from app.auth.service import AuthService
from app.db import PooledConnection
from app.errors import ServiceUnavailable, TooManyRequests
from app.ingest.gateway import IngestGateway, caller_key
from app.ops import Operations
from app.ops.backpressure import CLIENT_ADDRESS
from app.ops.metrics import AUTH_FAILURES
from app.registry import EntityRegistry
from app.replicas import current_route, note_caller, read_after_primary, read_engine
from app.schema_registry import SchemaRegistryClient
from app.search.model import SearchBackend
from app.search.service import SearchRuntime, SearchUnavailable
from app.search.worker import wait_until_indexed
from app.settings import Settings
from app.write.reader import EntityReader

Body = TypeVar("Body", bound=BaseModel)
Parsed = TypeVar("Parsed")
_PRINCIPAL = "metaledger.principal"  # the scope key of the request's caller, once authenticated
_READ_CONNECTION = "metaledger.read_connection"  # the scope key of the answer's pure-read connection, once taken


def _on_exit(request: Request) -> AsyncExitStack:
    """The request's exit stack: FastAPI closes it after the response is sent, however the request ends, as it ends
    the `yield` dependencies it keeps there. FastAPI's own scope key: `fastapi_inner_astack`, and in the older
    releases pyproject still allows `fastapi_astack`."""
    scope = request.scope
    return scope["fastapi_inner_astack"] if "fastapi_inner_astack" in scope else scope["fastapi_astack"]


class LazySession:
    """The request's session, built at the first use of any of its attributes: a request that uses none (a write the
    combiner takes into a shared transaction of its own session, app.write.combiner) builds none (a session costs
    about 25 µs to build). Stands for the `AsyncSession` it builds, every attribute forwarded."""

    __slots__ = ("_sessionmaker", "_session")

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        self._sessionmaker = sessionmaker
        self._session: AsyncSession | None = None

    def __getattr__(self, name: str) -> Any:  # only for names that are not the wrapper's own
        if self._session is None:
            self._session = self._sessionmaker()
        return getattr(self._session, name)

    async def release(self) -> None:
        """Close the session if it ever took a connection (it takes one at its first statement only)."""
        if self._session is not None and self._session.in_transaction():
            await asyncio.shield(
                self._session.close()
            )  # as `async with session` does: a cancelled request still closes it


async def get_session(request: Request) -> AsyncSession:
    """A session on the primary: writes, their precondition reads, and what must see the latest state at once."""
    session = LazySession(request.app.state.sessionmaker)
    _on_exit(request).push_async_callback(session.release)
    return cast(AsyncSession, session)  # it stands for the AsyncSession it builds


async def get_read_session(request: Request) -> PooledConnection:
    """A pure read's connection: on the request's read replica (app.replicas: healthy, and past the position the
    caller must see), else on the primary (no replicas, none healthy, none caught up in time). Given back once the
    answer is sent, however the request ends (shielded, as a session's close: a cancelled request still gives it)."""
    # Once per answer, however many of its dependencies ask. Kept with the answer's exit stack: an answer whose replica
    # failed under it is made again from the primary (app.replicas), with a stack and a connection of its own.
    on_exit = _on_exit(request)
    taken = request.scope.get(_READ_CONNECTION)
    if taken is not None and taken[0] is on_exit:
        return taken[1]
    route = current_route()
    replica = await route.replica() if route is not None else None
    connection = PooledConnection(request.app.state.engine if replica is None else replica.engine)
    on_exit.push_async_exit(connection)  # its shielded close
    request.scope[_READ_CONNECTION] = (on_exit, connection)
    return connection


async def get_gateway(request: Request) -> IngestGateway:
    return request.app.state.gateway


async def get_registry(request: Request) -> EntityRegistry:
    return request.app.state.registry


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_engine(request: Request) -> AsyncEngine:
    return request.app.state.engine


async def get_read_engine(request: Request) -> AsyncEngine:
    """The engine of a pure read that takes connections itself (the change feed): the request's replica's, else the
    primary's."""
    return await read_engine(request.app.state.engine)


async def get_schema_registry(request: Request) -> SchemaRegistryClient | None:
    return getattr(request.app.state, "schema_registry", None)


async def get_search_runtime(request: Request) -> SearchRuntime | None:
    return getattr(request.app.state, "search", None)


async def get_backend(request: Request) -> SearchBackend:
    """The started search backend as the caller may search it (app.auth.reads: the read rule is part of every query);
    503 when there is none or it cannot be reached now."""
    return await scoped_search_backend(request, await authenticate(request))


async def scoped_search_backend(request: Request, principal: Principal) -> SearchBackend:
    """The started search backend as `principal` may search it (the web view's signed-in person, or the bearer
    caller); 503 when there is none or it cannot be reached now."""
    runtime: SearchRuntime | None = getattr(request.app.state, "search", None)
    if runtime is None:
        raise ServiceUnavailable("no search backend in this process")
    try:
        backend = await runtime.ready_backend()
    except SearchUnavailable as error:
        raise ServiceUnavailable(f"the search backend is unavailable: {error}") from None
    return scoped_backend(backend, principal)


async def _already_current() -> bool:
    return False


async def get_index_wait(request: Request) -> Callable[[], Awaitable[bool]]:
    """Wait (bounded) until the embedded indexer has applied every change log committed so far; a no-op where there
    is no embedded indexer (Kafka configured: the Spark job indexes) or no search backend. (Not the replicas' wait for
    a caller's writes: app.replicas.)"""
    state = request.app.state
    if state.settings.kafka_bootstrap_servers or getattr(state, "search", None) is None:
        return _already_current
    if current_route() is None:
        return partial(wait_until_indexed, state.sessionmaker)
    return partial(_indexed_then_replayed, state.sessionmaker)


async def _indexed_then_replayed(sessionmaker: async_sessionmaker[AsyncSession]) -> bool:
    """The index wait, then the request's reads see at least the primary's position once it is over: a replica
    serves them only once it has replayed what the indexer wrote."""
    caught_up = await wait_until_indexed(sessionmaker)
    await read_after_primary()
    return caught_up


async def get_operations(request: Request) -> Operations:
    return request.app.state.ops


async def get_auth(request: Request) -> AuthService:
    return request.app.state.auth


async def authenticate(request: Request) -> Principal:
    """The caller, from the request's credentials: once per request, however many of its dependencies ask."""
    principal = request.scope.get(_PRINCIPAL)
    if principal is None:
        principal = request.scope[_PRINCIPAL] = await request.app.state.auth.authenticate(request.headers)
        # the token and surface its audit entries name (from the path, not `request.url`: building and parsing the
        # whole URL was a tenth of a v3 GET's dependencies)
        attribute_request(principal.token_id, request.scope["path"])
        note_caller(principal.token_id or (request.client.host if request.client else None))  # whose writes it reads
        if request.client is not None:  # whose share of the write admission a caller without a token is charged
            CLIENT_ADDRESS.set(request.client.host)
    return principal


class Allow:
    """A route's policy: the permission it needs. Every route declares exactly one (tests/integration/test_auth.py
    walks the app's routes and fails on a route without one), as a router or route dependency, or as the parameter
    that is its caller or what it guards (`Reader`, `Writer`, `StoredEntities`)."""

    def __init__(self, permission: Permission) -> None:
        self.permission = permission

    async def __call__(self, request: Request) -> Principal:
        principal = await authenticate(request)
        if not principal.allows(self.permission):
            AUTH_FAILURES.labels(reason="forbidden").inc()
            principal.require(self.permission)
        return principal


class AllowPrivilege(Allow):
    """A platform route's policy: DataHub's privilege for it, decided as every privilege is (app.auth.decision): the
    admin role holds it, and an ACTIVE PLATFORM access policy may grant it to anyone else. `permission` (ADMIN) is
    what the roles alone require, as the route walk checks it."""

    def __init__(self, privilege: str) -> None:
        super().__init__(Permission.ADMIN)
        self.privilege = privilege

    async def __call__(self, request: Request) -> Principal:
        principal = await authenticate(request)
        await request.app.state.auth.require(principal, self.privilege)
        return principal


async def _admit(request: Request, principal: Principal, stack: AsyncExitStack) -> None:
    """The write admission (app.ops.backpressure) of a request whose body is not read yet, on its Content-Length,
    held until `stack` closes: a write refused with 429 costs its bytes' arrival (received and dropped, see
    `_discard_body`), never their parsing."""
    admission = request.app.state.gateway.admission
    if admission is None:
        return
    body_bytes = int(request.headers.get("content-length") or 0)  # the HTTP server checked it is a number
    try:
        await stack.enter_async_context(admission.admit_before_body(caller_key(principal), body_bytes))
    except TooManyRequests:
        await _discard_body(request)
        raise


async def admit_before_body(request: Request) -> None:
    """The write admission of a route whose policy is not `AllowWrite` (the Rest.li actions, most of which are
    writes: app.api.restli.common.ActionBody), taken as `AllowWrite` takes it: before the body is read, held until
    the response is sent."""
    await _admit(request, await authenticate(request), _on_exit(request))


async def _discard_body(request: Request) -> None:
    """Receive (and drop, unparsed) what the client sends of a body refused before it was read, up to the body
    limit: the 429 then comes after the whole request, as every HTTP client expects, on a connection still usable."""
    limit, received = request.app.state.settings.max_request_bytes, 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            break


class AllowWrite(Allow):
    """The write routes' policy: WRITE (a writer, or a reader an access policy grants an edit: each write is then
    decided by the ingest gateway), then the write's admission, taken before the route reads the body and held until
    the response is sent."""

    def __init__(self) -> None:
        super().__init__(Permission.WRITE)

    async def __call__(self, request: Request) -> Principal:
        principal = await authenticate(request)
        await request.app.state.auth.require_write_access(principal)
        await _admit(request, principal, _on_exit(request))
        return principal


class DeclaredBody(ABC, Generic[Parsed]):
    """A route's JSON body, declared once: the dependency that reads it and parses it into what the handler needs,
    and the schema app.main documents it by (the operation's `requestBody`). Used as
    `body: Annotated[Parsed, Depends(SomeBody(...))]`, after the route's policy in the handler's signature.

    A dependency, never a body FastAPI parses itself: FastAPI reads and parses such a body before it solves any
    dependency, the route's policy included, with no bound on its size or nesting (an anonymous 42 MB body took a
    worker from 193 MB to 1.27 GB before its 401), and documents only such bodies. As a dependency it comes after the
    route's policy, and is read by `read_json` (415, 413 past MAX_REQUEST_BYTES, 400 past MAX_JSON_DEPTH); each kind
    says what its body must be (`request_body_schema`) and makes it what its handler needs (`parse`: a model, the
    write's drafts, ...), raising the 400 or 413 of what does not fit."""

    @abstractmethod
    def request_body_schema(self) -> dict[str, Any]:
        """The body's schema in the OpenAPI document: a `$ref` to a component, or the schema itself."""

    @abstractmethod
    async def parse(self, document: Any, request: Request) -> Parsed:
        """What the handler takes, from the body `read_json` read."""

    async def __call__(self, request: Request) -> Parsed:
        return await self.parse(await read_json(request, request.app.state.settings), request)


class JsonBody(DeclaredBody[Body]):
    """A body modelled by pydantic: `body: Annotated[Model, Depends(JsonBody(Model))]`. The model validates it and
    is its schema, a component of the document (app.main). What does not fit the model is answered as the
    framework's own validation errors are (app.main): a 400 naming each place, `$.a[0].b`."""

    def __init__(self, model: type[Body]) -> None:
        self.model = model

    def request_body_schema(self) -> dict[str, Any]:
        return {"$ref": f"#/components/schemas/{self.model.__name__}"}

    async def parse(self, document: Any, request: Request) -> Body:
        try:
            return self.model.model_validate(document)
        except ValidationError as error:
            issues = [{**e, "loc": ("body", *e["loc"])} for e in error.errors(include_url=False)]
            raise RequestValidationError(issues) from None


async def public() -> None:
    """The policy of the routes everyone may call (/health, /config, /ready)."""


public.permission = Permission.PUBLIC  # type: ignore[attr-defined]


class AllowRegistryRead(Allow):
    """Schema registry reads: open when METALEDGER_SCHEMA_REGISTRY_OPEN_READ (DataHub leaves the registry open)."""

    def __init__(self) -> None:
        super().__init__(Permission.READ)

    async def __call__(self, request: Request) -> Principal | None:  # type: ignore[override]
        if request.app.state.settings.schema_registry_open_read and "authorization" not in request.headers:
            return None
        principal = await authenticate(request)
        principal.require(self.permission)
        return principal


Session = Annotated[AsyncSession, Depends(get_session)]
ReadSession = Annotated[PooledConnection, Depends(get_read_session)]  # pure reads: a replica's when there is one
Gateway = Annotated[IngestGateway, Depends(get_gateway)]
Registry = Annotated[EntityRegistry, Depends(get_registry)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Engine = Annotated[AsyncEngine, Depends(get_engine)]
ReadEngine = Annotated[AsyncEngine, Depends(get_read_engine)]
Search = Annotated[SearchRuntime | None, Depends(get_search_runtime)]
SchemaRegistry = Annotated[SchemaRegistryClient | None, Depends(get_schema_registry)]
Backend = Annotated[SearchBackend, Depends(get_backend)]
Auth = Annotated[AuthService, Depends(get_auth)]
Ops = Annotated[Operations, Depends(get_operations)]
Caller = Annotated[Principal, Depends(authenticate)]  # with a route policy in front of it
# Route policies, as route or router dependencies; an endpoint that needs the caller takes `Caller` as well, or its
# policy as a parameter that is the caller (`Reader`, `Writer`: one dependency to solve, not two).
ALLOW_PUBLIC = Depends(public)
ALLOW_READ = Depends(Allow(Permission.READ))
ALLOW_WRITE = Depends(AllowWrite())
ALLOW_ADMIN = Depends(Allow(Permission.ADMIN))  # metaledger's own configuration: models, processors, the registry's
ALLOW_MANAGE_TOKENS = Depends(AllowPrivilege(MANAGE_ACCESS_TOKENS))
ALLOW_MANAGE_POLICIES = Depends(AllowPrivilege(MANAGE_POLICIES))
ALLOW_MANAGE_INGESTION = Depends(AllowPrivilege(MANAGE_INGESTION))
ALLOW_SYSTEM_OPERATIONS = Depends(AllowPrivilege(MANAGE_SYSTEM_OPERATIONS))
ALLOW_REGISTRY_READ = Depends(AllowRegistryRead())
Reader = Annotated[Principal, ALLOW_READ]
Writer = Annotated[Principal, ALLOW_WRITE]
RegistryCaller = Annotated[Principal | None, ALLOW_REGISTRY_READ]  # None: an open read without credentials
WaitForIndex = Annotated[Callable[[], Awaitable[bool]], Depends(get_index_wait)]


class AllowReadEntities(Allow):
    """The READ policy and the aspect store it guards, in one dependency: the store as the caller may read it (its
    read rule), on the request's read connection (a replica's when there is one). FastAPI solves each of a route's
    dependencies on every request (40-60 µs of CPU each) and the entity GETs are the hottest reads: a route that takes
    `StoredEntities` declares no other policy."""

    def __init__(self) -> None:
        super().__init__(Permission.READ)

    async def __call__(self, request: Request) -> EntityReader:  # type: ignore[override]
        principal = await super().__call__(request)  # refused before a connection is taken
        return EntityReader(await get_read_session(request), request.app.state.registry, principal)


StoredEntities = Annotated[EntityReader, Depends(AllowReadEntities())]  # the route's READ policy too


async def get_primary_entity_reader(session: Session, registry: Registry, caller: Caller) -> EntityReader:
    """The aspect store as the caller may read it, on the primary: what a write reads before it writes (what exists
    to delete) must be the latest state, never a replica's."""
    return EntityReader(session, registry, caller)


PrimaryEntities = Annotated[EntityReader, Depends(get_primary_entity_reader)]  # with a route policy in front of it
