"""Change logs the search backend refused (app.search.failures): recorded per row, skipped, retried later.

- `search_index_failure`: one row per refused change log (`outbox_id`: its row in `change_log_outbox`, which may be
  pruned since), with its topic, urn, aspect and version, the change log itself (`payload`: retries do not depend on
  the outbox's retention), the reason, the attempts, the first and last failure and when it is retried next. A row
  leaves the table when a retry indexes it or a newer version of the aspect is indexed.
- `ix_search_index_failure_urn`: the trace API's lookup (an entity's failing aspects) and the superseded cleanup.
- `ix_search_index_failure_retry`: the worker's due retries.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE search_index_failure (
            outbox_id        bigint                   NOT NULL,
            feed_offset      bigint,
            topic            varchar(255)             NOT NULL,
            urn              varchar(500) COLLATE "C" NOT NULL,
            aspect           varchar(200) COLLATE "C" NOT NULL,
            version          bigint                   NOT NULL,
            payload          text                     NOT NULL,
            reason           text                     NOT NULL,
            attempts         integer                  NOT NULL DEFAULT 1,
            first_failed_at  timestamptz              NOT NULL DEFAULT now(),
            last_failed_at   timestamptz              NOT NULL DEFAULT now(),
            next_retry_at    timestamptz              NOT NULL,
            CONSTRAINT pk_search_index_failure PRIMARY KEY (outbox_id)
        )
        """
    )
    op.execute("CREATE INDEX ix_search_index_failure_urn ON search_index_failure (urn, aspect)")
    op.execute("CREATE INDEX ix_search_index_failure_retry ON search_index_failure (next_retry_at)")


def downgrade() -> None:
    op.execute("DROP TABLE search_index_failure")
