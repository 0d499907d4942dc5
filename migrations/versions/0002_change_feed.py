"""Change feed and relay bookkeeping on the outbox: commit-order offsets, relay lanes, publish errors.

- `txid`: the writing transaction's id (xid8), filled by default, so the write path's INSERT is unchanged. A row
  whose txid is below the snapshot xmin was written by a finished transaction, and no transaction still running can
  add a row that sorts before it: that is when the sequencer may give it a feed offset.
- `feed_offset`: the row's position in the change feed, assigned by the sequencer in commit order (consecutive,
  never reused: the last one given is kept in `change_log_feed_state`, so pruning cannot make offsets restart).
- `lane`: `hashtext(urn) & 15` (stored, generated). A relay publishes a lane while it holds the lane's advisory
  lock, so every row of one URN is published by one relay, in order. (`& 15`, not `abs(...) % 16`: abs of the
  smallest int4 overflows.)
- `publish_error`: set when Kafka can never take the row (larger than the producer's maximum message size); such a
  row stays in the outbox (and in the feed) and no longer blocks its lane.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE change_log_outbox
            ADD COLUMN txid          xid8     NOT NULL DEFAULT pg_current_xact_id(),
            ADD COLUMN feed_offset   bigint,
            ADD COLUMN lane          smallint GENERATED ALWAYS AS ((hashtext(urn) & 15)::smallint) STORED,
            ADD COLUMN publish_error text
        """
    )
    # The old "pending" index served nothing the relay asks; these do:
    op.execute("DROP INDEX IF EXISTS ix_change_log_outbox_pending")
    # the sequencer: unsequenced rows in id order
    op.execute("CREATE INDEX ix_change_log_outbox_unsequenced ON change_log_outbox (id) WHERE feed_offset IS NULL")
    # the change feed, pruning (offset order), and uniqueness of offsets
    op.execute(
        "CREATE UNIQUE INDEX ux_change_log_outbox_feed_offset ON change_log_outbox (feed_offset) WHERE feed_offset IS NOT NULL"
    )
    # the publisher: sequenced, undelivered rows in offset order
    op.execute(
        """
        CREATE INDEX ix_change_log_outbox_undelivered ON change_log_outbox (feed_offset) INCLUDE (lane)
        WHERE delivered_at IS NULL AND feed_offset IS NOT NULL AND publish_error IS NULL
        """
    )
    op.execute(
        """
        CREATE TABLE change_log_feed_state (
            id          smallint PRIMARY KEY CHECK (id = 1),
            last_offset bigint   NOT NULL
        )
        """
    )
    op.execute("INSERT INTO change_log_feed_state (id, last_offset) VALUES (1, 0)")
    # The outbox is insert / update / update / delete churn: vacuum it more eagerly than the default 20 %, and keep
    # its statistics fresh (the share of undelivered rows decides whether the publisher's read uses its index).
    op.execute(
        "ALTER TABLE change_log_outbox SET (autovacuum_vacuum_scale_factor = 0.02,"
        " autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02)"
    )


def downgrade() -> None:
    op.execute("DROP TABLE change_log_feed_state")
    op.execute(
        "ALTER TABLE change_log_outbox RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_insert_scale_factor,"
        " autovacuum_analyze_scale_factor)"
    )
    op.execute("DROP INDEX ix_change_log_outbox_undelivered")
    op.execute("DROP INDEX ux_change_log_outbox_feed_offset")
    op.execute("DROP INDEX ix_change_log_outbox_unsequenced")
    op.execute(
        "ALTER TABLE change_log_outbox DROP COLUMN publish_error, DROP COLUMN lane, DROP COLUMN feed_offset, DROP COLUMN txid"
    )
    op.execute("CREATE INDEX ix_change_log_outbox_pending ON change_log_outbox (id) WHERE delivered_at IS NULL")
