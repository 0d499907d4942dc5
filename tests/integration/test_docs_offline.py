"""/docs and /redoc work offline: their Swagger UI / ReDoc assets are served by metaledger itself, not a CDN."""

from __future__ import annotations

import re

import pytest

CDN_HOSTS = ("cdn.jsdelivr", "unpkg", "fonts.googleapis", "fastapi.tiangolo.com")


def asset_urls(html: str) -> list[str]:
    return re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html) + re.findall(
        r"""url\s*:\s*["']([^"']+)["']""", html
    )


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("/docs", {"/docs/static/swagger-ui-bundle.js", "/docs/static/swagger-ui.css", "/docs/static/favicon.png"}),
        ("/redoc", {"/docs/static/redoc.standalone.js", "/docs/static/favicon.png"}),
    ],
)
async def test_docs_pages_reference_only_local_assets(client, page, expected):
    response = await client.get(page)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    for host in CDN_HOSTS:
        assert host not in html, f"{page} references {host}"
    urls = set(asset_urls(html))
    assert expected <= urls, urls
    assert "/openapi.json" in html
    for url in expected:
        asset = await client.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 0, url
    js = next(u for u in expected if u.endswith(".js"))
    assert "javascript" in (await client.get(js)).headers["content-type"]


async def test_docs_assets_are_not_in_the_openapi_spec(client):
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert not [p for p in paths if p.startswith(("/docs", "/redoc"))]
