"""Per-request operations, as one pure ASGI middleware (no BaseHTTPMiddleware: no extra task, no body wrapping):

- the request id: a sane incoming `X-Request-Id` (1-64 characters of `[A-Za-z0-9._:-]`) is kept, anything else is
  replaced by a generated one; it is set in `app.logs.REQUEST_ID` for the request's whole context (so every log line
  written while serving it carries `request_id`) and added to the response's headers;
- `metaledger_http_requests_total{route,method,status}` and `metaledger_http_request_duration_seconds{route,method}`,
  labelled with the matched route's template (`/openapi/v3/entity/{entityName}/{entityUrn}`), never the raw path;
  `unmatched` when no route matched (a 404 from the router);
- one INFO access line per request (`request_id`, `method`, `route`, `status`, `duration_ms`), on the logger
  `metaledger.access` (`METALEDGER_ACCESS_LOG=false` turns it off).

An exception that escapes the app is logged and answered here with a 500 carrying the request id, or a 503 with
Retry-After when a database fault is behind it (app.db_faults); it is not re-raised (the server would close the
connection), unless a response had already started.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from typing import Any

import orjson

from app.db_faults import DatabaseFault, classify, database_unavailable
from app.logs import REQUEST_ID
from app.ops.metrics import HTTP_DURATION, HTTP_REQUESTS, method_label

log = logging.getLogger("metaledger.access")

HEADER = b"x-request-id"
_SANE = re.compile(rb"[A-Za-z0-9._:\-]{1,64}")
_PREFIX = os.urandom(5).hex()  # per process: ids from several processes do not collide
_COUNTER = itertools.count(1)
UNMATCHED = "unmatched"
CLIENT_CLOSED = 499  # nginx's code for a request whose client went away before the response


def new_request_id() -> str:
    return f"{_PREFIX}-{next(_COUNTER):x}"


def route_template(scope: dict[str, Any]) -> str:
    """The template of the route that handled the request (a mount's path + `/{path}`), or `unmatched`."""
    route = scope.get("route")
    if route is None:
        return UNMATCHED
    return getattr(route, "path_format", None) or getattr(route, "path", None) or UNMATCHED


class OperationsMiddleware:
    def __init__(self, app: Any, *, metrics: bool = True, access_log: bool = True) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = access_log
        # (route, method, status) → (counter child, histogram child): labels() takes a lock and builds keys; a dict
        # lookup per request does not.
        self._series: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = None
        for name, value in scope["headers"]:
            if name == HEADER:
                if _SANE.fullmatch(value):
                    request_id = value.decode("ascii")
                break
        if request_id is None:
            request_id = new_request_id()
        token = REQUEST_ID.set(request_id)
        id_header = (HEADER, request_id.encode("ascii"))
        status = 0

        def send_with_id(message: dict[str, Any]):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), id_header]
            return send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as error:
            # Answered here and not re-raised: uvicorn closes the connection of an app that raises once a response
            # has started, and a keep-alive client then finds its next request unanswered. Re-raised only when a
            # response had already started (there is nothing left to answer with).
            if status != 0:
                raise
            log.exception("unhandled error", extra={"method": scope["method"], "route": route_template(scope)})
            if classify(error) is DatabaseFault.UNAVAILABLE:  # raised outside the app's handlers: still a 503
                unavailable = database_unavailable(error)
                status, extra = unavailable.status_code, [(b"retry-after", str(unavailable.retry_after_s).encode())]
                answer = {**unavailable.to_json(), "requestId": request_id}
            else:
                status, extra = 500, []
                answer = {
                    "error": "Internal Server Error",
                    "message": "an unexpected error; see the logs",
                    "issues": [],
                    "requestId": request_id,
                }
            body = orjson.dumps(answer)
            try:
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            id_header,
                            *extra,
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
            except Exception:  # noqa: BLE001 - the client is gone
                pass
        finally:
            if status == 0:
                status = CLIENT_CLOSED  # cancelled (the client went away) before any response
            elapsed = time.perf_counter() - start
            if self.metrics or self.access_log:
                self._record(scope, status, elapsed, request_id)
            REQUEST_ID.reset(token)

    def _record(self, scope: dict[str, Any], status: int, elapsed: float, request_id: str) -> None:
        route = route_template(scope)
        method = method_label(scope["method"])
        if self.metrics:
            key = (route, method, status)
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = (
                    HTTP_REQUESTS.labels(route, method, str(status)),
                    HTTP_DURATION.labels(route, method),
                )
            series[0].inc()
            series[1].observe(elapsed)
        if self.access_log and log.isEnabledFor(logging.INFO):
            log.info(
                "request",
                extra={"method": method, "route": route, "status": status, "duration_ms": round(elapsed * 1000, 2)},
            )
