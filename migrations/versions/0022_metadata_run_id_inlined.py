"""`metadata_run_id` (migration 0011) declared `CALLED ON NULL INPUT`, so that Postgres inlines it.

0011 declared it `RETURNS NULL ON NULL INPUT` (strict). Postgres inlines a SQL function's expression into the
statement that calls it only when the expression is itself strict where the function is, and a CASE is not: every
call ran as a SQL function of its own, with its own executor, four times a write (the run index's predicate and key
of the history row and of the new row 0), about 40 µs each. Inlined, it is the expression's own cost (parsing the
system metadata as jsonb). The body is the same, and so is every result: a NULL text gives NULL through the CASE
(`strpos` and the cast are strict), so the run index holds the same keys and needs no rebuild.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

# (migration 0023's downgrade brings this definition back)
RUN_ID = r"""
    CREATE OR REPLACE FUNCTION metadata_run_id(systemmetadata text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE {on_null} AS $$
        SELECT CASE WHEN strpos(systemmetadata, '\u0000') > 0 THEN NULL
                    ELSE NULLIF(systemmetadata::jsonb ->> 'runId', 'no-run-id-provided') END
    $$
"""


def upgrade() -> None:
    op.execute(RUN_ID.format(on_null="CALLED ON NULL INPUT"))


def downgrade() -> None:
    op.execute(RUN_ID.format(on_null="RETURNS NULL ON NULL INPUT"))
