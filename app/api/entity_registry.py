"""DataHub's entity registry API (`EntityRegistryController`, openapi v1), from the loaded registry.

`GET /openapi/v1/registry/models/entity/specifications?start=0&count=5` → DataHub's `PaginatedResponse` of
`EntitySpecDto`s, entities sorted by name: `{"elements": [{"name", "entityAnnotation", "keyAspectName",
"keyAspectSpec", "aspectSpecs", "aspectSpecMap"}], "start", "count", "total"}`. DataHub's client pages through it
(`DataHubGraph.get_entity_aspect_specs`) to learn which aspects each entity has and their `schemaVersion`.
DataHub asks for MANAGE_SYSTEM_OPERATIONS here; metaledger asks for READ: the registry is the data model every
reader writes against, and the published OpenAPI document already shows it. The field specs of DataHub's DTO
(searchable, relationship, timeseries fields) are not served.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from app.api.deps import ALLOW_READ, Registry
from app.api.http import json_response
from app.errors import ERROR_RESPONSES, Issue, ValidationFailed
from app.registry import EntityRegistry
from app.registry.registry import AspectSpec

router = APIRouter(prefix="/openapi/v1/registry/models", tags=["entity registry"], dependencies=[ALLOW_READ])


def aspect_spec_dto(aspect: AspectSpec) -> dict[str, Any]:
    annotation: dict[str, Any] = {
        "name": aspect.name,
        "timeseries": aspect.is_timeseries,
        "autoRender": bool(aspect.annotation.get("autoRender", False)),
        "schemaVersion": aspect.schema_version,
    }
    if isinstance(aspect.annotation.get("renderSpec"), dict):
        annotation["renderSpec"] = aspect.annotation["renderSpec"]
    return {"aspectAnnotation": annotation}


def entity_spec_dto(registry: EntityRegistry, name: str) -> dict[str, Any]:
    spec = registry.entities[name]
    aspects = [registry.aspects[a] for a in spec.aspects_in_order or sorted(spec.aspect_names)]
    dtos = {a.name: aspect_spec_dto(a) for a in aspects}
    entity_annotation: dict[str, Any] = {"name": spec.name, "keyAspect": spec.key_aspect}
    if spec.extra.get("searchGroup") is not None:
        entity_annotation["searchGroup"] = spec.extra["searchGroup"]
    return {
        "name": spec.name,
        "entityAnnotation": entity_annotation,
        "keyAspectName": spec.key_aspect,
        "keyAspectSpec": dtos[spec.key_aspect],
        "aspectSpecs": list(dtos.values()),
        "aspectSpecMap": dtos,
    }


@router.get(
    "/entity/specifications",
    responses=ERROR_RESPONSES,
    summary="Every entity of the registry with its aspects (DataHub's entity registry API), a page at a time",
)
async def entity_specifications(
    registry: Registry,
    start: Annotated[int, Query(ge=0, description="Index of the first entity (by name)")] = 0,
    count: Annotated[int, Query(ge=0, le=10_000, description="Entities per page")] = 5,
) -> Any:
    names = sorted(registry.entities)
    if names and start > len(names) - 1:
        # DataHub refuses a start past the last entity the same way (IllegalArgumentException)
        raise ValidationFailed(
            f"Start offset {start} exceeds total {len(names) - 1}",
            [Issue("start past the last entity", path="$start", expected=f"0..{len(names) - 1}", found=str(start))],
        )
    page = names[start : start + count]
    return json_response(
        {
            "elements": [entity_spec_dto(registry, name) for name in page],
            "start": start,
            "count": len(page),
            "total": len(names),
        }
    )
