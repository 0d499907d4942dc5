"""The FastAPI application: `uvicorn app.main:app` or `metaledger serve`."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

import asyncpg
from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.routing import iter_route_contexts
from pydantic import BaseModel
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import BaseRoute

from app import __version__, web
from app.api import documented_models, route_index, routers
from app.api.deps import ALLOW_PUBLIC, ALLOW_READ, DeclaredBody, JsonBody
from app.api.entities import EntityRoutes, entity_routes, expanded
from app.api.http import json_response, parameter_path
from app.api.trace_write import TraceparentMiddleware
from app.api.urn_paths import EncodedSlashMiddleware
from app.auth.service import AuthService
from app.avro.wire import ValueCodec
from app.background import Background
from app.db import create_engine, create_sessionmaker
from app.db_faults import DatabaseFault, classify, database_unavailable
from app.errors import Issue, MetaledgerError, ValidationFailed
from app.ingest.gateway import IngestGateway
from app.kafka.per_aspect import resolve_routes
from app.kafka.producer import ProposalProducer
from app.logs import configure_logging
from app.mcp import server as mcp_server
from app.modelset.watcher import ModelWatcher
from app.ops import Operations
from app.ops.drain import Drain, DrainMiddleware
from app.ops.middleware import OperationsMiddleware
from app.read_deadline import ReadDeadlineMiddleware
from app.registry import EntityRegistry
from app.registry.errors import RegistryError
from app.replicas import WRITTEN_AT_HEADER, ReplicaPool, ReplicaRoutingMiddleware, note_fault
from app.schema_registry import make_registry_client
from app.search.service import SearchRuntime
from app.settings import Settings, get_settings
from app.startup import announce_auth, build_write_service, start_and_migrate
from app.telemetry import ensure_client_id
from app.workers import follow_supervisor
from app.write.combiner import WriteCombiner

log = logging.getLogger("metaledger")
OPENAPI_URL = "/openapi.json"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    _build_routes(app)
    url, embedded = await asyncio.to_thread(start_and_migrate, settings)
    engine = create_engine(url, settings.db_pool_size, settings.db_pool_timeout_s)
    app.state.engine = engine
    app.state.sessionmaker = create_sessionmaker(engine)
    # The read replicas (METALEDGER_READ_DATABASE_URLS), checked once before the first request, then every second.
    app.state.replicas = replicas = ReplicaPool.from_settings(settings, engine)
    if replicas is not None:
        await replicas.start()
    app.state.schema_registry = make_registry_client(settings, engine)
    # The models registered at run time, taken up before the first request; then followed by this process's
    # background work, or by a watcher of its own in an API process of `serve --workers N`.
    stop_following = app.state.registry.on_change(lambda registry: follow_registry(app, registry))
    watcher = ModelWatcher(settings, app.state.sessionmaker, app.state.registry)
    await watcher.refresh()
    model_stop = asyncio.Event()
    model_watch = None if settings.background_in_process else asyncio.create_task(watcher.run(model_stop))
    # One codec per process: the relay, the proposal producer and the consumers encode and decode Kafka values with it
    # (writer schemas fetched by id from the registry are cached in it).
    app.state.value_codec = codec = ValueCodec(settings, app.state.schema_registry)
    # The registry and compiled validators live for the whole process: move them out of the collector's way, and
    # collect the young generation less often (a batch allocates thousands of short-lived dicts).
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    app.state.search = search = SearchRuntime.create(settings, app.state.registry, engine)
    await search.start(force=True)  # a search server that is down does not stop the service
    # Asynchronous writes go to the MCP topic when Kafka is configured (a broker that is down does not stop the
    # service either: the first queued write connects, or answers 503).
    producer = ProposalProducer(settings, codec) if settings.kafka_bootstrap_servers else None
    if producer is not None:
        await producer.start()
    app.state.proposal_producer = producer
    app.state.auth = auth = AuthService(settings, engine, app.state.registry)
    await announce_auth(settings, auth)
    app.state.ops = ops = Operations(settings, engine, app.state.registry, app.state.schema_registry, replicas)
    combiner = None
    if settings.write_combining:
        combiner = WriteCombiner(
            app.state.write_service,
            app.state.sessionmaker,
            flushers=settings.write_group_transactions,
            max_group_proposals=settings.write_group_max_proposals,
            contended=ops.admission.contended,
        )
    app.state.gateway = IngestGateway(
        app.state.write_service,
        search,
        producer,
        auth,
        admission=ops.admission,
        combiner=combiner,
    )
    if settings.telemetry_client_id:
        await ensure_client_id(app.state.write_service, app.state.sessionmaker)
    background = Background()
    if settings.background_in_process:  # else a process of its own runs them (`serve --workers N`, app.supervisor)
        await background.start(settings, engine, app.state.sessionmaker, app.state.gateway, search, codec)
    await ops.start(background)  # the outbox sampler (backpressure, /metrics) and /ready
    app.state.drain.take_over_sigterm(ops.readiness)  # SIGTERM drains, then stops (app.ops.drain)
    # A worker of `serve --workers N` stops (as on SIGTERM: uvicorn's graceful shutdown) if its supervisor is killed.
    orphan_watch = asyncio.create_task(follow_supervisor(lambda: os.kill(os.getpid(), signal.SIGTERM)))
    log.info("metaledger started", extra={"database": engine.url.render_as_string(hide_password=True)})
    try:
        yield
    finally:
        await app.state.mcp.stop()  # the MCP endpoint's task group (app.mcp.server), started by its first call
        orphan_watch.cancel()
        model_stop.set()
        if model_watch is not None:
            await model_watch
        stop_following()
        app.state.drain.close()
        await ops.close()
        await background.close()
        if producer is not None:
            await producer.stop()
        await search.close()
        await app.state.schema_registry.aclose()
        if replicas is not None:
            await replicas.close()
        await engine.dispose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)


def _build_routes(app: FastAPI) -> None:
    """FastAPI (0.160+) builds an included router's routes on the first request that reaches them, which the first
    caller of a process would wait for. Built at start-up instead."""
    for route in app.router.routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is not None:
            for _ in contexts():
                pass


def follow_registry(app: FastAPI, registry: EntityRegistry) -> None:
    """After the registry took up a runtime model set: the v3 routes of entity types added (removed), and the OpenAPI
    document made again on its next request."""
    served = {r.spec.name for r in app.router.routes if isinstance(r, EntityRoutes)}
    gone = served - registry.entities.keys()
    if gone:
        app.router.routes[:] = [
            r for r in app.router.routes if not (isinstance(r, EntityRoutes) and r.spec.name in gone)
        ]
    for name in sorted(registry.entities.keys() - served):
        app.router.routes.append(EntityRoutes(registry.entities[name]))
    app.openapi_schema = None


def _declare_json_bodies(spec: dict[str, Any], routes: list[BaseRoute]) -> list[type[BaseModel]]:
    """Each operation whose body a `DeclaredBody` dependency reads gets that body's schema as its request body
    (FastAPI documents only the bodies it parses itself, which are read before the route's policy: app.api.deps).
    Returns the models of the `JsonBody` ones, for the document's components."""
    models: list[type[BaseModel]] = []
    for context in iter_route_contexts(expanded(routes)):
        dependant = getattr(context, "dependant", None)
        bodies = [d.call for d in _dependencies(dependant) if isinstance(d.call, DeclaredBody)] if dependant else []
        if not bodies or not context.include_in_schema:
            continue
        body = bodies[0]
        for method in context.methods or ():
            spec["paths"][context.path_format][method.lower()]["requestBody"] = {
                "content": {"application/json": {"schema": body.request_body_schema()}},
                "required": True,
            }
        if isinstance(body, JsonBody):
            models.append(body.model)
    return models


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    for dependency in dependant.dependencies:
        yield dependency
        yield from _dependencies(dependency)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(MetaledgerError)
    async def metaledger_error(request: Request, error: MetaledgerError):
        return json_response(error.to_json(), error.status_code, error.headers())

    @app.exception_handler(RegistryError)
    async def registry_error(request: Request, error: RegistryError):
        return json_response(ValidationFailed(str(error), [Issue(str(error))]).to_json(), 400)

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(request: Request, error: RequestValidationError):
        issues = [
            Issue(e["msg"], path=parameter_path(e["loc"]), found=repr(e.get("input"))[:200]) for e in error.errors()
        ]
        return json_response(ValidationFailed("the request is malformed", issues).to_json(), 400)

    @app.exception_handler(SQLAlchemyError)
    @app.exception_handler(asyncpg.PostgresError)
    @app.exception_handler(asyncpg.InterfaceError)
    @app.exception_handler(OSError)
    async def database_error(request: Request, error: Exception):
        # Wherever it was raised (pool checkout, a statement, COMMIT) and however it was wrapped: a fault of the
        # database is a 503 with Retry-After, text Postgres cannot hold (a NUL that a check upstream let through) a
        # 400; anything else stays what it is (a bug: the 500 of app.ops.middleware).
        fault = classify(error)
        if fault is DatabaseFault.NUL_TEXT:
            log.warning("text Postgres cannot hold", extra={"path": request.url.path, "error": str(error)[:300]})
            invalid = ValidationFailed(
                "the request contains a NUL character (\\u0000), which cannot be stored or searched",
                [Issue("NUL character", expected="text without \\u0000")],
            )
            return json_response(invalid.to_json(), 400)
        if fault is DatabaseFault.UNAVAILABLE:
            note_fault()  # a read on a replica is answered again from the primary (app.replicas)
            log.warning(
                "database unavailable",
                extra={"path": request.url.path, "error": f"{type(error).__name__}: {error}"[:300]},
            )
            unavailable = database_unavailable(error)
            return json_response(unavailable.to_json(), unavailable.status_code, unavailable.headers())
        raise error

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        # FastAPI's and Starlette's own answers (an unknown path, a method not served, a body pydantic cannot parse)
        # in the same error body as every other (the declared ErrorResponse), with their headers (Allow on a 405).
        unknown_entity = _unknown_entity_type(request) if error.status_code in (404, 405) else None
        if unknown_entity is not None:
            return json_response(
                ValidationFailed(unknown_entity, [Issue(unknown_entity, path="$entityName")]).to_json(), 400
            )
        body = {"error": HTTPStatus(error.status_code).phrase, "message": str(error.detail), "issues": []}
        return json_response(body, error.status_code, dict(error.headers or {}))


def _unknown_entity_type(request: Request) -> str | None:
    """The v3 entity routes exist per entity type: a path under them that no route matched names an entity type the
    registry does not have, which is a 400 naming it (as for every unknown name in a request), not a bare 404/405."""
    from app.openapi_spec import API_PREFIX

    path = request.url.path
    if not path.startswith(API_PREFIX + "/"):
        return None
    name = path[len(API_PREFIX) + 1 :].split("/", 1)[0]
    try:
        request.app.state.registry.entity(name)
    except RegistryError as error:
        return str(error)
    return None


def _install_offline_docs(app: FastAPI, settings: Settings) -> None:
    """/openapi.json, /docs (Swagger UI) and /redoc, with the assets of the installed `fastapi-offline` package (no CDN
    needed). They need a reader token unless METALEDGER_AUTH_PUBLIC_DOCS (the static assets are public code)."""
    from pathlib import Path

    import fastapi_offline
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    static = "/docs/static"
    app.mount(static, StaticFiles(directory=Path(fastapi_offline.__file__).parent / "static"), name="docs-static")
    policy = [ALLOW_PUBLIC if settings.auth_public_docs else ALLOW_READ]

    @app.get(OPENAPI_URL, include_in_schema=False, dependencies=policy)
    async def openapi_document():
        return json_response(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=policy)
    async def swagger_ui():
        return get_swagger_ui_html(
            openapi_url=OPENAPI_URL,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{static}/swagger-ui-bundle.js",
            swagger_css_url=f"{static}/swagger-ui.css",
            swagger_favicon_url=f"{static}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False, dependencies=policy)
    async def redoc():
        return get_redoc_html(
            openapi_url=OPENAPI_URL,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{static}/redoc.standalone.js",
            redoc_favicon_url=f"{static}/favicon.png",
            with_google_fonts=False,
        )


def create_app(settings: Settings | None = None, registry: EntityRegistry | None = None) -> FastAPI:
    settings = settings or get_settings()
    configure_logging()
    write_service = build_write_service(settings, registry)
    resolve_routes(settings, write_service.registry)  # a bad METALEDGER_EVENTS_V5_ROUTES stops the start, named
    app = FastAPI(
        title="metaledger",
        version=__version__,
        description="A metadata change service that speaks DataHub's event model.",
        lifespan=lifespan,
        docs_url=None,  # served by _install_offline_docs, from local assets, behind the route policy
        redoc_url=None,
        openapi_url=None,
    )
    app.state.settings = settings
    app.state.registry = write_service.registry
    app.state.write_service = write_service
    app.state.drain = Drain(settings)
    route_index.include_once(app, routers)
    app.router.routes.extend(entity_routes(app.state.registry))  # each entity type's made on first use
    mcp_server.install(app)  # POST /mcp, metaledger's MCP endpoint
    web.install(app)  # the web view: pages at DataHub's frontend paths, its sign-in sessions and assets
    route_index.install(app.router)  # the routes along a request's path asked, not all (app.api.route_index)
    _install_error_handlers(app)
    _install_offline_docs(app, settings)
    if settings.cors_origins:
        # Off by default (no CORS headers: browsers refuse cross-origin calls); on for the listed origins only. No
        # cookies are involved (bearer tokens), so no credentials mode.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["X-Request-Id", "Retry-After", "traceparent", "X-Metaledger-Partial", WRITTEN_AT_HEADER],
            allow_credentials=False,
            max_age=600,
        )
    # Inside the read budget: a read's wait for its replica, and its answer again from the primary, spend it.
    app.add_middleware(ReplicaRoutingMiddleware)
    app.add_middleware(ReadDeadlineMiddleware, read_timeout_s=settings.read_timeout_s)  # each request's read budget
    app.add_middleware(EncodedSlashMiddleware)  # an s3 URN's `%2F` stays in its path segment (app.api.urn_paths)
    app.add_middleware(DrainMiddleware, drain=app.state.drain)
    app.add_middleware(TraceparentMiddleware)  # every response's traceparent; the writes keep its trace id
    # Request ids, per-route metrics and the access log, around everything but Starlette's last-resort error handler.
    app.add_middleware(OperationsMiddleware, metrics=settings.http_metrics_enabled, access_log=settings.access_log)
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]
    return app


def build_openapi(app: FastAPI) -> dict:
    """The OpenAPI document: FastAPI's, from the routes' declarations, with the registry's components they
    reference (app.openapi_spec) and the statuses every operation can answer."""
    if app.openapi_schema is None:
        from app.openapi_spec import add_registry_components, declare_statuses, entity_tags

        spec = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=expanded(app.routes),
            tags=entity_tags(app.state.registry),
        )
        # Every operation but the open ones takes DataHub's bearer token (or the system client's Basic credentials).
        spec.setdefault("components", {})["securitySchemes"] = {
            "bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
        }
        spec["security"] = [{"bearerAuth": []}]
        schemas = spec["components"].setdefault("schemas", {})
        models: list[type[BaseModel]] = [*documented_models, *_declare_json_bodies(spec, app.routes)]
        for model in models:  # documented by reference
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        app.openapi_schema = declare_statuses(add_registry_components(spec, app.state.registry))
    return app.openapi_schema


def __getattr__(name: str):
    # `uvicorn app.main:app` builds the app on first access, so importing this module stays cheap.
    if name == "app":
        globals()["app"] = create_app()
        return globals()["app"]
    raise AttributeError(name)
