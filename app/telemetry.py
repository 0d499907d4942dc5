"""DataHub's server id: `urn:li:telemetry:clientId`, aspect `telemetryClientId`, created once per deployment at start-up
(DataHub's `TelemetryUtils.createClientIdIfNotPresent`). Every `datahub` CLI call reads it when it connects; without it
the CLI logs a 404 and reports a missing server id.

It is an ordinary write (a CREATE: the first process to start wins, the others find it there), with its change log,
so that the index, Kafka consumers and `reconcile` see the same entity the database has."""

from __future__ import annotations

import logging
import uuid

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.errors import MetaledgerError
from app.write.proposal import SYSTEM_ACTOR, AuditStamp, Draft
from app.write.service import WriteService

log = logging.getLogger("metaledger")

CLIENT_ID_URN = "urn:li:telemetry:clientId"
CLIENT_ID_ASPECT = "telemetryClientId"


async def ensure_client_id(writer: WriteService, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    draft = Draft(0, "telemetry", CLIENT_ID_ASPECT, "CREATE", urn=CLIENT_ID_URN, value={"clientId": str(uuid.uuid4())})
    try:
        proposals = writer.prepare([draft])
        async with sessionmaker() as session:
            await writer.commit(session, proposals, AuditStamp.now(SYSTEM_ACTOR))
    except MetaledgerError as error:
        if error.status_code >= 500:
            log.warning(
                "the telemetry client id was not created; the next start tries again", extra={"error": error.message}
            )
        # else: refused as existing, created by another process or an earlier start
    except Exception:  # noqa: BLE001 - e.g. a registry plugin that refuses it: the CLI copes without it, the service must start
        log.warning("the telemetry client id was not created; the next start tries again", exc_info=True)
