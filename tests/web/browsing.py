"""A browser's requests to the web view in-process (httpx on the ASGI app): a signed-in session, the CSRF token of a
page's forms and DataHub's page paths. For the tests of every web page."""

from __future__ import annotations

import re
from urllib.parse import quote

import httpx

from tests.helpers import mint_token

ALICE = "urn:li:corpuser:alice"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def page_url(urn: str, tab: str | None = None) -> str:
    return f"/dataset/{quote(urn, safe='')}" + (f"/{tab}" if tab else "")


async def sign_in(
    app, role: str = "writer", actor: str = ALICE, base_url: str = "http://metaledger"
) -> httpx.AsyncClient:
    browser = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url)
    token = await mint_token(app, role, actor)
    form = await browser.get("/login")
    answer = await browser.post(
        "/login", data={"token": token, "csrf_token": CSRF.search(form.text).group(1), "next": "/search"}
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/search", answer.text
    return browser


def csrf_of(html: str) -> str:
    return CSRF.search(html).group(1)
