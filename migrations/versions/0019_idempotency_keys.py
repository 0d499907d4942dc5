"""Idempotent writes: `idempotency_key`, one row per (actor, key) of the `Idempotency-Key` header (app.idempotency).

A row is a claim of the request being run (`holder`, until `lease_until`) until it is answered (`done`: the reply's
`status`, `headers` as a JSON array of [name, value], `body`; no status: applied, its reply not known or over the
stored cap); `committed` is set by the write's own transaction;
it is kept until `expires_at` (METALEDGER_IDEMPOTENCY_WINDOW_S), then purged by later claims (the index on it).

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-29
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE idempotency_key (
            actor text NOT NULL,
            key text NOT NULL,
            digest bytea NOT NULL,
            holder uuid NOT NULL,
            done boolean NOT NULL,
            committed boolean NOT NULL,
            lease_until timestamptz,
            expires_at timestamptz NOT NULL,
            status integer,
            headers text,
            body bytea,
            PRIMARY KEY (actor, key)
        )
        """
    )
    op.execute("CREATE INDEX idempotency_key_expires_at ON idempotency_key (expires_at)")


def downgrade() -> None:
    op.execute("DROP TABLE idempotency_key")
