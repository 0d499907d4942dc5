"""Ingestion runs: what `/runs` (list, describe, rollback) reads without scanning the aspect store.

- `metadata_run_id(systemmetadata)`: the `runId` a row was written with; NULL for DataHub's default
  `no-run-id-provided` (a write without a run, which nobody lists or rolls back) and for a row Postgres' jsonb refuses
  (a NUL escape written before they were refused).
- `ix_metadata_aspect_v2_run`: (run, urn, aspect, version) of every row written by a run, history rows included:
  describe and rollback page through one run's rows in (urn, aspect) order; list counts a run's latest rows.
- `ingestion_run`: one row per run, kept by a statement trigger on the aspect store (no Python write path involved):
  `first_seen` when its first write landed, `first_change` the audit time of the earliest value it changed or
  created (a value's `createdon`: a write that only re-observes a value keeps the older one). A rollback uses it to
  tell a value the run wrote from one it merely re-observed, and the value before the run from the run's own.
  Registration is `ON CONFLICT DO NOTHING` and `first_change` is lowered only when a statement has an earlier one:
  concurrent batches of one run do not queue on its row. `rolled_back_at` is set by a completed rollback.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


# The trigger function registering runs (migration 0024 replaced it; its downgrade brings this one back).
RUN_NOTE_FUNCTION = """
        CREATE OR REPLACE FUNCTION ingestion_run_note() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                INSERT INTO ingestion_run AS r (run_id, first_change)
                SELECT metadata_run_id(n.systemmetadata), min(n.createdon)
                FROM new_rows n WHERE n.version = 0 AND metadata_run_id(n.systemmetadata) IS NOT NULL
                GROUP BY 1 ORDER BY 1
                ON CONFLICT (run_id) DO NOTHING;
                UPDATE ingestion_run r SET first_change = c.first_change
                FROM (SELECT metadata_run_id(n.systemmetadata) AS run_id, min(n.createdon) AS first_change
                      FROM new_rows n WHERE n.version = 0 AND metadata_run_id(n.systemmetadata) IS NOT NULL
                      GROUP BY 1) c
                WHERE r.run_id = c.run_id AND (r.first_change IS NULL OR r.first_change > c.first_change);
            ELSE
                INSERT INTO ingestion_run AS r (run_id, first_change)
                SELECT metadata_run_id(n.systemmetadata),
                       min(n.createdon) FILTER (WHERE o.createdon IS DISTINCT FROM n.createdon)
                FROM new_rows n JOIN old_rows o ON o.urn = n.urn AND o.aspect = n.aspect AND o.version = n.version
                WHERE n.version = 0 AND metadata_run_id(n.systemmetadata) IS NOT NULL
                GROUP BY 1 ORDER BY 1
                ON CONFLICT (run_id) DO NOTHING;
                UPDATE ingestion_run r SET first_change = c.first_change
                FROM (SELECT metadata_run_id(n.systemmetadata) AS run_id, min(n.createdon) AS first_change
                      FROM new_rows n JOIN old_rows o ON o.urn = n.urn AND o.aspect = n.aspect AND o.version = n.version
                      WHERE n.version = 0 AND o.createdon IS DISTINCT FROM n.createdon
                        AND metadata_run_id(n.systemmetadata) IS NOT NULL
                      GROUP BY 1) c
                WHERE r.run_id = c.run_id AND (r.first_change IS NULL OR r.first_change > c.first_change);
            END IF;
            RETURN NULL;
        END
        $$
        """


def upgrade() -> None:
    op.execute(
        r"""
        CREATE FUNCTION metadata_run_id(systemmetadata text) RETURNS text
        LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURNS NULL ON NULL INPUT AS $$
            SELECT CASE WHEN strpos(systemmetadata, '\u0000') > 0 THEN NULL
                        ELSE NULLIF(systemmetadata::jsonb ->> 'runId', 'no-run-id-provided') END
        $$
        """
    )
    op.execute(
        "CREATE INDEX ix_metadata_aspect_v2_run ON metadata_aspect_v2 (metadata_run_id(systemmetadata), urn, aspect, version) "
        "WHERE metadata_run_id(systemmetadata) IS NOT NULL"
    )
    op.execute(
        """
        CREATE TABLE ingestion_run (
            run_id          varchar(500) COLLATE "C" PRIMARY KEY,
            first_seen      timestamptz  NOT NULL DEFAULT now(),
            first_change    timestamp(6),
            rolled_back_at  timestamptz
        )
        """
    )
    op.execute("CREATE INDEX ix_ingestion_run_first_seen ON ingestion_run (first_seen DESC, run_id)")
    # Runs of the rows a statement wrote. A row "changed" is a new latest row (version 0) whose createdon differs from
    # the one it replaced: a first insert, or an update that wrote a new value (a re-observed value keeps createdon).
    # History rows (version > 0) carry the runs of older values and register nothing.
    op.execute(RUN_NOTE_FUNCTION)
    op.execute(
        "CREATE TRIGGER ingestion_run_inserted AFTER INSERT ON metadata_aspect_v2 REFERENCING NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION ingestion_run_note()"
    )
    op.execute(
        "CREATE TRIGGER ingestion_run_updated AFTER UPDATE ON metadata_aspect_v2 "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION ingestion_run_note()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER ingestion_run_updated ON metadata_aspect_v2")
    op.execute("DROP TRIGGER ingestion_run_inserted ON metadata_aspect_v2")
    op.execute("DROP FUNCTION ingestion_run_note()")
    op.execute("DROP TABLE ingestion_run")
    op.execute("DROP INDEX ix_metadata_aspect_v2_run")
    op.execute("DROP FUNCTION metadata_run_id(text)")
