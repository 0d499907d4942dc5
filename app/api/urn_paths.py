"""URNs with an encoded `/` in a path segment (`urn:li:dataset:(urn:li:dataPlatform:s3,bucket%2Fkey,PROD)`).

The server hands the router the percent-decoded path, so an s3 or gcs dataset's `%2F` became a `/` that splits the URN
across two segments: `GET /openapi/v2/timeline/v1/{urn}` and the v3 `{urn}` routes answered 404 (`datahub timeline`
of an s3 dataset failed). Rest.li's `{urn:path}` routes are unaffected, but a `:path` parameter cannot be followed by
another segment (`/{urn}/{aspectName}` would split at the URN's last `/`).

`EncodedSlashMiddleware` routes on the path decoded from `raw_path` with each `%2F` turned into NUL instead, which
no route template matches across; `restore_slashes`, the validator of every URN path parameter, turns it back into
`/` in the requests it rewrote (a context variable says so). A path that holds an encoded NUL of its own is left as
it was: its NUL stays an invalid URN (a 400 naming the parameter), never a `/`.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from urllib.parse import unquote

from starlette.types import ASGIApp, Receive, Scope, Send

ROUTING_SLASH = "\x00"
_ENCODED_SLASH = re.compile(rb"%2f", re.IGNORECASE)
_REWRITTEN: ContextVar[bool] = ContextVar("metaledger_encoded_slashes", default=False)


def restore_slashes(value: str) -> str:
    return value.replace(ROUTING_SLASH, "/") if _REWRITTEN.get() else value


class EncodedSlashMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path: bytes | None = scope.get("raw_path") if scope["type"] == "http" else None
        # some ASGI servers (httpx's test transport) leave the query on raw_path
        path = raw_path.split(b"?", 1)[0] if raw_path else b""
        if not (_ENCODED_SLASH.search(path) and b"%00" not in path):
            await self.app(scope, receive, send)
            return
        # in place: the router records the matched route on this scope, which the metrics middleware reads
        scope["path"] = unquote(_ENCODED_SLASH.sub(b"%00", path).decode("latin-1"))
        token = _REWRITTEN.set(True)
        try:
            await self.app(scope, receive, send)
        finally:
            _REWRITTEN.reset(token)
