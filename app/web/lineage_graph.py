"""The Lineage tab: upstream and downstream of an entity through DataHub's `searchAcrossLineage`, as the signed-in
principal reads it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request

from app.auth.model import Principal
from app.web.catalog import graphql, short_name
from app.web.paths import entity_url
from app.web.tabs import Tab, TabRequest

LINEAGE = """
query webLineage($urn: String!, $direction: LineageDirection!) {
  searchAcrossLineage(input: {urn: $urn, direction: $direction, query: "*", start: 0, count: 100,
                              orFilters: [{and: [{field: "degree", values: ["1", "2"]}]}]}) {
    total
    searchResults { degree entity { urn type ... on Dataset { name platform { name } properties { name } } } }
  }
}
"""


@dataclass(frozen=True, slots=True)
class LineageHit:
    urn: str
    url: str | None
    name: str
    platform: str | None
    degree: int


async def lineage(
    request: Request, session: AsyncSession, principal: Principal, urn: str
) -> dict[str, list[LineageHit]]:
    """Upstream and downstream, one and two hops, nearest first."""
    found: dict[str, list[LineageHit]] = {}
    for direction in ("UPSTREAM", "DOWNSTREAM"):
        data = await graphql(request, session, principal, LINEAGE, {"urn": urn, "direction": direction})
        results = (data.get("searchAcrossLineage") or {}).get("searchResults") or []
        hits = []
        for result in results:
            e = result["entity"]
            hits.append(
                LineageHit(
                    urn=e["urn"],
                    url=entity_url(e["urn"]),
                    name=(e.get("properties") or {}).get("name") or e.get("name") or short_name(e["urn"]),
                    platform=(e.get("platform") or {}).get("name"),
                    degree=int(result.get("degree") or 1),
                )
            )
        found[direction.lower()] = sorted(hits, key=lambda h: (h.degree, h.name))
    return found


async def _load(tab: TabRequest) -> dict[str, object]:
    return {"lineage": await lineage(tab.request, tab.db, tab.session.principal, tab.view.urn)}


TAB = Tab(load=_load)
