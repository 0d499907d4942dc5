"""Who is asking and what they may do: roles, permissions, the authenticated principal, and write policies."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Any

from app.errors import Forbidden, Issue
from app.write.proposal import DEFAULT_ACTOR, SYSTEM_ACTOR, AuditStamp

if TYPE_CHECKING:
    from app.auth.reads import ViewScope


class Role(IntEnum):
    """Ordered: each role holds the permissions of the ones below it."""

    READER = 1
    WRITER = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, raw: str) -> Role:
        try:
            return cls[raw.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown role {raw!r}: one of reader, writer, admin") from None


class Permission(Enum):
    """What a route needs. PUBLIC routes authenticate no one (the client's connection test, liveness)."""

    PUBLIC = None
    READ = Role.READER
    WRITE = Role.WRITER
    ADMIN = Role.ADMIN


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller. `token_id` is None for the system client and when authentication is off."""

    actor: str
    role: Role
    token_id: str | None = None
    via: str = "token"  # "token" | "system" | "disabled"
    # With view authorization on, what this caller may see (app.auth.reads.ViewScope); None: not restricted by it
    view: ViewScope | None = None

    def allows(self, permission: Permission) -> bool:
        return permission.value is None or self.role >= permission.value

    def require(self, permission: Permission) -> None:
        """Forbidden (403, naming the permission) unless this principal's role holds it."""
        if not self.allows(permission):
            raise Forbidden(
                f"this request needs the {permission.name} permission; {self.actor} has the {self.role.label} role",
                [Issue(f"needs {permission.name}", found=self.role.label)],
            )

    def audit_stamp(self) -> AuditStamp:
        return AuditStamp.now(self.actor)

    # What this principal may read: the read rule (app.auth.reads), as the readers below app.auth ask it
    # (app.write.reader.EntityReader's `ReadRule`).
    def may_read(self, entity_type: str, urn: str, aspect: str, value: Any) -> bool:
        from app.auth.reads import may_read_aspect

        return may_read_aspect(self, entity_type, urn, aspect, value)

    async def unreadable(
        self,
        urns: Iterable[str],
        repo: Any,
        *,
        in_hand: Mapping[tuple[str, str], Any] | None = None,
        complete: AbstractSet[str] = frozenset(),
    ) -> set[str]:
        from app.auth.reads import unreadable_entities

        return await unreadable_entities(self, urns, repo, in_hand=in_hand, complete=complete)

    def to_json(self) -> dict[str, Any]:
        return {"actor": self.actor, "role": self.role.label, "tokenId": self.token_id, "via": self.via}


SYSTEM_PRINCIPAL = Principal(SYSTEM_ACTOR, Role.ADMIN, via="system")
UNAUTHENTICATED_ADMIN = Principal(DEFAULT_ACTOR, Role.ADMIN, via="disabled")  # METALEDGER_AUTH_ENABLED=false


@dataclass(frozen=True, slots=True)
class WriteScope:
    """Narrows a writer: `actor`'s writer role then holds only writes of these entity types and aspects (None: all of
    them). metaledger's own, managed at /openapi/v1/auth/policies; DataHub's access policies, which grant, are
    app.auth.policies.AccessPolicy."""

    id: str
    actor: str
    entity_types: frozenset[str] | None
    aspects: frozenset[str] | None
    description: str | None = None
    created_by: str | None = None
    created_at: datetime | None = None

    def grants(self, entity_type: str, aspect: str) -> bool:
        return (self.entity_types is None or entity_type in self.entity_types) and (
            self.aspects is None or aspect in self.aspects
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "actor": self.actor,
            "entityTypes": sorted(self.entity_types) if self.entity_types is not None else None,
            "aspects": sorted(self.aspects) if self.aspects is not None else None,
            "description": self.description,
            "createdBy": self.created_by,
            "createdAt": _millis(self.created_at),
        }


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """An issued token as stored: everything but the token itself (only its hash is kept)."""

    id: str
    actor: str
    role: Role
    created_by: str
    created_at: datetime | None = None
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    description: str | None = None
    token_hash: str = field(default="", repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "actor": self.actor,
            "role": self.role.label,
            "description": self.description,
            "createdBy": self.created_by,
            "createdAt": _millis(self.created_at),
            "expiresAt": _millis(self.expires_at),
            "revokedAt": _millis(self.revoked_at),
        }


def _millis(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


_TTL = re.compile(r"^(\d{1,6})([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(raw: str | None) -> timedelta | None:
    """ "90d", "12h", "30m", "3600s"; "never" (or empty) for a token that does not expire."""
    if raw is None or raw.strip().lower() in ("", "never"):
        return None
    match = _TTL.match(raw.strip().lower())
    if match is None:
        raise ValueError(f"ttl {raw!r} is not a duration: a number and one of s, m, h, d (90d, 12h), or 'never'")
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"ttl {raw!r} must be positive")
    return timedelta(seconds=seconds)
