"""DataHub's own schemas as GMS's internal registry serves them: fixed ids (GMS's `SchemaIdOrdinal`) and one
subject per DataHub topic (`<topic>-value`, the topic names this service is configured with).

Nothing here is stored: the ids, versions and texts come from `app.avro.schemas`, so they are the same in every
process and across restarts. DataHub has several versions of most of these schemas; metaledger ships the current
one only, so an older id (MCP 0 and 9, ...) resolves to the current schema: every DataHub version is readable with
it, the older ones having fewer fields with defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from app.avro import schemas as avro_schemas
from app.schema_registry.normal_form import NormalSchema, normalize
from app.settings import Settings

# GMS's SchemaIdOrdinal: the ids of each topic role's versions, oldest first; the last is the current one.
VERSION_IDS: dict[str, tuple[int, ...]] = {
    "mcp": (0, 9, 16),
    "fmcp": (1, 10, 17),
    "mcl_versioned": (2, 11, 18),
    "mcl_timeseries": (3, 12, 19),
    "platform_event": (4,),
    "mce": (5, 13, 20),
    "fmce": (6, 14, 21),
    "mae": (7, 15, 22),
}

# The setting naming each role's topic. MetadataAuditEvent_v4's subject is served whether or not
# METALEDGER_MAE_V4_ENABLED publishes to its topic, as DataHub's registry serves it: a client that looks schemas up
# by subject finds it before the first event.
TOPIC_SETTINGS: dict[str, str] = {
    "mcp": "topic_mcp",
    "fmcp": "topic_fmcp",
    "mcl_versioned": "topic_mcl_versioned",
    "mcl_timeseries": "topic_mcl_timeseries",
    "platform_event": "topic_platform_event",
    "mce": "topic_mce",
    "fmce": "topic_fmce",
    "mae": "topic_mae",
}

# Ids at and above this are the registry's own (schemas producers register), never one of DataHub's.
FIRST_REGISTERED_ID = 1000


def subject_of(topic: str) -> str:
    """Confluent's TopicNameStrategy for values."""
    return f"{topic}-value"


@dataclass(frozen=True)
class DataHubSubject:
    subject: str
    role: str
    record: str
    version_ids: tuple[int, ...]  # version n is version_ids[n - 1]

    @property
    def current_id(self) -> int:
        return self.version_ids[-1]


def role_version_ids(role: str) -> tuple[int, ...]:
    """The ids of a role's versions that app.avro knows, ending with its current id."""
    current = avro_schemas.CURRENT_SCHEMA_ID[role]
    known = avro_schemas.DATAHUB_SCHEMA_IDS
    older = tuple(i for i in VERSION_IDS.get(role, ()) if i in known and i != current and i < current)
    return (*older, current)


class DataHubSchemas:
    """DataHub's ids and subjects for one configuration's topic names."""

    def __init__(self, settings: Settings) -> None:
        self.subjects: dict[str, DataHubSubject] = {}
        for role, setting in TOPIC_SETTINGS.items():
            if role not in avro_schemas.CURRENT_SCHEMA_ID:
                continue
            ids = role_version_ids(role)
            subject = subject_of(getattr(settings, setting))
            self.subjects.setdefault(subject, DataHubSubject(subject, role, record_of(ids[-1]), ids))
        # A schema that is one of DataHub's gets DataHub's current id for it, under any subject.
        self._id_of_fingerprint: dict[str, int] = {}
        for role in sorted(avro_schemas.CURRENT_SCHEMA_ID, key=avro_schemas.CURRENT_SCHEMA_ID.__getitem__):
            current = avro_schemas.CURRENT_SCHEMA_ID[role]
            self._id_of_fingerprint.setdefault(normal(record_of(current)).fingerprint, current)

    @staticmethod
    def is_datahub_id(schema_id: int) -> bool:
        return schema_id in avro_schemas.DATAHUB_SCHEMA_IDS

    @staticmethod
    def text(schema_id: int) -> str | None:
        record = avro_schemas.DATAHUB_SCHEMA_IDS.get(schema_id)
        return None if record is None else avro_schemas.schema_text(record)

    def id_of(self, schema: NormalSchema, subject: str) -> int | None:
        """DataHub's id of this schema if it is one of DataHub's: the subject's own current id when it is the
        subject's schema (MCL versioned 18, timeseries 19), else the lowest current id with that schema."""
        own = self.subjects.get(subject)
        if own is not None and normal(own.record).fingerprint == schema.fingerprint:
            return own.current_id
        return self._id_of_fingerprint.get(schema.fingerprint)

    def versions_of_id(self, schema_id: int) -> list[tuple[str, int]]:
        return [
            (s.subject, number)
            for s in self.subjects.values()
            for number, version_id in enumerate(s.version_ids, start=1)
            if version_id == schema_id
        ]


def record_of(schema_id: int) -> str:
    return avro_schemas.DATAHUB_SCHEMA_IDS[schema_id]


@cache
def normal(record: str) -> NormalSchema:
    """DataHub's schema of a record in normal form (parsed once per process)."""
    return normalize(avro_schemas.schema_text(record))
