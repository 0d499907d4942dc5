"""Sign-in sessions of the web view: a browser signs in with a metaledger token once, and its session cookie stands
for that token's principal afterwards (migration 0016, `web_session`).

The cookie holds 32 random bytes; the table holds their SHA-256, so neither a copy of the table nor a log of its
queries signs anyone in. A session lives at most `SESSION_LIFETIME`, never longer than its token, and ends as soon as
its token is revoked: every lookup joins `auth_token`, so a revocation ends it at once (not after the token cache's
`AUTH_CACHE_SECONDS`, which applies to bearer requests)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request

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
