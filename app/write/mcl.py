"""Metadata Change Logs: the record of one committed aspect change, as DataHub's MCL (JSON form).

Built inside the write transaction and stored in the outbox with the rows they describe, so a change log exists
exactly when its change committed.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.write.proposal import JSON_CONTENT_TYPE, AuditStamp, ChangeType, Proposal

DATABASE_ASPECT_VERSION_HEADER = "X-DataHub-Database-Aspect-Version"


def build_change_log(
    proposal: Proposal,
    *,
    change_type: ChangeType,
    aspect_name: str,
    aspect_json: str | None,
    system_metadata: dict[str, Any],
    previous_json: str | None,
    previous_system_metadata: dict[str, Any] | None,
    created: AuditStamp,
) -> str:
    mcl: dict[str, Any] = {
        "entityType": proposal.entity_type,
        "entityUrn": proposal.urn,
        "changeType": change_type.value,
        "aspectName": aspect_name,
    }
    if proposal.entity_key_aspect is not None and aspect_name == proposal.aspect_name:
        mcl["entityKeyAspect"] = {
            "value": orjson.dumps(proposal.entity_key_aspect).decode(),
            "contentType": JSON_CONTENT_TYPE,
        }
    if aspect_json is not None:
        mcl["aspect"] = {"value": aspect_json, "contentType": JSON_CONTENT_TYPE}
    mcl["systemMetadata"] = system_metadata
    headers = dict(proposal.headers) if aspect_name == proposal.aspect_name else {}
    headers[DATABASE_ASPECT_VERSION_HEADER] = system_metadata.get("version", "0")
    mcl["headers"] = headers
    if previous_json is not None:
        mcl["previousAspectValue"] = {"value": previous_json, "contentType": JSON_CONTENT_TYPE}
    if previous_system_metadata is not None:
        mcl["previousSystemMetadata"] = previous_system_metadata
    mcl["created"] = created.to_json()
    return orjson.dumps(mcl).decode()
