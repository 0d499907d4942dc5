"""The route index (app.api.route_index) picks the route the router's scan of every route would pick."""

from __future__ import annotations

import re
from typing import Any

import pytest
from starlette.routing import Match, Mount

from app.api.route_index import _SELECTED, RouteIndex

SAMPLES = {"path": "a/b", "int": "7", "float": "1.5", "uuid": "00000000-0000-0000-0000-000000000000", "str": "x1"}


@pytest.fixture(scope="module")
def app(registry):
    from app.main import create_app
    from app.settings import Settings

    return create_app(Settings(), registry)


def scope_of(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": "", "query_string": b"", "headers": []}


def concrete(path: str) -> str:
    return re.sub(r"\{\w+(?::(\w+))?\}", lambda m: SAMPLES[m.group(1) or "str"], path)


def scanned(app, scope: dict[str, Any]):
    """The router's own choice: the first route of the scan (after the index) that matches fully."""
    for route in app.router.routes[1:]:
        match, _ = route.matches(dict(scope))
        if match is Match.FULL:
            return route
    return None


def indexed(index: RouteIndex, scope: dict[str, Any]):
    match, child_scope = index.matches(dict(scope))
    return child_scope[_SELECTED] if match is Match.FULL else None


def every_path(app) -> list[tuple[str, str]]:
    found = []
    for route in app.router.routes[1:]:
        contexts = getattr(route, "effective_route_contexts", None)
        for r in contexts() if contexts is not None else [route]:
            path = r.path + "/file.css" if isinstance(r, Mount) else r.path  # a mount matches what is below it
            for method in sorted(getattr(r, "methods", None) or {"GET"}):
                found.append((method, concrete(path)))
    return found


def test_the_index_picks_the_scans_route_for_every_route(app):
    index = app.router.routes[0]
    assert isinstance(index, RouteIndex)
    paths = every_path(app)
    assert len(paths) > 700  # every entity type's routes and the routers'
    for method, path in paths:
        scope = scope_of(method, path)
        chosen = scanned(app, scope)
        assert chosen is not None, (method, path)
        assert indexed(index, scope) is chosen, (method, path)


@pytest.mark.parametrize("method, path", [
    ("GET", "/nowhere"),  # 404
    ("PUT", "/openapi/v3/entity/dataset/urn:li:dataset:x/status"),  # 405: a partial match, the scan's to answer
    ("GET", "/health/"),  # a slash redirect, the scan's too
    ("GET", "/openapi/v3/entity/notAnEntity/urn:li:notAnEntity:x"),
])
def test_no_full_match_is_left_to_the_scan(app, method, path):
    assert indexed(app.router.routes[0], scope_of(method, path)) is None


def test_the_index_follows_routes_removed_and_added(registry):
    from app.main import create_app
    from app.settings import Settings

    app = create_app(Settings(), registry)
    index = app.router.routes[0]
    scope = scope_of("GET", "/openapi/v3/entity/tag/urn:li:tag:t1")
    tag_route = indexed(index, scope)
    assert tag_route is not None and tag_route.path == "/openapi/v3/entity/tag/{urn}"

    def is_tag(route) -> bool:
        return getattr(route, "path", "").startswith("/openapi/v3/entity/tag/")

    removed = [r for r in app.router.routes if is_tag(r)]
    app.router.routes[:] = [r for r in app.router.routes if not is_tag(r)]
    assert indexed(index, scope) is None

    app.router.routes.extend(removed)
    assert indexed(index, scope) is tag_route
