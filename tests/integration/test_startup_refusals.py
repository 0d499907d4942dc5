"""A setting `metaledger` cannot start with is one line on stderr naming the setting, exit code 78, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.embedded_pg import free_port
from tests.processes import ROOT, service_env

METALEDGER = str(Path(sys.executable).with_name("metaledger"))


@pytest.mark.parametrize(("setting", "value", "problem"), [
    ("METALEDGER_EVENTS_V5_ROUTES", "garbage", "cannot be parsed"),
    ("METALEDGER_EVENTS_V5_ROUTES", '[{"entityTypes": ["nope"], "aspects": ["x"]}]', "matches no entity/aspect pair"),
    ("METALEDGER_DATABASE_URL", "garbage", "not a URL"),
    ("METALEDGER_DATABASE_URL", "mysql://u@localhost/db", "not supported"),
    ("METALEDGER_REGISTRY_PATH", "/nonexistent/entity_registry.yml", "does not exist"),
    ("METALEDGER_DB_POOL_SIZE", "many", "valid integer"),
    ("METALEDGER_SHUTDOWN_DRAIN_S", "-1", "greater than or equal to 0"),
])
@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_refuses_a_bad_setting_in_one_line(setting: str, value: str, problem: str, workers: str, database_url):
    env = {"METALEDGER_DATABASE_URL": database_url, "METALEDGER_APPLY_MIGRATIONS_ON_START": "false", setting: value}
    done = subprocess.run([METALEDGER, "serve", "--port", str(free_port()), "--workers", workers], cwd=ROOT,
                          env=service_env(env), capture_output=True, text=True, timeout=120)
    assert done.returncode == 78, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"metaledger cannot start: {setting}"), done.stderr
    assert problem in lines[0] and "Traceback" not in done.stderr


def test_an_unreachable_database_is_refused_in_one_line_by_every_command_that_starts():
    url = f"postgresql+asyncpg://u:secret@127.0.0.1:{free_port()}/db"
    for argv in (["serve", "--workers", "1"], ["relay"], ["token", "list"], ["db", "upgrade"]):
        done = subprocess.run([METALEDGER, *argv], cwd=ROOT, env=service_env({"METALEDGER_DATABASE_URL": url}),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 78, (argv, done.stderr)
        assert done.stderr.strip().splitlines() == [done.stderr.strip()], (argv, done.stderr)
        assert "METALEDGER_DATABASE_URL: cannot connect" in done.stderr and "secret" not in done.stderr, done.stderr
