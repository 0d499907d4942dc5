"""The `metaledger` command."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click
import orjson

from app.settings import PROJECT_ROOT, get_settings

OPENAPI_PATH = PROJECT_ROOT / "openapi" / "openapi.json"
EX_CONFIG = 78  # sysexits.h: a configuration error


def refusal(error: BaseException) -> str | None:
    """The one line naming the setting and its problem, when `error` is a setting the service cannot start with."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from app.kafka.per_aspect import EventRoutingError
    from app.registry.errors import RegistryConfigError
    from app.supervisor import StartupRefused

    if isinstance(error, ValidationError):
        text = "; ".join(
            f"{_env_name(e['loc'][0]) if e['loc'] else 'METALEDGER_*'}: {e['msg']} (found {e['input']!r})"
            for e in error.errors()
        )
    elif isinstance(error, SettingsError):
        field = re.search(r'field "(\w+)"', str(error))
        cause = error.__cause__
        problem = f"cannot be parsed: {cause}" if cause is not None else str(error)
        text = f"{_env_name(field.group(1)) if field else 'METALEDGER_*'}: {problem}"
    elif isinstance(error, RegistryConfigError):
        text = f"METALEDGER_REGISTRY_PATH: {error}"
    elif isinstance(error, (EventRoutingError, StartupRefused)):
        text = str(error)  # it names the setting
    else:
        return None
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _env_name(field: str | int) -> str:
    return f"METALEDGER_{str(field).upper()}"


class _Commands(click.Group):
    """Every command: a setting it cannot start with is one line on stderr and exit code 78, no traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except Exception as error:
            line = refusal(error)
            if line is None:
                raise
            click.echo(f"metaledger cannot start: {line}", err=True)
            sys.exit(EX_CONFIG)


@click.group(cls=_Commands)
def main() -> None:
    """metaledger: a metadata change service that speaks DataHub's event model."""


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--no-migrate", is_flag=True, help="Do not apply pending migrations at start.")
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    envvar="METALEDGER_WORKERS",
    show_envvar=True,
    help="API processes sharing the port; above 1, the background work (relay, consumers, embedded indexer) runs in "
    "a process of its own  [default: the machine's cores]",
)
def serve(host: str, port: int, no_migrate: bool, log_level: str, workers: int | None) -> None:
    """Run the service. Without METALEDGER_DATABASE_URL it starts its own Postgres under METALEDGER_DATA_DIR."""
    from app import supervisor

    settings = get_settings()
    if no_migrate:
        settings.apply_migrations_on_start = False
    if not settings.auth_enabled and host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(
            f"WARNING: authentication is off (METALEDGER_AUTH_ENABLED=false) and metaledger listens on {host}: anyone "
            "who can reach it can write and delete anything.",
            err=True,
        )
    supervisor.serve(settings, host, port, workers or supervisor.default_workers(), log_level)
    # uvicorn's own last words are about its workers; a newcomer wants to know that all of it has stopped (an
    # embedded Postgres this start found running is left running, as docs/getting-started.md says).
    click.echo("metaledger stopped", err=True)


@main.command()
def relay() -> None:
    """Run the outbox relay standalone (several may run at once)."""
    from app.kafka.per_aspect import DerivedEvents
    from app.kafka.relay import OutboxRelay
    from app.modelset.watcher import ModelWatcher, WithModelWatcher
    from app.startup import load_registry_of
    from app.supervisor import run_standalone

    def make(settings, engine, maker, codec):
        registry = load_registry_of(settings)
        models = ModelWatcher(settings, maker, registry)
        return WithModelWatcher(
            OutboxRelay(settings, engine, codec, DerivedEvents(settings, registry, codec), models), models
        )

    run_standalone(make)


def _consumer(consumer_class, settings, maker, codec):
    """A standalone consumer: its gateway applies (never queues) and leaves indexing to the indexer, with the runtime
    model set taken up (app.modelset.watcher.WithModelWatcher)."""
    from app.ingest.gateway import IngestGateway
    from app.modelset.watcher import ModelWatcher, WithModelWatcher
    from app.startup import build_write_service

    gateway = IngestGateway(build_write_service(settings))
    return WithModelWatcher(
        consumer_class(settings, maker, gateway, codec=codec), ModelWatcher(settings, maker, gateway.registry)
    )


@main.command("consume-mcp")
def consume_mcp() -> None:
    """Apply proposals from the MetadataChangeProposal_v1 topic; failures go to FailedMetadataChangeProposal_v1."""
    from app.kafka.consumers import McpConsumer
    from app.supervisor import run_standalone

    run_standalone(lambda settings, engine, maker, codec: _consumer(McpConsumer, settings, maker, codec))


@main.command("consume-mce")
def consume_mce() -> None:
    """Apply legacy MetadataChangeEvents from MetadataChangeEvent_v4; failures go to FailedMetadataChangeEvent_v4."""
    from app.kafka.consumers import MceConsumer
    from app.supervisor import run_standalone

    run_standalone(lambda settings, engine, maker, codec: _consumer(MceConsumer, settings, maker, codec))


def _with_auth(operation):
    """Run `operation(auth)` against the configured (or embedded) database, migrated first, and return its result."""
    import asyncio

    from app.auth.service import AuthService
    from app.db import create_engine, upgrade_database
    from app.registry import load_registry
    from app.startup import resolve_database_url
    from app.supervisor import check_database_url

    settings = get_settings()
    check_database_url(settings)
    url = resolve_database_url(settings)
    if settings.apply_migrations_on_start:
        upgrade_database(url)

    async def run():
        engine = create_engine(url, 1)
        try:
            return await operation(AuthService(settings, engine, load_registry(settings.registry_path)))
        finally:
            await engine.dispose()

    from app.errors import MetaledgerError

    try:
        return asyncio.run(run())
    except (MetaledgerError, ValueError) as error:
        issues = "".join(f"\n  {i.path or ''} {i.message}" for i in getattr(error, "issues", []))
        raise click.ClickException(f"{error}{issues}") from None


CLI_ACTOR = "urn:li:corpuser:__metaledger_cli"  # who created what the CLI creates (whoever can reach the database)


@main.group()
def token() -> None:
    """Access tokens: `Authorization: Bearer <token>` (the datahub client's DATAHUB_GMS_TOKEN)."""


@token.command("create")
@click.option("--actor", required=True, help="the corpuser the token acts as, e.g. urn:li:corpuser:alice")
@click.option("--role", required=True, type=click.Choice(["reader", "writer", "admin"]))
@click.option(
    "--ttl", default=None, help='lifetime: 90d, 12h, 30m, 3600s or "never" [default: METALEDGER_AUTH_TOKEN_DEFAULT_TTL]'
)
@click.option("--description", default=None)
def token_create(actor: str, role: str, ttl: str | None, description: str | None) -> None:
    """Issue a token. It is printed once, alone on the last line (scripts: `... | tail -n1`); only its hash is kept."""
    from app.auth.model import Role

    async def create(auth):
        return await auth.create_token(actor, Role.parse(role), ttl=ttl, description=description, created_by=CLI_ACTOR)

    token_value, info = _with_auth(create)
    expires = "never" if info.expires_at is None else info.expires_at.isoformat()
    click.echo(f"token {info.id} for {info.actor} ({info.role.label}), expires {expires}", err=True)
    click.echo(token_value)


@token.command("list")
@click.option("--actor", default=None)
@click.option("--all", "include_inactive", is_flag=True, help="include revoked and expired tokens")
def token_list(actor: str | None, include_inactive: bool) -> None:
    """Issued tokens, one JSON object per line (never the tokens themselves)."""

    async def listing(auth):
        return await auth.tokens(actor, include_inactive)

    for info in _with_auth(listing):
        click.echo(orjson.dumps(info.to_json()).decode())


@token.command("revoke")
@click.argument("token_id")
def token_revoke(token_id: str) -> None:
    """Revoke a token by its id: every process refuses it within METALEDGER_AUTH_CACHE_SECONDS."""

    async def revoke(auth):
        return await auth.revoke_token(token_id, CLI_ACTOR)

    click.echo(f"token {token_id} revoked at {_with_auth(revoke).isoformat()}")


@main.group()
def policy() -> None:
    """Write policies: an actor with policies may write only the entity types and aspects they grant."""


@policy.command("create")
@click.option("--actor", required=True)
@click.option("--entity-type", "entity_types", multiple=True, help="repeatable; none: every entity type")
@click.option("--aspect", "aspects", multiple=True, help="repeatable; none: every aspect")
@click.option("--description", default=None)
def policy_create(actor: str, entity_types: tuple[str, ...], aspects: tuple[str, ...], description: str | None) -> None:
    """Grant `actor` writes of these entity types and aspects."""

    async def create(auth):
        return await auth.create_policy(
            actor, entity_types or None, aspects or None, description=description, created_by=CLI_ACTOR
        )

    click.echo(orjson.dumps(_with_auth(create).to_json()).decode())


@policy.command("list")
def policy_list() -> None:
    """Every policy, one JSON object per line."""

    async def listing(auth):
        return await auth.policies()

    for item in _with_auth(listing):
        click.echo(orjson.dumps(item.to_json()).decode())


@policy.command("delete")
@click.argument("policy_id")
def policy_delete(policy_id: str) -> None:
    async def delete(auth):
        await auth.delete_policy(policy_id, CLI_ACTOR)

    _with_auth(delete)
    click.echo(f"policy {policy_id} deleted")


@main.group()
def db() -> None:
    """Database commands."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Apply pending migrations (to the embedded database when METALEDGER_DATABASE_URL is unset)."""
    from app.db import upgrade_database
    from app.startup import resolve_database_url
    from app.supervisor import check_database_url

    check_database_url(get_settings())
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
@click.option(
    "--url",
    envvar="METALEDGER_URL",
    default="http://127.0.0.1:8080",
    show_default=True,
    show_envvar=True,
    help="the metaledger server",
)
@click.option("--token", envvar="DATAHUB_GMS_TOKEN", default=None, show_envvar=True, help="an admin token")
@click.pass_context
def model(ctx: click.Context, url: str, token: str | None) -> None:
    """Models registered at run time (POST /openapi/v1/models): <dir> holds .avsc aspect schemas and an optional
    models.yml (entities: as in entity_registry.yml, compatibility: {aspect: BACKWARD|FULL|NONE})."""
    ctx.obj = (url.rstrip("/"), {"Authorization": f"Bearer {token}"} if token else {})


def _model_call(ctx: click.Context, method: str, path: str, **kwargs) -> dict:
    import httpx

    url, headers = ctx.obj
    response = httpx.request(method, f"{url}/openapi/v1/models{path}", headers=headers, timeout=60, **kwargs)
    if response.status_code != 200:
        click.echo(f"{response.status_code}: {response.text}", err=True)
        sys.exit(1)
    return response.json()


def _model_body(directory: Path) -> dict:
    from app.registry.runtime import ModelSetError, RuntimeModelSet

    try:
        models = RuntimeModelSet.from_directory(directory)
    except ModelSetError as error:
        raise click.ClickException(str(error)) from None
    return {
        "aspects": [{"schema": a.schema, "compatibility": a.compatibility.value} for a in models.aspects.values()],
        "entities": [e.to_yml() for e in models.entities],
    }


@model.command("apply")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.pass_context
def model_apply(ctx: click.Context, directory: Path) -> None:
    """Check and store the whole runtime model set of DIRECTORY; print the new version and what changed."""
    click.echo(orjson.dumps(_model_call(ctx, "POST", "", json=_model_body(directory)), option=orjson.OPT_INDENT_2))


@model.command("diff")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.pass_context
def model_diff(ctx: click.Context, directory: Path) -> None:
    """What applying DIRECTORY would change (checked, nothing stored)."""
    answer = _model_call(ctx, "POST", "", params={"dryRun": "true"}, json=_model_body(directory))
    click.echo(orjson.dumps(answer, option=orjson.OPT_INDENT_2))


@model.command("history")
@click.pass_context
def model_history(ctx: click.Context) -> None:
    """Every stored version of the runtime model set, newest first."""
    for v in _model_call(ctx, "GET", "/history")["versions"]:
        click.echo(
            f"{v['version']}\t{v['createdOn']}\t{v['createdBy']}\taspects: {', '.join(v['aspects']) or '-'}"
            f"\tentities: {', '.join(v['entities']) or '-'}"
        )


@main.group()
def events() -> None:
    """Per-aspect events ("Metadata Events (v5)")."""


@events.command("export-schemas")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option(
    "--all",
    "every_pair",
    is_flag=True,
    help="every entity/aspect pair of the registry, not only the routed ones (METALEDGER_EVENTS_V5_ROUTES)",
)
def events_export_schemas(directory: Path, every_pair: bool) -> None:
    """Write the generated MetadataChangeEvent, MetadataAuditEvent and FailedMetadataChangeEvent schemas of the
    routed pairs as .avsc files (one per record: <com.linkedin.mxe.entity.aspect>.<Record>.avsc)."""
    from app.kafka.per_aspect import EventRoutingError, export_schemas, pair_routes
    from app.startup import load_registry_of

    settings = get_settings()
    try:
        routes = pair_routes(settings, load_registry_of(settings), every_pair=every_pair)
    except EventRoutingError as error:
        click.echo(f"METALEDGER_EVENTS_V5_ROUTES is not valid: {error}", err=True)
        sys.exit(1)
    if not routes:
        click.echo("no pair is routed (METALEDGER_EVENTS_V5_ROUTES is empty); --all exports every pair", err=True)
        sys.exit(1)
    written = export_schemas(routes, directory)
    click.echo(f"wrote {len(written)} schemas of {len(routes)} pairs to {directory}")


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


@main.group("settings")
def settings_group() -> None:
    """The settings (METALEDGER_* environment variables) and their documentation."""


@settings_group.command("docs")
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="where to write the page  [default: docs/configuration.md]",
)
@click.option("--check", is_flag=True, help="Fail if the committed page differs from the settings' (CI drift check).")
def settings_docs(output: Path | None, check: bool) -> None:
    """Write docs/configuration.md, generated from the settings' declarations (app/settings.py and
    spark_indexer/config.py)."""
    from app import settings_docs as docs

    output = output or docs.DOCS_PATH
    missing = docs.missing_descriptions()
    if missing:
        click.echo(f"settings without a description (Field(description=...)): {', '.join(missing)}", err=True)
        sys.exit(1)
    if check:
        problem = docs.check(main, output)
        if problem:
            click.echo(problem, err=True)
            sys.exit(1)
        click.echo(f"{output} matches the settings")
        return
    page = docs.render(main)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(page, encoding="utf-8")
    click.echo(f"wrote {output} ({len(page.splitlines())} lines)")
