"""The v1 proposals endpoint: a JSON array of raw MCPs with every field of DataHub's model (metaledger's own)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from app.api.deps import DeclaredBody, Gateway, Session, Writer, get_gateway
from app.api.http import Flag, check_batch_size, json_response
from app.errors import ERROR_RESPONSES
from app.idempotency import idempotent
from app.ingest.gateway import Submission
from app.ingest.mcp import MCP_FIELDS
from app.write.proposal import JSON_CONTENT_TYPE, Draft

router = APIRouter(prefix="/openapi/v1", tags=["proposals"])

ChangeTypeName = Literal["UPSERT", "CREATE", "CREATE_ENTITY", "UPDATE", "DELETE", "PATCH"]


class GenericAspect(BaseModel):
    value: dict[str, Any] | list[Any] | str = Field(
        description="The aspect as a JSON object (or, as Rest.li sends it, the same JSON as a string); "
        "for PATCH an RFC 6902 array or {patch: [...]}"
    )
    contentType: str = JSON_CONTENT_TYPE


class MetadataChangeProposal(BaseModel):
    entityType: str = Field(examples=["dataset"])
    entityUrn: str | None = Field(None, examples=["urn:li:dataset:(urn:li:dataPlatform:hive,db.table,PROD)"])
    entityKeyAspect: GenericAspect | None = Field(None, description="Identifies the entity instead of entityUrn")
    changeType: ChangeTypeName = "UPSERT"
    aspectName: str = Field(examples=["status"])
    aspect: GenericAspect | None = None
    systemMetadata: dict[str, Any] | None = None
    headers: dict[str, str] | None = Field(
        None,
        description="If-Version-Match, If-Modified-Since, If-Unmodified-Since, If-None-Match, X-DataHub-Sync-Index-Update",
    )
    auditHeader: dict[str, Any] | None = None


class ChangeProcessorReport(BaseModel):
    processor: str
    outcome: Literal["accepted", "mutated", "ignored", "rejected", "failed"]
    reason: str | None = None
    emitted: int | None = Field(None, description="Proposals it emitted")
    ms: float


class EmittedResult(BaseModel):
    urn: str
    aspectName: str
    status: str
    version: str | None = None
    changeProcessors: list[ChangeProcessorReport] | None = None


class ProposalResult(BaseModel):
    index: int
    urn: str
    aspectName: str
    status: Literal["CREATED", "UPDATED", "UNCHANGED", "DELETED", "ABSENT", "FILTERED", "IGNORED", "APPENDED"]
    version: str | None = None
    systemMetadata: dict[str, Any] | None = None
    message: str | None = None
    changeProcessors: list[ChangeProcessorReport] | None = Field(
        None, description="The change processors' before phase on this proposal, in order (absent: none ran)"
    )
    emitted: list[EmittedResult] | None = Field(
        None, description="Proposals the change processors emitted because of this one, written with it"
    )


class ProposalsResponse(BaseModel):
    results: list[ProposalResult]
    changeLogs: int = Field(description="Change logs committed with this write")


class QueuedResult(BaseModel):
    index: int
    urn: str
    aspectName: str
    status: Literal["QUEUED"] = "QUEUED"


class QueuedResponse(BaseModel):
    results: list[QueuedResult]
    changeLogs: int = Field(0, description="Always 0: nothing is committed yet")


assert frozenset(MetadataChangeProposal.model_fields) == MCP_FIELDS, "the documented MCP and the parsed one differ"


class ProposalBatch(DeclaredBody[list[Draft]]):
    """A JSON array of MCPs, at most MAX_BATCH_ITEMS (413), parsed into their drafts (a 400 naming every bad one).
    Documented by reference: MetadataChangeProposal is a component of the document (app.api.documented_models)."""

    def request_body_schema(self) -> dict[str, Any]:
        return {"type": "array", "items": {"$ref": "#/components/schemas/MetadataChangeProposal"}}

    async def parse(self, document: Any, request: Request) -> list[Draft]:
        gateway = await get_gateway(request)
        check_batch_size(document, gateway.settings)
        return await gateway.parse_in_turns(document)


@router.post(
    "/proposals",
    response_model=ProposalsResponse,
    responses={
        **ERROR_RESPONSES,
        202: {"model": QueuedResponse, "description": "Queued (async=true): validated and on the proposal topic"},
    },
    summary="Write a batch of Metadata Change Proposals in one transaction",
    operation_id="ingestProposals",
)
@idempotent
async def ingest_proposals(
    caller: Writer,
    drafts: Annotated[list[Draft], Depends(ProposalBatch())],
    request: Request,
    session: Session,
    gateway: Gateway,
    async_: Annotated[
        Flag,
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
    outcome = await gateway.submit(session, drafts, caller, queue=async_, request_headers=request.headers)
    if outcome.result is None:
        return json_response(_queued(outcome), 202)
    return json_response(_written(outcome))


def _queued(outcome: Submission) -> dict[str, Any]:
    results = [
        {"index": p.index, "urn": p.urn, "aspectName": p.aspect_name, "status": "QUEUED"} for _, p in outcome.queued
    ]
    return {"results": results, "changeLogs": 0}


def _written(outcome: Submission) -> dict[str, Any]:
    assert outcome.result is not None
    return {
        **({"index": outcome.index.to_json()} if outcome.index is not None else {}),
        "results": [
            {
                "index": r.index,
                "urn": r.urn,
                "aspectName": r.aspect,
                "status": r.status.value,
                "version": r.version,
                "systemMetadata": r.system_metadata,
                **({"message": r.message} if r.message else {}),
                **r.processing(),
            }
            for r in outcome.result.items
        ],
        "changeLogs": outcome.result.change_logs,
    }
