"""The aspect store (DataHub's metadata_aspect_v2) and the change-log outbox.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # DataHub's exact columns and primary key. "C" collation: binary, case-sensitive comparison as DataHub
    # requires (utf8mb4_bin on MySQL), and a sort order equal to Python's, so lock order is deterministic.
    op.execute(
        """
        CREATE TABLE metadata_aspect_v2 (
            urn            varchar(500) COLLATE "C" NOT NULL,
            aspect         varchar(200) COLLATE "C" NOT NULL,
            version        bigint       NOT NULL,
            metadata       text         NOT NULL,
            systemmetadata text,
            createdon      timestamp(6) NOT NULL,
            createdby      varchar(255) NOT NULL,
            createdfor     varchar(255),
            CONSTRAINT pk_metadata_aspect_v2 PRIMARY KEY (urn, aspect, version)
        )
        """
    )
    op.execute('CREATE INDEX "timeIndex" ON metadata_aspect_v2 (createdon)')
    op.execute("CREATE INDEX idx_version_urn_aspect ON metadata_aspect_v2 (version, urn, aspect)")
    # Every committed change writes its change log here in the same transaction; a relay publishes the rows.
    op.execute(
        """
        CREATE TABLE change_log_outbox (
            id            bigserial    PRIMARY KEY,
            topic         varchar(255) NOT NULL,
            message_key   varchar(600) NOT NULL,
            urn           varchar(500) COLLATE "C" NOT NULL,
            aspect        varchar(200) COLLATE "C" NOT NULL,
            version       bigint       NOT NULL,
            change_type   varchar(16)  NOT NULL,
            payload       text         NOT NULL,
            created_at    timestamptz  NOT NULL DEFAULT now(),
            delivered_at  timestamptz
        )
        """
    )
    op.execute("CREATE INDEX ix_change_log_outbox_pending ON change_log_outbox (id) WHERE delivered_at IS NULL")


def downgrade() -> None:
    op.execute("DROP TABLE change_log_outbox")
    op.execute("DROP TABLE metadata_aspect_v2")
