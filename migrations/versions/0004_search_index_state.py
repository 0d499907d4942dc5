"""The embedded indexing worker's position in the change feed (app.search.worker).

`search_index_state.last_offset`: every outbox row with `feed_offset <= last_offset` has been applied to the search
backend. The row is created by the worker when it first runs (not here): the outbox pruning keeps rows past
`last_offset` only on databases where an indexing worker has registered itself (app.changelog.outbox.prune).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE search_index_state (
            id          smallint    PRIMARY KEY CHECK (id = 1),
            last_offset bigint      NOT NULL,
            updated_at  timestamptz NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE search_index_state")
