"""The telemetry client id DataHub creates at start-up (its TelemetryUtils): `urn:li:telemetry:clientId` with its key
aspect and `telemetryClientId {"clientId": <a random UUID>}`. The datahub CLI and SDK read it on every connection and
know the server by it; nothing is sent anywhere. Stored once per database, here rather than by each process at start:
a bootstrap row, not a metadata change, so it has no change log (DataHub's has one, which no consumer of its
`telemetry` entity relies on).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

URN = "urn:li:telemetry:clientId"


def upgrade() -> None:
    op.execute(
        f"""
        INSERT INTO metadata_aspect_v2 (urn, aspect, version, metadata, systemmetadata, createdon, createdby)
        SELECT '{URN}', a.aspect, 0, a.metadata,
               json_build_object('runId', 'no-run-id-provided', 'lastRunId', 'no-run-id-provided',
                                 'lastObserved', (extract(epoch FROM now()) * 1000)::bigint, 'version', '1')::text,
               now() AT TIME ZONE 'UTC', 'urn:li:corpuser:__datahub_system'
        FROM (VALUES ('telemetryKey', '{{"name": "clientId"}}'),
                     ('telemetryClientId', json_build_object('clientId', gen_random_uuid()::text)::text)) AS a(aspect, metadata)
        ON CONFLICT DO NOTHING
        """
    )


def downgrade() -> None:
    op.execute(f"DELETE FROM metadata_aspect_v2 WHERE urn = '{URN}'")
