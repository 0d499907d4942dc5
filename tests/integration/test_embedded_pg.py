"""The embedded default database and the Postgres test fixtures, against the real PostgreSQL binaries.

These never skip for missing binaries: find_pg_bin() raises with the `apt-get install postgresql` hint.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from app.embedded_pg import EmbeddedPostgres, EmbeddedPostgresError, PostgresNotFoundError, find_pg_bin, free_port


def _dsn(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def _fetch(url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(_dsn(url))
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


@pytest.fixture
def pg_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="metaledger-embedded-test-"))
    yield base
    for pid_file in base.rglob("postmaster.pid"):  # a test that failed half-way leaves its server up
        EmbeddedPostgres(pid_file.parent.parent, 0).stop()
    shutil.rmtree(base, ignore_errors=True)


def test_find_pg_bin_has_server_binaries() -> None:
    bin_dir = find_pg_bin()  # raises PostgresNotFoundError("... apt-get install -y postgresql ...")
    for exe in ("initdb", "pg_ctl", "postgres"):
        assert os.access(bin_dir / exe, os.X_OK), exe


def test_find_pg_bin_without_binaries_names_the_install_command(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(PostgresNotFoundError, match=r"apt-get install -y postgresql"):
        find_pg_bin(search_root=tmp_path)
    # the highest version wins when several are installed
    for version in ("13", "15", "9.6"):
        for exe in ("initdb", "pg_ctl", "postgres"):
            f = tmp_path / version / "bin" / exe
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("#!/bin/sh\n")
            f.chmod(0o755)
    assert find_pg_bin(search_root=tmp_path) == tmp_path / "15" / "bin"


async def test_data_survives_stop_and_start(pg_dir: Path) -> None:
    pg = EmbeddedPostgres(pg_dir / "pg", free_port())  # durable, as the embedded default
    url = pg.start()
    assert url == f"postgresql+asyncpg://postgres@127.0.0.1:{pg.port}/metaledger"
    # a new durable cluster has a checkpoint cycle's WAL segment files (512 MB) made, ready for a burst's WAL, and
    # checkpoints keep up to 1 GB of them
    assert (await _fetch(url, "SHOW min_wal_size"))[0][0] == "1GB"
    ahead = "SELECT count(*) FROM pg_ls_waldir() WHERE name > pg_walfile_name(pg_current_wal_lsn())"
    assert (await _fetch(url, ahead))[0][0] >= 30  # future segments (renamed old files), not old ones kept
    assert pg.is_running()
    assert pg.start() == url  # idempotent: reuses the running server
    await _fetch(url, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    await _fetch(url, "INSERT INTO t VALUES (1, 'kept')")
    pg.stop()
    assert not pg.is_running()
    pg.stop()  # no-op when stopped

    again = EmbeddedPostgres(pg_dir / "pg", pg.port)  # a new process would build a new object
    assert again.start() == url
    rows = await _fetch(url, "SELECT v FROM t WHERE id = 1")
    assert [r["v"] for r in rows] == ["kept"]
    assert (pg_dir / "pg" / "postgres.log").stat().st_size > 0
    # durable: fsync stays on for the embedded default
    assert (await _fetch(url, "SHOW fsync"))[0][0] == "on"
    # and its backends start the writeback of the pages they evict (no burst of expired dirty pages stalls COMMIT)
    assert (await _fetch(url, "SHOW backend_flush_after"))[0][0] == "256kB"
    # Listens on 127.0.0.1 over TCP only: no Unix socket anywhere.
    assert (await _fetch(url, "SHOW listen_addresses"))[0][0] == "127.0.0.1"
    assert (await _fetch(url, "SHOW unix_socket_directories"))[0][0] == ""
    again.stop()


async def test_start_after_kill_9_of_postmaster(pg_dir: Path) -> None:
    pg = EmbeddedPostgres(pg_dir / "pg", free_port())
    url = pg.start()
    await _fetch(url, "CREATE TABLE t (id int)")
    await _fetch(url, "INSERT INTO t VALUES (42)")
    pid_file = pg.pgdata / "postmaster.pid"
    pid = int(pid_file.read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pg.is_running():
        assert time.monotonic() < deadline, f"the killed postmaster {pid} is still alive after 5 s"
        await asyncio.sleep(0.05)
    assert pid_file.exists()  # stale; on this kind of machine the dead postmaster may even stay a zombie

    assert pg.start() == url
    assert pg.is_running()
    assert [r[0] for r in await _fetch(url, "SELECT id FROM t")] == [42]
    pg.stop()


async def test_start_with_stale_pid_file_naming_a_live_unrelated_process(pg_dir: Path) -> None:
    """After a reboot or container restart the PID in postmaster.pid may belong to another process."""
    pg = EmbeddedPostgres(pg_dir / "pg", free_port(), durable=False)
    url = pg.start()
    # not durable (the tests' clusters): no WAL segments made ahead, so the tests' many clusters start fast
    assert (await _fetch(url, "SELECT count(*) FROM pg_ls_waldir()"))[0][0] < 8
    await _fetch(url, "CREATE TABLE t (id int)")
    pid = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pg.is_running():
        assert time.monotonic() < deadline, f"the killed postmaster {pid} is still alive after 5 s"
        await asyncio.sleep(0.05)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid_file = pg.pgdata / "postmaster.pid"
        lines = pid_file.read_text().splitlines()
        pid_file.write_text("\n".join([str(sleeper.pid), *lines[1:]]) + "\n")
        assert not pg.is_running()
        assert pg.start() == url
        assert await _fetch(url, "SELECT * FROM t") == []
    finally:
        sleeper.kill()
        sleeper.wait()
        pg.stop()


def test_start_failure_reports_the_log_tail(pg_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        pg = EmbeddedPostgres(pg_dir / "pg", busy.getsockname()[1], durable=False)
        with pytest.raises(EmbeddedPostgresError) as info:
            pg.start()
    message = str(info.value)
    assert "postgres.log" in message and "could not bind" in message, message
    assert not pg.is_running()


@pytest.mark.skipif(os.geteuid() != 0, reason="root-only situation: PostgreSQL runs as the postgres user")
async def test_root_data_dir_below_a_directory_postgres_cannot_enter(pg_dir: Path) -> None:
    """Like a clone under /root (mode 0700): the postgres user is given search permission on the way."""
    private = pg_dir / "home"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)  # no umask games
    target = private / "repo" / ".metaledger" / "pg"
    pg = EmbeddedPostgres(target, free_port(), durable=False)
    url = pg.start()
    assert (await _fetch(url, "SELECT 1"))[0][0] == 1
    assert os.stat(private).st_mode & 0o077 in (0, 0o010, 0o001)  # at most search permission was added
    assert target.stat().st_uid == pwd.getpwnam("postgres").pw_uid
    pg.stop()


def test_start_refuses_a_non_cluster_directory(pg_dir: Path) -> None:
    junk = pg_dir / "pg" / "data"
    junk.mkdir(parents=True)
    (junk / "something").write_text("not a cluster")
    with pytest.raises(EmbeddedPostgresError, match="no PG_VERSION"):
        EmbeddedPostgres(pg_dir / "pg", free_port()).start()


# ---- the conftest fixtures ----------------------------------------------------------------------


async def test_fresh_database_url_is_an_empty_new_database(fresh_database_url: str, pg_admin_dsn: str) -> None:
    assert fresh_database_url.startswith("postgresql+asyncpg://")
    assert pg_admin_dsn.startswith("postgresql://") and pg_admin_dsn.endswith("/postgres")
    tables = await _fetch(fresh_database_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    assert tables == []
    await _fetch(fresh_database_url, "CREATE TABLE mine (x int)")


async def test_make_database_twice_gives_separate_databases(make_database) -> None:
    a, b = make_database(), make_database()
    assert a != b
    await _fetch(a, "CREATE TABLE only_in_a (x int)")
    assert await _fetch(b, "SELECT 1 FROM pg_tables WHERE tablename = 'only_in_a'") == []
    # from a template, e.g. a migrated database cloned per test
    c = make_database(template=a.rsplit("/", 1)[1])
    assert await _fetch(c, "SELECT 1 FROM pg_tables WHERE tablename = 'only_in_a'") != []
