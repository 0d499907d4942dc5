"""The runtime model set as stored: the aspect MODELS_ASPECT of MODELS_URN, metaledger's own entity, written only by
the model set service (app.modelset.service) through the ordinary write path (versioned, with its change log). Reads of
the set in force, of one version and of its history; the cheap version query every watcher polls."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import session_connection
from app.registry.runtime import EMPTY, MODELS_ASPECT, RuntimeModelSet
from app.write.rules import MODELS_URN

_VERSION_OF_LATEST = """SELECT systemmetadata::jsonb ->> 'version' FROM metadata_aspect_v2
                        WHERE urn = $1 AND aspect = $2 AND version = 0"""


@dataclass(frozen=True, slots=True)
class StoredModels:
    models: RuntimeModelSet
    version: int  # 0: none stored yet
    created_on: datetime | None = None
    created_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "urn": MODELS_URN,
            "aspectName": MODELS_ASPECT,
            "version": self.version,
            "createdOn": int(self.created_on.timestamp() * 1000) if self.created_on else None,
            "createdBy": self.created_by,
            **self.models.to_stored(),
        }


async def stored_models(session: AsyncSession, version: int | None = None) -> StoredModels:
    """The stored set (its latest version, or `version`)."""
    conn = await session_connection(session)
    rows = await conn.fetch(
        """SELECT metadata, systemmetadata, createdon, createdby FROM metadata_aspect_v2
           WHERE urn = $1 AND aspect = $2 ORDER BY version = 0 DESC, version DESC""",
        MODELS_URN,
        MODELS_ASPECT,
    )
    for row in rows:
        stored = _stored(row)
        if version is None or stored.version == version:
            return stored
    return StoredModels(EMPTY, 0)


async def stored_version(conn) -> int:
    """The stored set's latest version (0: none stored yet): one indexed single-row query."""
    raw = await conn.fetchval(_VERSION_OF_LATEST, MODELS_URN, MODELS_ASPECT)
    return int(raw) if raw else 0


async def model_history(session: AsyncSession) -> list[dict[str, Any]]:
    """Every stored version, newest first: when, by whom, which aspects and entities."""
    conn = await session_connection(session)
    rows = await conn.fetch(
        """SELECT metadata, systemmetadata, createdon, createdby FROM metadata_aspect_v2
           WHERE urn = $1 AND aspect = $2""",
        MODELS_URN,
        MODELS_ASPECT,
    )
    versions = sorted((_stored(row) for row in rows), key=lambda s: s.version, reverse=True)
    return [
        {
            "version": s.version,
            "createdOn": int(s.created_on.timestamp() * 1000),
            "createdBy": s.created_by,
            "aspects": {name: a.compatibility.value for name, a in sorted(s.models.aspects.items())},
            "entities": [e.name for e in s.models.entities],
        }
        for s in versions
        if s.created_on is not None
    ]


def _stored(row) -> StoredModels:
    system_metadata = orjson.loads(row["systemmetadata"] or "{}")
    return StoredModels(
        RuntimeModelSet.from_json(orjson.loads(row["metadata"])),
        int(system_metadata.get("version") or 1),
        row["createdon"],
        row["createdby"],
    )
