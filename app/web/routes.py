"""The web view's routes, at DataHub's frontend paths (app.web.paths). Thin: each parses the request, calls
app.web.catalog or the session store, and renders a template (app.web.render)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from app.api.deps import Auth, Registry, Session, SettingsDep
from app.errors import MetaledgerError
from app.web import catalog, history, lineage_graph, stats
from app.web.paths import (
    ENTITY_TYPES,
    HISTORY,
    LINEAGE,
    PATH_NAMES,
    SCHEMA,
    STATS,
    parse_filters,
    split_entity_path,
    tabs_of,
)
from app.web.policy import (
    ALLOW_PAGE_PUBLIC,
    FormOfSession,
    FormOfSignIn,
    PageReader,
    current_session,
    local_path,
)
from app.web.render import message
from app.web.render import page as render
from app.web.sessions import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    new_secret,
    session_store,
    sign_in_keys,
    sign_in_throttle,
)
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
    return _login_page(request, 200, local_path(next), None)


def _login_page(request: Request, status: int, next_path: str, error: str | None) -> Response:
    """The sign-in form, with a CSRF token of its own (double submit: LOGIN_COOKIE)."""
    csrf = new_secret()
    response = render("login.html", None, status=status, next=next_path, csrf_token=csrf, error=error)
    _set_cookie(response, request, LOGIN_COOKIE, csrf, max_age=3600)
    return response


@router.post("/login", dependencies=[ALLOW_PAGE_PUBLIC])
async def login(request: Request, form: FormOfSignIn, auth: Auth) -> Response:
    next_path = local_path(form.get("next"))
    token = form.get("token", "").strip()
    throttle = sign_in_throttle(request)
    keys = sign_in_keys(request.client.host if request.client else None, token)
    wait = await throttle.wait(keys)
    if wait is not None:  # refused before the token is checked: a guess made now tells nothing
        minutes = max(1, round(wait / 60))
        error = f"Too many failed sign-ins: try again in about {minutes} minute{'s' if minutes > 1 else ''}."
        refused = _login_page(request, 429, next_path, error)
        refused.headers["Retry-After"] = str(wait)
        return refused
    try:
        principal = await auth.authenticate({"authorization": f"Bearer {token}"})
    except MetaledgerError as error:
        if error.status_code == 401:
            await throttle.failed(keys)
        return _login_page(request, error.status_code, next_path, error.message)
    await throttle.forget(keys[1])
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


@router.get("/")
async def home(session: PageReader) -> Response:
    return _see_other("/search")


def _number(raw: str, top: int) -> int | None:
    return min(int(raw), top) if raw.isascii() and raw.isdigit() and len(raw) < 10 else None  # not `²`


@router.get("/search")
async def search(
    request: Request,
    session: PageReader,
    db: Session,
    settings: SettingsDep,
    query: str = "",
    page: str = "",
    cursor: str = "",
    offset: str = "",
) -> Response:
    """The first page and the ones a `cursor` (a page's scrollId) continues from, as far as the results go; DataHub's
    `page=N` for the links it prints. `offset`: the results before a cursor's page, for its heading only."""
    filters = parse_filters(list(request.query_params.multi_items()))
    # DataHub's page numbers reach as far as a search's window (GRAPHQL_MAX_COUNT results); past it, pages go by cursor
    last_page = max(1, -(-settings.graphql_max_count // catalog.PAGE_SIZE))
    page_number = max(_number(page, last_page) or 1, 1)
    by_page = page_number > 1 and not cursor
    start = (page_number - 1) * catalog.PAGE_SIZE if by_page else (_number(offset, 10**9) or 0) if cursor else 0
    try:
        found = await catalog.search(
            request, db, session.principal, query.strip(), filters, start, cursor or None, by_page
        )
    except catalog.GraphQLRefused as refused:
        return message(session, refused.status if refused.status < 500 else 503, "Search failed", refused.message)
    return render(
        "search.html",
        session,
        found=found,
        page_size=catalog.PAGE_SIZE,
        page_number=page_number if by_page else None,
        last_page=min(last_page, -(-found.total // catalog.PAGE_SIZE)),
    )


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
    can_edit = await request.app.state.auth.may_write(session.principal)
    # a writer's page opens one field's edit panel (`field`) or one chooser (`choose`) at a time: only then are
    # the existing tags (terms, people, domains) searched
    editing = request.query_params.get("field") if can_edit and tab == SCHEMA else None
    choosing = request.query_params.get("choose") if can_edit else None
    chooser = None
    owner_types = catalog.SYSTEM_OWNERSHIP_CHOICES
    if choosing in catalog.CHOOSABLE:
        chooser = await catalog.choose(request, db, session.principal, choosing, request.query_params.get("q", ""))
        if choosing == "owner":
            owner_types = await catalog.ownership_types(request, db, session.principal)
    return render(
        "entity.html",
        session,
        view=view,
        tab=tab,
        tabs=tabs,
        path_name=path_name,
        assets=chosen,
        can_edit=can_edit,
        editing=editing,
        chooser=chooser,
        ownership_types=owner_types,
        **loaded,
    )


for _path_name in sorted(ENTITY_TYPES):
    router.add_api_route(f"/{_path_name}/{{rest:path}}", entity_page, methods=["GET"], name=f"web:{_path_name}")
