"""Sign-in sessions of the web view: a browser signs in with a metaledger token once, and its session cookie stands
for that token's principal afterwards (migration 0016, `web_session`).

The cookie holds 32 random bytes; the table holds their SHA-256, so neither a copy of the table nor a log of its
queries signs anyone in. A session lives at most `SESSION_LIFETIME`, never longer than its token, and ends as soon as
its token is revoked: every lookup joins `auth_token`, so a revocation ends it at once (not after the token cache's
`AUTH_CACHE_SECONDS`, which applies to bearer requests).

Sign-ins are throttled (`SignInThrottle`, migration 0017): after ADDRESS_FAILURES wrong tokens from one client address,
or TOKEN_FAILURES for one token's signed part, within SIGN_IN_WINDOW, that address's (that token's) sign-ins are
refused with 429 and Retry-After until the window ends, counted in Postgres for every process."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request

from app.audit import repository as audit_log
from app.audit.model import WEB_SIGN_IN, Entry
from app.auth.model import Principal, Role

SESSION_COOKIE = "metaledger_session"
LOGIN_COOKIE = "metaledger_login"  # the sign-in form's CSRF token: there is no session yet to hold it
SESSION_LIFETIME = timedelta(hours=12)


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def same_secret(expected: str, given: str | None) -> bool:
    """In constant time, so that the comparison tells an attacker nothing of how much of a guess was right."""
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


@dataclass(frozen=True, slots=True)
class WebSession:
    principal: Principal
    csrf_token: str
    expires_at: datetime


def session_store(request: Request) -> SessionStore:
    """The store on the process's database engine (app.main's lifespan makes it)."""
    return SessionStore(request.app.state.engine)


class SessionStore:
    """All SQL of `web_session`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def open(self, principal: Principal, token_expires_at: datetime | None) -> tuple[str, WebSession]:
        """A new session for `principal`: the cookie's value and the session."""
        session_id, csrf = new_secret(), secrets.token_hex(32)
        expires_at = datetime.now(UTC) + SESSION_LIFETIME
        if token_expires_at is not None:
            expires_at = min(expires_at, token_expires_at)
        async with self.engine.begin() as connection:
            # the ones that ended are removed here, where sessions are made, rather than by a background job
            await connection.execute(text("DELETE FROM web_session WHERE expires_at < now() - interval '1 day'"))
            await connection.execute(
                text(
                    "INSERT INTO web_session (id_hash, token_id, actor, role, csrf_token, expires_at) "
                    "VALUES (:id_hash, :token_id, :actor, :role, :csrf, :expires_at)"
                ),
                {
                    "id_hash": _hash(session_id),
                    "token_id": principal.token_id,
                    "actor": principal.actor,
                    "role": principal.role.label,
                    "csrf": csrf,
                    "expires_at": expires_at,
                },
            )
            await audit_log.record_on(connection, Entry(WEB_SIGN_IN, principal.actor, principal.token_id, "web"))
        return session_id, WebSession(principal, csrf, expires_at)

    async def find(self, session_id: str) -> WebSession | None:
        """The session, while it and its token are valid."""
        if not session_id or len(session_id) > 100:
            return None
        async with self.engine.connect() as connection:
            row = (
                await connection.execute(
                    text(
                        "SELECT s.token_id, s.actor, s.role, s.csrf_token, s.expires_at FROM web_session s "
                        "LEFT JOIN auth_token t ON t.id = s.token_id "
                        "WHERE s.id_hash = :id_hash AND s.expires_at > now() AND (s.token_id IS NULL OR "
                        "(t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now())))"
                    ),
                    {"id_hash": _hash(session_id)},
                )
            ).one_or_none()
        if row is None:
            return None
        via = "token" if row.token_id is not None else "disabled"
        return WebSession(Principal(row.actor, Role.parse(row.role), row.token_id, via), row.csrf_token, row.expires_at)

    async def close(self, session_id: str) -> None:
        async with self.engine.begin() as connection:
            await connection.execute(text("DELETE FROM web_session WHERE id_hash = :h"), {"h": _hash(session_id)})


# --- sign-in throttling

SIGN_IN_WINDOW = timedelta(minutes=10)
ADDRESS_FAILURES = 10  # wrong tokens from one client address in a window, then its sign-ins wait
TOKEN_FAILURES = 5  # wrong tokens sharing one token's signed part (its header and claims) in a window


@dataclass(frozen=True, slots=True)
class ThrottleKey:
    """One counter of failed sign-ins: its key's SHA-256 (a wrong token may be a real one mistyped: it is never
    stored) and how many failures a window allows."""

    key_hash: str
    limit: int


def client_address(host: str | None) -> str:
    """The address a client's failures count against: an IPv6 client's /64 (one host has a whole /64 to pick
    addresses from), an IPv4 address as it is."""
    if not host:
        return "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def sign_in_keys(host: str | None, token: str) -> tuple[ThrottleKey, ThrottleKey]:
    """The counters a sign-in with `token` from `host` is counted on: the client's address, and the token's signed
    part (a JWT without its signature: guesses at one token's signature from many addresses). Another person's
    sign-ins are refused only from the same address, or with a token whose claims (its random id among them) only
    that token's holder knows."""
    address = _hash("address:" + client_address(host))
    signed = token.rpartition(".")[0] or token
    return ThrottleKey(address, ADDRESS_FAILURES), ThrottleKey(_hash("token:" + signed), TOKEN_FAILURES)


class SignInThrottle:
    """Failed sign-ins counted in Postgres (`web_sign_in_failure`, migration 0017), so that every worker of a
    `serve --workers N` and every process on the database counts the same failures. A counter is a fixed window:
    it starts at its first failure and ends SIGN_IN_WINDOW later."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def wait(self, keys: tuple[ThrottleKey, ...]) -> int | None:
        """Seconds until a sign-in counted on `keys` is taken again, or None when it is taken now."""
        async with self.engine.connect() as connection:
            seconds = (
                await connection.execute(
                    text(
                        "SELECT max(extract(epoch FROM window_start + make_interval(secs => :window) - now())) "
                        "FROM web_sign_in_failure f JOIN unnest(CAST(:hashes AS text[]), CAST(:limits AS int[])) "
                        "AS k(key_hash, lim) ON k.key_hash = f.key_hash "
                        "WHERE f.failures >= k.lim AND f.window_start > now() - make_interval(secs => :window)"
                    ),
                    {
                        "hashes": [k.key_hash for k in keys],
                        "limits": [k.limit for k in keys],
                        "window": SIGN_IN_WINDOW.total_seconds(),
                    },
                )
            ).scalar_one()
        return None if seconds is None else max(1, math.ceil(seconds))

    async def failed(self, keys: tuple[ThrottleKey, ...]) -> None:
        """Count a failure on each key (a window that ended starts again)."""
        async with self.engine.begin() as connection:
            window = {"window": SIGN_IN_WINDOW.total_seconds()}
            # the counters whose window ended go here, where failures are counted, rather than by a background job
            await connection.execute(
                text("DELETE FROM web_sign_in_failure WHERE window_start <= now() - make_interval(secs => :window)"),
                window,
            )
            await connection.execute(
                text(
                    "INSERT INTO web_sign_in_failure AS f (key_hash, window_start, failures) "
                    "SELECT key_hash, now(), 1 FROM unnest(CAST(:hashes AS text[])) AS k(key_hash) "
                    "ON CONFLICT (key_hash) DO UPDATE SET "
                    "failures = CASE WHEN f.window_start <= now() - make_interval(secs => :window) THEN 1 "
                    "ELSE f.failures + 1 END, "
                    "window_start = CASE WHEN f.window_start <= now() - make_interval(secs => :window) THEN now() "
                    "ELSE f.window_start END"
                ),
                {"hashes": [k.key_hash for k in keys], **window},
            )

    async def forget(self, key: ThrottleKey) -> None:
        """A sign-in succeeded with this token: its own mistyped attempts are forgotten (never an address's: an
        attacker's own valid token would reset its address's count)."""
        async with self.engine.begin() as connection:
            await connection.execute(text("DELETE FROM web_sign_in_failure WHERE key_hash = :h"), {"h": key.key_hash})


def sign_in_throttle(request: Request) -> SignInThrottle:
    return SignInThrottle(request.app.state.engine)
