"""The per-aspect event records of the design document "Metadata Events (v5)": one family per entity-aspect pair,
generated from the aspect's own schema (never written by hand), in the namespace `com.linkedin.mxe.<entity>.<aspect>`:

    MetadataChangeEvent        {auditHeader: optional KafkaAuditHeader, urn: string, proposedValue: optional <Aspect>}
    MetadataAuditEvent         {auditHeader: optional KafkaAuditHeader, urn: string, oldValue: optional <Aspect>,
                                newValue: <Aspect>}
    FailedMetadataChangeEvent  {auditHeader: optional KafkaAuditHeader, metadataChangeEvent: MetadataChangeEvent,
                                error: string}

Each document is self-contained (the aspect's record and the named types it uses defined inline, once), so a
registry can serve it and fastavro or confluent-kafka's AvroDeserializer can read it alone. A user's own aspect (a
`path:` model source) gets its family the same way. Values inside are the aspect's JSON form (app.avro.records).
"""

from __future__ import annotations

from typing import Any

from app.avro import schemas

CHANGE = "MetadataChangeEvent"
AUDIT = "MetadataAuditEvent"
FAILED = "FailedMetadataChangeEvent"
FAMILY = (CHANGE, AUDIT, FAILED)
AUDIT_HEADER = "com.linkedin.events.KafkaAuditHeader"


def namespace(entity: str, aspect: str) -> str:
    return f"com.linkedin.mxe.{entity}.{aspect}"


def event_schemas(entity: str, aspect: str, aspect_schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The three record schemas of the pair (record short name → self-contained Avro schema document)."""
    space = namespace(entity, aspect)
    aspect_record = dict(aspect_schema)
    aspect_record.pop("Aspect", None)  # metaledger's annotation, not Avro's business
    header = {
        "name": "auditHeader",
        "type": ["null", AUDIT_HEADER],
        "default": None,
        "doc": "Kafka audit header (DataHub's KafkaAuditHeader).",
    }
    urn = {"name": "urn", "type": "string", "doc": f"The {entity} the aspect belongs to."}
    aspect_name = schemas.full_name(aspect_schema["name"], aspect_schema.get("namespace"))
    change = {
        "type": "record",
        "name": CHANGE,
        "namespace": space,
        "doc": f"A proposed change of the {aspect} aspect of a {entity}: an UPSERT of proposedValue, or (absent) a "
        "DELETE of the aspect.",
        "fields": [header, urn, {"name": "proposedValue", "type": ["null", aspect_record], "default": None}],
    }
    # each document defines the aspect's record (and, for the failed record, the change event) once, inline
    audit = schemas.self_contained(
        {
            "type": "record",
            "name": AUDIT,
            "namespace": space,
            "doc": f"A committed change of the {aspect} aspect of a {entity}: its value before (absent: it did not "
            "exist) and after. A DELETE is a tombstone record (no value) with the same key (the URN).",
            "fields": [
                header,
                urn,
                {"name": "oldValue", "type": ["null", aspect_record], "default": None},
                {"name": "newValue", "type": aspect_name},
            ],
        }
    )
    failed = schemas.self_contained(
        {
            "type": "record",
            "name": FAILED,
            "namespace": space,
            "doc": f"A {entity}.{aspect} MetadataChangeEvent that could not be applied, with the reason.",
            "fields": [header, {"name": "metadataChangeEvent", "type": change}, {"name": "error", "type": "string"}],
        }
    )
    return {CHANGE: schemas.self_contained(change), AUDIT: audit, FAILED: failed}
