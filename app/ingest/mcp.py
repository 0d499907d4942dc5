"""The Metadata Change Proposal wire format (DataHub's MCP, JSON form): MCPs as clients send them ↔ drafts.

Every protocol that carries MCPs parses them here: the v1 proposals endpoint (a JSON array), Rest.li's
`ingestProposal`/`ingestProposalBatch` (one object, or an array under `proposals`), and the MCP topic (one record).
`base` is the JSON path of the MCPs in the caller's document, so every issue names what the caller sent.
`proposal_to_mcp` is the reverse, for the MCP topic (asynchronous ingestion).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from app.errors import Issue, Location, ValidationFailed
from app.turns import TimeSlice
from app.write.proposal import JSON_CONTENT_TYPE, JSON_PATCH_CONTENT_TYPE, ChangeType, Draft, Proposal

MCP_FIELDS = frozenset(
    {
        "entityType",
        "entityUrn",
        "entityKeyAspect",
        "changeType",
        "aspectName",
        "aspect",
        "systemMetadata",
        "headers",
        "auditHeader",
    }
)


def _generic_aspect(raw: Any, index: int | None, path: str) -> tuple[Any, str | None]:
    """(value, contentType) of a GenericAspect whose value may be a JSON object or a JSON string."""
    if not isinstance(raw, dict) or "value" not in raw:
        raise ValidationFailed(
            f"{path} must be {{value, contentType}}", [Issue("expected a GenericAspect", index, path=path)]
        )
    value = raw["value"]
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as error:
            raise ValidationFailed(
                f"{path}.value is not valid JSON", [Issue(str(error), index, path=f"{path}.value")]
            ) from None
    return value, raw.get("contentType")


def parse_mcp(mcp: Any, location: Location, draft_index: int = 0) -> Draft:
    """One MCP → a draft; ValidationFailed naming the field (paths under `location.base`)."""
    index, path = location.index, location.base
    if not isinstance(mcp, dict):
        raise ValidationFailed("a proposal must be an object", [Issue("expected an object", index, path=path)])
    unknown = set(mcp) - MCP_FIELDS
    if unknown:
        raise ValidationFailed(
            "unknown field", [Issue(f"unknown proposal field(s) {sorted(unknown)}", index, path=path)]
        )
    for required in ("entityType", "aspectName"):
        if not isinstance(mcp.get(required), str):
            raise ValidationFailed(
                "missing field",
                [Issue(f"missing required string field {required!r}", index, path=f"{path}.{required}")],
            )
    value, content_type = (None, None)
    if mcp.get("aspect") is not None:
        value, content_type = _generic_aspect(mcp["aspect"], index, f"{path}.aspect")
    elif mcp.get("changeType", "UPSERT") != "DELETE":
        raise ValidationFailed(
            "missing aspect", [Issue("`aspect` is required unless changeType is DELETE", index, path=f"{path}.aspect")]
        )
    key_aspect = None
    if mcp.get("entityKeyAspect") is not None:
        key_aspect, _ = _generic_aspect(mcp["entityKeyAspect"], index, f"{path}.entityKeyAspect")
    system_metadata = mcp.get("systemMetadata")
    if isinstance(system_metadata, str):  # `datahub put --run-id` sends it as a JSON string
        try:
            system_metadata = orjson.loads(system_metadata)
        except orjson.JSONDecodeError as error:
            raise ValidationFailed(
                "bad systemMetadata",
                [Issue(f"systemMetadata is not valid JSON: {error}", index, path=f"{path}.systemMetadata")],
            ) from None
    if system_metadata is not None and not isinstance(system_metadata, dict):
        raise ValidationFailed(
            "bad systemMetadata", [Issue("systemMetadata must be an object", index, path=f"{path}.systemMetadata")]
        )
    headers = mcp.get("headers")
    if headers is not None and not (isinstance(headers, dict) and all(isinstance(v, str) for v in headers.values())):
        raise ValidationFailed(
            "bad headers", [Issue("headers must be an object of strings", index, path=f"{path}.headers")]
        )
    return Draft(
        index=draft_index,
        entity_type=mcp["entityType"],
        aspect_name=mcp["aspectName"],
        change_type=mcp.get("changeType") or "UPSERT",
        urn=mcp.get("entityUrn"),
        entity_key_aspect=key_aspect,
        value=value,
        content_type=content_type,
        system_metadata=system_metadata,
        headers=headers,
        location=location,
    )


def parse_proposals(body: Any, base: str = "$") -> list[Draft]:
    """A JSON array of MCPs (at `base` in the caller's document) → drafts; one error listing every bad item."""
    _check_batch(body, base)
    drafts: list[Draft] = []
    issues: list[Issue] = []
    _parse_items(body, base, range(len(body)), drafts, issues)
    return _parsed(body, drafts, issues)


async def parse_proposals_in_turns(
    body: Any, base: str = "$", contended: Callable[[], bool] | None = None
) -> list[Draft]:
    """`parse_proposals`, `PARSE_CHUNK` items at a time with the event loop's turns between them (app.turns)."""
    _check_batch(body, base)
    drafts: list[Draft] = []
    issues: list[Issue] = []
    cpu = TimeSlice()
    for start in range(0, len(body), PARSE_CHUNK):
        await cpu.pause_if_over(contended)
        _parse_items(body, base, range(start, min(start + PARSE_CHUNK, len(body))), drafts, issues)
    return _parsed(body, drafts, issues)


PARSE_CHUNK = 20  # MCPs parsed between two looks at the time slice (~0.3 ms)


def _check_batch(body: Any, base: str) -> None:
    if not isinstance(body, list):
        raise ValidationFailed(f"{base} must be a JSON array of proposals", [Issue("expected an array", path=base)])
    if not body:
        raise ValidationFailed(
            f"{base} is an empty array: send at least one proposal", [Issue("empty batch", path=base)]
        )


def _parse_items(body: list[Any], base: str, indexes: range, drafts: list[Draft], issues: list[Issue]) -> None:
    for index in indexes:
        try:
            drafts.append(parse_mcp(body[index], Location(index, f"{base}[{index}]"), index))
        except ValidationFailed as error:
            issues.extend(error.issues)


def _parsed(body: list[Any], drafts: list[Draft], issues: list[Issue]) -> list[Draft]:
    if issues:
        raise ValidationFailed(
            f"{len({i.index for i in issues})} of {len(body)} proposals are malformed; nothing was written", issues
        )
    return drafts


def proposal_to_mcp(draft: Draft, proposal: Proposal) -> dict[str, Any]:
    """The MetadataChangeProposal DataHub's MCP topic carries for a validated proposal.

    The aspect is the value *as the client sent it* (the consumer runs the same pipeline, mutators included, so it
    must see the same input), serialized as a JSON string. The entity is always named by its URN (resolved from
    `entityKeyAspect` when the client sent that); the change type is the resolved one (a v3 single-aspect write's
    CREATE, a PATCH given as a json-patch content type)."""
    mcp: dict[str, Any] = {
        "entityType": proposal.entity_type,
        "entityUrn": proposal.urn,
        "changeType": proposal.change_type.value,
        "aspectName": proposal.aspect_name,
    }
    if proposal.change_type is not ChangeType.DELETE:
        if proposal.change_type is ChangeType.PATCH:
            content_type = JSON_PATCH_CONTENT_TYPE
        else:
            content_type = draft.content_type or JSON_CONTENT_TYPE
        mcp["aspect"] = {"value": orjson.dumps(draft.value).decode(), "contentType": content_type}
    if draft.system_metadata:
        mcp["systemMetadata"] = draft.system_metadata
    if draft.headers:
        mcp["headers"] = draft.headers
    return mcp
