"""The FastAPI application: `uvicorn app.main:app` or `metaledger serve`."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi

from app import __version__
from app.background import Background
from app.db import create_engine, create_sessionmaker, upgrade_database
from app.entities.endpoints import router as entities_router
from app.events.feed import router as feed_router
from app.errors import Issue, MetaledgerError, ServiceUnavailable, ValidationFailed
from app.http import json_response
from app.logs import configure_logging
from app.proposals.endpoints import router as proposals_router
from app.restli import router as restli_router
from app.search.endpoints import router as search_router
from app.search.service import SearchRuntime
from app.registry import EntityRegistry, load_registry
from app.registry.errors import RegistryError
from app.settings import Settings, get_settings
from app.system.endpoints import router as system_router
from app.write.plugins import load_rule_chain
from app.write.service import WriteService

if TYPE_CHECKING:
    from app.embedded_pg import EmbeddedPostgres

log = logging.getLogger("metaledger")


def resolve_database_url(settings: Settings) -> str:
    """The configured database, or the embedded default: a private Postgres under the data directory."""
    return start_database(settings)[0]


def start_database(settings: Settings) -> tuple[str, EmbeddedPostgres | None]:
    """(URL, the embedded server if this call started it, so the caller stops it on shutdown)."""
    if settings.database_url:
        return settings.database_url, None
    from app.embedded_pg import EmbeddedPostgres

    pg = EmbeddedPostgres(settings.data_dir / "pg", settings.embedded_pg_port, durable=True)
    already_running = pg.is_running()
    url = pg.start()
    return url, None if already_running else pg


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    url, embedded = await asyncio.to_thread(start_database, settings)
    if settings.apply_migrations_on_start:
        await asyncio.to_thread(upgrade_database, url)
    engine = create_engine(url, settings.db_pool_size)
    app.state.engine = engine
    app.state.sessionmaker = create_sessionmaker(engine)
    # The registry and compiled validators live for the whole process: move them out of the collector's way, and
    # collect the young generation less often (a batch allocates thousands of short-lived dicts).
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    app.state.search = SearchRuntime.create(settings, app.state.registry, engine)
    await app.state.search.start(force=True)  # a search server that is down does not stop the service
    background = Background()
    await background.start(app)
    log.info("metaledger started", extra={"database": engine.url.render_as_string(hide_password=True)})
    try:
        yield
    finally:
        await background.close()
        await app.state.search.close()
        await engine.dispose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(MetaledgerError)
    async def metaledger_error(request: Request, error: MetaledgerError):
        return json_response(error.to_json(), error.status_code)

    @app.exception_handler(RegistryError)
    async def registry_error(request: Request, error: RegistryError):
        return json_response(ValidationFailed(str(error), [Issue(str(error))]).to_json(), 400)

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(request: Request, error: RequestValidationError):
        issues = [
            Issue(e["msg"], path="$." + ".".join(str(p) for p in e["loc"]), found=repr(e.get("input"))[:200])
            for e in error.errors()
        ]
        return json_response(ValidationFailed("the request is malformed", issues).to_json(), 400)

    @app.exception_handler(OSError)
    async def database_unreachable(request: Request, error: OSError):
        log.error("database unreachable", extra={"path": request.url.path, "error": str(error)})
        return json_response(ServiceUnavailable(f"the database is unreachable: {error}").to_json(), 503)


def create_app(settings: Settings | None = None, registry: EntityRegistry | None = None) -> FastAPI:
    settings = settings or get_settings()
    configure_logging()
    registry = registry or load_registry(
        settings.registry_path, trim_unknown_fields=settings.trim_unknown_fields, strict_urns=settings.strict_urn_validation
    )
    app = FastAPI(
        title="metaledger",
        version=__version__,
        description="A metadata change service that speaks DataHub's event model.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.registry = registry
    app.state.write_service = WriteService(registry, load_rule_chain(settings.registry_path), settings)
    app.include_router(system_router)
    app.include_router(proposals_router)
    app.include_router(entities_router)
    app.include_router(feed_router)
    app.include_router(restli_router)
    app.include_router(search_router)  # after entities_router: GET /openapi/v3/entity/{entityName} (search)
    _install_error_handlers(app)
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]
    return app


def build_openapi(app: FastAPI) -> dict:
    if app.openapi_schema is None:
        from app.openapi_spec import add_registry_paths

        spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        app.openapi_schema = add_registry_paths(spec, app.state.registry)
    return app.openapi_schema


def __getattr__(name: str):
    # `uvicorn app.main:app` builds the app on first access, so importing this module stays cheap.
    if name == "app":
        globals()["app"] = create_app()
        return globals()["app"]
    raise AttributeError(name)
