"""Pages from the Jinja2 templates of app/web/templates, autoescaped (every value a page shows came from someone's
metadata), with what every page's layout needs: the session (its actor and CSRF token) and the asset URLs."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.responses import HTMLResponse

from app.web.paths import Filter, entity_url, filter_params, tabs_of
from app.web.sessions import WebSession

TEMPLATES = Path(__file__).with_name("templates")
STATIC = Path(__file__).with_name("static")
STATIC_URL = "/web/static"

_env = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.globals.update(
    static=lambda name: f"{STATIC_URL}/{name}",
    entity_url=entity_url,
    filter_params=filter_params,
    urlencode=urlencode,
    tabs_of=tabs_of,
    filter_of=lambda field, value: Filter(field, (value,)),
)


def page(template: str, session: WebSession | None, status: int = 200, **values: Any) -> HTMLResponse:
    html = _env.get_template(template).render(session=session, **values)
    response = HTMLResponse(html, status_code=status)
    # A page shows what its session may read: no shared cache keeps it, and no other site frames it.
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; "
        "form-action 'self'; base-uri 'none'"
    )
    response.headers["Referrer-Policy"] = "same-origin"
    return response


def message(session: WebSession | None, status: int, title: str, text: str) -> HTMLResponse:
    return page("message.html", session, status=status, title=title, text=text)
