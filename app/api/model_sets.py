"""Models registered at run time (app.registry.runtime, app.modelset) over HTTP, admins only: apply a
whole runtime model set (or a dry run: the checks and the diff), read the set in force, list its versions. The same
operations as `metaledger model apply|diff|history`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import ALLOW_ADMIN, Caller, Gateway, JsonBody, Session
from app.api.http import Flag, json_response
from app.errors import ERROR_RESPONSES, Issue, ValidationFailed
from app.modelset.service import apply_models
from app.modelset.store import model_history, stored_models
from app.registry.runtime import Compatibility, ModelSetError, RuntimeModelSet

router = APIRouter(prefix="/openapi/v1/models", tags=["models"], responses=ERROR_RESPONSES, dependencies=[ALLOW_ADMIN])


class ModelAspect(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_: dict[str, Any] | str = Field(
        alias="schema",
        description='The .avsc record schema (an object or its JSON text) with an "Aspect": {"name": '
        "...} annotation, as in a model source",
    )
    compatibility: Compatibility = Field(
        Compatibility.BACKWARD,
        description="How it may change at the next apply: BACKWARD (the new schema reads the "
        "stored values), FULL (both ways) or NONE",
    )


class ModelEntity(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=200, examples=["dataset"])
    keyAspect: str | None = Field(None, max_length=200, description="Required for a new entity")
    aspects: list[str] = Field(default_factory=list, max_length=1000)
    category: str | None = Field(None, max_length=200)
    doc: str | None = Field(None, max_length=10_000)


class ModelSet(BaseModel):
    """The whole runtime model set: what is not in it is removed (refused while stored values use it)."""

    model_config = ConfigDict(extra="forbid")

    aspects: list[ModelAspect] = Field(default_factory=list, max_length=1000)
    entities: list[ModelEntity] = Field(
        default_factory=list, max_length=1000, description="entity_registry.yml's entities: entries"
    )


def _model_set(body: ModelSet) -> RuntimeModelSet:
    try:
        return RuntimeModelSet.from_json(body.model_dump(by_alias=True))
    except ModelSetError as error:
        raise ValidationFailed(str(error), [Issue(error.reason, path=error.path)]) from None


@router.post("", summary="Apply a runtime model set (checked; dryRun: the diff only)")
async def apply(
    body: Annotated[ModelSet, Depends(JsonBody(ModelSet))],
    gateway: Gateway,
    session: Session,
    caller: Caller,
    dry_run: Annotated[Flag, Query(alias="dryRun", description="Check and diff, store nothing")] = False,
    if_version: Annotated[
        int | None,
        Query(
            alias="ifVersion",
            ge=0,
            description="Refuse (409) unless the stored set is at this version (0: none stored)",
        ),
    ] = None,
) -> Any:
    return json_response(
        await apply_models(gateway, session, caller, _model_set(body), dry_run=dry_run, if_version=if_version)
    )


@router.get("", summary="The runtime model set in force: its aspects, entities and version")
async def current(session: Session) -> Any:
    return json_response((await stored_models(session)).to_json())


@router.get("/history", summary="Every stored version of the runtime model set, newest first")
async def history(session: Session) -> Any:
    return json_response({"versions": await model_history(session)})
