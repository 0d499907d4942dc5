"""Route lookup by the literal segments of each route's path, ahead of the router's scan of every route.

The app has about 800 routes (eleven per entity type of the registry, app.api.entities, and the routers'), and
Starlette's router asks each in turn whether it matches: a v3 write paid for every route before its own (most of the
request's framework CPU). `RouteIndex`, first in the app's routes, files each route under the literal path segments
before its first parameter (`/openapi/v3/entity/dataset/{urn}` under openapi → v3 → entity → dataset, an included
router under each of its routes', an entity type's routes under its path) and asks only the routes
filed along the request's path, in the routes' order.
A route filed elsewhere has a literal segment the path does not have, so it cannot match it: the first full match
among the candidates is the router's own first full match. Without a full match the index answers no match, and the
router's scan decides as before (a 405, a slash redirect, a 404).

The index follows the routes: `install` makes the router's route list a `RouteList`, which counts its changes (the
v3 routes of an entity type registered at run time), and the index is filed again after one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette._utils import get_route_path
from starlette.routing import BaseRoute, Match, Mount, NoMatchFound, Route, Router, WebSocketRoute
from starlette.types import Receive, Scope, Send

from app.api.entities import EntityRoutes

_SELECTED = "metaledger.route"  # the scope key of the route the index matched, for its `handle`


class RouteList(list):
    """A router's routes, with a count of the changes made to them (`version`)."""

    version = 0

    def _changed(self) -> None:
        self.version += 1


def _counting(name: str) -> Any:
    method = getattr(list, name)

    def changed(self: RouteList, *args: Any) -> Any:
        self._changed()
        return method(self, *args)

    changed.__name__ = name
    return changed


for _name in (
    "__setitem__",
    "__delitem__",
    "__iadd__",
    "__imul__",
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "sort",
    "reverse",
):
    setattr(RouteList, _name, _counting(_name))


class _Node:
    __slots__ = ("children", "filed", "candidates")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.filed: list[int] = []  # positions of the routes filed here
        self.candidates: list[BaseRoute] = []  # the routes filed here and above, in the routes' order


def literal_segments(path: str) -> list[str]:
    """The complete path segments before the first parameter: every segment a matching path starts with."""
    literal, parameter, _ = path.partition("{")
    segments = literal.split("/")[1:]
    return segments[:-1] if parameter else segments


def _outermost(places: Iterable[list[str]]) -> list[list[str]]:
    """The places none of the others is on the way to (a route filed at `/a` is a candidate along `/a/b` already)."""
    kept: list[list[str]] = []
    for place in sorted(places, key=len):
        if not any(place[: len(k)] == k for k in kept):
            kept.append(place)
    return kept


def filed_under(route: BaseRoute) -> list[list[str]]:
    """Where a route is filed: the literal segments every path it matches starts with ([]: asked for every path). An
    included router is filed at each of its routes' places: a path along none of them cannot reach it (filed where
    its routes' paths part, it was asked on every path under `/openapi`)."""
    if isinstance(route, (Route, WebSocketRoute, Mount)):
        return [literal_segments(route.path)]
    if isinstance(route, EntityRoutes):  # filed without building its routes
        return [literal_segments(route.prefix)]
    contexts = getattr(route, "effective_route_contexts", None)  # FastAPI's included router
    if contexts is not None:
        return _outermost(literal_segments(context.path) for context in contexts()) or [[]]
    return [[]]


class RouteIndex(BaseRoute):
    def __init__(self, routes: RouteList) -> None:
        self.routes = routes
        self._version = -1
        self._root = _Node()
        self._depth = 0

    def _file(self) -> None:
        root, depth = _Node(), 0
        for position, route in enumerate(self.routes):
            if route is self:
                continue
            for segments in filed_under(route):
                node = root
                depth = max(depth, len(segments))
                for segment in segments:
                    node = node.children.setdefault(segment, _Node())
                node.filed.append(position)

        def collect(node: _Node, above: list[int]) -> None:
            positions = sorted(above + node.filed)  # once each: no place of a route is on the way to another
            node.candidates = [self.routes[p] for p in positions]
            for child in node.children.values():
                collect(child, positions)

        collect(root, [])
        self._root, self._depth, self._version = root, depth, self.routes.version

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http":
            return Match.NONE, {}
        if self._version != self.routes.version:
            self._file()
        node = self._root
        for segment in get_route_path(scope).split("/", self._depth + 1)[1:]:
            child = node.children.get(segment)
            if child is None:
                break
            node = child
        for route in node.candidates:
            match, child_scope = route.matches(scope)
            if match is Match.FULL:
                return Match.FULL, {**child_scope, _SELECTED: route}
        return Match.NONE, {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await scope.pop(_SELECTED).handle(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        raise NoMatchFound(name, path_params)  # the routes themselves answer, after the index


def install(router: Router) -> RouteIndex:
    """Put an index first in `router`'s routes, over the routes it has and those added or removed later."""
    routes = router.routes if isinstance(router.routes, RouteList) else RouteList(router.routes)
    index = RouteIndex(routes)
    routes.insert(0, index)
    router.routes = routes
    return index


# Routers as included by the first app of the process, kept: FastAPI builds an included router's routes once per
# inclusion (0.4 s for the protocol modules' ones, 70-150 ms for the web view's and the MCP endpoint's), and an app
# made again (the tests make one per test) takes them built. Their routes read the app from the request, never from
# the app they were first included in.
_INCLUDED: dict[tuple[int, ...], list[BaseRoute]] = {}


def include_once(app: FastAPI, routers: Iterable[APIRouter]) -> None:
    """`app.include_router` of each of `routers`, in order (their lifespans and event handlers merged into the app's,
    as always), with the routes the process built for them before in place of new ones."""
    routers = list(routers)
    key = tuple(map(id, routers))
    start = len(app.router.routes)
    for router in routers:
        app.include_router(router)
    built = _INCLUDED.get(key)
    if built is None:
        _INCLUDED[key] = app.router.routes[start:]
    else:
        app.router.routes[start:] = built
