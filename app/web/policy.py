"""The web routes' policies and their form bodies.

A page is allowed by a sign-in session (its cookie), never by a bearer token, and the JSON APIs by a bearer token,
never by the cookie (app.api.deps reads the Authorization header only): a page a browser opens carries the cookie by
itself, so anything that cookie authorized would be open to cross-site requests. Each policy has the `permission`
attribute the route walks read (tests/integration/test_auth.py) and `web = True`, which says how it answers a caller
without a session: a page redirects to the sign-in form, a form POST is a 403 (a browser that lost its session
follows no redirect of a POST usefully, and a forged POST learns nothing)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

from fastapi import Depends, Request

from app.api.deps import DeclaredBody
from app.audit.model import attribute
from app.auth.model import Permission
from app.errors import Forbidden
from app.web.sessions import LOGIN_COOKIE, SESSION_COOKIE, WebSession, same_secret, session_store

MAX_FORM_BYTES = 64 * 1024  # a description is the largest thing a form sends
_SESSION = "metaledger.web_session"  # the scope key of the request's session, once found


class WebError(Exception):
    """Answered as an HTML page with `status` (app.web.install)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class SignInRequired(Exception):
    """Answered with a redirect to the sign-in form, which comes back to `next` (a local path)."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


def local_path(raw: str | None) -> str:
    """`raw` if it is a path of this site, else `/search`: `next` must never send a signed-in browser elsewhere
    (`//evil.example` and `/\\evil.example` are other hosts to a browser)."""
    if not raw or not raw.startswith("/") or raw.startswith("//") or "\\" in raw or any(ord(c) < 32 for c in raw):
        return "/search"
    return raw


async def current_session(request: Request) -> WebSession | None:
    """The request's session from its cookie, looked up once per request."""
    if _SESSION not in request.scope:
        cookie = request.cookies.get(SESSION_COOKIE)
        session = await session_store(request).find(cookie) if cookie else None
        if session is not None:  # what it may see with view authorization on, as a bearer token's caller
            session = replace(session, principal=await request.app.state.auth.with_view_scope(session.principal))
        request.scope[_SESSION] = session
    return request.scope[_SESSION]


class SessionPolicy:
    """A page's policy: a session whose principal holds `permission`."""

    web = True

    def __init__(self, permission: Permission) -> None:
        self.permission = permission

    async def __call__(self, request: Request) -> WebSession:
        session = await current_session(request)
        if session is None:
            if request.method in ("GET", "HEAD"):
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                raise SignInRequired(target)
            raise WebError(403, "This form needs a signed-in session. Sign in and try again.")
        if self.permission is Permission.WRITE:  # a writer, or a reader an access policy grants an edit
            try:
                await request.app.state.auth.require_write_access(session.principal)
            except Forbidden as refused:
                raise WebError(403, f"{refused.message}.") from None
        elif not session.principal.allows(self.permission):
            raise WebError(
                403,
                f"This needs the {self.permission.name} permission; {session.principal.actor} has the "
                f"{session.principal.role.label} role.",
            )
        attribute(session.principal.token_id, "web")  # what the page writes names its session's token in the audit log
        return session


async def public_page() -> None:
    """The sign-in form's policy: everyone may see it and send it (it checks its own CSRF cookie)."""


public_page.permission = Permission.PUBLIC  # type: ignore[attr-defined]
public_page.web = True  # type: ignore[attr-defined]


def sign_in_url(next_path: str) -> str:
    return "/login?next=" + quote(local_path(next_path), safe="/")


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form, bounded (MAX_FORM_BYTES): the first value of each name."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("", "application/x-www-form-urlencoded"):
        raise WebError(415, "This form is sent as application/x-www-form-urlencoded.")
    declared = request.headers.get("content-length")
    if declared is not None and int(declared) > MAX_FORM_BYTES:
        raise WebError(413, f"A form may hold at most {MAX_FORM_BYTES} bytes.")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise WebError(413, f"A form may hold at most {MAX_FORM_BYTES} bytes.")
    if body and not kind:
        raise WebError(415, "This form is sent as application/x-www-form-urlencoded.")
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, max_num_fields=50)
    except (UnicodeDecodeError, ValueError):
        raise WebError(400, "The form could not be read.") from None
    return {name: values[0] for name, values in fields.items()}


class SessionForm(DeclaredBody[dict[str, str]]):
    """A state-changing form of a signed-in session: read after the route's policy (a `DeclaredBody`, as every body
    of the app: tests/integration/test_request_bodies.py), and refused (403) unless its `csrf_token` is the
    session's own."""

    def request_body_schema(self) -> dict[str, Any]:
        return {"type": "object"}  # the web routes are not in the OpenAPI document

    async def parse(self, document: Any, request: Request) -> dict[str, str]:
        return dict(document)

    async def __call__(self, request: Request) -> dict[str, str]:
        session = await current_session(request)
        form = await read_form(request)
        if session is None or not same_secret(session.csrf_token, form.get("csrf_token")):
            raise WebError(403, "This form's CSRF token is missing or is not this session's: nothing was changed.")
        return form


class SignInForm(DeclaredBody[dict[str, str]]):
    """The sign-in form: its CSRF token is the one the form's page set in LOGIN_COOKIE (double submit), so that no
    other site can sign a browser in with a token of its choosing."""

    def request_body_schema(self) -> dict[str, Any]:
        return {"type": "object"}

    async def parse(self, document: Any, request: Request) -> dict[str, str]:
        return dict(document)

    async def __call__(self, request: Request) -> dict[str, str]:
        form = await read_form(request)
        expected = request.cookies.get(LOGIN_COOKIE)
        if not expected or not same_secret(expected, form.get("csrf_token")):
            raise WebError(403, "The sign-in form expired or came from another site. Open it again and sign in.")
        return form


ALLOW_PAGE_PUBLIC = Depends(public_page)
PageReader = Annotated[WebSession, Depends(SessionPolicy(Permission.READ))]
PageWriter = Annotated[WebSession, Depends(SessionPolicy(Permission.WRITE))]
PageAdmin = Annotated[WebSession, Depends(SessionPolicy(Permission.ADMIN))]
FormOfSession = Annotated[dict[str, str], Depends(SessionForm())]
FormOfSignIn = Annotated[dict[str, str], Depends(SignInForm())]
