"""The `metaledger` command."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import orjson

from app.settings import PROJECT_ROOT, get_settings

OPENAPI_PATH = PROJECT_ROOT / "openapi" / "openapi.json"


@click.group()
def main() -> None:
    """metaledger: a metadata change service that speaks DataHub's event model."""


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--no-migrate", is_flag=True, help="Do not apply pending migrations at start.")
@click.option("--log-level", default="info", show_default=True)
def serve(host: str, port: int, no_migrate: bool, log_level: str) -> None:
    """Run the service. Without METALEDGER_DATABASE_URL it starts its own Postgres under METALEDGER_DATA_DIR."""
    import uvicorn

    from app.main import create_app

    settings = get_settings()
    if no_migrate:
        settings.apply_migrations_on_start = False
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, access_log=False)


def _run_worker(make_worker) -> None:
    """Run one background worker standalone until SIGINT/SIGTERM."""
    import asyncio
    import signal

    from app.db import create_engine, create_sessionmaker
    from app.logs import configure_logging
    from app.main import resolve_database_url

    from app.avro.wire import ValueCodec
    from app.schema_registry import make_registry_client

    async def run() -> None:
        configure_logging()
        settings = get_settings()
        engine = create_engine(resolve_database_url(settings), settings.db_pool_size)
        registry = make_registry_client(settings, engine)
        codec = ValueCodec(settings, registry)  # one per process: Kafka values encoded and decoded with it
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await make_worker(settings, engine, create_sessionmaker(engine), codec).run(stop)
        finally:
            await registry.aclose()
            await engine.dispose()

    asyncio.run(run())


@main.command()
def relay() -> None:
    """Run the outbox relay standalone (several may run at once)."""
    from app.kafka.relay import OutboxRelay

    _run_worker(lambda settings, engine, maker, codec: OutboxRelay(settings, engine, codec))


def _gateway(settings):
    """The ingest gateway of a standalone consumer: it applies (never queues) and leaves indexing to the indexer."""
    from app.ingest.gateway import IngestGateway
    from app.main import build_write_service

    return IngestGateway(build_write_service(settings))


@main.command("consume-mcp")
def consume_mcp() -> None:
    """Apply proposals from the MetadataChangeProposal_v1 topic; failures go to FailedMetadataChangeProposal_v1."""
    from app.kafka.consumers import McpConsumer

    _run_worker(lambda settings, engine, maker, codec: McpConsumer(settings, maker, _gateway(settings), codec=codec))


@main.command("consume-mce")
def consume_mce() -> None:
    """Apply legacy MetadataChangeEvents from MetadataChangeEvent_v4; failures go to FailedMetadataChangeEvent_v4."""
    from app.kafka.consumers import MceConsumer

    _run_worker(lambda settings, engine, maker, codec: MceConsumer(settings, maker, _gateway(settings), codec=codec))


@main.group()
def db() -> None:
    """Database commands."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Apply pending migrations (to the embedded database when METALEDGER_DATABASE_URL is unset)."""
    from app.db import upgrade_database
    from app.main import resolve_database_url

    url = resolve_database_url(get_settings())
    upgrade_database(url, revision)
    click.echo(f"database at {revision}")


@main.group()
def registry() -> None:
    """Entity registry commands."""


@registry.command("check")
@click.option("--path", type=click.Path(path_type=Path), default=None, help="entity_registry.yml to check")
def registry_check(path: Path | None) -> None:
    """Validate the registry and print its counts."""
    from app.registry import check_registry

    ok, report = check_registry(path or get_settings().registry_path)
    click.echo(report)
    sys.exit(0 if ok else 1)


@main.group()
def openapi() -> None:
    """OpenAPI spec commands."""


def _current_spec() -> bytes:
    from app.main import build_openapi, create_app

    return orjson.dumps(build_openapi(create_app()), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


@openapi.command("export")
@click.option("--output", type=click.Path(path_type=Path), default=OPENAPI_PATH, show_default=True)
@click.option("--check", is_flag=True, help="Fail if the committed spec differs from the code's (CI drift check).")
def openapi_export(output: Path, check: bool) -> None:
    """Write the OpenAPI spec generated from the code and the registry."""
    spec = _current_spec()
    if check:
        committed = output.read_bytes() if output.exists() else b""
        if committed != spec:
            click.echo(f"{output} is out of date: run `metaledger openapi export` and commit it", err=True)
            sys.exit(1)
        click.echo(f"{output} matches the code")
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(spec)
    click.echo(f"wrote {output} ({len(spec)} bytes)")
