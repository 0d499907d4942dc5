"""A DataHub Actions action that records every event it gets, one JSON line each, in the file `config.path`.

Loaded by a real `datahub actions` process (in `.venv-actions`, this directory on its PYTHONPATH) as the action type
`recording_action.RecordingAction`. Never imported by the tests themselves (metaledger's venv has no datahub_actions).
"""

from __future__ import annotations

import json
from typing import Any

from datahub_actions.action.action import Action
from datahub_actions.event.event_envelope import EventEnvelope
from datahub_actions.pipeline.pipeline_context import PipelineContext


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _aspect(aspect: Any) -> Any:
    """A GenericAspect's JSON value (bytes or str on the wire), parsed."""
    if aspect is None:
        return None
    return {"value": json.loads(_text(aspect.value)), "contentType": aspect.contentType}


class RecordingAction(Action):
    def __init__(self, path: str) -> None:
        self.file = open(path, "a", encoding="utf-8")

    @classmethod
    def create(cls, config_dict: dict, ctx: PipelineContext) -> RecordingAction:
        return cls(config_dict["path"])

    def act(self, event: EventEnvelope) -> None:
        e = event.event
        record: dict[str, Any] = {"eventType": event.event_type, **event.meta.get("kafka", {})}
        if event.event_type == "MetadataChangeLogEvent_v1":
            system = e.systemMetadata
            record.update(
                urn=e.entityUrn,
                entityType=e.entityType,
                aspect=e.aspectName,
                changeType=e.changeType,
                value=_aspect(e.aspect),
                previousValue=_aspect(e.previousAspectValue),
                systemMetadata=system.to_obj() if system is not None else None,
                previousSystemMetadata=e.previousSystemMetadata.to_obj() if e.previousSystemMetadata else None,
                created=e.created.to_obj() if e.created is not None else None,
                headers=e.headers,
            )
        elif event.event_type == "EntityChangeEvent_v1":
            record.update(
                urn=e.entityUrn,
                entityType=e.entityType,
                category=e.category,
                operation=e.operation,
                modifier=e.modifier,
                version=e.version,
                auditStamp=e.auditStamp.to_obj(),
                parameters=e._inner_dict.get("__parameters_json"),
            )
        else:
            record["event"] = json.loads(e.as_json())
        self.file.write(json.dumps(record, default=str) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()
