"""An entity page's tabs beyond the entity's own aspects: what each loads, and the assets its template needs.

Every tab is `templates/tabs/<tab in lower case>.html`, included in the entity page with the page's values (`view`,
`session`, `tab`) and what its loader returned. A tab without a loader shows only what `app.web.catalog.entity`
read. The loaders live with their pages (app.web.lineage_graph, app.web.history, app.web.stats); app.web.routes
names each tab's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request

from app.registry.registry import EntityRegistry
from app.web.catalog import EntityView
from app.web.sessions import WebSession


@dataclass(frozen=True, slots=True)
class TabRequest:
    """What a tab's loader may use: the request (its query parameters choose within a tab, e.g. two versions to
    compare), the database session, the registry, the signed-in session and the entity as `catalog.entity` read it."""

    request: Request
    db: AsyncSession
    registry: EntityRegistry
    session: WebSession
    view: EntityView

    @property
    def params(self) -> Mapping[str, str]:
        return self.request.query_params


Loader = Callable[[TabRequest], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Tab:
    load: Loader | None = None
    styles: tuple[str, ...] = ()  # file names under app/web/static
    scripts: tuple[str, ...] = ()
