"""The web view's routes, at DataHub's frontend paths (app.web.paths). Thin: each parses the request, calls
app.web.catalog or the session store, and renders a template (app.web.render)."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from app.api.deps import Auth, Registry, Session
from app.errors import MetaledgerError
from app.web import catalog, history, lineage_graph, stats
from app.web.paths import (
    ENTITY_TYPES,
    HISTORY,
    LINEAGE,
    PATH_NAMES,
    STATS,
    entity_url,
    parse_filters,
    split_entity_path,
    tabs_of,
)
from app.web.policy import (
    ALLOW_PAGE_PUBLIC,
    FormOfSession,
    FormOfSignIn,
    PageReader,
    PageWriter,
    WebError,
    current_session,
    local_path,
)
from app.web.render import message
from app.web.render import page as render
from app.web.sessions import LOGIN_COOKIE, SESSION_COOKIE, new_secret, session_store
from app.web.tabs import Tab, TabRequest
from app.write.reader import EntityReader

router = APIRouter(include_in_schema=False)  # pages, not API operations: out of the OpenAPI document

# the tabs that load more than the entity's own aspects, or bring their own assets
TABS = {LINEAGE: lineage_graph.TAB, HISTORY: history.TAB, STATS: stats.TAB}


def _secure(request: Request) -> bool:
    # uvicorn puts a trusted proxy's X-Forwarded-Proto in the scheme (--proxy-headers, --forwarded-allow-ips)
    return request.url.scheme == "https"


def _set_cookie(response: Response, request: Request, name: str, value: str, max_age: int | None = None) -> None:
    response.set_cookie(
        name, value, max_age=max_age, path="/", httponly=True, samesite="strict", secure=_secure(request)
    )


def _see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


@router.get("/login", dependencies=[ALLOW_PAGE_PUBLIC])
async def login_form(request: Request, next: str = "/search") -> Response:
    if await current_session(request) is not None:
        return _see_other(local_path(next))
    csrf = new_secret()
    response = render("login.html", None, next=local_path(next), csrf_token=csrf, error=None)
    _set_cookie(response, request, LOGIN_COOKIE, csrf, max_age=3600)
    return response


@router.post("/login", dependencies=[ALLOW_PAGE_PUBLIC])
async def login(request: Request, form: FormOfSignIn, auth: Auth) -> Response:
    next_path = local_path(form.get("next"))
    token = form.get("token", "").strip()
    try:
        principal = await auth.authenticate({"authorization": f"Bearer {token}"})
    except MetaledgerError as error:
        csrf = new_secret()
        response = render("login.html", None, status=401, next=next_path, csrf_token=csrf, error=error.message)
        _set_cookie(response, request, LOGIN_COOKIE, csrf, max_age=3600)
        return response
    info = await auth.repository.token(principal.token_id) if principal.token_id else None
    store = session_store(request)
    if SESSION_COOKIE in request.cookies:  # a sign-in replaces the browser's session: the old one ends here
        await store.close(request.cookies[SESSION_COOKIE])
    session_id, _ = await store.open(principal, info.expires_at if info else None)
    signed_in = _see_other(next_path)
    _set_cookie(signed_in, request, SESSION_COOKIE, session_id)
    signed_in.delete_cookie(LOGIN_COOKIE, path="/")
    return signed_in


@router.post("/logout")
async def logout(request: Request, session: PageReader, form: FormOfSession) -> Response:
    await session_store(request).close(request.cookies.get(SESSION_COOKIE, ""))
    response = _see_other("/login")
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/search")
async def search(request: Request, session: PageReader, db: Session, query: str = "", page: str = "1") -> Response:
    filters = parse_filters(list(request.query_params.multi_items()))
    page_number = min(max(int(page), 1), 500) if page.isdigit() and len(page) < 6 else 1  # DataHub's `page`
    start = (page_number - 1) * catalog.PAGE_SIZE
    try:
        found = await catalog.search(request, db, session.principal, query.strip(), filters, start)
    except catalog.GraphQLRefused as refused:
        return message(session, refused.status if refused.status < 500 else 503, "Search failed", refused.message)
    return render("search.html", session, found=found, page_size=catalog.PAGE_SIZE, page_number=page_number)


async def entity_page(request: Request, session: PageReader, db: Session, registry: Registry, rest: str) -> Response:
    path_name = request.url.path.split("/", 2)[1]
    entity_type = ENTITY_TYPES[path_name]
    wanted = split_entity_path(rest)
    urn_type = wanted.urn.split(":", 3)[2] if wanted.urn.startswith("urn:li:") and wanted.urn.count(":") >= 3 else None
    if urn_type != entity_type:
        shown = PATH_NAMES.get(urn_type or "")
        hint = f" It is shown at /{shown}/." if shown else ""
        return message(session, 404, "Not found", f"{wanted.urn!r} is not the URN of a {entity_type}.{hint}")
    view = await catalog.entity(EntityReader(db, registry, session.principal), entity_type, wanted.urn)
    if view is None:
        return message(session, 404, "Not found", f"There is no {entity_type} {wanted.urn}.")
    tabs = tabs_of(entity_type)
    tab = wanted.tab if wanted.tab in tabs else (tabs[1] if tabs[0] == "Schema" and not view.fields else tabs[0])
    chosen = TABS.get(tab, Tab())
    loaded = await chosen.load(TabRequest(request, db, registry, session, view)) if chosen.load else {}
    return render("entity.html", session, view=view, tab=tab, tabs=tabs, path_name=path_name, assets=chosen, **loaded)


for _path_name in sorted(ENTITY_TYPES):
    router.add_api_route(f"/{_path_name}/{{rest:path}}", entity_page, methods=["GET"], name=f"web:{_path_name}")


@router.post("/web/description")
async def edit_description(request: Request, session: PageWriter, form: FormOfSession, db: Session) -> Response:
    urn, field_path = form.get("urn", ""), form.get("field") or None
    back = entity_url(urn, "Schema" if field_path else "Documentation")
    if back is None:
        raise WebError(400, "This form names no entity the web view shows.")
    try:
        await catalog.update_description(request, db, session.principal, urn, form.get("description", ""), field_path)
    except catalog.GraphQLRefused as refused:
        return message(session, refused.status if refused.status < 500 else 503, "Not saved", refused.message)
    return _see_other(back + ("#field-" + quote(field_path, safe="") if field_path else ""))
