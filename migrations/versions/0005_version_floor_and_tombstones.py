"""Versions monotonic across hard deletes; search tombstones.

- `metadata_aspect_version_floor`: the highest logical version an aspect reached before it was deleted (an aspect
  DELETE, or the entity's key aspect DELETE, which deletes every aspect). Written in the delete's transaction
  (GREATEST of what is there); a later first insert of the aspect gets version floor + 1, so a change log replayed
  after a delete can never pass for a newer version. Never pruned: one small row per deleted aspect.
- `search_document.entity_removed`: the embedded search backend keeps a removed entity's document as a tombstone
  (per-aspect versions, no searchable content), hidden from every read.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE metadata_aspect_version_floor (
            urn      varchar(500) COLLATE "C" NOT NULL,
            aspect   varchar(200) COLLATE "C" NOT NULL,
            version  bigint                   NOT NULL,
            CONSTRAINT pk_metadata_aspect_version_floor PRIMARY KEY (urn, aspect)
        )
        """
    )
    op.execute("ALTER TABLE search_document ADD COLUMN entity_removed boolean NOT NULL DEFAULT false")


def downgrade() -> None:
    op.execute("ALTER TABLE search_document DROP COLUMN entity_removed")
    op.execute("DROP TABLE metadata_aspect_version_floor")
