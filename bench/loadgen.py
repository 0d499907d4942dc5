"""An open-loop HTTP load generator: requests are scheduled at a fixed rate and their latency is counted from the
scheduled send time, not from when a connection became free (no coordinated omission: a server that stalls is
charged for every request it made wait).

The client is a few lines of asyncio over keep-alive HTTP/1.1 connections, so that the generator costs little of
the CPU it shares with the service (httpx spends ~10x more per request).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit


class HttpConnection:
    """One keep-alive HTTP/1.1 connection; `request` returns (status, body). Responses must carry Content-Length
    (every metaledger answer does)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes, dict[str, str]]:
        if self.reader is not None and self.reader.at_eof():
            # the server closed it while it sat idle (uvicorn's keep-alive timeout is 5 s, and at low rates a
            # connection of the pool waits longer than that): a new one, or the request fails without being sent
            self.close()
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        response_headers: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            response_headers[name.strip().lower()] = value.strip()
        payload = await self.reader.readexactly(int(response_headers.get("content-length", "0")))
        if response_headers.get("connection", "").lower() == "close":
            self.close()
        return status, payload, response_headers

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass
class StepResult:
    offered_rate: float
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)  # of the requests that answered 2xx
    errors: Counter = field(default_factory=Counter)  # "429", "500", "timeout", "ConnectionError", ...
    sent: int = 0
    behind_ms: float = 0.0  # how late the generator itself was at its worst (0 when it kept up)

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def ok(self) -> int:
        return len(self.latencies_ms)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


# A request to send: (method, path, body) for the n-th request of a step.
RequestFactory = Callable[[int], tuple[str, str, bytes]]


async def open_loop(
    base: str,
    headers: dict[str, str],
    rate: float,
    seconds: float,
    make_request: RequestFactory,
    connections: int = 128,
    timeout_s: float = 10.0,
) -> StepResult:
    """Send `rate` requests/s for `seconds` on a schedule; each request waits for a free connection (of
    `connections`) if need be, and its latency runs from its scheduled time to its complete response."""
    url = urlsplit(base)
    result = StepResult(rate, seconds)
    queue: asyncio.Queue[tuple[float, int] | None] = asyncio.Queue()
    pool = [HttpConnection(url.hostname or "127.0.0.1", url.port or 80) for _ in range(connections)]
    headers = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "host")}

    async def worker(conn: HttpConnection) -> None:
        while (item := await queue.get()) is not None:
            scheduled, n = item
            method, path, body = make_request(n)
            try:
                status, payload, _ = await asyncio.wait_for(conn.request(method, path, body, headers), timeout_s)
            except TimeoutError:
                conn.close()
                result.errors["timeout"] += 1
                continue
            except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as error:
                conn.close()
                result.errors[type(error).__name__] += 1
                continue
            if 200 <= status < 300:
                result.latencies_ms.append((time.perf_counter() - scheduled) * 1000)
            else:
                result.errors[str(status)] += 1

    workers = [asyncio.create_task(worker(conn)) for conn in pool]
    total = int(rate * seconds)
    start = time.perf_counter() + 0.05
    for n in range(total):
        scheduled = start + n / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            result.behind_ms = max(result.behind_ms, -delay * 1000)
        queue.put_nowait((scheduled, n))
        result.sent += 1
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    for conn in pool:
        conn.close()
    return result


async def closed_loop(
    base: str,
    headers: dict[str, str],
    clients: int,
    requests_per_client: int,
    make_request: RequestFactory,
    timeout_s: float = 120.0,
) -> tuple[float, Counter]:
    """`clients` connections each sending `requests_per_client` requests back to back: (elapsed seconds, errors)."""
    url = urlsplit(base)
    errors: Counter = Counter()

    async def client(c: int) -> None:
        conn = HttpConnection(url.hostname or "127.0.0.1", url.port or 80)
        try:
            for i in range(requests_per_client):
                method, path, body = make_request(c * requests_per_client + i)
                status, payload, _ = await asyncio.wait_for(conn.request(method, path, body, headers), timeout_s)
                if status >= 300:
                    errors[str(status)] += 1
                    if len(errors) == 1 and errors[str(status)] == 1:
                        print(f"  first error: {status} {payload[:300]!r}")
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return time.perf_counter() - started, errors
