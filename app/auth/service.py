"""Authentication (bearer tokens, the system client), authorization of writes, and token and policy management.

Tokens are HS256 JWTs carrying the actor (`sub`), a token id (`jti`), the role and an expiry, as DataHub's personal
access tokens do. The JWT is only a signed handle: a token is valid while its row in `auth_token` is (not revoked,
not expired, same hash), and that row is re-read at most every `auth_cache_seconds`, so a revocation reaches every
process within that time. Policies are re-read on the same schedule.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import hmac
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import jwt
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.auth.model import (
    SYSTEM_PRINCIPAL,
    UNAUTHENTICATED_ADMIN,
    Permission,
    Policy,
    Principal,
    Role,
    TokenInfo,
    parse_ttl,
)
from app.auth.repository import AuthRepository
from app.errors import Forbidden, Issue, NotFound, ServiceUnavailable, Unauthorized, ValidationFailed
from app.ops.metrics import AUTH_FAILURES
from app.registry import EntityRegistry
from app.settings import Settings
from app.urns import InvalidUrnError, entity_type_of
from app.write.processors import PIPELINE_ENTITY
from app.write.proposal import ChangeType, Draft
from app.write.rules import system_entity_refusal

log = logging.getLogger("metaledger.auth")

ISSUER = "metaledger"
ALGORITHM = "HS256"
# DataHub's delegation header: only the system client may act on behalf of another actor.
ACTOR_HEADER = "x-datahub-actor"
_MAX_CACHED_TOKENS = 10_000
_MAX_TOKEN_CHARS = 4096
_POLICIES = ("policies",)  # the policies' key among the reads in flight (a token's is the token)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AuthService:
    def __init__(self, settings: Settings, engine: AsyncEngine, registry: EntityRegistry) -> None:
        self.settings = settings
        self.enabled = settings.auth_enabled
        self.repository = AuthRepository(engine)
        self.registry = registry
        self._key: bytes | None = settings.auth_secret.encode() if settings.auth_secret else None
        self._ttl = settings.auth_cache_seconds
        # token -> (principal, or the reason it is refused; monotonic time it was checked). Only correctly signed
        # tokens are cached, so no one can fill it with junk; it is bounded anyway.
        self._tokens: OrderedDict[str, tuple[Principal | str, float]] = OrderedDict()
        self._policies: dict[str, list[Policy]] = {}
        self._policies_loaded_at = float("-inf")
        # Re-reads in flight (a token's row, the policies), shared by every request that finds the cache entry
        # expired meanwhile: one query when it expires, not one per request in flight then.
        self._reading: dict[Hashable, asyncio.Future] = {}

    async def _read_once(self, key: Hashable, read: Callable[[], Awaitable[Any]]) -> Any:
        pending = self._reading.get(key)
        if pending is None:
            pending = self._reading[key] = asyncio.ensure_future(read())
            pending.add_done_callback(functools.partial(self._read_done, key))
        return await asyncio.shield(pending)  # a request cancelled while it waits leaves the read to the others

    def _read_done(self, key: Hashable, read: asyncio.Future) -> None:
        if self._reading.get(key) is read:
            del self._reading[key]
        if not read.cancelled():
            read.exception()  # retrieved: when every waiter was cancelled, no "never retrieved" warning

    async def key(self) -> bytes:
        if self._key is None:
            self._key = await self.repository.signing_key()
        return self._key

    # --- authentication

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """The principal behind a request's credentials; Unauthorized when there are none or they are not valid."""
        if not self.enabled:
            return UNAUTHENTICATED_ADMIN
        authorization = headers.get("authorization")
        if not authorization:
            self._failed("missing_credentials")
            raise Unauthorized(
                "authentication required: send 'Authorization: Bearer <token>' (create one with "
                "'metaledger token create'; the datahub client sends DATAHUB_GMS_TOKEN)"
            )
        scheme, _, credentials = authorization.strip().partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer":
            principal = await self._bearer(credentials.strip())
        elif scheme == "basic":
            principal = self._system_client(credentials.strip())
        else:
            self._failed("unsupported_scheme")
            raise Unauthorized(
                f"unsupported authorization scheme {scheme[:20]!r}: use Bearer (or Basic for the system client)"
            )
        return self._delegated(principal, headers.get(ACTOR_HEADER))

    def _delegated(self, principal: Principal, actor: str | None) -> Principal:
        if actor is None or actor == principal.actor:
            return principal
        if principal.via != "system":
            self._failed("impersonation")
            raise Forbidden(
                f"the {ACTOR_HEADER} header (acting as another actor) is reserved for the system client",
                [Issue("impersonation is not allowed with a personal token", path=f"$.headers.{ACTOR_HEADER}")],
            )
        if not is_actor_urn(actor, ("corpuser",)):
            raise Unauthorized(f"{ACTOR_HEADER} must be a corpuser URN (urn:li:corpuser:<id>)")
        return Principal(actor, Role.ADMIN, via="system")

    def _system_client(self, credentials: str) -> Principal:
        # DataHub's clients send "Basic <id>:<secret>" unencoded; HTTP's Basic scheme base64-encodes it: accept both.
        pair = credentials
        if ":" not in pair:
            try:
                pair = base64.b64decode(credentials, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                pair = ""
        client_id, _, secret = pair.partition(":")
        expected = self.settings.system_client_secret
        if (
            expected
            and hmac.compare_digest(client_id.encode(), self.settings.system_client_id.encode())
            and hmac.compare_digest(secret.encode(), expected.encode())
        ):
            return SYSTEM_PRINCIPAL
        self._failed("bad_system_credentials")
        raise Unauthorized("the system client credentials are not valid")

    async def _bearer(self, token: str) -> Principal:
        cached = self._tokens.get(token)
        if cached is not None and time.monotonic() - cached[1] < self._ttl:
            verdict = cached[0]
        else:
            verdict = await self._read_once(token, functools.partial(self._verify_and_cache, token))
        if isinstance(verdict, str):
            self._failed("refused_token")
            raise Unauthorized(verdict)
        return verdict

    async def _verify_and_cache(self, token: str) -> Principal | str:
        now = time.monotonic()
        verdict = await self._verify(token)
        self._tokens[token] = (verdict, now)
        self._tokens.move_to_end(token)
        if len(self._tokens) > _MAX_CACHED_TOKENS:
            self._tokens.popitem(last=False)
        return verdict

    async def _verify(self, token: str) -> Principal | str:
        """Check the signature (raises for tokens not signed by this deployment: never cached) and then the row."""
        if len(token) > _MAX_TOKEN_CHARS:
            self._failed("malformed_token")
            raise Unauthorized("the bearer token is not valid: too long")
        try:
            claims = jwt.decode(
                token,
                await self.key(),
                algorithms=[ALGORITHM],
                issuer=ISSUER,
                options={"require": ["sub", "jti", "iss"], "verify_exp": False},
            )
        except jwt.InvalidTokenError as error:
            self._failed("malformed_token")
            raise Unauthorized(f"the bearer token is not valid: {error}") from None
        try:
            row = await self.repository.token(str(claims["jti"]))
        except (DBAPIError, OSError) as error:  # the database is down: retryable, never a 500
            raise ServiceUnavailable(
                f"the database is unreachable, tokens cannot be checked: {type(error).__name__}"
            ) from None
        if row is None or not hmac.compare_digest(row.token_hash, token_hash(token)):
            return "the bearer token is not valid: it is not known to this service"
        if row.revoked_at is not None:
            return f"the bearer token was revoked at {row.revoked_at.isoformat()}"
        if row.expires_at is not None and row.expires_at <= datetime.now(UTC):
            return f"the bearer token expired at {row.expires_at.isoformat()}"
        return Principal(row.actor, row.role, token_id=row.id)

    @staticmethod
    def _failed(reason: str) -> None:
        AUTH_FAILURES.labels(reason=reason).inc()

    # --- authorization

    async def authorize_writes(self, principal: Principal, drafts: Sequence[Draft]) -> None:
        """Every draft must be within the principal's role and policies: deleting a whole entity (its key aspect) and
        writing metaledger's own configuration (through its own services only: app.write.rules) need ADMIN; a writer with policies may write only the entity types and aspects they grant. One 403 names them all."""
        if principal.role >= Role.ADMIN:
            return
        principal.require(Permission.WRITE)
        policies = await self._policies_of(principal.actor)
        refused = []
        for draft in drafts:
            if str(draft.entity_type).lower() == PIPELINE_ENTITY.lower():
                refused.append(
                    Issue(
                        f"{system_entity_refusal(draft.urn, 'a write')} (ADMIN only); {principal.actor} has the "
                        f"{principal.role.label} role",
                        draft.index,
                        draft.urn,
                        draft.aspect_name,
                    )
                )
            elif draft.change_type == ChangeType.DELETE.value and self._is_key_aspect(draft):
                refused.append(
                    Issue(
                        f"deleting a whole entity needs the ADMIN permission; {principal.actor} has the "
                        f"{principal.role.label} role",
                        draft.index,
                        draft.urn,
                        draft.aspect_name,
                    )
                )
            elif policies and not any(policy.grants(draft.entity_type, draft.aspect_name) for policy in policies):
                refused.append(
                    Issue(
                        f"no policy of {principal.actor} grants WRITE on {draft.entity_type}.{draft.aspect_name}",
                        draft.index,
                        draft.urn,
                        draft.aspect_name,
                    )
                )
        if refused:
            self._failed("forbidden_write")
            raise Forbidden(f"{len(refused)} of {len(drafts)} writes are not allowed for {principal.actor}", refused)

    async def require(self, principal: Principal, privilege: str, resource: str | None = None) -> None:
        """Forbidden, with the reason, unless `principal` holds `privilege` (DataHub's name, e.g. MANAGE_POLICIES) on
        `resource` (an URN; None for a platform privilege)."""
        if principal.role < Role.ADMIN:
            raise Forbidden(f"{principal.actor} does not hold {privilege}", [Issue(f"needs {privilege}")])

    def _is_key_aspect(self, draft: Draft) -> bool:
        try:
            return self.registry.entity(draft.entity_type).key_aspect == draft.aspect_name
        except Exception:  # noqa: BLE001 - an unknown entity type is the validator's to report
            return False

    async def _policies_of(self, actor: str) -> list[Policy]:
        policies = self._policies
        if time.monotonic() - self._policies_loaded_at >= self._ttl:
            policies = await self._read_once(_POLICIES, self._load_policies)
        return policies.get(actor, [])

    async def _load_policies(self) -> dict[str, list[Policy]]:
        """The policies by actor, as read now; kept for the next requests unless they changed meanwhile."""
        grouped: dict[str, list[Policy]] = {}
        try:
            policies = await self.repository.policies()
        except (DBAPIError, OSError) as error:
            raise ServiceUnavailable(
                f"the database is unreachable, policies cannot be read: {type(error).__name__}"
            ) from None
        for policy in policies:
            grouped.setdefault(policy.actor, []).append(policy)
        if self._reading.get(_POLICIES) is asyncio.current_task():
            self._policies, self._policies_loaded_at = grouped, time.monotonic()
        return grouped

    def _forget_policies(self) -> None:
        """After a change: the next write reads the policies again, without joining a read begun before it."""
        self._policies_loaded_at = float("-inf")
        self._reading.pop(_POLICIES, None)

    # --- tokens

    async def create_token(
        self,
        actor: str,
        role: Role,
        *,
        ttl: str | None = None,
        description: str | None = None,
        created_by: str,
        bootstrap: bool = False,
    ) -> tuple[str, TokenInfo] | None:
        """Issue a token: (the token, shown once, and what is stored). `bootstrap`: only if no token exists yet."""
        self._check_actor(actor)
        lifetime = parse_ttl(self.settings.auth_token_default_ttl if ttl is None else ttl)
        now = datetime.now(UTC).replace(microsecond=0)
        expires = now + lifetime if lifetime is not None else None
        token_id = uuid.uuid4().hex
        claims = {
            "iss": ISSUER,
            "sub": actor,
            "jti": token_id,
            "role": role.label,
            "iat": int(now.timestamp()),
            # DataHub's personal access token claims, for tools that read them
            "type": "PERSONAL",
            "actorType": "USER",
            "actorId": actor.rsplit(":", 1)[-1],
            "version": "2",
        }
        if expires is not None:
            claims["exp"] = int(expires.timestamp())
        token = jwt.encode(claims, await self.key(), algorithm=ALGORITHM)
        info = TokenInfo(
            token_id,
            actor,
            role,
            created_by=created_by,
            created_at=now,
            expires_at=expires,
            description=description,
            token_hash=token_hash(token),
        )
        if not await self.repository.insert_token(info, only_if_none_exist=bootstrap):
            return None
        log.info("token created", extra={"token_id": token_id, "actor": actor, "role": role.label, "by": created_by})
        return token, info

    async def tokens(self, actor: str | None = None, include_inactive: bool = False) -> list[TokenInfo]:
        return await self.repository.tokens(actor, include_inactive)

    async def revoke_token(self, token_id: str, by: str) -> datetime:
        revoked_at = await self.repository.revoke_token(token_id, by)
        if revoked_at is None:
            raise NotFound(f"no token with id {token_id[:64]!r}")
        self._tokens = OrderedDict((t, v) for t, v in self._tokens.items() if not _is_token(v[0], token_id))
        log.info("token revoked", extra={"token_id": token_id, "by": by})
        return revoked_at

    # --- policies

    async def create_policy(
        self,
        actor: str,
        entity_types: Iterable[str] | None,
        aspects: Iterable[str] | None,
        *,
        description: str | None = None,
        created_by: str,
    ) -> Policy:
        self._check_actor(actor)
        entity_types = None if entity_types is None else frozenset(entity_types)
        aspects = None if aspects is None else frozenset(aspects)
        issues = [
            Issue(f"unknown entity type {name[:100]!r}", path="$.entityTypes", found=name[:100])
            for name in sorted(entity_types or ())
            if name not in self.registry.entities
        ] + [
            Issue(f"unknown aspect {name[:100]!r}", path="$.aspects", found=name[:100])
            for name in sorted(aspects or ())
            if name not in self.registry.aspects
        ]
        if entity_types == frozenset() or aspects == frozenset():
            issues.append(Issue("an empty list grants nothing: leave it out to grant every one"))
        if issues:
            raise ValidationFailed("the policy names what the registry does not have", issues)
        policy = await self.repository.insert_policy(
            Policy(uuid.uuid4().hex, actor, entity_types, aspects, description, created_by)
        )
        self._forget_policies()
        log.info("policy created", extra={"policy_id": policy.id, "actor": actor, "by": created_by})
        return policy

    async def policies(self) -> list[Policy]:
        return await self.repository.policies()

    async def delete_policy(self, policy_id: str, by: str) -> None:
        if not await self.repository.delete_policy(policy_id):
            raise NotFound(f"no policy with id {policy_id[:64]!r}")
        self._forget_policies()
        log.info("policy deleted", extra={"policy_id": policy_id, "by": by})

    @staticmethod
    def _check_actor(actor: str) -> None:
        if not is_actor_urn(actor, ("corpuser", "corpGroup")):
            raise ValidationFailed(
                "the actor must be a corpuser URN", [Issue("not a corpuser URN", path="$.actor", found=actor[:200])]
            )


def is_actor_urn(actor: object, entity_types: tuple[str, ...]) -> bool:
    if not isinstance(actor, str) or len(actor) > 500:
        return False
    try:
        return entity_type_of(actor) in entity_types
    except InvalidUrnError:
        return False


def _is_token(verdict: Principal | str, token_id: str) -> bool:
    return isinstance(verdict, Principal) and verdict.token_id == token_id
