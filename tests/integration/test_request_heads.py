"""A request's head is bounded in a real `metaledger serve` (app.http_server): a 100 MB header, streamed over a raw
socket without credentials, is answered 431 as soon as it passes METALEDGER_MAX_HEADER_BYTES, a concurrent request
is not held up, and the API process's memory does not grow; too many header lines are a 431 too. Both `--workers 1`
(uvicorn in the process itself) and `--workers 2` (uvicorn's supervisor of API processes) run the protocol."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time

import httpx
import psutil
import pytest

from app.embedded_pg import free_port
from tests.processes import start_service, stop_process, wait_healthy

HEADER_MB = 100
CHUNK = 1 << 20


def rss_mb(service: subprocess.Popen) -> float:
    """The resident memory of the process answering: the serve process, or its API processes (not the background)."""
    parent = psutil.Process(service.pid)
    processes = [parent, *(c for c in parent.children() if "background" not in " ".join(c.cmdline()))]
    return sum(p.memory_info().rss for p in processes) / 2**20


def send_huge_header(port: int) -> tuple[bytes, float, int]:
    """`GET /health` with one X-Big header of up to HEADER_MB MB, streamed until an answer arrives: the answer's
    first bytes, the seconds it took and the bytes sent."""
    started = time.monotonic()
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sock.setblocking(False)
        chunk = b"a" * CHUNK
        while sent < HEADER_MB * CHUNK:
            try:
                answer = sock.recv(4096)
                return answer, time.monotonic() - started, sent
            except BlockingIOError:
                pass
            try:
                sent += sock.send(chunk)
            except BlockingIOError:
                time.sleep(0.001)
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.setblocking(True)
        sock.settimeout(5)
        return sock.recv(4096), time.monotonic() - started, sent


def send_whole_head(port: int, header_bytes: int) -> bytes:
    """`GET /health` with headers of `header_bytes` bytes in all (4 KB each), sent in one write: the answer's
    first bytes."""
    lines = b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 4000) for i in range(header_bytes // 4000))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + lines + b"Connection: close\r\n\r\n")
        sock.settimeout(10)
        return sock.recv(4096)


@pytest.mark.parametrize("workers", [1, 2])
async def test_huge_and_many_headers_are_refused_at_once(make_database, migrated_template, workers: int):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        "METALEDGER_DATABASE_URL": make_database(template=migrated_template),
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
    }
    service = start_service(env, port, workers=workers, new_session=True)
    try:
        await wait_healthy(base, 90, service)
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            for _ in range(20):  # warm: every API process has answered, its memory settled
                assert (await http.get("/health")).status_code == 200
            before = rss_mb(service)

            huge = asyncio.create_task(asyncio.to_thread(send_huge_header, port))
            beside = []
            while not huge.done():  # requests beside it are answered promptly all along
                started = time.monotonic()
                assert (await http.get("/health")).status_code == 200
                beside.append(time.monotonic() - started)
                await asyncio.sleep(0.01)
            answer, took, sent = await huge
            assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
            assert b"METALEDGER_MAX_HEADER_BYTES" in answer
            assert took < 1.0 and sent < 8 * CHUNK, (took, sent)
            assert max(beside) < 0.5, beside
            assert rss_mb(service) - before < 20, (before, rss_mb(service))

            many = {f"x-h{i}": "v" for i in range(101)}
            refused = await http.get("/health", headers=many)
            assert refused.status_code == 431 and "METALEDGER_MAX_HEADERS" in refused.text
            assert (await http.get("/health", headers=dict(list(many.items())[:90]))).status_code == 200

            # A head that arrives whole, in one read, is measured as it is parsed: 160 KB is refused (it passed
            # when only the reads after the first were counted); a head just under the limit is served.
            whole = await asyncio.to_thread(send_whole_head, port, 160_000)
            assert whole.startswith(b"HTTP/1.1 431 ") and b"METALEDGER_MAX_HEADER_BYTES" in whole, whole[:200]
            under = await asyncio.to_thread(send_whole_head, port, 60_000)
            assert under.startswith(b"HTTP/1.1 200 "), under[:200]
    finally:
        stop_process(service)
