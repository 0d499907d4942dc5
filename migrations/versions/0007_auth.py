"""Authentication and authorization (app.auth): the token signing key, issued tokens, and the policies that narrow
what an actor's writer role may write.

- `auth_signing_key`: one row, the HS256 key tokens are signed with when METALEDGER_AUTH_SECRET is not set (so every
  process of a deployment verifies the same tokens without sharing a setting).
- `auth_token`: one row per issued token: its id (the JWT's `jti`), actor, role, the SHA-256 of the token (the token
  itself is never stored), expiry and revocation. A token is valid only while its row says so.
- `auth_policy`: an actor with policies may write only the (entity type, aspect) pairs some policy grants
  (NULL = every entity type / every aspect). Admins are never narrowed.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE auth_signing_key (
            id          smallint    NOT NULL DEFAULT 1,
            secret      bytea       NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT pk_auth_signing_key PRIMARY KEY (id),
            CONSTRAINT ck_auth_signing_key_single_row CHECK (id = 1)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE auth_token (
            id           varchar(64)  COLLATE "C" NOT NULL,
            actor        varchar(500) COLLATE "C" NOT NULL,
            role         varchar(16)              NOT NULL,
            token_hash   char(64)     COLLATE "C" NOT NULL,
            description  text,
            created_by   varchar(500) COLLATE "C" NOT NULL,
            created_at   timestamptz              NOT NULL DEFAULT now(),
            expires_at   timestamptz,
            revoked_at   timestamptz,
            CONSTRAINT pk_auth_token PRIMARY KEY (id),
            CONSTRAINT ck_auth_token_role CHECK (role IN ('reader', 'writer', 'admin'))
        )
        """
    )
    op.execute("CREATE INDEX ix_auth_token_actor ON auth_token (actor)")
    op.execute(
        """
        CREATE TABLE auth_policy (
            id            varchar(64)  COLLATE "C" NOT NULL,
            actor         varchar(500) COLLATE "C" NOT NULL,
            entity_types  text[],
            aspects       text[],
            description   text,
            created_by    varchar(500) COLLATE "C" NOT NULL,
            created_at    timestamptz              NOT NULL DEFAULT now(),
            CONSTRAINT pk_auth_policy PRIMARY KEY (id)
        )
        """
    )
    op.execute("CREATE INDEX ix_auth_policy_actor ON auth_policy (actor)")


def downgrade() -> None:
    op.execute("DROP TABLE auth_policy")
    op.execute("DROP TABLE auth_token")
    op.execute("DROP TABLE auth_signing_key")
