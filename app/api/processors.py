"""The change-processor pipeline (app.write.processors): what is loaded, from which package, in which order."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import ALLOW_READ, Gateway
from app.api.http import json_response

router = APIRouter(prefix="/openapi/v1/change-processors", tags=["change processors"])


@router.get("", summary="The change-processor pipeline: each step in order, loaded or not, from where",
            dependencies=[ALLOW_READ])
async def pipeline(gateway: Gateway):
    processors = gateway.writer.processors
    if processors is None:
        return json_response({"version": 0, "steps": []})
    return json_response({"version": processors.version, "steps": processors.describe()})
