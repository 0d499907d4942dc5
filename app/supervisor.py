"""`metaledger serve --workers N`: the whole machine for one service.

With one worker everything runs in one process (the API, the relay, the consumers, the embedded indexer), as
`uvicorn app.main:app` does. With N > 1 this process becomes a supervisor:
- it starts the database (the embedded default) and applies migrations once, and announces the first admin token;
- N API processes share the listening socket (uvicorn's multiprocess supervisor: a worker that dies is replaced);
  their event loops serve requests only (`METALEDGER_BACKGROUND_IN_PROCESS=false`);
- one background process runs what `Background` runs in a single process: the outbox relay (and with it the
  change-feed sequencer), the Kafka consumers, and without Kafka the search indexing worker; it is restarted if it
  dies. These already coordinate through Postgres (advisory locks, `FOR UPDATE SKIP LOCKED` lanes), so any number of
  API processes writing at once is safe.
- every child stops on its own when the supervisor is killed with -9 (app.workers.follow_supervisor);
- on SIGTERM (to the supervisor or its whole process group) the API processes drain (app.ops.drain): after
  `shutdown_drain_s` the supervisor makes the shared socket take no new connection, they answer what they accepted and
  exit, and only then is the background process stopped (its relay gives its lanes back with the last writes
  published);
- Prometheus counters are shared through files in one directory (prometheus_client's multiprocess mode), so that a
  scrape of `/metrics`, whichever process takes it, sums every process's.
Children are spawned (not forked) and read their settings from the environment this process sets up.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

from uvicorn.supervisors import Multiprocess

from app.http_server import HeadLimitedProtocol
from app.ops.activity import ACTIVITY_FILE_ENV, create_activity_file
from app.ops.drain import refuse_new_connections
from app.settings import Settings, get_settings
from app.workers import SUPERVISOR_PID_ENV, follow_supervisor

log = logging.getLogger("metaledger.supervisor")

BACKGROUND_RESTART_PAUSE_S = 1.0
# The background process (indexing, relay, after-processors) is work that may lag: under load it yields the CPU to
# the API processes, whose callers wait on every request.
BACKGROUND_NICENESS = 10


def default_workers() -> int:
    """The machine's cores (the cores this process may run on)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# How long an idle keep-alive connection is kept (uvicorn's default is 5 s). Longer than the longest Retry-After
# metaledger answers (60 s): a client that waits as told and reuses its pooled connection must not meet it closing
# at that very moment (a POST is never retried by the client: it would see a connection closed without an answer).
KEEP_ALIVE_S = 75


def serve(settings: Settings, host: str, port: int, workers: int, log_level: str) -> None:
    import uvicorn

    check_database_url(settings)
    if workers <= 1:
        from app.main import create_app

        uvicorn.run(
            create_app(settings),
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=settings.shutdown_timeout_s,  # type: ignore[arg-type]  # uvicorn hints int; it only passes it on as asyncio.wait_for's timeout (a float)
            http=http_protocol(settings),  # type: ignore[arg-type]  # uvicorn hints a class but only calls it, as it does a partial of one
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        return

    from app.kafka.per_aspect import resolve_routes
    from app.logs import configure_logging
    from app.startup import load_registry_of, prepare_database

    configure_logging()
    # what every child checks at its start (create_app): a bad route stops here, once, instead of N crash loops
    resolve_routes(settings, load_registry_of(settings))
    url, embedded = prepare_database(settings)
    metrics_dir = Path(tempfile.mkdtemp(prefix="metaledger-metrics-"))
    activity_file = create_activity_file()
    # Every child reads these: the database this process resolved (and migrated), no second first-start token, the
    # shared metrics directory. Settings given on the command line travel the same way.
    os.environ.update(
        {
            "METALEDGER_DATABASE_URL": url,
            "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
            "METALEDGER_AUTH_BOOTSTRAP_ADMIN_TOKEN": "false",
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            SUPERVISOR_PID_ENV: str(os.getpid()),  # children stop if this process is killed (app.workers)
            ACTIVITY_FILE_ENV: str(activity_file),  # who wrote lately, for write admission's duty cycle
        }
    )
    background = BackgroundProcess()
    background.start()
    log.info("serving", extra={"workers": workers, "host": host, "port": port})
    try:
        os.environ["METALEDGER_BACKGROUND_IN_PROCESS"] = "false"
        config = uvicorn.Config(
            "app.main:app",
            host=host,
            port=port,
            workers=workers,
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=settings.shutdown_timeout_s,  # type: ignore[arg-type]  # uvicorn hints int; it only passes it on as asyncio.wait_for's timeout (a float)
            http=http_protocol(settings),  # type: ignore[arg-type]  # uvicorn hints a class but only calls it, as it does a partial of one
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        _ApiProcesses(config, [config.bind_socket()], settings.shutdown_drain_s).run()
    finally:
        background.stop()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        activity_file.unlink(missing_ok=True)
        if embedded is not None:
            embedded.stop()


def http_protocol(settings: Settings) -> partial[HeadLimitedProtocol]:
    """uvicorn's `http=` for every API process: requests' heads bounded (app.http_server)."""
    return partial(HeadLimitedProtocol, max_header_bytes=settings.max_header_bytes, max_headers=settings.max_headers)


class StartupRefused(Exception):
    """A setting the service cannot start with: `metaledger` prints one line naming it and exits (app.cli)."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"{setting}: {problem}")
        self.setting = setting


def check_database_url(settings: Settings) -> None:
    """METALEDGER_DATABASE_URL, when set, is an asyncpg URL of a database that answers."""
    url = settings.database_url
    if not url:
        return
    import asyncpg
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    setting = "METALEDGER_DATABASE_URL"
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StartupRefused(setting, "not a URL (postgresql+asyncpg://user:password@host:port/database)") from None
    if parsed.drivername != "postgresql+asyncpg":
        raise StartupRefused(
            setting, f"{parsed.drivername}:// is not supported: postgresql+asyncpg://user:password@host:port/database"
        )
    dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)

    async def connect() -> None:
        conn = await asyncpg.connect(dsn, timeout=settings.ready_timeout_s * 5)
        await conn.close()

    try:
        asyncio.run(connect())
    except (OSError, TimeoutError, asyncpg.PostgresError) as error:
        where = parsed.render_as_string(hide_password=True)
        raise StartupRefused(setting, f"cannot connect to {where}: {type(error).__name__}: {error}") from None


class _ApiProcesses(Multiprocess):
    """uvicorn's manager of the API processes, which on SIGTERM lets them drain (app.ops.drain) before the shared
    socket takes no new connection, and then waits for them."""

    def __init__(self, config, sockets, drain_s: float) -> None:
        super().__init__(config, sockets)
        self.drain_s = drain_s
        self._drain_until: float | None = None

    def handle_term(self) -> None:
        self._drain_until = time.monotonic() + self.drain_s
        super().handle_term()

    def terminate_all(self) -> None:
        super().terminate_all()  # SIGTERM each: it drains (or it already is: the process group's SIGTERM)
        if self._drain_until is not None:  # not on SIGINT: uvicorn's immediate stop
            time.sleep(max(0.0, self._drain_until - time.monotonic()))
        for sock in self.sockets:
            refuse_new_connections(sock)  # the API processes answer what the kernel accepted, then exit


class BackgroundProcess:
    """The background workers in a process of their own, restarted (after a pause) whenever it exits until `stop`."""

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._process: multiprocessing.process.BaseProcess | None = None
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        self._spawn()
        self._watcher = threading.Thread(target=self._watch, name="background-watch", daemon=True)
        self._watcher.start()

    def _spawn(self) -> None:
        self._process = self._context.Process(target=run_background, name="metaledger-background", daemon=False)
        self._process.start()

    def _watch(self) -> None:
        while not self._stopping.is_set():
            process = self._process
            if process is not None:
                process.join(timeout=0.5)
                if process.exitcode == 0:  # it was told to stop (a Ctrl-C reaches the whole process group)
                    return
                if process.exitcode is not None and not self._stopping.is_set():
                    log.error("the background process exited; restarting it", extra={"exitcode": process.exitcode})
                    if self._stopping.wait(BACKGROUND_RESTART_PAUSE_S):
                        return
                    self._spawn()

    def stop(self, timeout: float = 15) -> None:
        self._stopping.set()
        process = self._process
        if process is None or process.pid is None or process.exitcode is not None:  # none started, or exited
            return
        # SIGINT: the workers finish their batch and stop (SIGTERM, the process group's, is for the API processes)
        os.kill(process.pid, signal.SIGINT)
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join(5)


def run_standalone(make_worker, stop_on: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
    """A process of background work: `make_worker(settings, engine, sessionmaker, codec).run(stop)` until one of
    `stop_on` (or, under `serve --workers N`, until the supervisor is gone). `metaledger relay` and `consume-*` run one
    worker this way; the background process of `serve --workers N` runs all of them (`run_background`)."""
    check_database_url(get_settings())
    from uvicorn.loops.auto import auto_loop_factory

    # the API processes' event loop (uvicorn's auto: uvloop, which uvicorn[standard] installs): asyncio's own loop
    # spent ~15 % of the background process's CPU reading the change logs' rows off asyncpg's sockets
    with asyncio.Runner(loop_factory=auto_loop_factory()) as runner:
        runner.run(_standalone(make_worker, stop_on))


async def _standalone(make_worker, stop_on: tuple[signal.Signals, ...]) -> None:
    from app.avro.wire import ValueCodec
    from app.db import create_engine, create_sessionmaker
    from app.logs import configure_logging
    from app.schema_registry import make_registry_client
    from app.startup import resolve_database_url

    configure_logging()
    settings = get_settings()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        if sig in stop_on:
            loop.add_signal_handler(sig, stop.set)
        else:
            signal.signal(sig, signal.SIG_IGN)
    orphan_watch = asyncio.create_task(follow_supervisor(stop.set))
    engine = create_engine(resolve_database_url(settings), settings.db_pool_size, settings.db_pool_timeout_s)
    schema_registry = make_registry_client(settings, engine)
    codec = ValueCodec(settings, schema_registry)  # one per process: Kafka values encoded and decoded with it
    try:
        await make_worker(settings, engine, create_sessionmaker(engine), codec).run(stop)
    finally:
        orphan_watch.cancel()
        await schema_registry.aclose()
        await engine.dispose()


def run_background() -> None:
    """The background process: every background worker of this configuration until SIGINT, which the supervisor
    sends once the API processes are gone (they may still be writing while they drain after a SIGTERM)."""
    os.nice(BACKGROUND_NICENESS)
    run_standalone(_EveryBackgroundWorker, stop_on=(signal.SIGINT,))


class _EveryBackgroundWorker:
    """What `Background` runs inside a single-process service, as one worker of its own process."""

    def __init__(self, settings: Settings, engine, sessionmaker, codec) -> None:
        self.settings, self.engine, self.sessionmaker, self.codec = settings, engine, sessionmaker, codec

    async def run(self, stop: asyncio.Event) -> None:
        from app.background import Background
        from app.ingest.gateway import IngestGateway
        from app.search.service import SearchRuntime
        from app.startup import build_write_service

        writer = build_write_service(self.settings)
        search = SearchRuntime.create(self.settings, writer.registry, self.engine)
        await search.start(force=True)
        background = Background()
        # The consumers apply what they read (never queue it) as the system actor, as in a single process.
        await background.start(
            self.settings, self.engine, self.sessionmaker, IngestGateway(writer, search), search, self.codec
        )
        log.info("background workers started", extra={"workers": [type(w).__name__ for w in background.workers]})
        try:
            await stop.wait()
        finally:
            await background.close()
            await search.close()
