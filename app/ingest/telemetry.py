"""The telemetry client id, `urn:li:telemetry:clientId`, as DataHub creates it at start-up (TelemetryUtils): one
`telemetryClientId` aspect `{"clientId": <a random UUID>}`, written once. The datahub CLI and SDK read it on every
graph connection (`get_aspect(urn, TelemetryClientIdClass)`) and know the server by it; nothing is sent anywhere."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.errors import ExistenceConflict
from app.ingest.gateway import IngestGateway
from app.write.reader import EntityReader
from app.write.proposal import SYSTEM_ACTOR, AuditStamp, ChangeType, Draft

TELEMETRY_CLIENT_URN = "urn:li:telemetry:clientId"
TELEMETRY_CLIENT_ASPECT = "telemetryClientId"


async def ensure_telemetry_client_id(sessionmaker: async_sessionmaker[AsyncSession], gateway: IngestGateway) -> None:
    """Create the client id unless it exists. CREATE: of processes starting together, the first one's id stays."""
    async with sessionmaker() as session:
        if await EntityReader(session, gateway.registry).repo.entity_latest(TELEMETRY_CLIENT_URN, [TELEMETRY_CLIENT_ASPECT]):
            return
    draft = Draft(0, "telemetry", TELEMETRY_CLIENT_ASPECT, ChangeType.CREATE.value, urn=TELEMETRY_CLIENT_URN,
                  value={"clientId": str(uuid.uuid4())})
    async with sessionmaker() as session:
        try:
            await gateway.apply(session, gateway.prepare([draft]), AuditStamp.now(SYSTEM_ACTOR), [draft])
        except ExistenceConflict:
            pass
