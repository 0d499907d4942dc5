"""`python -m spark_indexer …` (or `spark-submit spark_indexer/job.py …`): the indexer's command line.

Configuration comes from the service's `METALEDGER_*` settings (database, Kafka, search, topics) plus the job's
own `METALEDGER_SPARK_*` ones (spark_indexer.config). Without `METALEDGER_DATABASE_URL`, the commands use the
embedded Postgres `make run` is running (under `METALEDGER_DATA_DIR`), or stop with "start `make run` first or set
METALEDGER_DATABASE_URL" before starting Spark."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import click

from spark_indexer.config import DatabaseNotFoundError, IndexerSettings, with_database


def _session(settings: IndexerSettings, master: str | None):
    from spark_indexer.session import build_session

    return build_session(master or settings.spark_master)


def _database(settings: IndexerSettings) -> IndexerSettings:
    try:
        return with_database(settings)
    except DatabaseNotFoundError as error:
        raise click.ClickException(str(error)) from error


def _when(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError as error:
        raise click.BadParameter(
            f"{value!r} is not an ISO date/time (e.g. 2026-11-21 or 2026-11-21T10:00:00)"
        ) from error


@click.group()
@click.option(
    "--master", default=None, help="Spark master (default: METALEDGER_SPARK_MASTER, local[*]); spark-submit's wins."
)
@click.pass_context
def main(ctx: click.Context, master: str | None) -> None:
    """metaledger's PySpark indexer: change logs → search, lineage graph and timeseries."""
    from app.logs import configure_logging

    configure_logging()
    ctx.obj = {"master": master, "settings": IndexerSettings()}


@main.command()
@click.option(
    "--checkpoint",
    default=None,
    help="Checkpoint location, a Hadoop filesystem URI or path (default: METALEDGER_SPARK_CHECKPOINT_DIR or <work dir>/checkpoint).",
)
@click.option("--once", is_flag=True, help="Index everything on the topics now, then exit (cron-style runs, tests).")
@click.option(
    "--metrics-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the batch figures to this Prometheus textfile after every batch (default: METALEDGER_SPARK_METRICS_FILE).",
)
@click.pass_context
def stream(ctx: click.Context, checkpoint: str | None, once: bool, metrics_file: str | None) -> None:
    """Stream the MCL topics into the indices until stopped."""
    from spark_indexer.stream import run_stream

    settings: IndexerSettings = ctx.obj["settings"]
    if metrics_file:
        settings = settings.model_copy(update={"spark_metrics_file": Path(metrics_file)})
    if not settings.search_url:  # the embedded Postgres search backend: its tables are in the database
        settings = _database(settings)
    result = run_stream(_session(settings, ctx.obj["master"]), settings, checkpoint=checkpoint, once=once)
    click.echo(result.summary(), err=True)


@main.command("restore-indices")
@click.option("--clean", is_flag=True, help="Rebuild into fresh indices and swap them in (search keeps serving).")
@click.option("--entity", "entities", multiple=True, help="Only these entity types (repeatable).")
@click.option("--aspect", "aspects", multiple=True, help="Only these aspects (repeatable).")
@click.option("--urn-like", default=None, help="Only URNs matching this SQL LIKE pattern.")
@click.option("--since", default=None, help="Only aspects written at or after this time (ISO).")
@click.option("--until", default=None, help="Only aspects written before this time (ISO).")
@click.pass_context
def restore_indices(
    ctx: click.Context,
    clean: bool,
    entities: tuple[str, ...],
    aspects: tuple[str, ...],
    urn_like: str | None,
    since: str | None,
    until: str | None,
) -> None:
    """Rebuild the indices from the latest rows of metadata_aspect_v2."""
    from spark_indexer.restore import restore_indices as run

    settings = _database(ctx.obj["settings"])
    result = run(
        _session(settings, ctx.obj["master"]),
        settings,
        clean=clean,
        entities=list(entities) or None,
        aspects=list(aspects) or None,
        urn_like=urn_like,
        since=_when(since),
        until=_when(until),
    )
    click.echo(result.summary(), err=True)
    sys.exit(0 if result.ok else 1)


@main.command()
@click.option(
    "--repair", is_flag=True, help="Re-apply drifted aspects from Postgres and remove orphans, then re-check."
)
@click.option("--entity", "entities", multiple=True, help="Only these entity types (repeatable).")
@click.pass_context
def reconcile(ctx: click.Context, repair: bool, entities: tuple[str, ...]) -> None:
    """Compare Postgres with the index; exit status 0 only when no drift remains."""
    from spark_indexer.reconcile import reconcile as run

    settings = _database(ctx.obj["settings"])
    report = run(_session(settings, ctx.obj["master"]), settings, repair=repair, entities=list(entities) or None)
    click.echo(report.summary())
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
