"""The change-processor pipeline (app.write.processors): what is in force, loaded from which package, in which order.
It is changed by writing its aspect through the ordinary write API (ADMIN only), so this route only reads."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import ALLOW_READ, Gateway, Session
from app.api.http import json_response
from app.write.processors import PIPELINE_ASPECT, PIPELINE_URN

router = APIRouter(prefix="/openapi/v1/change-processors", tags=["change processors"])


@router.get("", summary="The change-processor pipeline in force: each step in order, loaded or not, from where",
            dependencies=[ALLOW_READ])
async def pipeline(gateway: Gateway, session: Session):
    processors = await gateway.writer.current_processors(session)
    return json_response({
        "urn": PIPELINE_URN,
        "aspectName": PIPELINE_ASPECT,
        "version": processors.version,
        "source": "stored aspect" if processors.version else "entity_registry.yml changeProcessors (no stored pipeline yet)",
        "steps": processors.describe(),
    })
