"""The ingestion-run trigger's function computes each statement's runs once, with no join of its transition tables.

`ingestion_run_note()` (migration 0011) matched an UPDATE's new rows to its old ones with a join of the two
transition tables, in each of its two statements. Postgres has no statistics of a transition table, and the plan
PL/pgSQL kept for the statement counted one row on each side: a nested loop, 100 x 100 comparisons for a batch of 100
row-0 updates, twice (2.0 ms a statement, `auto_explain`), about 30 µs of Postgres's CPU an aspect written with a run
id — a third of a raw row's. Now the new and old rows of a key are grouped (`UNION ALL` then `GROUP BY`: no plan
compares every row with every other), each statement's runs and first changes are computed once into two arrays, and
the registration and the lowering of `first_change` read those: same rows registered, same `first_change` (the run
tests hold it), and a statement whose rows carry no run writes nothing.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-29
"""

from alembic import context, op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

# Each statement's runs, and per run the earliest `createdon` of a value it created or changed (an INSERT: every row
# 0 it wrote; an UPDATE: the rows 0 whose `createdon` moved, as 0011 decided it); registration is `ON CONFLICT DO
# NOTHING` in run order, `first_change` only lowered (0011's reasons: concurrent batches of one run do not queue).
_GROUPED = r"""
    CREATE OR REPLACE FUNCTION ingestion_run_note() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        runs text[];
        firsts timestamp[];
    BEGIN
        IF TG_OP = 'INSERT' THEN
            SELECT array_agg(run_id ORDER BY run_id), array_agg(first_change ORDER BY run_id) INTO runs, firsts
            FROM (
                SELECT run_id, min(createdon) AS first_change
                FROM (SELECT metadata_run_id(n.systemmetadata) AS run_id, n.createdon
                      FROM new_rows n WHERE n.version = 0 OFFSET 0) s
                WHERE run_id IS NOT NULL GROUP BY run_id
            ) r;
        ELSE
            SELECT array_agg(run_id ORDER BY run_id), array_agg(first_change ORDER BY run_id) INTO runs, firsts
            FROM (
                SELECT run_id, min(created) FILTER (WHERE changed) AS first_change
                FROM (
                    SELECT max(run_id) AS run_id, max(createdon) FILTER (WHERE is_new) AS created,
                           max(createdon) FILTER (WHERE is_new) IS DISTINCT FROM max(createdon) FILTER (WHERE NOT is_new)
                               AS changed
                    FROM (SELECT n.urn, n.aspect, metadata_run_id(n.systemmetadata) AS run_id, n.createdon, true AS is_new
                          FROM new_rows n WHERE n.version = 0
                          UNION ALL
                          SELECT o.urn, o.aspect, NULL, o.createdon, false FROM old_rows o WHERE o.version = 0) u
                    GROUP BY urn, aspect HAVING bool_or(is_new) AND NOT bool_and(is_new)
                ) k
                WHERE run_id IS NOT NULL GROUP BY run_id
            ) r;
        END IF;
        IF runs IS NULL THEN
            RETURN NULL;
        END IF;
        INSERT INTO ingestion_run AS r (run_id, first_change)
        SELECT run_id, first_change FROM unnest(runs, firsts) AS c(run_id, first_change) ORDER BY run_id
        ON CONFLICT (run_id) DO NOTHING;
        UPDATE ingestion_run r SET first_change = c.first_change
        FROM unnest(runs, firsts) AS c(run_id, first_change)
        WHERE r.run_id = c.run_id AND c.first_change IS NOT NULL
          AND (r.first_change IS NULL OR r.first_change > c.first_change);
        RETURN NULL;
    END
    $$
"""


def upgrade() -> None:
    op.execute(_GROUPED)


def downgrade() -> None:
    op.execute(context.script.get_revision("0011").module.RUN_NOTE_FUNCTION)
