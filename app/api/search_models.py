"""Response shapes the search routes (app.api.search) and the scroll routes (app.api.scroll) share."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ScrollEntity(BaseModel):
    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "description": '`urn` and the entity\'s aspects as in GET entity: `{<aspect>: {"value", "systemMetadata"?}}`'
        },
    )
    urn: str


class EntityRef(BaseModel):
    urn: str
    entityType: str


class RelationshipItem(BaseModel):
    source: EntityRef
    destination: EntityRef
    relationshipType: str
    createdOn: int | None = None
    createdActor: str | None = None
    updatedOn: int | None = None
    updatedActor: str | None = None
    via: str | None = None
    properties: dict[str, Any] | None = None
