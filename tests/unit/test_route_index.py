"""The route index (app.api.route_index) picks the route the router's scan of every route would pick; each entity
type's v3 routes (app.api.entities.EntityRoutes) are made when a request or a reader of every route first needs them."""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx
import pytest
from starlette.routing import Match, Mount

from app.api.entities import EntityRoutes, expanded
from app.api.route_index import _SELECTED, RouteIndex
from app.main import create_app
from app.openapi_spec import API_PREFIX
from app.registry import load_registry
from app.settings import Settings

SAMPLES = {"path": "a/b", "int": "7", "float": "1.5", "uuid": "00000000-0000-0000-0000-000000000000", "str": "x1"}


@pytest.fixture(scope="module")
def app(registry):
    return create_app(Settings(), registry)


@pytest.fixture
def fresh_app():
    """An app of a registry of its own: its entity types' routes (kept per registry) made by nothing but the test."""
    return create_app(Settings(), load_registry(Settings().registry_path))


def made(app) -> set[str]:
    """The entity types whose routes `app` has made (an `EntityRoutes` keeps its routes once made)."""
    return {r.spec.name for r in app.router.routes if isinstance(r, EntityRoutes) and "routes" in vars(r)}


def scope_of(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": "", "query_string": b"", "headers": []}


def concrete(path: str) -> str:
    return re.sub(r"\{\w+(?::(\w+))?\}", lambda m: SAMPLES[m.group(1) or "str"], path)


def scanned(app, scope: dict[str, Any]):
    """The router's own choice: the first route of the scan (after the index) that matches fully, and the route that
    serves the request (FastAPI's `route`: an entity type's own route)."""
    for route in app.router.routes[1:]:
        match, child_scope = route.matches(dict(scope))
        if match is Match.FULL:
            return route, child_scope.get("route")
    return None


def indexed(index: RouteIndex, scope: dict[str, Any]):
    match, child_scope = index.matches(dict(scope))
    return (child_scope[_SELECTED], child_scope.get("route")) if match is Match.FULL else None


def every_path(app) -> list[tuple[str, str]]:
    found = []
    for route in expanded(app.router.routes[1:]):
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
        assert indexed(index, scope) == chosen, (method, path)


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/nowhere"),  # 404
        ("PUT", "/openapi/v3/entity/dataset/urn:li:dataset:x/status"),  # 405: a partial match, the scan's to answer
        ("GET", "/health/"),  # a slash redirect, the scan's too
        ("GET", "/openapi/v3/entity/notAnEntity/urn:li:notAnEntity:x"),
    ],
)
def test_no_full_match_is_left_to_the_scan(app, method, path):
    assert indexed(app.router.routes[0], scope_of(method, path)) is None


def test_the_index_follows_routes_removed_and_added(registry):
    app = create_app(Settings(), registry)
    index = app.router.routes[0]
    scope = scope_of("GET", "/openapi/v3/entity/tag/urn:li:tag:t1")
    tag_route = indexed(index, scope)
    assert tag_route is not None and tag_route[1].path == "/openapi/v3/entity/tag/{urn}"

    def is_tag(route) -> bool:
        return isinstance(route, EntityRoutes) and route.spec.name == "tag"

    removed = [r for r in app.router.routes if is_tag(r)]
    app.router.routes[:] = [r for r in app.router.routes if not is_tag(r)]
    assert indexed(index, scope) is None

    app.router.routes.extend(removed)
    assert indexed(index, scope) == tag_route


async def test_an_entity_types_routes_are_made_by_the_first_request_that_reaches_them(fresh_app, caplog):
    assert made(fresh_app) == set()
    assert indexed(fresh_app.router.routes[0], scope_of("GET", "/health")) is not None  # the index is filed
    assert made(fresh_app) == set()

    async def put(path: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fresh_app), base_url="http://test") as client:
            return await client.put(path)

    with caplog.at_level(logging.INFO, logger="metaledger.access"):
        answer = await put("/openapi/v3/entity/dataset/urn:li:dataset:x/status")
    assert made(fresh_app) == {"dataset"}
    # A method the path does not serve: the 405 of the error handler, as before the routes were made on demand, and
    # the access log names the template of the entity type's route.
    assert answer.status_code == 405
    assert answer.json() == {"error": "Method Not Allowed", "message": "Method Not Allowed", "issues": []}
    assert [r.route for r in caplog.records if r.name == "metaledger.access"] == [
        "/openapi/v3/entity/dataset/{urn}/{aspectName}"
    ]

    [dataset_routes] = [r for r in fresh_app.router.routes if isinstance(r, EntityRoutes) and r.spec.name == "dataset"]
    made_first = dataset_routes.routes
    await put("/openapi/v3/entity/dataset/urn:li:dataset:x/status")
    assert dataset_routes.routes is made_first  # kept, not made again


def in_order(routes, scope: dict[str, Any]):
    """A router's scan of `routes`: the first full match, else the first partial one (the route that answers 405)."""
    partial = None
    for route in routes:
        match, _ = route.matches(dict(scope))
        if match is Match.FULL:
            return Match.FULL, route
        if match is Match.PARTIAL and partial is None:
            partial = route
    return (Match.NONE, None) if partial is None else (Match.PARTIAL, partial)


def test_an_entity_types_routes_answer_every_method_as_their_scan_in_order(app):
    """`EntityRoutes` asks the routes serving the request's method first: for every path of an entity type's routes
    and every method (those of HTTP and one no route serves), the route it picks is the scan's, partial matches too."""
    [dataset] = [r for r in app.router.routes if isinstance(r, EntityRoutes) and r.spec.name == "dataset"]
    paths = {concrete(route.path) for route in dataset.routes}
    asked = 0
    for path in sorted(paths):
        for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "BREW"):
            scope = scope_of(method, path)
            match, child_scope = dataset.matches(dict(scope))
            expected, route = in_order(dataset.routes, scope)
            assert match is expected, (method, path)
            assert child_scope.get("route") is route, (method, path)
            asked += 1
    assert asked == 8 * len(paths) >= 8 * 4  # the collection, batchGet, an entity, an aspect


def test_url_path_for_names_an_entity_route_of_a_fresh_app(fresh_app):
    first = sorted(fresh_app.state.registry.entities)[0]  # each entity type's routes have the same names
    path = fresh_app.url_path_for("get_aspect", urn="urn:li:x", aspectName="status")
    assert path == f"{API_PREFIX}/{first}/urn:li:x/status"
    assert made(fresh_app) == {first}


def test_the_openapi_document_lists_every_entity_route(app):
    spec = app.openapi()
    entity_routes = [r for r in app.router.routes if isinstance(r, EntityRoutes)]
    assert {r.spec.name for r in entity_routes} == set(app.state.registry.entities)
    declared = [
        (route.path_format, method.lower(), route.operation_id)
        for stand_in in entity_routes
        for route in stand_in.routes
        for method in route.methods
    ]
    assert len(declared) > 700
    documented = {
        (path, method, operation["operationId"])
        for path, operations in spec["paths"].items()
        for method, operation in operations.items()
    }
    assert set(declared) <= documented


async def test_a_router_included_once_per_process_still_joins_each_apps_lifespan():
    """Routers are included with the routes the process built for them before (`include_once`), and each app still
    runs their lifespans: the web view's feed streams are made in the lifespan of every app, not
    only of the process's first (the tests make one app per test)."""
    from contextlib import asynccontextmanager

    from fastapi import APIRouter, FastAPI

    from app.api.route_index import include_once

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.entered = True
        yield

    router = APIRouter(lifespan=lifespan)

    @router.get("/ping")
    async def ping() -> str:
        return "pong"

    first, second = FastAPI(), FastAPI()
    include_once(first, [router])
    include_once(second, [router])
    assert second.router.routes[-1] is first.router.routes[-1]  # the same built routes
    for app in (first, second):
        async with app.router.lifespan_context(app):
            assert app.state.entered
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as client:
            assert (await client.get("/ping")).json() == "pong"
