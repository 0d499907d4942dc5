"""A setting `metaledger` cannot start with is one line on stderr naming the setting, exit code 78, no traceback.

Each case is its own CLI process; they run side by side (each spends its time importing and checking, not waiting)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from app.embedded_pg import free_port
from tests.processes import ROOT, service_env

METALEDGER = str(Path(sys.executable).with_name("metaledger"))

BAD_SETTINGS = [  # (setting, value, what the line says, serve's --workers)
    ("METALEDGER_EVENTS_V5_ROUTES", "garbage", "cannot be parsed", "1"),
    ("METALEDGER_EVENTS_V5_ROUTES", "garbage", "cannot be parsed", "2"),  # the supervisor checks before its children
    (
        "METALEDGER_EVENTS_V5_ROUTES",
        '[{"entityTypes": ["nope"], "aspects": ["x"]}]',
        "matches no entity/aspect pair",
        "1",
    ),
    ("METALEDGER_DATABASE_URL", "garbage", "not a URL", "2"),
    ("METALEDGER_DATABASE_URL", "mysql://u@localhost/db", "not supported", "1"),
    ("METALEDGER_REGISTRY_PATH", "/nonexistent/entity_registry.yml", "does not exist", "2"),
    ("METALEDGER_DB_POOL_SIZE", "many", "valid integer", "1"),
    ("METALEDGER_SHUTDOWN_DRAIN_S", "-1", "greater than or equal to 0", "1"),
]


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [METALEDGER, *argv], cwd=ROOT, env=service_env(env), capture_output=True, text=True, timeout=180
    )


def test_serve_refuses_a_bad_setting_in_one_line(database_url):
    def attempt(case):
        setting, value, _, workers = case
        env = {"METALEDGER_DATABASE_URL": database_url, "METALEDGER_APPLY_MIGRATIONS_ON_START": "false", setting: value}
        return _run(["serve", "--port", str(free_port()), "--workers", workers], env)

    with ThreadPoolExecutor(len(BAD_SETTINGS)) as pool:
        results = list(pool.map(attempt, BAD_SETTINGS))
    for (setting, value, problem, workers), done in zip(BAD_SETTINGS, results):
        case = f"{setting}={value!r} --workers {workers}"
        assert done.returncode == 78, (case, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"metaledger cannot start: {setting}"), (case, done.stderr)
        assert problem in lines[0] and "Traceback" not in done.stderr, (case, done.stderr)


def test_an_unreachable_database_is_refused_in_one_line_by_every_command_that_starts():
    url = f"postgresql+asyncpg://u:secret@127.0.0.1:{free_port()}/db"
    commands = (["serve", "--workers", "1"], ["relay"], ["token", "list"], ["db", "upgrade"])
    with ThreadPoolExecutor(len(commands)) as pool:
        results = list(pool.map(lambda argv: _run(argv, {"METALEDGER_DATABASE_URL": url}), commands))
    for argv, done in zip(commands, results):
        assert done.returncode == 78, (argv, done.stderr)
        assert done.stderr.strip().splitlines() == [done.stderr.strip()], (argv, done.stderr)
        assert "METALEDGER_DATABASE_URL: cannot connect" in done.stderr and "secret" not in done.stderr, done.stderr
