"""Run in the client's virtualenv (tests/client/conftest.py: `DataHubClient`): imports DataHub's CLI once, then forks
one child per request read from stdin, so a `datahub` command or a client script does not pay the package's import
(seconds of CPU) again. A child is a process of its own, as `datahub ...` or `python -c` would be: its arguments, its
stdin (/dev/null), stdout and stderr (the request's files), its own exit (atexit handlers, thread joins, flushes).

Request, one JSON line: {"argv": [...]} (the `datahub` console script's arguments) or {"code": "..."} (Python, run
as `python -c` runs it), with "stdout", "stderr" (file paths) and "timeout" (seconds). Answer, one JSON line:
{"returncode": n}, or {"timeout": true} once the child was killed for running longer.

Standalone on purpose: the client's virtualenv has none of metaledger's modules.
"""

import gc
import json
import os
import select
import signal
import sys

sys.path[0] = ""  # as under `python -c`: this directory's modules are not the client's
# What the requests share: the CLI imports the SDK and the graph client; each command's upgrade check, aiohttp.
import aiohttp  # noqa: E402, F401
import datahub.entrypoints  # noqa: E402

# The imported objects move out of the collector's reach: a child's collections (its exit's included) would otherwise
# walk them all, copying every page of the parent it touches (2-3 s of a child's exit, against 0.3 s).
gc.freeze()

DATAHUB = os.path.join(os.path.dirname(sys.executable), "datahub")


def serve() -> dict:
    """Answers requests until stdin closes (then exits); returns, in a child, the request the child is to run."""
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return request
        pidfd = os.pidfd_open(pid)
        ready, _, _ = select.select([pidfd], [], [], request["timeout"])
        os.close(pidfd)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)} if ready else {"timeout": True}), flush=True)
    sys.exit(0)


def redirect(request: dict) -> None:
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # not the server's reader of requests, which may hold buffered input


request = serve()
redirect(request)
if "argv" in request:  # what the console script (bin/datahub) does
    sys.argv = [DATAHUB, *request["argv"]]
    sys.path[0] = os.path.dirname(DATAHUB)
    sys.exit(datahub.entrypoints.main())
sys.argv = ["-c"]
exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
