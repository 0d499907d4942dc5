"""Every reader of the change feed keeps its position in one table, by name.

`search_index_state` held the embedded search indexer's position alone (one row, id 1). The change processors'
after phase (app.write.after_processors) is a second reader. `feed_reader_state.last_offset`: every outbox row with
`feed_offset <= last_offset` has been applied by that reader; pruning keeps the rows past the lowest position
(app.changelog.outbox.prune). The indexer's position moves over as reader 'search-indexer'.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE feed_reader_state (
            reader      text        PRIMARY KEY,
            last_offset bigint      NOT NULL,
            updated_at  timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        "INSERT INTO feed_reader_state (reader, last_offset, updated_at) "
        "SELECT 'search-indexer', last_offset, updated_at FROM search_index_state"
    )
    op.execute("DROP TABLE search_index_state")


def downgrade() -> None:
    op.execute(
        """
        CREATE TABLE search_index_state (
            id          smallint    PRIMARY KEY CHECK (id = 1),
            last_offset bigint      NOT NULL,
            updated_at  timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        "INSERT INTO search_index_state (id, last_offset, updated_at) "
        "SELECT 1, last_offset, updated_at FROM feed_reader_state WHERE reader = 'search-indexer'"
    )
    op.execute("DROP TABLE feed_reader_state")
