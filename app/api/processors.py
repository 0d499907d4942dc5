"""The change-processor pipeline (app.write.processors): what is in force, loaded from which package, in which order
(`GET`, READ); and the one way to change it (`PUT`, ADMIN): the pipeline is metaledger's own configuration, the
aspect PIPELINE_ASPECT of PIPELINE_URN, which the general write paths refuse (app.write.rules
SystemEntityThroughItsServices). It is written through the ordinary write pipeline all the same: validated against its
schema, versioned, audited, with its change log; every process takes it up within CHANGE_PROCESSOR_REFRESH_S."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import ALLOW_ADMIN, ALLOW_READ, Caller, Gateway, JsonBody, Session
from app.api.http import json_response
from app.errors import ExistenceConflict, Location, PreconditionFailed
from app.ingest.gateway import IngestGateway
from app.write.processors import PIPELINE_ASPECT, PIPELINE_ENTITY, PIPELINE_URN
from app.write.proposal import IF_VERSION_MATCH, ChangeType, Draft
from app.write.rules import system_service_write

router = APIRouter(prefix="/openapi/v1/change-processors", tags=["change processors"])

# The body is the aspect's value: the pipeline's issues (`$.aspect.value.steps[0].name`) are placed in it
BODY = Location(None, "$", value="$", fields="$")


class StepScope(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entityTypes: list[str] | None = Field(
        None, description="fnmatch patterns of entity types (absent: the processor's own)"
    )
    aspects: list[str] | None = Field(
        None, description="fnmatch patterns of aspect names (absent: the processor's own)"
    )
    changeTypes: list[str] | None = Field(None, description="Change types (absent: the processor's own)")


class PipelineStep(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="An entry point of the group metaledger.change_processors, or a dotted class path")
    enabled: bool = True
    required: bool = Field(False, description="Writes in its scope are refused while it is missing or fails to load")
    scope: StepScope | None = Field(None, description="Overrides of the processor's own scope")
    config: dict[str, str] = Field(default_factory=dict, description="The processor's configuration (strings)")


class PipelineBody(BaseModel):
    """The whole pipeline: its steps in the order they run (an empty list: no processor runs)."""

    model_config = ConfigDict(extra="forbid")

    steps: list[PipelineStep] = Field(max_length=1000)


async def _in_force(gateway: IngestGateway, session: Any) -> dict[str, Any]:
    processors = await gateway.writer.current_processors(session)
    return {
        "urn": PIPELINE_URN,
        "aspectName": PIPELINE_ASPECT,
        "version": processors.version,
        "source": "stored aspect"
        if processors.version
        else "entity_registry.yml changeProcessors (no stored pipeline yet)",
        "steps": processors.describe(),
    }


@router.get(
    "",
    summary="The change-processor pipeline in force: each step in order, loaded or not, from where",
    dependencies=[ALLOW_READ],
)
async def pipeline(gateway: Gateway, session: Session):
    return json_response(await _in_force(gateway, session))


@router.put(
    "",
    summary="Store the change-processor pipeline (the whole of it): in force in every process within "
    "CHANGE_PROCESSOR_REFRESH_S, in this one at once",
    dependencies=[ALLOW_ADMIN],
)
async def store_pipeline(
    body: Annotated[PipelineBody, Depends(JsonBody(PipelineBody))],
    gateway: Gateway,
    session: Session,
    caller: Caller,
    if_version: Annotated[
        int | None,
        Query(
            alias="ifVersion",
            ge=0,
            description="Refuse (409) unless the stored pipeline is at this version (0: none stored)",
        ),
    ] = None,
) -> Any:
    headers = {IF_VERSION_MATCH: str(if_version) if if_version else "-1"} if if_version is not None else None
    draft = Draft(
        0,
        PIPELINE_ENTITY,
        PIPELINE_ASPECT,
        ChangeType.UPSERT.value,
        urn=PIPELINE_URN,
        value=body.model_dump(exclude_none=True),
        headers=headers,
        location=BODY,
    )
    try:
        with system_service_write(PIPELINE_URN, PIPELINE_ASPECT):  # the one write of it the write path lets pass
            outcome = await gateway.submit(session, [draft], caller)
    except PreconditionFailed as error:
        raise ExistenceConflict(
            f"the stored pipeline is not at version {if_version}; nothing was stored", error.issues
        ) from None
    assert outcome.result is not None
    return json_response({**await _in_force(gateway, session), "status": outcome.result.items[0].status.value})
