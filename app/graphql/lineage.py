"""GraphQL's lineage (lineage.graphql): the `paths` of a lineage search's results, `lineage(input: LineageInput!)` of
every type DataHub declares it on, and `Dataset.assertions`. Every lineage answer reads the one walk,
app.search.lineage (searchAcrossLineage and scrollAcrossLineage through app.search.across, in app.graphql.resolvers).

The field resolvers are registered in app.graphql.entities.FIELD_RESOLVERS when this module is imported (by
app.graphql.resolvers)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from app.errors import Issue, ValidationFailed
from app.graphql.entities import FIELD_RESOLVERS, GRAPHQL_TYPE_OF_ENTITY, EntityRef, entity_ref
from app.graphql.paging import declare_paged
from app.registry import EntityRegistry
from app.search import lineage
from app.search.lineage import LineageStep, Path
from app.search.model import URN_FIELD, SearchBackend

if TYPE_CHECKING:
    from app.graphql.resolvers import Context

DEFAULT_LINEAGE_COUNT = 100  # DataHub's EntityLineageResultResolver
DEFAULT_ASSERTIONS_COUNT = 200  # DataHub's EntityAssertionsResolver
declare_paged("lineage", "relationships", DEFAULT_LINEAGE_COUNT)
declare_paged("assertions", "assertions", DEFAULT_ASSERTIONS_COUNT, in_input=False)
MAX_LIST = 10_000  # start + count of one page of either (DataHub's result window)
ASSERTS = "Asserts"  # assertionInfo's relationship to the entity it checks
# DataHub's lineage search groups schema fields into their dataset unless the search's groupingSpec says otherwise
SCHEMA_FIELD_GROUPING = {"baseEntityType": "SCHEMA_FIELD", "groupingEntityType": "DATASET"}
MANUAL_SOURCE = "UI"  # an edge's `properties.source` when a person drew it (DataHub's isManual)


def path_entity(urn: str, entity_type: str, registry: EntityRegistry) -> EntityRef | None:
    """An entity on a path, as GraphQL answers it (null: a type DataHub's GraphQL has none for)."""
    entity = registry.entities.get(entity_type)
    return EntityRef(urn, entity.name) if entity is not None and entity.name in GRAPHQL_TYPE_OF_ENTITY else None


def entity_paths(paths: Iterable[Path], registry: EntityRegistry) -> list[dict[str, Any]]:
    """DataHub's `paths: [EntityPath]`: each from the start to the result (or to one of its schema fields)."""
    return [{"path": [path_entity(u, t, registry) for u, t in path]} for path in paths]


def groups_fields(search_flags: dict[str, Any] | None) -> bool:
    """Whether a lineage search answers schema fields as their datasets: DataHub's default groupingSpec does, a
    groupingSpec without that criterion does not."""
    spec = (search_flags or {}).get("groupingSpec")
    if spec is None:
        return True
    return any(
        all(criterion.get(k) == v for k, v in SCHEMA_FIELD_GROUPING.items())
        for criterion in spec.get("groupingCriteria") or ()
        if isinstance(criterion, dict)
    )


async def indexed(backend: SearchBackend, steps: Sequence[LineageStep]) -> set[str]:
    """The URNs among `steps` that have a live search document (ingested, not soft-deleted): DataHub's lineage
    leaves the others out (ghost entities) unless asked for them."""
    by_type: dict[str, list[str]] = {}
    for step in steps:
        by_type.setdefault(step.entity_type, []).append(step.urn)
    found: set[str] = set()
    for entity_type, urns in by_type.items():
        for start in range(0, len(urns), 1_000):
            chunk = urns[start : start + 1_000]
            page = await backend.search(entity_type, "*", filters={URN_FIELD: chunk}, count=len(chunk), facets=False)
            found.update(hit.urn for hit in page.hits)
    return found


def _window(start: int | None, count: int | None, default: int, path: str) -> tuple[int, int]:
    start = 0 if start is None else start
    count = default if count is None else count
    if start < 0 or count < 0 or start + count > MAX_LIST:
        raise ValidationFailed(
            f"start and count must be at least 0, start + count at most {MAX_LIST}",
            [Issue("out of range", path=path, expected=f"0 <= start, count; start + count <= {MAX_LIST}")],
        )
    return start, count


def _in_time(step: LineageStep, start_ms: int | None, end_ms: int | None) -> bool:
    """An edge is in [start, end] unless it was last updated before `start` or created after `end` (an edge without
    its times always is)."""
    edge = step.edge
    updated = edge.updated_on if edge.updated_on is not None else edge.created_on
    if start_ms is not None and updated is not None and updated < start_ms:
        return False
    return not (end_ms is not None and edge.created_on is not None and edge.created_on > end_ms)


async def resolve_lineage(root: EntityRef, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    """DataHub's EntityLineageResultResolver: the entities one hop from this one in `direction` (the walk's first
    hop), the ones without a live search document left out and counted in `filtered` unless
    `includeGhostEntities`; `total` counts the rest."""
    context: Context = info.context
    start, count = _window(input.get("start"), input.get("count"), DEFAULT_LINEAGE_COUNT, "$input.start")
    backend = await context.backend()
    walk = await lineage.walk(backend, root.urn, direction=input["direction"], max_hops=1)
    walked = [s for s in walk.steps if _in_time(s, input.get("startTimeMillis"), input.get("endTimeMillis"))]
    kept = walked
    if not input.get("includeGhostEntities"):
        live = await indexed(backend, walked)
        kept = [s for s in walked if s.urn in live]
    page = kept[start : start + count]
    return {
        "start": start,
        "count": len(page),
        "total": len(kept),
        "filtered": len(walked) - len(kept),
        "relationships": [
            {
                "type": step.edge.relationship,
                "entity": path_entity(step.urn, step.entity_type, context.registry),
                "degree": step.degree,
                "createdOn": step.edge.created_on,
                "createdActor": entity_ref(step.edge.created_actor) if step.edge.created_actor else None,
                "updatedOn": step.edge.updated_on,
                "updatedActor": entity_ref(step.edge.updated_actor) if step.edge.updated_actor else None,
                "isManual": (step.edge.properties or {}).get("source") == MANUAL_SOURCE,
                "paths": entity_paths([step.path], context.registry),
            }
            for step in page
        ],
    }


async def resolve_assertions(
    root: EntityRef, info: Any, start: int | None = None, count: int | None = None, includeSoftDeleted: bool = False
) -> dict[str, Any]:
    """DataHub's EntityAssertionsResolver: the assertions whose assertionInfo targets this entity (their `Asserts`
    edges to it), a page of the edges; those that do not exist, the caller may not see or (unless
    `includeSoftDeleted`) are soft-deleted are left out of the page, not of `total`."""
    context: Context = info.context
    start, count = _window(start, count, DEFAULT_ASSERTIONS_COUNT, "$start")
    backend = await context.backend()
    edges, total = await backend.relationships(
        root.urn, direction="INCOMING", types=[ASSERTS], start=start, count=count
    )
    urns = list(dict.fromkeys(e.source for e in edges if e.source_type == "assertion"))

    async def shown(urn: str) -> bool:
        if not await context.exists(urn):
            return False
        status = await context.aspect(urn, "status") if not includeSoftDeleted else None
        return not (status or {}).get("removed")

    hidden = await context.unreadable(urns)  # the read rule
    urns = [u for u in urns if u not in hidden]
    visible = await asyncio.gather(*(shown(u) for u in urns))
    assertions = [EntityRef(u, "assertion") for u, ok in zip(urns, visible, strict=True) if ok]
    return {"start": start, "count": len(assertions), "total": total, "assertions": assertions}


for _type in (
    "Dataset",
    "ERModelRelationship",
    "SchemaFieldEntity",
    "Dashboard",
    "Chart",
    "DataFlow",
    "DataJob",
    "DataProcessInstance",
    "Assertion",
    "MLModel",
    "MLModelGroup",
    "MLFeature",
    "MLPrimaryKey",
    "MLFeatureTable",
):
    FIELD_RESOLVERS.setdefault(_type, {})["lineage"] = resolve_lineage
FIELD_RESOLVERS.setdefault("Dataset", {})["assertions"] = resolve_assertions
