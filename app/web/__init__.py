"""The web view (issue 42): pages at DataHub's frontend paths over metaledger's own services, for people.

`install(app)` mounts it: the routes (app.web.routes), the static assets (app/web/static, served by the service:
nothing is fetched from elsewhere at run time), the session store, and the answers of a refused page (an HTML page,
or a redirect to the sign-in form), which are the web view's own and never the JSON APIs' errors."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.staticfiles import StaticFiles
from starlette.responses import RedirectResponse, Response

from app.web import edits, operations, routes, runs, tokens
from app.web.policy import SignInRequired, WebError, current_session, sign_in_url
from app.web.render import STATIC, STATIC_URL, message


def install(app: FastAPI) -> None:
    app.mount(STATIC_URL, StaticFiles(directory=STATIC), name="web-static")
    for pages in (routes, edits, runs, operations, tokens):
        app.include_router(pages.router)
    app.add_exception_handler(SignInRequired, _sign_in)  # type: ignore[arg-type]
    app.add_exception_handler(WebError, _refused)  # type: ignore[arg-type]


async def _sign_in(request: Request, error: SignInRequired) -> Response:
    return RedirectResponse(sign_in_url(error.next_path), status_code=303)


async def _refused(request: Request, error: WebError) -> Response:
    session = await current_session(request)
    titles = {403: "Not allowed", 404: "Not found", 413: "Too large", 415: "Not a form"}
    return message(session, error.status, titles.get(error.status, "Not possible"), error.message)
