"""The web view (issue 42): pages at DataHub's frontend paths over metaledger's own services, for people.

`install(app)` mounts it: the routes (app.web.routes), the static assets (app/web/static, served by the service:
nothing is fetched from elsewhere at run time), the session store, the answers of a refused page (an HTML page,
or a redirect to the sign-in form), which are the web view's own and never the JSON APIs' errors, and the page a
browser gets for a path nothing serves."""

from __future__ import annotations

import difflib

from fastapi import FastAPI, Request
from fastapi.routing import iter_route_contexts
from fastapi.staticfiles import StaticFiles
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.route_index import include_once
from app.web import edits, operations, routes, runs, tokens
from app.web.paths import PATH_NAMES
from app.web.policy import SignInRequired, WebError, current_session, sign_in_url
from app.web.render import STATIC, STATIC_URL, message, page

STATIC_NAME = "web-static"


def install(app: FastAPI) -> None:
    app.mount(STATIC_URL, StaticFiles(directory=STATIC), name=STATIC_NAME)
    include_once(app, (pages.router for pages in (routes, edits, runs, operations, tokens)))
    app.add_exception_handler(SignInRequired, _sign_in)  # type: ignore[arg-type]
    app.add_exception_handler(WebError, _refused)  # type: ignore[arg-type]
    app.router.default = _PageNotFound(app, app.router.default)


async def _sign_in(request: Request, error: SignInRequired) -> Response:
    return RedirectResponse(sign_in_url(error.next_path), status_code=303)


async def _refused(request: Request, error: WebError) -> Response:
    session = await current_session(request)
    titles = {403: "Not allowed", 404: "Not found", 413: "Too large", 415: "Not a form"}
    return message(session, error.status, titles.get(error.status, "Not possible"), error.message)


def accepts_html(accept: str) -> bool:
    """Whether an Accept header names text/html (a browser's): `*/*` alone, what API clients send, does not."""
    for media_range in accept.split(","):
        kind, *parameters = (part.strip() for part in media_range.split(";"))
        if kind.lower() in ("text/html", "application/xhtml+xml"):
            quality = next((p[2:] for p in parameters if p.lower().startswith("q=")), "1")
            try:
                return float(quality) > 0
            except ValueError:
                return False
    return False


def _is_web(context: object) -> bool:
    dependant = getattr(context, "dependant", None)
    stack = list(dependant.dependencies) if dependant is not None else []
    while stack:
        dependency = stack.pop()
        if getattr(dependency.call, "web", False):
            return True
        stack.extend(dependency.dependencies)
    return False


def api_roots(app: FastAPI) -> frozenset[str]:
    """The first path segments the app's other routes (the JSON APIs, the docs, the probes) are under: a path
    there keeps its API's JSON 404, whoever asks."""
    roots: set[str] = set()
    for route in app.router.routes:
        prefix = getattr(route, "prefix", None)  # a registry entity type's v3 routes, made on first use
        if isinstance(prefix, str):
            roots.add(prefix.split("/")[1])
            continue
        for context in iter_route_contexts([route]):
            path = getattr(context, "path", None)
            if isinstance(path, str) and getattr(context, "name", None) != STATIC_NAME and not _is_web(context):
                roots.add(path.split("/")[1])
    return frozenset(roots)


class _PageNotFound:
    """The router's answer when no route matched a path: for a browser's GET of a path no API is under, a page
    saying so (404); for everything else the router's own 404, which the app answers in its JSON error body."""

    def __init__(self, app: FastAPI, fallback: ASGIApp) -> None:
        self.app = app
        self.fallback = fallback
        self._roots: frozenset[str] | None = None  # read at the first miss: by then every router is included

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            request = Request(scope, receive)
            if self._roots is None:
                self._roots = api_roots(self.app)
            first = request.url.path.split("/")[1]
            if first not in self._roots and accepts_html(request.headers.get("accept", "")):
                response = await not_found_page(request, first)
                await response(scope, receive, send)
                return
        await self.fallback(scope, receive, send)


async def not_found_page(request: Request, first: str) -> Response:
    """`There is no page at …`, with DataHub's path it was likely meant for (`/datasets/…` → `/dataset/…`)."""
    session = await current_session(request)
    link = None
    close = difflib.get_close_matches(first, sorted(set(PATH_NAMES.values())), n=1, cutoff=0.75)
    if close:
        # the rest of the path as the browser sent it (still percent-encoded), and its query
        raw = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
        rest = raw.split("/", 2)[2] if raw.count("/") >= 2 else ""
        query = f"?{request.url.query}" if request.url.query else ""
        link = (f"Did you mean /{close[0]}/…?", f"/{close[0]}/{rest}{query}")
    text = f"There is no page at {request.url.path}."
    return page("message.html", session, status=404, title="Not found", text=text, link=link)
