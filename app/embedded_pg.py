"""A private PostgreSQL server under metaledger's data directory (the embedded default database).

When ``METALEDGER_DATABASE_URL`` is unset, ``metaledger serve`` runs its own Postgres cluster from the
machine's PostgreSQL binaries (Debian: ``apt-get install postgresql``) and keeps its files under
``<data_dir>/pg``.  The same class starts the throwaway clusters the tests use (``durable=False``).

Layout of the directory handed to :class:`EmbeddedPostgres` (owned by ``postgres`` when run as root)::

    <root>/data/          the cluster (PGDATA)
    <root>/postgres.log   server log (rotated once past 10 MiB, at start)

Design notes:

* The server listens on TCP ``127.0.0.1`` only, with ``trust`` authentication and *no* Unix socket
  (``unix_socket_directories=''``).  That avoids the 107-byte socket path limit and socket-directory
  permissions; ``pg_ctl -w`` waits on the status line of ``postmaster.pid``, not on a connection.
* PostgreSQL refuses to run as root.  As root, every PostgreSQL program runs through
  ``runuser -u postgres --``, the directory is chowned to ``postgres``, and any ancestor directory that
  ``postgres`` cannot traverse (``/root`` is 0700) gets search permission for that one user through a
  POSIX ACL (``chmod o+x`` where the file system has no ACLs).  A warning is logged for each change.
* ``durable=True`` (the embedded default) keeps fsync on, has the backends flush the pages they
  evict as they go (``backend_flush_after``: see ``_server_flags``), and keeps up to ``min_wal_size`` (1 GB)
  of WAL segment files ready for reuse, 512 MB of them made when the cluster is new (``_ready_wal_segments``).
  ``durable=False`` (tests) uses
  ``initdb --no-sync``, ``fsync=off`` and ``full_page_writes=off``: it survives a crash of the server
  process (the writes are in the OS cache), not of the machine.
* Unclean shutdowns: a ``postmaster.pid`` whose process is gone, a zombie, or not a postgres process
  (PID reused after a reboot or a container restart) is removed before starting; PostgreSQL itself then
  runs crash recovery.  Orphaned backends of a killed postmaster are given a few seconds to exit.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import pwd
import re
import shutil
import socket
import stat
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Self, TypeVar

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found. "
    "Install them with `apt-get install -y postgresql` (or run `make postgres-bin`), "
    "or set METALEDGER_DATABASE_URL to use an existing server."
)
PG_USER = "postgres"  # the OS account PostgreSQL runs as when we are root; also the database superuser
LOG_ROTATE_BYTES = 10 * 1024 * 1024

T = TypeVar("T")


class EmbeddedPostgresError(RuntimeError):
    """Starting, stopping or initialising the embedded server failed."""


class PostgresNotFoundError(EmbeddedPostgresError):
    """No PostgreSQL server binaries on this machine."""


# --------------------------------------------------------------------------------------------------
# Binaries
# --------------------------------------------------------------------------------------------------


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", path.parent.parent.name)) or (0,)


def find_pg_bin(search_root: Path = Path("/usr/lib/postgresql")) -> Path:
    """The directory holding ``initdb``/``pg_ctl``/``postgres``.

    ``/usr/lib/postgresql/<highest version>/bin`` (Debian, Ubuntu), else ``pg_config --bindir``, else
    the directory of an ``initdb`` on ``PATH``.  Raises :class:`PostgresNotFoundError` naming
    ``apt-get install postgresql`` when none has them.
    """
    candidates = sorted(Path(search_root).glob("*/bin/initdb"), key=_version_key, reverse=True)
    dirs = [c.parent for c in candidates]
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], check=False, capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                dirs.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    on_path = shutil.which("initdb")
    if on_path:
        dirs.append(Path(on_path).resolve().parent)
    for d in dirs:
        if all(os.access(d / exe, os.X_OK) for exe in ("initdb", "pg_ctl", "postgres")):
            return d
    raise PostgresNotFoundError(INSTALL_HINT)


# --------------------------------------------------------------------------------------------------
# Small helpers shared with the test fixtures
# --------------------------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (another process may still take it before we bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_coro_sync(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run an async function to completion from sync code, even when called inside a running event loop.

    The coroutine runs in a private loop on a helper thread, so this works from CLI code, from sync
    pytest fixtures and from within async fixtures alike.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(factory()))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(exc)

    t = threading.Thread(target=target, name="embedded-pg-sync", daemon=True)
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _ensure_database(dsn: str, name: str, template: str | None = None) -> bool:
    import asyncpg  # a project dependency; imported lazily to keep `import app.embedded_pg` light

    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            return False
        sql = f"CREATE DATABASE {quote_ident(name)}"
        if template:
            sql += f" TEMPLATE {quote_ident(template)}"
        try:
            await conn.execute(sql)
        except (asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
            # Created concurrently (a racing CREATE DATABASE fails on pg_database's unique index).
            if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                return False
            raise
        return True
    finally:
        await conn.close()


async def _ready_wal_segments(dsn: str) -> int:
    """Make WAL segment files ready for reuse on a new cluster; the number made.

    A WAL segment the server has not made yet is made when the WAL reaches it: 16 MB of zeros written and
    synced while the WAL write lock is held, so every COMMIT waits for it (60-140 ms stalls of every
    writer at once under a flood of batches, which makes a new segment every second or so).  A cluster
    that has run through checkpoints reuses its old segments instead (up to ``min_wal_size`` of them); a
    new one has none.  So, once: a commit and a switch to the next segment, N times, then a checkpoint,
    which renames the old files as future segments instead of deleting them.  N is ``min_wal_size``'s
    segments, but no more than a checkpoint cycle's WAL (``max_wal_size`` / (1 +
    ``checkpoint_completion_target``): 32 segments by default): past it the server checkpoints on its own
    midway, and the switches after that only use up the files that checkpoint kept.
    """
    import asyncpg

    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        segments = await conn.fetchval("""
            SELECT least(pg_size_bytes(current_setting('min_wal_size')) / s,
                         floor(pg_size_bytes(current_setting('max_wal_size')) / s
                               / (1 + current_setting('checkpoint_completion_target')::float))::bigint - 2)
            FROM (SELECT pg_size_bytes(current_setting('wal_segment_size')) AS s) AS segment""")
        for _ in range(segments):
            await conn.execute("SELECT txid_current()")  # a commit record: WAL in the current segment to switch from
            await conn.execute("SELECT pg_switch_wal()")
        await conn.execute("CHECKPOINT")
        return int(segments)
    finally:
        await conn.close()


def ensure_database(admin_dsn: str, name: str, template: str | None = None) -> bool:
    """Create database ``name`` (optionally from ``template``) unless it exists; True if created.

    ``admin_dsn`` is a plain libpq-style URL (``postgresql://user@host:port/postgres``).
    """
    return run_coro_sync(lambda: _ensure_database(admin_dsn, name, template))


# --------------------------------------------------------------------------------------------------
# Process and permission helpers
# --------------------------------------------------------------------------------------------------


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _pid_is_postgres(pid: int) -> bool:
    """True if ``pid`` is a live (non-zombie) process that looks like a PostgreSQL server."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user (postgres)
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return True  # no procfs (not Linux): trust kill(0)
    try:
        stat_line = (proc / "stat").read_text()
        state = stat_line[stat_line.rindex(")") + 2 :].split()[0]
        if state in ("Z", "X"):
            return False
        comm = (proc / "comm").read_text().strip()
    except (OSError, ValueError, IndexError):
        return False  # vanished meanwhile
    return comm in ("postgres", "postmaster")


def _grant_search_to(uid: int, directory: Path) -> str:
    """Give user ``uid`` search (x) permission on ``directory``; returns how it was done.

    A POSIX ACL entry ``user:<uid>:--x`` (what ``setfacl -m u:postgres:x`` does, without needing the
    ``acl`` package), else ``chmod o+x`` where the file system does not support ACLs.
    """
    # xattr format: u32 version (2), then (u16 tag, u16 perm, u32 id) entries sorted by (tag, id).
    user_obj, user, group_obj, group, mask, other = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
    undefined = 0xFFFFFFFF
    name = "system.posix_acl_access"
    try:
        try:
            raw = os.getxattr(directory, name)
            acl = {(t, i): p for t, p, i in (struct.unpack_from("<HHI", raw, o) for o in range(4, len(raw), 8))}
        except OSError as exc:
            if exc.errno != errno.ENODATA:
                raise
            mode = directory.stat().st_mode
            acl = {
                (user_obj, undefined): (mode >> 6) & 7,
                (group_obj, undefined): (mode >> 3) & 7,
                (other, undefined): mode & 7,
            }
        acl[(user, uid)] = acl.get((user, uid), 0) | 1
        # Recompute the mask as the union of the group class, as setfacl does.
        acl[(mask, undefined)] = 0
        for (tag, _), perm in list(acl.items()):
            if tag in (user, group_obj, group):
                acl[(mask, undefined)] |= perm
        blob = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i) for (t, i), p in sorted(acl.items()))
        os.setxattr(directory, name, blob)
        return f"ACL user:{PG_USER}:x"
    except OSError:
        os.chmod(directory, stat.S_IMODE(directory.stat().st_mode) | stat.S_IXOTH)
        return "chmod o+x"


# --------------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------------


class EmbeddedPostgres:
    """A private PostgreSQL cluster in ``data_dir`` listening on ``127.0.0.1:<port>``.

    ``data_dir`` is the directory this server owns (the CLI passes ``settings.data_dir / "pg"``, see
    :meth:`from_settings`).  ``database`` is created on :meth:`start` if missing (``None`` or
    ``"postgres"``: nothing to create).  ``durable=False`` trades crash safety for speed (tests).
    """

    def __init__(
        self,
        data_dir: Path,
        port: int,
        database: str | None = "metaledger",
        *,
        durable: bool = True,
        start_timeout: float = 60.0,
        server_options: dict[str, str] | None = None,
    ) -> None:
        self.root = Path(data_dir).absolute()
        self.port = int(port)
        self.database = database
        self.durable = durable
        self.start_timeout = start_timeout
        self.server_options = dict(server_options or {})
        self.pgdata = self.root / "data"
        self.log_file = self.root / "postgres.log"
        self.host = "127.0.0.1"
        self.user = PG_USER
        self._bin: Path | None = None

    @classmethod
    def from_settings(cls, settings) -> EmbeddedPostgres:
        """The embedded default server: ``<settings.data_dir>/pg`` on ``settings.embedded_pg_port``."""
        return cls(Path(settings.data_dir) / "pg", settings.embedded_pg_port, "metaledger", durable=True)

    # ---- URLs -------------------------------------------------------------------------------------

    def url(self, database: str | None = None, driver: str = "postgresql+asyncpg") -> str:
        """SQLAlchemy URL of ``database`` (default: :attr:`database`) on this server."""
        db = database or self.database or "postgres"
        return f"{driver}://{self.user}@{self.host}:{self.port}/{db}"

    @property
    def admin_dsn(self) -> str:
        """Plain libpq/asyncpg DSN of the ``postgres`` maintenance database."""
        return self.url("postgres", driver="postgresql")

    # ---- public API -------------------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        if self._bin is None:
            self._bin = find_pg_bin()
        return self._bin

    def is_running(self) -> bool:
        """True if a postmaster is alive for this data directory."""
        pid, _port, _status = self._read_pid_file()
        return pid is not None and _pid_is_postgres(pid)

    def start(self) -> str:
        """Initialise (once), start (unless running) and create the database; return its SQLAlchemy URL.

        Idempotent: a server already running on this data directory is reused (on its own port).
        """
        bin_dir = self.bin_dir  # fail early, with the install hint, before touching anything
        self._prepare_dirs()
        new_cluster = not (self.pgdata / "PG_VERSION").exists()
        if new_cluster:
            self._initdb(bin_dir)
        if self.is_running():
            _pid, port, _status = self._read_pid_file()
            if port and port != self.port:
                log.warning(
                    "embedded Postgres in %s is already running on port %s (configured: %s); using it",
                    self.pgdata,
                    port,
                    self.port,
                )
                self.port = port
            self._wait_ready()
        else:
            self._remove_stale_pid_file()
            self._start_server(bin_dir)
        if new_cluster and self.durable:
            started = time.monotonic()
            try:
                made = run_coro_sync(lambda: _ready_wal_segments(self.admin_dsn))
            except Exception as exc:  # the server works without them: its first bursts are slower
                log.warning("embedded Postgres: making WAL segment files ready for reuse failed: %s", exc)
            else:
                log.info(
                    "embedded Postgres: %d WAL segment files made ready for reuse in %.1f s",
                    made,
                    time.monotonic() - started,
                )
        if self.database and self.database != "postgres":
            try:
                if ensure_database(self.admin_dsn, self.database):
                    log.info("created database %s on embedded Postgres", self.database)
            except Exception as exc:
                raise EmbeddedPostgresError(
                    f"embedded Postgres is running on {self.host}:{self.port} but creating database "
                    f"{self.database!r} failed: {exc}\n{self._log_tail()}"
                ) from exc
        return self.url()

    def stop(self) -> None:
        """Fast shutdown (``pg_ctl stop -m fast``); a no-op if the server is not running."""
        if not self.is_running():
            return
        res = self._pg_run(
            [str(self.bin_dir / "pg_ctl"), "stop", "-D", str(self.pgdata), "-m", "fast", "-w", "-t", "60"]
        )
        if res.returncode != 0 and self.is_running():
            raise EmbeddedPostgresError(
                f"pg_ctl stop failed (exit {res.returncode}): {res.stdout}{res.stderr}\n{self._log_tail()}"
            )

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedPostgres({str(self.root)!r}, port={self.port}, durable={self.durable})"

    # ---- internals --------------------------------------------------------------------------------

    def _pg_cmd(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", PG_USER, "--", *argv] if _is_root() else argv

    def _pg_run(self, argv: list[str], timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        # cwd: somewhere the server user can always enter (PostgreSQL programs complain otherwise).
        return subprocess.run(
            self._pg_cmd(argv),
            check=False,
            cwd=str(self.root),
            capture_output=True,
            text=True,
            timeout=timeout or self.start_timeout + 30,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "LC_ALL": "C.UTF-8"},
        )

    def _pg_user(self) -> pwd.struct_passwd:
        try:
            return pwd.getpwnam(PG_USER)
        except KeyError:
            raise EmbeddedPostgresError(
                f"running as root, but there is no {PG_USER!r} OS user to run PostgreSQL as "
                "(the Debian `postgresql` package creates it: apt-get install -y postgresql)"
            ) from None

    def _prepare_dirs(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not _is_root():
            return
        pw = self._pg_user()
        st = self.root.stat()
        if st.st_uid != pw.pw_uid:
            for path in [self.root, *self.root.rglob("*")]:
                os.chown(path, pw.pw_uid, pw.pw_gid, follow_symlinks=False)
        os.chmod(self.root, 0o700)
        self._ensure_traversable(pw.pw_uid)

    def _postgres_can_reach(self, path: Path) -> bool:
        return (
            subprocess.run(
                ["runuser", "-u", PG_USER, "--", "test", "-x", str(path)],
                check=False,
                cwd="/",
                stdin=subprocess.DEVNULL,
                capture_output=True,
            ).returncode
            == 0
        )

    def _ensure_traversable(self, uid: int) -> None:
        """As root: let the postgres user reach ``self.root`` through every ancestor directory."""
        if self._postgres_can_reach(self.root):
            return
        for ancestor in reversed(self.root.parents):  # "/" first, down to the parent of root
            if not self._postgres_can_reach(ancestor):
                how = _grant_search_to(uid, ancestor)
                log.warning(
                    "gave the %s user search permission on %s (%s) so the embedded Postgres can reach %s",
                    PG_USER,
                    ancestor,
                    how,
                    self.root,
                )
                if not self._postgres_can_reach(ancestor):
                    raise EmbeddedPostgresError(
                        f"the {PG_USER} user cannot reach {ancestor} even after {how}; "
                        f"choose a data directory outside it (METALEDGER_DATA_DIR)"
                    )
        if not self._postgres_can_reach(self.root):
            raise EmbeddedPostgresError(f"the {PG_USER} user cannot reach {self.root}")

    def _initdb(self, bin_dir: Path) -> None:
        if self.pgdata.exists() and any(self.pgdata.iterdir()):
            raise EmbeddedPostgresError(
                f"{self.pgdata} exists and is not empty but holds no PostgreSQL cluster (no PG_VERSION); "
                "move it away or delete it"
            )
        argv = [
            str(bin_dir / "initdb"),
            "-D",
            str(self.pgdata),
            "-U",
            PG_USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        ]
        if not self.durable:
            argv.append("--no-sync")
        res = self._pg_run(argv, timeout=300)
        if res.returncode != 0:
            raise EmbeddedPostgresError(
                f"initdb failed (exit {res.returncode}) for {self.pgdata}:\n{res.stdout}{res.stderr}"
            )

    def _server_flags(self) -> str:
        opts = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": "",
            "logging_collector": "off",
            "timezone": "UTC",
        }
        if not self.durable:
            # Survives a crash of the server process (the OS still has the writes), not of the machine.
            opts.update(fsync="off", full_page_writes="off")
        else:
            # A backend that evicts a dirty page asks the kernel to write it out at once (every 256 kB), as the
            # background writer and the checkpointer already do. Left to the kernel, a flood's evicted pages (800 MB
            # in 30 s of 1,000-proposal batches beside 128 MB of shared buffers) all expire together 30 s later, the
            # disk's queue fills, and every COMMIT's WAL flush waits behind it: 0.3-0.6 s stalls of every writer at
            # once (bench/flood.py: single writes' p99 325-470 ms before, 140-223 ms after).
            opts.update(backend_flush_after="256kB")
            # Segment files a checkpoint keeps for reuse rather than deleting (the default, 80 MB, is five): a burst's
            # WAL then goes into files that exist instead of new ones made while every COMMIT waits (see
            # _ready_wal_segments; single writes' p99 beside a flood, interleaved runs: 128-247 ms making segments,
            # 99-146 ms with them ready).
            opts.update(min_wal_size="1GB")
        opts.update(self.server_options)
        # pg_ctl hands -o to /bin/sh: single-quote every value.
        parts = [f"-p {self.port}"]
        for k, v in opts.items():
            if not re.fullmatch(r"[A-Za-z_.]+", k) or "'" in str(v):
                raise ValueError(f"unsupported server option {k}={v!r}")
            parts.append(f"-c {k}='{v}'")
        return " ".join(parts)

    def _rotate_log(self) -> None:
        try:
            if self.log_file.stat().st_size > LOG_ROTATE_BYTES:
                self.log_file.replace(self.log_file.with_suffix(".log.1"))
        except FileNotFoundError:
            pass

    def _start_server(self, bin_dir: Path) -> None:
        self._rotate_log()
        argv = [
            str(bin_dir / "pg_ctl"),
            "start",
            "-D",
            str(self.pgdata),
            "-l",
            str(self.log_file),
            "-w",
            "-t",
            str(int(self.start_timeout)),
            "-o",
            self._server_flags(),
        ]
        deadline = time.monotonic() + 10
        while True:
            res = self._pg_run(argv)
            if res.returncode == 0 and self.is_running():
                return
            if self.is_running():  # another process (a second `metaledger serve`) started it meanwhile
                self._wait_ready()
                return
            tail = self._log_tail()
            # Backends orphaned by a kill -9 of the postmaster keep the old shared memory attached for a
            # moment; PostgreSQL refuses to start until they are gone.
            if "pre-existing shared memory block" in tail and time.monotonic() < deadline:
                time.sleep(0.3)
                continue
            raise EmbeddedPostgresError(
                f"could not start PostgreSQL in {self.pgdata} on {self.host}:{self.port} "
                f"(pg_ctl exit {res.returncode}): {res.stdout.strip()} {res.stderr.strip()}\n{tail}"
            )

    def _read_pid_file(self) -> tuple[int | None, int | None, str | None]:
        """(pid, port, status) from ``postmaster.pid``, Nones if missing or unreadable."""
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, NotADirectoryError):
            return None, None, None
        except PermissionError:
            return None, None, None

        def field(i: int) -> str | None:
            return lines[i].strip() if len(lines) > i else None

        try:
            pid = int(field(0) or "")
        except ValueError:
            pid = None
        port_s = field(3)
        port = int(port_s) if port_s and port_s.isdigit() else None
        return pid, port, field(7)

    def _remove_stale_pid_file(self) -> None:
        pid_file = self.pgdata / "postmaster.pid"
        pid, _port, _status = self._read_pid_file()
        if pid_file.exists() and not (pid is not None and _pid_is_postgres(pid)):
            log.warning("removing stale %s (pid %s is not a running postgres)", pid_file, pid)
            pid_file.unlink(missing_ok=True)

    def _wait_ready(self) -> None:
        """Wait for a running server to accept connections (it may be in crash recovery)."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            pid, _port, status = self._read_pid_file()
            if pid is None or not _pid_is_postgres(pid):
                raise EmbeddedPostgresError(f"PostgreSQL in {self.pgdata} went away\n{self._log_tail()}")
            if status == "ready":
                return
            time.sleep(0.1)
        raise EmbeddedPostgresError(f"PostgreSQL in {self.pgdata} is not ready\n{self._log_tail()}")

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(errors="replace").splitlines()[-lines:]
        except OSError as exc:
            return f"(no server log at {self.log_file}: {exc})"
        return f"--- last {len(text)} lines of {self.log_file} ---\n" + "\n".join(text)
