"""A serving process's stop on SIGTERM (a rolling restart, `docker stop`, Kubernetes): no connection closes without an
answer.

1. For `shutdown_drain_s` the process keeps accepting and answers every new request 503 with `Retry-After` and
   `Connection: close` (the probes `/ready`, which says not ready, and `/health` are served): a load balancer sees
   the process leave and sends no more, and a keep-alive client is told to reconnect, elsewhere. Requests already
   in flight go on.
2. The listening socket stops taking connections without dropping any: a filter on it makes the kernel drop new
   handshakes (the client's SYN is retransmitted and then refused once the socket is gone: nothing was sent), the
   connections the kernel already completed are accepted, and only then is the socket closed (closing it with
   connections queued resets them). Under `serve --workers N` the socket is shared: the supervisor sets the filter
   (app.supervisor) and each API process waits for it; a process stopped alone closes its copy and the others go on.
3. uvicorn's graceful shutdown: the connections still open are closed once their response is sent, in-flight
   requests get `shutdown_timeout_s`, then the lifespan's shutdown (the background workers give their relay lanes
   back).

SIGINT (Ctrl-C) is uvicorn's immediate graceful shutdown, as before.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from app.errors import ServiceUnavailable
from app.settings import Settings
from app.workers import SUPERVISOR_PID_ENV

log = logging.getLogger("metaledger")

SERVED_WHILE_DRAINING = frozenset({"/ready", "/health"})
_CLOSE = (b"connection", b"close")
# How long the last steps may take: the supervisor setting its filter (its signal loop ticks every 0.5 s), the
# accept queue emptying, a connection accepted at the very end sending its request.
SUPERVISOR_FILTER_WAIT_S = 2.0
ACCEPT_QUEUE_WAIT_S = 1.0
CONNECTIONS_WAIT_S = 1.0
_POLL_S = 0.01

# Linux: SO_ATTACH_FILTER / SO_GET_FILTER, a classic BPF program of one instruction, `ret #0` (keep no byte of any
# packet); TCP_INFO's tcpi_unacked is a listening socket's accept queue length.
_SO_FILTER = 26
_DROP_ALL = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0), 8)
_TCPI_UNACKED_OFFSET = 24


def refuse_new_connections(sock: Any) -> None:
    """Make the kernel drop every new handshake on listening socket `sock` (shared by every process holding it)."""
    sock.setsockopt(socket.SOL_SOCKET, _SO_FILTER, struct.pack("HL", 1, ctypes.addressof(_DROP_ALL)))


def refuses_new_connections(sock: Any) -> bool:
    return bool(sock.getsockopt(socket.SOL_SOCKET, _SO_FILTER, 8))  # one instruction (8 bytes) or nothing


def accept_queue(sock: Any) -> int:
    """Connections the kernel completed on listening socket `sock` that no process has accepted yet."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return struct.unpack_from("I", info, _TCPI_UNACKED_OFFSET)[0]


async def _until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)
    return True


class Drain:
    """One app's share of the stop: whether it is draining (read by `DrainMiddleware` and /ready), and the steps."""

    def __init__(self, settings: Settings) -> None:
        self.drain_s = settings.shutdown_drain_s
        self.draining = False
        self._server: Any = None  # the uvicorn.Server running this app, once `take_over_sigterm` found it
        self._readiness: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    def take_over_sigterm(self, readiness: Any) -> None:
        """When uvicorn serves this app (its server's handler is SIGTERM's, set before the lifespan starts), SIGTERM
        starts the drain, which hands over to that handler at its end. Elsewhere (a test client, another server)
        nothing changes."""
        import uvicorn

        handler = signal.getsignal(signal.SIGTERM)
        server = getattr(handler, "__self__", None)
        if not isinstance(server, uvicorn.Server) or threading.current_thread() is not threading.main_thread():
            return
        self._server, self._readiness, self._loop = server, readiness, asyncio.get_running_loop()
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._server is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._server.handle_exit)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # A signal handler runs between two bytecodes of the main thread, maybe inside the loop's select: the
        # threadsafe call wakes the loop. A second SIGTERM (the supervisor's, after the process group's) changes nothing.
        if not self.draining:
            self.draining = True
            assert self._loop is not None  # set with this handler (`take_over_sigterm`)
            self._loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        assert self._loop is not None  # called on it (`_on_sigterm`)
        self._task = self._loop.create_task(self._stop(), name="sigterm-drain")

    async def _stop(self) -> None:
        server = self._server
        self._readiness.stopping = (
            f"the process is stopping (SIGTERM): it answers 503 for {self.drain_s:g} s, "
            "then finishes the requests in flight and exits"
        )
        log.info("SIGTERM: draining", extra={"drain_s": self.drain_s})
        await asyncio.sleep(self.drain_s)
        listeners = [sock for listening in server.servers for sock in listening.sockets or ()]
        if os.environ.get(SUPERVISOR_PID_ENV):
            await _until(lambda: all(refuses_new_connections(s) for s in listeners), SUPERVISOR_FILTER_WAIT_S)
        else:
            for sock in listeners:
                refuse_new_connections(sock)
        await _until(lambda: not any(accept_queue(s) for s in listeners), ACCEPT_QUEUE_WAIT_S)
        for listening in server.servers:
            listening.close()
        # Each connection answers its next request 503 and closes: give the last ones accepted time to send theirs.
        await _until(lambda: not server.server_state.connections, CONNECTIONS_WAIT_S)
        log.info(
            "SIGTERM: no more connections are accepted; stopping",
            extra={"open_connections": len(server.server_state.connections)},
        )
        server.handle_exit(signal.SIGTERM, None)


class DrainMiddleware:
    """While the process drains: 503 with `Retry-After` and `Connection: close` for every new request but the probes,
    which are served and close their connection too."""

    def __init__(self, app: Any, drain: Drain) -> None:
        self.app = app
        self.drain = drain
        self._refusal = ServiceUnavailable("this process is stopping; retry (another process or instance answers)")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.drain.draining:
            await self.app(scope, receive, send)
            return
        if scope["path"] in SERVED_WHILE_DRAINING:

            async def send_closing(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
                await send(message)

            await self.app(scope, receive, send_closing)
            return
        body = orjson.dumps(self._refusal.to_json())
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            _CLOSE,
            *((name.lower().encode(), value.encode()) for name, value in self._refusal.headers().items()),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
