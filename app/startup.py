"""What a process of the service sets up before its work, apart from the HTTP application (app.main): the database
(started and migrated), the entity registry and the write pipeline of a configuration. The supervisor of
`metaledger serve --workers N`, its background process and the CLI's commands take them from here without importing
the application's routes (FastAPI and every protocol module: seconds of a process's start)."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING

from app.auth.model import Role
from app.auth.service import AuthService
from app.db import create_engine, upgrade_database
from app.registry import EntityRegistry, load_registry
from app.settings import Settings
from app.write.proposal import DEFAULT_ACTOR, SYSTEM_ACTOR

if TYPE_CHECKING:
    from app.embedded_pg import EmbeddedPostgres
    from app.write.service import WriteService

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


def start_and_migrate(settings: Settings) -> tuple[str, EmbeddedPostgres | None]:
    """`start_database`, then the pending migrations unless turned off."""
    url, embedded = start_database(settings)
    if settings.apply_migrations_on_start:
        upgrade_database(url)
    return url, embedded


def prepare_database(settings: Settings) -> tuple[str, EmbeddedPostgres | None]:
    """What a supervisor of several processes does once before starting them (app.supervisor): the database started
    and migrated, and on the first start the admin token created and printed."""
    url, embedded = start_and_migrate(settings)

    async def announce() -> None:
        engine = create_engine(url, 1)
        try:
            await announce_auth(settings, AuthService(settings, engine, load_registry(settings.registry_path)))
        finally:
            await engine.dispose()

    asyncio.run(announce())
    return url, embedded


async def announce_auth(settings: Settings, auth: AuthService) -> None:
    """On the first start, create the admin token and print it once (only its hash is kept)."""
    if not settings.auth_enabled:
        log.warning("AUTHENTICATION IS OFF (METALEDGER_AUTH_ENABLED=false): anyone who reaches this port is an admin")
        return
    await auth.key()  # loaded (or created) now: verifying a token then needs no database round trip for it
    if not settings.auth_bootstrap_admin_token:
        return
    issued = await auth.create_token(
        DEFAULT_ACTOR,
        Role.ADMIN,
        ttl="never",
        description="the first-start admin token",
        created_by=SYSTEM_ACTOR,
        bootstrap=True,
    )
    if issued is None:
        return
    token = issued[0]
    print(
        "\nmetaledger created its first admin token (shown this once; only its hash is stored):\n\n"
        f"    {token}\n\n"
        "Use it with the datahub client:  DATAHUB_GMS_TOKEN=<token> datahub ...\n"
        "or over HTTP:                    curl -H 'Authorization: Bearer <token>' ...\n"
        "More tokens:  metaledger token create --actor urn:li:corpuser:alice --role writer\n",
        file=sys.stderr,
        flush=True,
    )


def load_registry_of(settings: Settings) -> EntityRegistry:
    """The entity registry of this configuration."""
    return load_registry(
        settings.registry_path,
        trim_unknown_fields=settings.trim_unknown_fields,
        strict_urns=settings.strict_urn_validation,
    )


def build_write_service(settings: Settings, registry: EntityRegistry | None = None) -> WriteService:
    """The write pipeline of this configuration: the registry (loaded unless given) and the plugins' rule chain."""
    # imported by the processes that write, not by a supervisor, which has no use for them
    from app.write.plugins import load_pipeline, load_rule_chain
    from app.write.service import WriteService

    registry = registry or load_registry_of(settings)
    return WriteService(
        registry, load_rule_chain(settings.registry_path), settings, load_pipeline(settings.registry_path)
    )
