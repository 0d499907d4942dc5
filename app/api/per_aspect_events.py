"""Per-aspect events ("Metadata Events (v5)", app.kafka.per_aspect): which entity/aspect pairs are routed, on which
topics and subjects, with their generated schemas. Configuration is METALEDGER_EVENTS_V5_ROUTES; this only reads."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import ALLOW_READ, Registry, SettingsDep
from app.api.http import Flag, json_response
from app.avro import per_aspect
from app.kafka.per_aspect import pair_routes

router = APIRouter(prefix="/openapi/v1/events/v5", tags=["per-aspect events"])


@router.get(
    "",
    summary="The routed entity/aspect pairs: their topics, schema registry subjects and schemas",
    dependencies=[ALLOW_READ],
)
async def routed_pairs(
    settings: SettingsDep,
    registry: Registry,
    schemas: Annotated[Flag, Query(description="include each pair's three generated Avro schemas")] = False,
):
    pairs = []
    for route in pair_routes(settings, registry):
        described = route.describe()
        del described["schemaIds"]  # given by the registry that holds the subjects
        if schemas:
            described["schemas"] = {record: route.schemas[record] for record in per_aspect.FAMILY}
        pairs.append(described)
    return json_response({"pairs": pairs, "legacyAuditEvents": settings.mae_v4_enabled, "maeTopic": settings.topic_mae})
