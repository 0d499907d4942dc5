"""Rest.li `POST /entities?action=ingest`: the legacy MetadataChangeEvent, as DataHub's Python client sends it
(`emit(MetadataChangeEvent)`, sink `mode: SYNC/ASYNC`):

    {"entity": {"value": {"com.linkedin.metadata.snapshot.DatasetSnapshot": {"urn": ..., "aspects": [{FQN: {...}}]}}},
     "systemMetadata": {...}}

The snapshot is unbundled into one UPSERT per aspect (app.proposals.mce) and written in one transaction. The answer
is 200 with an empty JSON object (the Rest.li action has no return value); a bad event answers 400 with the
project's error body, every issue's `path` pointing into the request. `X-RestLi-Protocol-Version` is accepted and
ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy.ext.asyncio import AsyncSession

from app.deps import get_session, get_write_service, request_audit_stamp
from app.errors import ERROR_RESPONSES, ValidationFailed
from app.http import json_response, read_json
from app.proposals.mce import relocate_issues, unbundle_restli_entity
from app.write.proposal import AuditStamp
from app.write.service import WriteService

router = APIRouter(tags=["rest.li"])


@router.post(
    "/entities",
    responses=ERROR_RESPONSES,
    summary="Ingest a legacy MetadataChangeEvent snapshot (Rest.li action=ingest)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["entity"],
                        "properties": {
                            "entity": {
                                "type": "object",
                                "required": ["value"],
                                "properties": {
                                    "value": {
                                        "type": "object",
                                        "description": 'One member, the snapshot class: {"com.linkedin.metadata.snapshot.'
                                        '<Entity>Snapshot": {"urn": "...", "aspects": [{"<Pegasus class>": {...}}]}}',
                                    }
                                },
                            },
                            "systemMetadata": {"type": "object"},
                        },
                    }
                }
            },
        }
    },
)
async def entities_action(
    request: Request,
    session: Annotated[AsyncSession, Depends(get_session)],
    writer: Annotated[WriteService, Depends(get_write_service)],
    audit: Annotated[AuditStamp, Depends(request_audit_stamp)],
    action: Annotated[Literal["ingest"], Query(description="Only `ingest` is served here")],
) -> Response:
    """Every aspect of the snapshot is committed together, or none is."""
    body = await read_json(request, writer.settings.max_request_bytes)
    event = unbundle_restli_entity(body, writer.registry)
    try:
        proposals = writer.prepare(event.drafts)
    except ValidationFailed as error:
        raise relocate_issues(error, event) from None
    await writer.apply(session, proposals, audit)
    return json_response({})

