"""Personal tokens at DataHub's `/settings/tokens`: a signed-in person lists their own tokens, creates one and sees
it once, and revokes one, through metaledger's token service (app.auth.service.AuthService, the service behind
`/openapi/v1/auth/tokens` and `metaledger token …`).

Who may create one is DataHub's rule for personal access tokens (its Generate Personal Access Tokens privilege,
which its Admin and Editor roles hold): a writer or an admin, for themselves only — a token's actor is the session's
— with a role no higher than the session's and an expiry no later than the token the session was opened with (a
token never outlives the credential that made it; "never" only from a token that never expires). Everyone signed in
lists and revokes their own tokens; an admin manages everyone's through the API or the CLI. Revoking the token the
session was opened with ends the session (every session of a token ends with it: app.web.sessions)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from app.api.deps import Auth
from app.auth.model import Permission, Role, TokenInfo, parse_ttl
from app.auth.service import AuthService
from app.web.policy import FormOfSession, PageReader, PageWriter, WebError
from app.web.render import page
from app.web.sessions import SESSION_COOKIE, WebSession, session_store

router = APIRouter(include_in_schema=False)

PATH = "/settings/tokens"  # DataHub's
MAX_NAME = 100
# (the token service's ttl, label); "signin": until the token the session was opened with expires
LIFETIMES = (("1h", "1 hour"), ("1d", "1 day"), ("30d", "30 days"), ("90d", "90 days"), ("365d", "1 year"))
NEVER, SIGN_IN = "never", "signin"


@dataclass(frozen=True, slots=True)
class Lifetime:
    value: str
    label: str
    ttl: str  # as AuthService.create_token takes it


async def _sign_in_expiry(auth: AuthService, session: WebSession) -> datetime | None:
    """When the token the session was opened with expires (None: never)."""
    token_id = session.principal.token_id
    info = await auth.repository.token(token_id) if token_id else None
    return info.expires_at if info else None


async def lifetimes(auth: AuthService, session: WebSession) -> list[Lifetime]:
    """The lifetimes a new token may have now: none ending after the session's own token."""
    cap = await _sign_in_expiry(auth, session)
    now = datetime.now(UTC)
    offered = []
    for ttl, label in LIFETIMES:
        length = parse_ttl(ttl)
        if cap is None or (length is not None and now + length <= cap):
            offered.append(Lifetime(ttl, label, ttl))
    if cap is None:
        offered.append(Lifetime(NEVER, "Never expires", NEVER))
    elif (minutes := int((cap - now) / timedelta(minutes=1))) >= 1:
        when = cap.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
        offered.append(Lifetime(SIGN_IN, f"Until {when}, when the token you signed in with expires", _ttl(minutes)))
    return offered


def _ttl(minutes: int) -> str:
    """At most `minutes`, as the token service writes a lifetime (at most six digits: hours past that)."""
    return f"{minutes}m" if minutes < 10**6 else f"{minutes // 60}h"


def roles_of(session: WebSession) -> list[Role]:
    """The roles a new token may have: the session's and the ones below it."""
    return [role for role in Role if role <= session.principal.role]


async def _page(
    auth: AuthService,
    session: WebSession,
    status: int = 200,
    created: tuple[str, TokenInfo] | None = None,
    error: str | None = None,
) -> Response:
    if not auth.enabled:
        text = "Authentication is off (METALEDGER_AUTH_ENABLED=false): no token is asked for, so none is made here."
        return page("message.html", session, status=status, title="No tokens", text=text)
    may_create = session.principal.allows(Permission.WRITE)
    return page(
        "tokens.html",
        session,
        status=status,
        tokens=await auth.tokens(session.principal.actor),
        created=created,
        error=error,
        may_create=may_create,
        roles=roles_of(session) if may_create else [],
        lifetimes=await lifetimes(auth, session) if may_create else [],
    )


@router.get(PATH)
async def tokens_page(session: PageReader, auth: Auth) -> Response:
    return await _page(auth, session)


@router.post(PATH)
async def create_token(session: PageWriter, form: FormOfSession, auth: Auth) -> Response:
    """The new token is shown on the answer itself (201), once: a redirect would need it kept somewhere until the
    next request, and only its hash is ever kept."""
    if not auth.enabled:
        return await _page(auth, session)
    name = " ".join(form.get("name", "").split())
    if not name or len(name) > MAX_NAME:
        return await _page(auth, session, 400, error=f"Give the token a name of 1 to {MAX_NAME} characters.")
    try:
        role = Role.parse(form.get("role", ""))
    except ValueError:
        return await _page(auth, session, 400, error="Choose the token's role.")
    if role not in roles_of(session):
        return await _page(
            auth, session, 403, error=f"A token of yours has at most your own role, {session.principal.role.label}."
        )
    chosen = next((t for t in await lifetimes(auth, session) if t.value == form.get("lifetime")), None)
    if chosen is None:
        return await _page(
            auth,
            session,
            400,
            error="Choose one of the lifetimes offered: none ends after the token you signed in with.",
        )
    actor = session.principal.actor
    issued = await auth.create_token(actor, role, ttl=chosen.ttl, description=name, created_by=actor)
    assert issued is not None  # only a bootstrap's insert may be skipped
    return await _page(auth, session, 201, created=issued)


@router.post(PATH + "/revoke")
async def revoke_token(request: Request, session: PageReader, form: FormOfSession, auth: Auth) -> Response:
    token_id = form.get("id", "")
    info = await auth.repository.token(token_id) if token_id and len(token_id) <= 64 else None
    if info is None or info.actor != session.principal.actor:
        raise WebError(404, "You have no token with this id.")
    await auth.revoke_token(token_id, session.principal.actor)
    if token_id != session.principal.token_id:
        return RedirectResponse(PATH, status_code=303)
    # the token this session stands for: the session ends with it
    await session_store(request).close(request.cookies.get(SESSION_COOKIE, ""))
    ended = RedirectResponse("/login", status_code=303)
    ended.delete_cookie(SESSION_COOKIE, path="/")
    return ended
