"""Failed sign-ins of the web view, counted for its throttle (app.web.sessions.SignInThrottle).

- `web_sign_in_failure`: one counter per key — a client's address, or a token's signed part — holding the failures
  since its window started. Keys are SHA-256 hashes (a wrong token may be a real one mistyped: it is never stored).
  Every process on the database counts on the same rows, so a `serve --workers N` throttles as one. Counters whose
  window ended are deleted when failures are counted.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE web_sign_in_failure (
            key_hash      char(64)     COLLATE "C" NOT NULL,
            window_start  timestamptz              NOT NULL,
            failures      integer                  NOT NULL,
            CONSTRAINT pk_web_sign_in_failure PRIMARY KEY (key_hash)
        )
        """
    )
    op.execute("CREATE INDEX ix_web_sign_in_failure_window ON web_sign_in_failure (window_start)")


def downgrade() -> None:
    op.execute("DROP TABLE web_sign_in_failure")
