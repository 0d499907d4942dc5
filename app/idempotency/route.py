"""`Idempotency-Key` on a write route, declared once: `@idempotent` on the route's handler.

With the header, the request is claimed for (caller, key) in the `idempotency_key` table (app.idempotency.store)
before the handler runs: the same request (method, path, query and body: a SHA-256 digest) answered within
METALEDGER_IDEMPOTENCY_WINDOW_S gets the stored reply again, byte for byte, with `Idempotency-Replayed: true`, and
writes nothing; the same key with another request is a 422 naming the key; the same request still in flight a 409
with `Retry-After`. A reply is kept when the handler answers (2xx, 4xx) or raises a client error (4xx, stored as the
error handler renders it); on a 5xx or any other failure the key is released (nothing is known to be written: the
write path answers the results when an interrupted COMMIT did commit, app.write.service), and on a cancelled request
it is left to its lease (the write may still commit). Without the header the route runs as before."""

from __future__ import annotations

import functools
import hashlib
import inspect
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, ParamSpec

import orjson
from fastapi import Depends, Header, Request, Response

from app.errors import Backpressure, Issue, MetaledgerError, PayloadTooLarge, ValidationFailed
from app.idempotency.commit import CLAIM
from app.idempotency.store import (
    MAX_STORED_REPLY_BYTES,
    Answered,
    Claimed,
    IdempotencyStore,
    InFlight,
    OtherRequest,
    Reply,
)

HEADER = "Idempotency-Key"
REPLAYED = "Idempotency-Replayed"
MAX_KEY_CHARS = 255
_PARAMETER = "idempotency_request"  # the parameter `idempotent` adds to its handler's signature
P = ParamSpec("P")


class KeyInFlight(Backpressure):
    status_code = 409
    error = "Conflict"


class KeyReused(MetaledgerError):
    status_code = 422
    error = "Unprocessable Content"


class AlreadyApplied(MetaledgerError):
    """The documented answer of a request applied within the window whose reply is not kept: lost (the process died
    after COMMIT, or the service could not learn the COMMIT's outcome) or over MAX_STORED_REPLY_BYTES."""

    status_code = 409
    error = "Conflict"

    def headers(self) -> dict[str, str]:
        return {REPLAYED: "true"}


@dataclass(frozen=True, slots=True)
class KeyedRequest:
    key: str
    digest: bytes
    store: IdempotencyStore


def _check_key(key: str) -> None:
    if not 1 <= len(key) <= MAX_KEY_CHARS or not all(" " <= c <= "~" for c in key):
        raise ValidationFailed(
            f"the {HEADER} header must be 1 to {MAX_KEY_CHARS} printable ASCII characters",
            [Issue("not a valid idempotency key", path=f"${HEADER}", expected=f"1–{MAX_KEY_CHARS} printable ASCII")],
        )


async def _keyed_request(
    request: Request,
    key: Annotated[
        str | None,
        Header(
            alias=HEADER,
            description=f"1–{MAX_KEY_CHARS} printable ASCII characters, chosen by the client per logical write: the "
            "same request again with the same key (within METALEDGER_IDEMPOTENCY_WINDOW_S) is answered with the "
            f"first reply, byte for byte, and `{REPLAYED}: true`, and writes nothing; another request with the key: "
            "422; while the first is still running: 409 with `Retry-After`",
        ),
    ] = None,
) -> KeyedRequest | None:
    """The key and the request's digest. The body is read here, bounded by MAX_REQUEST_BYTES as `read_json` bounds
    it, before the route's body declaration parses it: kept where Starlette keeps a body `request.body()` read
    (`_body`), which its `stream()` then yields to that declaration."""
    if key is None:
        return None
    _check_key(key)
    limit = request.app.state.settings.max_request_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is over the limit of {limit} bytes (METALEDGER_MAX_REQUEST_BYTES)")
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > limit:
            raise PayloadTooLarge(f"request body is over the limit of {limit} bytes (METALEDGER_MAX_REQUEST_BYTES)")
        body += chunk
    request._body = bytes(body)
    digest = hashlib.sha256()
    for part in (request.method.encode(), request.url.path.encode(), request.url.query.encode()):
        digest.update(len(part).to_bytes(8, "big") + part)
    digest.update(body)
    return KeyedRequest(key, digest.digest(), _store(request))


def _store(request: Request) -> IdempotencyStore:
    state = request.app.state
    settings = state.settings
    # A claim whose process died frees its key after the longest a write may run (the write deadline) and some slack
    lease_s = max(settings.write_deadline_ms / 1000, 10.0) + 5.0
    return IdempotencyStore(state.engine, float(settings.idempotency_window_s), lease_s)


def _replay(reply: Reply) -> Response:
    response = Response(reply.body, status_code=reply.status)
    response.raw_headers = [*reply.headers, (REPLAYED.lower().encode(), b"true")]
    return response


def _rendered(error: MetaledgerError) -> Reply:
    """A client error as app.main's handler renders it (the bytes a retry must get again)."""
    response = Response(
        orjson.dumps(error.to_json()), error.status_code, error.headers(), media_type="application/json"
    )
    return Reply(response.status_code, list(response.raw_headers), bytes(response.body))


def idempotent(handler: Callable[P, Awaitable[Response]]) -> Callable[P, Awaitable[Response]]:
    """The route honours `Idempotency-Key`. The handler returns a `Response` and takes its caller as `caller`
    (its `actor`: keys are the caller's own). The header is read, and the body digested, just before the route's body declaration
    (after its policy, which FastAPI solves first). FastAPI passes every parameter by name: the handler's signature
    becomes keyword-only, with the key's parameter in that place."""
    signature = inspect.signature(handler, eval_str=True)
    parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in signature.parameters.values()]
    at = next(
        (i for i, p in enumerate(parameters) if hasattr(_dependency_of(p), "request_body_schema")), len(parameters)
    )
    keyed = inspect.Parameter(
        _PARAMETER,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[KeyedRequest | None, Depends(_keyed_request)],
    )

    @functools.wraps(handler)
    async def run(**kwargs: Any) -> Response:
        keyed_request: KeyedRequest | None = kwargs.pop(_PARAMETER)
        if keyed_request is None:
            return await handler(**kwargs)  # type: ignore[call-arg]
        return await _run_once(kwargs["caller"].actor, keyed_request, lambda: handler(**kwargs))  # type: ignore[call-arg]

    run.__signature__ = signature.replace(parameters=[*parameters[:at], keyed, *parameters[at:]])  # type: ignore[attr-defined]
    return run  # type: ignore[return-value]


def _dependency_of(parameter: inspect.Parameter) -> Any:
    for meta in getattr(parameter.annotation, "__metadata__", ()):
        dependency = getattr(meta, "dependency", None)
        if dependency is not None:
            return dependency
    return None


async def _run_once(actor: str, keyed: KeyedRequest, write: Callable[[], Awaitable[Response]]) -> Response:
    store = keyed.store
    claim = await store.claim(actor, keyed.key, keyed.digest)
    if isinstance(claim, OtherRequest):
        raise KeyReused(
            f"the {HEADER} {keyed.key!r} was used with another request (method, path, query or body) within the "
            "idempotency window: use a new key for a new request",
            [Issue("key used with another request", path=f"${HEADER}", found=keyed.key)],
        )
    if isinstance(claim, InFlight):
        raise KeyInFlight(
            f"a request with the {HEADER} {keyed.key!r} is still running: retry after it is answered (its claim "
            f"lapses in {claim.lease_left_s} s at most, should its process have died)",
            [Issue("request with this key in flight", path=f"${HEADER}", found=keyed.key)],
        )
    if isinstance(claim, Answered):
        if claim.reply is None:
            raise AlreadyApplied(
                f"the request with the {HEADER} {keyed.key!r} was applied (committed) already; its reply is not kept "
                f"(lost with the request that wrote it, or over {MAX_STORED_REPLY_BYTES} bytes): read the written "
                "state",
                [Issue("already applied", path=f"${HEADER}", found=keyed.key)],
            )
        return _replay(claim.reply)
    assert isinstance(claim, Claimed)
    ref = (actor, keyed.key, claim.holder)
    token = CLAIM.set(ref)  # the write path marks it committed in the write's transaction (app.idempotency.commit)
    try:
        response = await write()
    except MetaledgerError as error:
        if error.status_code >= 500:
            await store.release(*ref)
        else:
            await _keep(store, ref, _rendered(error))
        raise
    except Exception:
        await store.release(*ref)
        raise
    finally:
        CLAIM.reset(token)
    body = getattr(response, "body", None)
    if response.status_code >= 500 or not isinstance(body, bytes):
        await store.release(*ref)
    else:
        await _keep(store, ref, Reply(response.status_code, list(response.raw_headers), body))
    return response


async def _keep(store: IdempotencyStore, ref: tuple[str, str, uuid.UUID], reply: Reply) -> None:
    if len(reply.body) <= MAX_STORED_REPLY_BYTES:
        await store.answer(*ref, reply)
    elif reply.status < 300:  # applied: a retry must not apply it again, though its reply is not kept
        await store.answer(*ref, None)
    else:  # a refusal wrote nothing: the retry may as well run again
        await store.release(*ref)
