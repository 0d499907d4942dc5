"""All SQL of the auth tables (migration 0007): the signing key, issued tokens, write scopes; and the reads of the
aspects decisions need (access policies, group memberships, what a resource's aspects say), through the aspect
store's repository."""

from __future__ import annotations

import secrets
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.audit import repository as audit_log
from app.audit.model import TOKEN_CREATE, TOKEN_REVOKE, Entry
from app.auth.model import Role, TokenInfo, WriteScope
from app.write.repository import AspectRepository, StoredAspect

_TOKEN_COLUMNS = "id, actor, role, token_hash, description, created_by, created_at, expires_at, revoked_at"
_POLICY_COLUMNS = "id, actor, entity_types, aspects, description, created_by, created_at"
# Serialises the first-start bootstrap across processes starting together (any constant unique to this use).
_BOOTSTRAP_LOCK = 0x6D6C_6175_7468


def _token(row) -> TokenInfo:
    return TokenInfo(
        id=row.id,
        actor=row.actor,
        role=Role.parse(row.role),
        token_hash=row.token_hash,
        description=row.description,
        created_by=row.created_by,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )


def _policy(row) -> WriteScope:
    return WriteScope(
        id=row.id,
        actor=row.actor,
        description=row.description,
        created_by=row.created_by,
        created_at=row.created_at,
        entity_types=frozenset(row.entity_types) if row.entity_types is not None else None,
        aspects=frozenset(row.aspects) if row.aspects is not None else None,
    )


class AuthRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def signing_key(self) -> bytes:
        """The deployment's signing key, created by whichever process asks first."""
        async with self.engine.begin() as connection:
            await connection.execute(
                text("INSERT INTO auth_signing_key (id, secret) VALUES (1, :secret) ON CONFLICT (id) DO NOTHING"),
                {"secret": secrets.token_bytes(32)},
            )
            return (await connection.execute(text("SELECT secret FROM auth_signing_key WHERE id = 1"))).scalar_one()

    async def insert_token(self, token: TokenInfo, *, only_if_none_exist: bool = False) -> bool:
        """Store an issued token. `only_if_none_exist`: the first-start admin token, stored only while the table is
        empty (under a lock, so two processes starting together do not both create one)."""
        async with self.engine.begin() as connection:
            if only_if_none_exist:
                await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _BOOTSTRAP_LOCK})
                if (await connection.execute(text("SELECT EXISTS (SELECT 1 FROM auth_token)"))).scalar_one():
                    return False
            await connection.execute(
                text(
                    "INSERT INTO auth_token (id, actor, role, token_hash, description, created_by, expires_at) "
                    "VALUES (:id, :actor, :role, :token_hash, :description, :created_by, :expires_at)"
                ),
                {
                    "id": token.id,
                    "actor": token.actor,
                    "role": token.role.label,
                    "token_hash": token.token_hash,
                    "description": token.description,
                    "created_by": token.created_by,
                    "expires_at": token.expires_at,
                },
            )
            await audit_log.record_on(
                connection,
                Entry(
                    TOKEN_CREATE,
                    token.created_by,
                    urn=token.actor,
                    detail={"token": token.id, "role": token.role.label},
                ),
            )
            return True

    async def token(self, token_id: str) -> TokenInfo | None:
        async with self.engine.connect() as connection:
            row = (
                await connection.execute(
                    text(f"SELECT {_TOKEN_COLUMNS} FROM auth_token WHERE id = :id"), {"id": token_id}
                )
            ).one_or_none()
        return None if row is None else _token(row)

    async def tokens(self, actor: str | None = None, include_inactive: bool = False) -> list[TokenInfo]:
        conditions = ["(CAST(:actor AS text) IS NULL OR actor = :actor)"]
        if not include_inactive:
            conditions.append("revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())")
        sql = f"SELECT {_TOKEN_COLUMNS} FROM auth_token WHERE {' AND '.join(conditions)} ORDER BY created_at, id"
        async with self.engine.connect() as connection:
            rows = (await connection.execute(text(sql), {"actor": actor})).all()
        return [_token(row) for row in rows]

    async def revoke_token(self, token_id: str, by: str) -> datetime | None:
        """Revoke (idempotent: a revoked token keeps its first revocation time), recorded in the audit log as `by`'s;
        None when there is no such token."""
        async with self.engine.begin() as connection:
            revoked_at = (
                await connection.execute(
                    text(
                        "UPDATE auth_token SET revoked_at = coalesce(revoked_at, now()) WHERE id = :id "
                        "RETURNING revoked_at"
                    ),
                    {"id": token_id},
                )
            ).scalar_one_or_none()
            if revoked_at is not None:
                await audit_log.record_on(connection, Entry(TOKEN_REVOKE, by, detail={"token": token_id}))
            return revoked_at

    async def insert_policy(self, policy: WriteScope) -> WriteScope:
        async with self.engine.begin() as connection:
            row = (
                await connection.execute(
                    text(
                        "INSERT INTO auth_policy (id, actor, entity_types, aspects, description, created_by) "
                        "VALUES (:id, :actor, :entity_types, :aspects, :description, :created_by) "
                        f"RETURNING {_POLICY_COLUMNS}"
                    ),
                    {
                        "id": policy.id,
                        "actor": policy.actor,
                        "description": policy.description,
                        "created_by": policy.created_by,
                        "entity_types": sorted(policy.entity_types) if policy.entity_types is not None else None,
                        "aspects": sorted(policy.aspects) if policy.aspects is not None else None,
                    },
                )
            ).one()
        return _policy(row)

    async def policies(self) -> list[WriteScope]:
        async with self.engine.connect() as connection:
            rows = (
                await connection.execute(text(f"SELECT {_POLICY_COLUMNS} FROM auth_policy ORDER BY created_at, id"))
            ).all()
        return [_policy(row) for row in rows]

    async def delete_policy(self, policy_id: str) -> bool:
        async with self.engine.begin() as connection:
            deleted = await connection.execute(text("DELETE FROM auth_policy WHERE id = :id"), {"id": policy_id})
        return deleted.rowcount > 0

    async def latest_of_type(self, entity_type: str, aspect: str) -> list[StoredAspect]:
        async with AsyncSession(self.engine) as session:
            return await AspectRepository(session).latest_of_type(entity_type, aspect)

    async def latest(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], StoredAspect]:
        async with AsyncSession(self.engine) as session:
            return await AspectRepository(session).latest(keys)
