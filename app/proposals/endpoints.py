"""metaledger's generic write endpoint: a list of raw MCPs with every field of DataHub's model."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession

from app.deps import get_session, get_write_service, request_audit_stamp
from app.errors import ERROR_RESPONSES
from app.http import json_response, read_json
from app.proposals.schemas import MetadataChangeProposal, ProposalsResponse, parse_proposals
from app.write.proposal import AuditStamp
from app.write.service import WriteService

router = APIRouter(prefix="/openapi/v1", tags=["proposals"])


@router.post(
    "/proposals",
    response_model=ProposalsResponse,
    responses=ERROR_RESPONSES,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"type": "array", "items": {"$ref": "#/components/schemas/MetadataChangeProposal"}}
                }
            },
        }
    },
    summary="Write a batch of Metadata Change Proposals in one transaction",
)
async def ingest_proposals(
    request: Request,
    session: Annotated[AsyncSession, Depends(get_session)],
    writer: Annotated[WriteService, Depends(get_write_service)],
    audit: Annotated[AuditStamp, Depends(request_audit_stamp)],
    async_: Annotated[bool, Query(alias="async", description="Accepted; the write is applied synchronously")] = False,
):
    """All proposals commit together or none does. A bad proposal fails the batch with a 400 naming it (DataHub
    skips bad proposals silently); a failed If-* precondition answers 412, an existence conflict 409."""
    drafts = parse_proposals(await read_json(request, writer.settings.max_request_bytes))
    result = await writer.apply(session, writer.prepare(drafts), audit)
    return json_response(
        {
            "results": [
                {
                    "index": r.index,
                    "urn": r.urn,
                    "aspectName": r.aspect,
                    "status": r.status.value,
                    "version": r.version,
                    "systemMetadata": r.system_metadata,
                    **({"message": r.message} if r.message else {}),
                }
                for r in result.items
            ],
            "changeLogs": result.change_logs,
        }
    )


# Referenced from the request body above; listed so the spec carries the component.
PROPOSAL_COMPONENTS = [MetadataChangeProposal]
