"""DataHub's Timeline API, as `datahub timeline --urn … --category …` calls it (app.timeline computes it).

`GET /openapi/v2/timeline/v1/{urn}?categories=TAG,OWNERSHIP&startTime=&endTime=&raw=` → DataHub's list of
ChangeTransactions `[{"timestamp", "actor", "semVer", "semVerChange", "changeEvents": [...], "versionStamp",
"rawDiff"?}]`, oldest first. When retention pruned versions the range reaches back to, the list is what the kept
versions tell, and `X-Metaledger-History-Truncated` (`<aspect>=<oldest version kept>, ...`) with
`X-Metaledger-History-Complete-From` (epoch ms from which the history is whole) say so: a header, because
DataHub's client reads the body as a bare list.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import ALLOW_READ, Caller, ReadSession, Registry
from app.api.http import Flag, UrnPath, entity_of_urn, json_response
from app.auth.reads import unreadable_entities
from app.errors import ERROR_RESPONSES
from app.timeline.service import CATEGORY_ASPECTS, TimelineService, parse_categories, time_range
from app.write.repository import AspectRepository

router = APIRouter(prefix="/openapi/v2/timeline/v1", tags=["timeline"], dependencies=[ALLOW_READ])

TRUNCATED_HEADER = "X-Metaledger-History-Truncated"
COMPLETE_FROM_HEADER = "X-Metaledger-History-Complete-From"
MAX_EPOCH_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last instant a timestamp column holds


class ChangeEvent(BaseModel):
    model_config = ConfigDict(extra="allow")
    entityUrn: str
    category: str
    operation: str
    modifier: str | None = None
    parameters: dict[str, Any] | None = None
    auditStamp: dict[str, Any]
    semVerChange: str = Field(description="MAJOR, MINOR, PATCH or NONE")
    description: str | None = None


class ChangeTransaction(BaseModel):
    model_config = ConfigDict(extra="allow")
    timestamp: int = Field(description="When the versions of this transaction were written (epoch ms)")
    actor: str
    semVer: str = Field(description="`<major>.<minor>.<patch>-computed`, the first transaction of the range 0.0.0")
    semVerChange: str = Field(description="The highest change of the transaction: MAJOR, MINOR, PATCH or NONE")
    changeEvents: list[ChangeEvent]
    versionStamp: str = Field(description="`<aspect>:<version>;...` of the aspects read, at this transaction")
    rawDiff: list[dict[str, Any]] | None = Field(
        None,
        description="With raw=true: a JSON Patch (RFC 6902) of the "
        "transaction's first aspect (by name) from its previous version",
    )


@router.get(
    "/{urn}",
    response_model=list[ChangeTransaction],
    responses=ERROR_RESPONSES,
    summary="An entity's history as change transactions with semantic versions (DataHub's Timeline API)",
    description="`categories` (repeat it or separate with commas): " + ", ".join(CATEGORY_ASPECTS) + " (OWNER is "
    "OWNERSHIP). `startTime`/`endTime` in epoch ms (default: the week before now). Computed from the versions "
    "the store keeps (RETENTION_MAX_VERSIONS per aspect): when older ones were pruned, the header "
    f"`{TRUNCATED_HEADER}` names the aspects and `{COMPLETE_FROM_HEADER}` the time from which the history is whole.",
)
async def timeline(
    urn: UrnPath,
    session: ReadSession,
    registry: Registry,
    caller: Caller,
    categories: Annotated[list[str], Query(description="Change categories: TAG, OWNERSHIP, TECHNICAL_SCHEMA, ...")],
    startTime: Annotated[int, Query(ge=-1, le=MAX_EPOCH_MS, description="Epoch ms; -1: a week before endTime")] = -1,
    endTime: Annotated[int, Query(ge=0, le=MAX_EPOCH_MS, description="Epoch ms; 0: now")] = 0,
    raw: Annotated[Flag, Query(description="true: each transaction carries its rawDiff")] = False,
) -> Any:
    entity_type = entity_of_urn(registry, urn)
    wanted = parse_categories(categories)
    start, end = time_range(startTime, endTime)
    if await unreadable_entities(caller, [urn], AspectRepository(session)):  # the read rule: an entity never written
        return json_response([])
    result = await TimelineService(session, registry).timeline(urn, entity_type, wanted, start, end, raw)
    headers = None
    if result.truncated:
        headers = {
            TRUNCATED_HEADER: ", ".join(f"{aspect}={version}" for aspect, version in sorted(result.truncated.items())),
            COMPLETE_FROM_HEADER: str(result.complete_from_ms),
        }
    return json_response(result.transactions, headers=headers)
