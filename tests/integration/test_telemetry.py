"""DataHub's server id, `urn:li:telemetry:clientId` (app.telemetry): created at the first start as an ordinary write
with its change log, kept by every later start."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import pytest

from app.main import create_app
from app.settings import Settings
from app.telemetry import CLIENT_ID_ASPECT, CLIENT_ID_URN

pytestmark = pytest.mark.parametrize("settings_overrides", [{"telemetry_client_id": True}])


async def client_id(client) -> str:
    response = await client.get(f"/aspects/{quote(CLIENT_ID_URN, safe='')}", params={"aspect": CLIENT_ID_ASPECT})
    assert response.status_code == 200, response.text
    return response.json()["aspect"]["com.linkedin.telemetry.TelemetryClientId"]["clientId"]


async def test_the_first_start_creates_it_with_a_change_log_and_later_starts_keep_it(
    client, db, database_url, registry
):
    first = await client_id(client)
    assert uuid.UUID(first)
    logs = await db.fetch(
        "SELECT urn, aspect, change_type FROM change_log_outbox WHERE topic LIKE 'MetadataChangeLog_%'"
    )
    assert sorted(tuple(r) for r in logs) == [
        (CLIENT_ID_URN, CLIENT_ID_ASPECT, "CREATE"),
        (CLIENT_ID_URN, "telemetryKey", "UPSERT"),
    ]

    again = create_app(
        Settings(
            database_url=database_url,
            apply_migrations_on_start=False,
            auth_bootstrap_admin_token=False,
            telemetry_client_id=True,
        ),
        registry,
    )
    async with again.router.lifespan_context(again):
        pass
    assert await client_id(client) == first
    assert await db.fetchval("SELECT max(version) FROM metadata_aspect_v2 WHERE urn = $1", CLIENT_ID_URN) == 0
    assert await db.fetchval("SELECT count(*) FROM change_log_outbox WHERE urn = $1", CLIENT_ID_URN) == 2
