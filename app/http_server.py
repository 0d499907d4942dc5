"""The HTTP/1.1 protocol `metaledger serve` runs: uvicorn's httptools protocol with bounds on a request's head (its
request line and headers), which uvicorn's has none of.

httptools keeps a header that has not ended by concatenating its pieces (quadratic in its length): one 100 MB
header stalled the worker 12 s and its memory stayed held. Here the head's bytes are counted as they arrive, and its
header lines as they are parsed; past METALEDGER_MAX_HEADER_BYTES or METALEDGER_MAX_HEADERS the request is answered
431 at once, before more is buffered, and the connection is closed. MAX_REQUEST_BYTES bounds bodies (app.api.http).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

# After a refusal the client may still be sending its head: what arrives is dropped for this long (the answer was
# written and the sending side shut) so that it reads the 431 instead of a reset, then the connection is closed.
LINGER_S = 1.0


class _HeadRefused(httptools.HttpParserError):
    """Raised from a parser callback: httptools stops parsing and uvicorn answers (send_400_response)."""


class HeadLimitedProtocol(HttpToolsProtocol):
    """uvicorn's HttpToolsProtocol refusing a request whose head is larger than `max_header_bytes` bytes or has
    more than `max_headers` header lines, with 431 naming the limit. Given to uvicorn as
    `functools.partial(HeadLimitedProtocol, max_header_bytes=..., max_headers=...)` (`http=`)."""

    def __init__(self, *args: Any, max_header_bytes: int, max_headers: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_header_bytes = max_header_bytes
        self._max_headers = max_headers
        self._head_open = False  # a request has begun and its headers have not ended
        self._head_bytes = 0
        self._header_lines = 0
        self._parsed_bytes = 0  # of the head being parsed: its request target and header lines
        self._refusal: str | None = None

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:  # lingering after the answer: dropped
            return
        head_was_open = self._head_open
        super().data_received(data)
        if self._head_open and self._refusal is None:
            # A chunk in which a head began counts from the next one: at most one read (256 KiB) more is parsed.
            if head_was_open:
                self._head_bytes += len(data)
            if self._head_bytes > self._max_header_bytes:
                self._refuse(self._head_too_large())

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_open, self._head_bytes, self._header_lines, self._parsed_bytes = True, 0, 0, 0

    def on_url(self, url: bytes) -> None:
        self._count_parsed(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_lines += 1
        if self._header_lines > self._max_headers:
            self._refusal = f"the request has more than {self._max_headers} headers (METALEDGER_MAX_HEADERS)"
            raise _HeadRefused(self._refusal)
        self._count_parsed(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def _count_parsed(self, size: int) -> None:
        """The head's parsed bytes (request target and header lines): a head that arrives whole in one read, which
        the count of reads above does not see (a 160 KB head passed it), is refused by this one."""
        self._parsed_bytes += size
        if self._parsed_bytes > self._max_header_bytes:
            self._refusal = self._head_too_large()
            raise _HeadRefused(self._refusal)

    def _head_too_large(self) -> str:
        return f"the request's headers are over {self._max_header_bytes} bytes (METALEDGER_MAX_HEADER_BYTES)"

    def on_headers_complete(self) -> None:
        self._head_open = False
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if self._refusal is None:
            super().send_400_response(msg)
        else:
            self._refuse(self._refusal)

    def _refuse(self, message: str) -> None:
        self._refusal = message
        body = message.encode("ascii")
        head = [STATUS_LINE[431]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: ",
            str(len(body)).encode(),
            b"\r\nconnection: close\r\n\r\n",
            body,
        ]
        self.logger.warning("request refused: %s", message)
        self.transport.write(b"".join(head))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)
