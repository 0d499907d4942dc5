"""The job's default database: without METALEDGER_DATABASE_URL, `python -m spark_indexer …` uses the embedded Postgres
`make run` runs under METALEDGER_DATA_DIR (a real one here, in a temporary data directory), and says what to do when
it is not running."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.db import upgrade_database
from app.embedded_pg import EmbeddedPostgres, free_port
from spark_indexer.cli import main
from spark_indexer.config import NO_DATABASE_HINT, DatabaseNotFoundError, IndexerSettings, with_database


@pytest.fixture
def data_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="metaledger-spark-data-"))
    yield base
    EmbeddedPostgres(base / "pg", 0).stop()  # a test that failed half-way leaves its server up
    shutil.rmtree(base, ignore_errors=True)


def env_of(data_dir: Path, port: int) -> dict[str, str | None]:
    """The environment of `python -m spark_indexer …` next to `make run`: no database URL, no search server."""
    return {
        "METALEDGER_DATA_DIR": str(data_dir),
        "METALEDGER_EMBEDDED_PG_PORT": str(port),
        "METALEDGER_DATABASE_URL": None,
        "METALEDGER_SEARCH_URL": None,
    }


def test_no_database_url_and_no_embedded_postgres_says_what_to_do(data_dir):
    settings = IndexerSettings(database_url=None, data_dir=data_dir, embedded_pg_port=free_port())
    with pytest.raises(DatabaseNotFoundError, match=re.escape(NO_DATABASE_HINT)):
        with_database(settings)
    assert not (data_dir / "pg").exists(), "the job does not start a server of its own"

    runner = CliRunner()
    for command in (["restore-indices"], ["reconcile"], ["stream", "--once"]):
        result = runner.invoke(main, command, env=env_of(data_dir, settings.embedded_pg_port))
        assert result.exit_code == 1, (command, result.output)
        assert "start `make run` first or set METALEDGER_DATABASE_URL" in result.output, (command, result.output)


def test_no_database_url_uses_the_running_embedded_postgres(data_dir):
    port = free_port()
    server = EmbeddedPostgres(data_dir / "pg", port, durable=False)  # what `make run` starts (durable there)
    url = server.start()
    try:
        settings = IndexerSettings(database_url=None, data_dir=data_dir, embedded_pg_port=port)
        assert (
            with_database(settings).database_url == url == f"postgresql+asyncpg://postgres@127.0.0.1:{port}/metaledger"
        )
        # the server's own port wins over a stale setting (as `make run` reuses a running server)
        elsewhere = IndexerSettings(database_url=None, data_dir=data_dir, embedded_pg_port=free_port())
        assert with_database(elsewhere).database_url == url
        # a configured URL is used as is
        configured = IndexerSettings(database_url="postgresql+asyncpg://u@db:5432/x", data_dir=data_dir)
        assert with_database(configured).database_url == "postgresql+asyncpg://u@db:5432/x"
    finally:
        server.stop()
    with pytest.raises(DatabaseNotFoundError):
        with_database(settings)


def test_reconcile_runs_against_make_runs_embedded_postgres(spark, data_dir):
    """docs/spark-indexer.md's command, as is: `python -m spark_indexer reconcile` next to `make run` (embedded Postgres, its
    search tables as the backend), no URL copied from a log."""
    port = free_port()
    server = EmbeddedPostgres(data_dir / "pg", port, durable=False)
    try:
        upgrade_database(server.start())  # `make run` applies the migrations on start
        result = CliRunner().invoke(main, ["reconcile"], env=env_of(data_dir, port))
        assert result.exit_code == 0, result.output
        assert "reconcile (postgres)" in result.output and "OK: no drift" in result.output
    finally:
        server.stop()
