"""The web view's sign-in sessions (app.web.sessions).

- `web_session`: one row per signed-in browser. The cookie holds a random id; only its SHA-256 is stored (`id_hash`),
  so a copy of the table signs no one in. A session carries the principal of the token it was opened with (actor,
  role, `token_id`) and its CSRF token. It ends at `expires_at`, when it is deleted (sign-out), and when its token
  stops being valid: every read joins `auth_token` (revoked, expired), and deleting the token's row deletes it.
  `token_id` is NULL only when authentication is off (METALEDGER_AUTH_ENABLED=false).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE web_session (
            id_hash     char(64)     COLLATE "C" NOT NULL,
            token_id    varchar(64)  COLLATE "C" REFERENCES auth_token (id) ON DELETE CASCADE,
            actor       varchar(500) COLLATE "C" NOT NULL,
            role        varchar(16)              NOT NULL,
            csrf_token  char(64)     COLLATE "C" NOT NULL,
            created_at  timestamptz              NOT NULL DEFAULT now(),
            expires_at  timestamptz              NOT NULL,
            CONSTRAINT pk_web_session PRIMARY KEY (id_hash),
            CONSTRAINT ck_web_session_role CHECK (role IN ('reader', 'writer', 'admin'))
        )
        """
    )
    op.execute("CREATE INDEX ix_web_session_token ON web_session (token_id)")
    op.execute("CREATE INDEX ix_web_session_expires ON web_session (expires_at)")


def downgrade() -> None:
    op.execute("DROP TABLE web_session")
