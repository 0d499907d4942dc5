"""The Metadata Change Proposal as metaledger's generic endpoint takes it: every field of DataHub's MCP model.
These models document the API (OpenAPI); bodies are parsed by `parse_proposals` for speed and precise errors."""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field

from app.errors import Issue, ValidationFailed
from app.write.proposal import JSON_CONTENT_TYPE
from app.write.service import Draft

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
        None, description="If-Version-Match, If-Modified-Since, If-Unmodified-Since, If-None-Match, X-DataHub-Sync-Index-Update"
    )
    auditHeader: dict[str, Any] | None = None


class ProposalResult(BaseModel):
    index: int
    urn: str
    aspectName: str
    status: Literal["CREATED", "UPDATED", "UNCHANGED", "DELETED", "ABSENT", "FILTERED", "APPENDED"]
    version: str | None = None
    systemMetadata: dict[str, Any] | None = None
    message: str | None = None


class ProposalsResponse(BaseModel):
    results: list[ProposalResult]
    changeLogs: int = Field(description="Change logs committed with this write")


MCP_FIELDS = frozenset(MetadataChangeProposal.model_fields)


def _generic_aspect(raw: Any, index: int, path: str) -> tuple[Any, str | None]:
    """(value, contentType) of a GenericAspect whose value may be a JSON object or a JSON string."""
    if not isinstance(raw, dict) or "value" not in raw:
        raise ValidationFailed(f"{path} must be {{value, contentType}}", [Issue("expected a GenericAspect", index, path=path)])
    value = raw["value"]
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as error:
            raise ValidationFailed(f"{path}.value is not valid JSON", [Issue(str(error), index, path=f"{path}.value")]) from None
    return value, raw.get("contentType")


def parse_proposals(body: Any) -> list[Draft]:
    if not isinstance(body, list):
        raise ValidationFailed("the body must be a JSON array of proposals", [Issue("expected an array", path="$")])
    drafts: list[Draft] = []
    issues: list[Issue] = []
    for index, mcp in enumerate(body):
        path = f"$[{index}]"
        try:
            if not isinstance(mcp, dict):
                raise ValidationFailed("a proposal must be an object", [Issue("expected an object", index, path=path)])
            unknown = set(mcp) - MCP_FIELDS
            if unknown:
                raise ValidationFailed("unknown field", [Issue(f"unknown proposal field(s) {sorted(unknown)}", index, path=path)])
            for required in ("entityType", "aspectName"):
                if not isinstance(mcp.get(required), str):
                    raise ValidationFailed("missing field", [Issue(f"missing required string field {required!r}", index, path=f"{path}.{required}")])
            value, content_type = (None, None)
            if mcp.get("aspect") is not None:
                value, content_type = _generic_aspect(mcp["aspect"], index, f"{path}.aspect")
            elif mcp.get("changeType", "UPSERT") != "DELETE":
                raise ValidationFailed("missing aspect", [Issue("`aspect` is required unless changeType is DELETE", index, path=f"{path}.aspect")])
            key_aspect = None
            if mcp.get("entityKeyAspect") is not None:
                key_aspect, _ = _generic_aspect(mcp["entityKeyAspect"], index, f"{path}.entityKeyAspect")
            system_metadata = mcp.get("systemMetadata")
            if isinstance(system_metadata, str):  # `datahub put --run-id` sends it as a JSON string
                system_metadata = orjson.loads(system_metadata)
            if system_metadata is not None and not isinstance(system_metadata, dict):
                raise ValidationFailed("bad systemMetadata", [Issue("systemMetadata must be an object", index, path=f"{path}.systemMetadata")])
            headers = mcp.get("headers")
            if headers is not None and not (isinstance(headers, dict) and all(isinstance(v, str) for v in headers.values())):
                raise ValidationFailed("bad headers", [Issue("headers must be an object of strings", index, path=f"{path}.headers")])
            drafts.append(
                Draft(
                    index=index,
                    entity_type=mcp["entityType"],
                    aspect_name=mcp["aspectName"],
                    change_type=mcp.get("changeType") or "UPSERT",
                    urn=mcp.get("entityUrn"),
                    entity_key_aspect=key_aspect,
                    value=value,
                    content_type=content_type,
                    system_metadata=system_metadata,
                    headers=headers,
                )
            )
        except ValidationFailed as error:
            issues.extend(error.issues)
        except orjson.JSONDecodeError as error:
            issues.append(Issue(f"systemMetadata is not valid JSON: {error}", index, path=f"{path}.systemMetadata"))
    if issues:
        raise ValidationFailed(f"{len({i.index for i in issues})} of {len(body)} proposals are malformed; nothing was written", issues)
    return drafts
