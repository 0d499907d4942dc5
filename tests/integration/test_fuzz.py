"""Schemathesis over the committed spec (tests/fuzz.py) against a real metaledger process with a bearer token: no
server error, no undocumented status, no schema-violating response. A fixed seed and one round over the operations
(the same cases on every machine); `bench/fuzz.py` runs every operation for longer."""

from __future__ import annotations

import asyncio

from app.embedded_pg import free_port
from tests.fuzz import ci_path_filter, fuzz
from tests.processes import service_token, start_service, stop_process, wait_healthy

# GET /openapi/v1/events/poll long-polls for a first event, 10 s when pollTimeoutSeconds is absent (up to 60 s when a
# large one is generated), and the fuzzed service has no event to give: every case of it would spend that much of the
# run's time budget waiting. Schemathesis (SCHEMATHESIS_HOOKS) sends its cases with no wait (pollTimeoutSeconds=0: the
# events there are, at once); the parameter's other generated values (negative, not a number) go as generated.
POLL_WAIT_HOOK = """
import schemathesis

MAX_WAIT_S = 0


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    if case.operation.path != "/openapi/v1/events/poll":
        return
    query = case.query if case.query is not None else {}
    wait = query.get("pollTimeoutSeconds")
    if wait is None or (str(wait).isdigit() and int(wait) > MAX_WAIT_S):
        query["pollTimeoutSeconds"] = MAX_WAIT_S
        case.query = query
"""


async def test_schemathesis_finds_no_server_error_and_no_undocumented_status(database_url, tmp_path, monkeypatch):
    hooks = tmp_path / "poll_wait_hook.py"
    hooks.write_text(POLL_WAIT_HOOK)
    monkeypatch.setenv("SCHEMATHESIS_HOOKS", str(hooks))  # read by the schemathesis process tests.fuzz starts
    env = {
        "METALEDGER_DATABASE_URL": database_url,
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
        "METALEDGER_KAFKA_BOOTSTRAP_SERVERS": "",
        "METALEDGER_ACCESS_LOG": "false",
    }
    port = free_port()
    service = start_service(env, port)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", process=service)
        token = await asyncio.to_thread(service_token, env)
        run = await asyncio.to_thread(
            fuzz,
            f"http://127.0.0.1:{port}",
            token,
            seed=20261124,
            max_examples=1,
            # one round (~130 cases, 20-40 s): a time budget made schemathesis repeat the fuzzing phase over every
            # operation until it was spent (80 s, 400-700 cases by the machine's speed), new random values of what
            # the first round covers
            max_time_s=None,
            path_regex=ci_path_filter(),
            report_dir=tmp_path,
        )
    finally:
        stop_process(service)
    # every selected operation reached, each with its examples or a generated case at least
    selected, tested = run.operations
    assert selected >= 100 and tested == selected and run.generated >= selected, run.summary
    assert run.returncode == 0, run.failures + run.summary
