"""The audit log (app.audit): who changed what — every aspect write, token create/revoke, model apply, processor
pipeline change, rollback and web sign-in — chained by hashes.

- `audit_log`: one row per entry, inserted in the transaction of what it records. `seq` (its position in the chain)
  and `hash` are given after commit, in the order commits are seen, by the chain's sealer
  (app.audit.repository.seal): NULL until then. An insert touches the primary key and the partial index of unsealed entries only (the write path's cost);
  the indexes the reads use (position, actor, URN) hold sealed entries.
- `audit_chain`: the chain's one row: its last position and hash, and its anchor (the position and hash of the last
  entry purged by retention, from which verification starts).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE audit_log (
            id              bigserial    NOT NULL,
            at              timestamptz  NOT NULL DEFAULT now(),
            action          text         NOT NULL,
            actor           text         NOT NULL,
            token_id        text,
            surface         text         NOT NULL,
            urn             text,
            aspect          text,
            change_type     text,
            version_before  bigint,
            version_after   bigint,
            run_id          text,
            trace_id        text,
            detail          text,
            seq             bigint,
            hash            text,
            CONSTRAINT pk_audit_log PRIMARY KEY (id)
        )
        """
    )
    op.execute("CREATE INDEX ix_audit_log_unsealed ON audit_log (id) WHERE seq IS NULL")
    op.execute("CREATE UNIQUE INDEX ux_audit_log_seq ON audit_log (seq) WHERE seq IS NOT NULL")
    op.execute("CREATE INDEX ix_audit_log_actor_seq ON audit_log (actor, seq) WHERE seq IS NOT NULL")
    op.execute("CREATE INDEX ix_audit_log_urn_seq ON audit_log (urn, seq) WHERE seq IS NOT NULL")
    op.execute(
        """
        CREATE TABLE audit_chain (
            id           smallint  NOT NULL,
            last_seq     bigint    NOT NULL DEFAULT 0,
            last_hash    text      NOT NULL DEFAULT '',
            anchor_seq   bigint    NOT NULL DEFAULT 0,
            anchor_hash  text      NOT NULL DEFAULT '',
            CONSTRAINT pk_audit_chain PRIMARY KEY (id),
            CONSTRAINT ck_audit_chain_one_row CHECK (id = 1)
        )
        """
    )
    op.execute("INSERT INTO audit_chain (id) VALUES (1)")


def downgrade() -> None:
    op.execute("DROP TABLE audit_chain")
    op.execute("DROP TABLE audit_log")
