"""A request's read deadline: the one time budget every read of the request shares.

The budget is METALEDGER_READ_TIMEOUT_S from the request's arrival, shortened (never lengthened) by the caller's
`X-Metaledger-Deadline-Ms`; a value that is no whole number of milliseconds of at least 1 is a 400 naming the header.
`ReadDeadlineMiddleware` sets it once per request; the Postgres search backend runs each read statement under what
is left of it (`statement_timeout_ms`), and the lineage walk stops hop by hop when it runs out (app.search.lineage).

An answer cut by the budget says so: the surface marks it (`mark_partial`) and the response carries
`X-Metaledger-Partial: true` (GraphQL's lineage searches also set DataHub's `isPartial`). A budget exhausted before
anything was found is `DeadlineExceeded`: 504 with `Retry-After`.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import Backpressure, Issue, ValidationFailed

HEADER = "X-Metaledger-Deadline-Ms"
PARTIAL_HEADER = "X-Metaledger-Partial"
# what a lineage search keeps of the budget to complete its page (GraphQL's fields, serialising): its walk and the
# filtering of what it found stop at 400 ms of a 500 ms budget (app.search.across)
FINISH_SHARE = 0.2


class DeadlineExceeded(Backpressure):
    """The read's budget ran out before it found anything to answer with (retryable: a larger budget, or later)."""

    status_code = 504
    error = "Gateway Timeout"


# OpenAPI: what a route whose answer the budget can cut declares besides ERROR_RESPONSES
CUT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "headers": {
            PARTIAL_HEADER: {
                "description": f"`true`: the read's budget (METALEDGER_READ_TIMEOUT_S, or a shorter {HEADER}) cut "
                "the answer; it holds what was found within it",
                "schema": {"type": "string", "enum": ["true"]},
            }
        }
    },
    DeadlineExceeded.status_code: {
        "description": f"{DeadlineExceeded.error}: the read's budget ran out before it found anything (Retry-After)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    },
}


@dataclass(slots=True)
class ReadBudget:
    """One request's budget: it ends at `ends_at` (time.monotonic()); `partial` once an answer was cut by it."""

    ends_at: float
    seconds: float
    partial: bool = False

    def remaining_s(self) -> float:
        return self.ends_at - time.monotonic()

    def walk_remaining_s(self) -> float:
        """What is left for walking (and a lineage search's filtering): the budget less the share kept to finish
        the answer."""
        return self.remaining_s() - self.seconds * FINISH_SHARE


_BUDGET: ContextVar[ReadBudget | None] = ContextVar("read_budget", default=None)


def current() -> ReadBudget | None:
    """The budget of the request being served (None: outside a request, or no budget at all)."""
    return _BUDGET.get()


def statement_timeout_ms(default_s: float, *, walking: bool = False) -> int:
    """The `statement_timeout` of a read statement: what is left of the request's budget (of its walking share when
    `walking`), at least 1 ms (0 would be none); outside a request `default_s` (0: none)."""
    budget = _BUDGET.get()
    if budget is None:
        return int(default_s * 1000)
    left = budget.walk_remaining_s() if walking else budget.remaining_s()
    return max(int(left * 1000), 1)


def mark_partial() -> None:
    """The answer being built was cut by the budget: the response says so (`X-Metaledger-Partial`)."""
    budget = _BUDGET.get()
    if budget is not None:
        budget.partial = True


def _requested_ms(scope: Scope) -> int | None:
    """The caller's `X-Metaledger-Deadline-Ms`, or None when it sent none; a 400 naming it when it is no whole
    number of milliseconds of at least 1."""
    wanted = HEADER.lower().encode()
    raw = next((v for k, v in scope.get("headers", ()) if k == wanted), None)
    if raw is None:
        return None
    text = raw.decode("latin-1").strip()
    if not (text.isascii() and text.isdigit() and 0 < int(text) <= 86_400_000):
        raise ValidationFailed(
            f"{HEADER} must be a whole number of milliseconds, 1 to 86400000",
            [Issue("not a deadline", path=f"$.headers.{HEADER}", expected="1..86400000", found=text[:40])],
        )
    return int(text)


class ReadDeadlineMiddleware:
    """Sets each HTTP request's budget (`current`) before the routes run, and adds `X-Metaledger-Partial: true` to a
    response whose answer was cut by it."""

    def __init__(self, app: ASGIApp, *, read_timeout_s: float) -> None:
        self.app = app
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        try:
            requested = _requested_ms(scope)
        except ValidationFailed as error:
            refused = Response(orjson.dumps(error.to_json()), error.status_code, media_type="application/json")
            await refused(scope, receive, send)
            return
        limits = [s for s in (self.read_timeout_s or None, requested / 1000 if requested else None) if s]
        budget = ReadBudget(started + min(limits), min(limits)) if limits else None
        token = _BUDGET.set(budget)

        async def send_marked(message: Message) -> None:
            if message["type"] == "http.response.start" and budget is not None and budget.partial:
                message = {**message, "headers": [*message.get("headers", []), (b"x-metaledger-partial", b"true")]}
            await send(message)

        try:
            await self.app(scope, receive, send_marked)
        finally:
            _BUDGET.reset(token)
