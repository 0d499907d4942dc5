"""metaledger's generic write endpoint: a list of raw MCPs with every field of DataHub's model."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncSession

from app.deps import get_session, get_write_service, request_audit_stamp
from app.errors import ERROR_RESPONSES
from app.http import json_response, read_json
from app.kafka.proposals import proposal_to_mcp
from app.proposals.schemas import MetadataChangeProposal, ProposalsResponse, parse_proposals
from app.search.service import sync_index_if_requested
from app.write.proposal import AuditStamp, Proposal
from app.write.service import Draft, WriteService

router = APIRouter(prefix="/openapi/v1", tags=["proposals"])


class QueuedResult(BaseModel):
    index: int
    urn: str
    aspectName: str
    status: Literal["QUEUED"] = "QUEUED"


class QueuedResponse(BaseModel):
    results: list[QueuedResult]
    changeLogs: int = Field(0, description="Always 0: nothing is committed yet")


async def queue_proposals(request: Request, drafts: list[Draft], proposals: list[Proposal]) -> list[tuple[Draft, Proposal]] | None:
    """Produce validated proposals to the MCP topic (async=true). Returns the (draft, proposal) pairs queued, or None
    when Kafka is not configured: the caller then applies synchronously (documented behaviour)."""
    producer = getattr(request.app.state, "proposal_producer", None)
    if producer is None:
        return None
    by_index = {draft.index: draft for draft in drafts}
    pairs = [(by_index[p.index], p) for p in proposals]
    await producer.send([proposal_to_mcp(draft, proposal) for draft, proposal in pairs])
    return pairs


@router.post(
    "/proposals",
    response_model=ProposalsResponse,
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
    responses={**ERROR_RESPONSES, 202: {"model": QueuedResponse, "description": "Queued (async=true): validated and on the proposal topic"}},
    summary="Write a batch of Metadata Change Proposals in one transaction",
)
async def ingest_proposals(
    request: Request,
    session: Annotated[AsyncSession, Depends(get_session)],
    writer: Annotated[WriteService, Depends(get_write_service)],
    audit: Annotated[AuditStamp, Depends(request_audit_stamp)],
    async_: Annotated[
        bool,
        Query(
            alias="async",
            description="Validate now, queue on the proposal topic and answer 202. The MCP consumer applies the "
            "proposals later, each on its own (not as one transaction); a failure goes to the failed-proposal topic. "
            "Without Kafka configured the write is applied synchronously (200).",
        ),
    ] = False,
):
    """All proposals commit together or none does. A bad proposal fails the batch with a 400 naming it (DataHub
    skips bad proposals silently); a failed If-* precondition answers 412, an existence conflict 409.
    With `async=true` the validation still happens now (400), and the 202 lists what was queued.
    A proposal with header `X-DataHub-Sync-Index-Update: true` (or that HTTP request header) is indexed before the
    response: top-level `"index": {"status": "UPDATED"|"PENDING", "error"?}` (PENDING: the index catches up later)."""
    drafts = parse_proposals(await read_json(request, writer.settings.max_request_bytes))
    proposals = writer.prepare(drafts)
    if async_:
        queued = await queue_proposals(request, drafts, proposals)
        if queued is not None:
            return json_response(
                {
                    "results": [
                        {"index": p.index, "urn": p.urn, "aspectName": p.aspect_name, "status": "QUEUED"} for _, p in queued
                    ],
                    "changeLogs": 0,
                },
                202,
            )
    result = await writer.apply(session, proposals, audit)
    index = await sync_index_if_requested(request, proposals, result)
    return json_response(
        {
            **({"index": index.to_json()} if index is not None else {}),
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
