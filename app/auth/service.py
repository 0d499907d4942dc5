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
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import jwt
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.auth.decision import Decision, Resource, Subject, decide, may_name
from app.auth.facts import FACT_ASPECTS, GROUP_ASPECTS, resource_of
from app.auth.model import (
    SYSTEM_PRINCIPAL,
    UNAUTHENTICATED_ADMIN,
    Principal,
    Role,
    TokenInfo,
    WriteScope,
    parse_ttl,
)
from app.auth.policies import AccessPolicy, parse_policy, policy_issues
from app.auth.privileges import (
    POLICY_ENTITY,
    POLICY_INFO,
    VIEW_ENTITY_PAGE,
    WRITE_GRANTS,
    role_holds,
    write_privileges,
)
from app.auth.reads import ViewScope
from app.auth.repository import AuthRepository
from app.errors import Forbidden, Issue, NotFound, ServiceUnavailable, Unauthorized, ValidationFailed
from app.ops.metrics import AUTH_FAILURES
from app.registry import EntityRegistry
from app.settings import Settings
from app.urns import is_urn_of, type_of
from app.write.processors import PIPELINE_ENTITY
from app.write.proposal import ChangeType, Draft
from app.write.rules import system_entity_refusal

log = logging.getLogger("metaledger.auth")
T = TypeVar("T")

ISSUER = "metaledger"
ALGORITHM = "HS256"
# DataHub's delegation header: only the system client may act on behalf of another actor.
ACTOR_HEADER = "x-datahub-actor"
_MAX_CACHED_TOKENS = 10_000
_MAX_TOKEN_CHARS = 4096


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Snapshot(Generic[T]):
    """A value read from Postgres and trusted for `ttl` seconds. One read when it expires, shared by every request
    that finds it expired meanwhile (not one per request in flight); `forget` makes the next `get` read again,
    without joining a read begun before it."""

    def __init__(self, ttl: float, read: Callable[[], Awaitable[T]]) -> None:
        self._ttl = ttl
        self._read = read
        self._value: T | None = None
        self._read_at = float("-inf")
        self._reading: asyncio.Future[T] | None = None

    async def get(self) -> T:
        if self._value is not None and time.monotonic() - self._read_at < self._ttl:
            return self._value
        if self._reading is None:
            self._reading = reading = asyncio.ensure_future(self._read())
            reading.add_done_callback(functools.partial(self._done, time.monotonic()))
        return await asyncio.shield(self._reading)  # a request cancelled while it waits leaves the read to the others

    def _done(self, started: float, reading: asyncio.Future[T]) -> None:
        if self._reading is reading:
            self._reading = None
            if not reading.cancelled() and reading.exception() is None:
                self._value, self._read_at = reading.result(), started
        elif not reading.cancelled():
            reading.exception()  # retrieved: when every waiter was cancelled, no "never retrieved" warning

    def forget(self) -> None:
        self._value, self._read_at, self._reading = None, float("-inf"), None


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
        # What the decisions read from Postgres, trusted for auth_cache_seconds (`written` forgets them sooner here)
        self._scopes: Snapshot[dict[str, list[WriteScope]]] = Snapshot(self._ttl, self._load_scopes)
        self._policies: Snapshot[list[AccessPolicy]] = Snapshot(self._ttl, self._load_access_policies)
        self._groups: OrderedDict[str, tuple[frozenset[str], float]] = OrderedDict()  # actor → (groups, read at)
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
        return await self.with_view_scope(self._delegated(principal, headers.get(ACTOR_HEADER)))

    async def with_view_scope(self, principal: Principal) -> Principal:
        """With view authorization on, the principal with what it may see (app.auth.reads.ViewScope): the ACTIVE
        policies granting it VIEW_ENTITY_PAGE, read as every decision reads them (trusted for auth_cache_seconds)."""
        if not self.settings.view_authorization or principal.role >= Role.ADMIN:
            return principal
        policies = await self._access_policies()
        subject = await self._subject(principal, policies)
        grants = tuple(
            policy
            for policy in policies
            if policy.active and VIEW_ENTITY_PAGE in policy.privileges and may_name(policy, subject)
        )
        return replace(principal, view=ViewScope(subject, grants))

    def _delegated(self, principal: Principal, actor: str | None) -> Principal:
        if actor is None or actor == principal.actor:
            return principal
        if principal.via != "system":
            self._failed("impersonation")
            raise Forbidden(
                f"the {ACTOR_HEADER} header (acting as another actor) is reserved for the system client",
                [Issue("impersonation is not allowed with a personal token", path=f"$.headers.{ACTOR_HEADER}")],
            )
        if not is_urn_of(actor, ("corpuser",)):
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

    # --- authorization: every surface asks `decide` (app.auth.decision) through the methods below

    async def decide(self, principal: Principal, privilege: str, resource: str | None = None) -> Decision:
        """May `principal` use `privilege` (DataHub's name) on `resource` (an URN; None: a platform privilege)?"""
        role_grant = self._role_grant(principal, privilege)
        if role_grant is not None:
            return decide(Subject(principal), privilege, None, (), role_grant=role_grant)
        policies = await self._access_policies()
        subject = await self._subject(principal, policies)
        facts = await self._resources([resource], policies) if resource is not None else {}
        return decide(subject, privilege, facts.get(resource or ""), policies, role_grant=None)

    async def require(self, principal: Principal, privilege: str, resource: str | None = None) -> None:
        """Forbidden, with the decision's reason, unless `principal` holds `privilege` on `resource`."""
        decision = await self.decide(principal, privilege, resource)
        if not decision.allowed:
            self._failed("forbidden")
            raise Forbidden(decision.reason, [Issue(decision.reason, found=privilege)])

    async def may_write(self, principal: Principal) -> bool:
        """A writer or admin, or a reader that an ACTIVE policy grants some edit to (which resources it may edit is
        decided per write by `authorize_writes`)."""
        if principal.role >= Role.WRITER:
            return True
        policies = await self._access_policies()
        subject = await self._subject(principal, policies)
        return any(
            policy.active and policy.privileges & WRITE_GRANTS and may_name(policy, subject) for policy in policies
        )

    async def require_write_access(self, principal: Principal) -> None:
        """The write surfaces' gate, before a body is read: Forbidden unless `may_write`."""
        if await self.may_write(principal):
            return
        self._failed("forbidden")
        reason = (
            f"this request needs the WRITE permission or an ACTIVE access policy granting an edit; {principal.actor} "
            f"has the {principal.role.label} role, and no policy grants it an edit"
        )
        raise Forbidden(reason, [Issue("needs WRITE or a policy granting an edit", found=principal.role.label)])

    async def authorize_writes(self, principal: Principal, drafts: Sequence[Draft]) -> None:
        """Each draft needs the privileges its aspect maps to (app.auth.privileges.write_privileges), on its entity:
        held by the caller's role (a writer's narrowed by its write scopes) or granted by an access policy; writes of
        metaledger's own configuration need ADMIN; a policy written must be sound and grant nothing its author lacks.
        One 403 names every refused draft, each with its reason."""
        refused = [issue for draft in drafts for issue in self._policy_content_issues(draft)]
        if refused:
            raise ValidationFailed("the access policy is not valid", refused)
        if principal.role >= Role.ADMIN:
            return
        await self.require_write_access(principal)  # the gate every write surface shares, in the same words
        scopes = await self._scopes_of(principal.actor)
        view_authorization = self.settings.view_authorization
        wanted: list[tuple[Draft, str, str | None]] = []  # (draft, privilege, its role grant)
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
                continue
            deletes_entity = draft.change_type == ChangeType.DELETE.value and self._is_key_aspect(draft)
            for privilege in write_privileges(draft.entity_type, draft.aspect_name, deletes_entity=deletes_entity):
                if not scopes and role_holds(principal.role, privilege, view_authorization=view_authorization):
                    continue  # the role holds it (a writer's every edit): nothing to decide, on the write hot path
                wanted.append((draft, privilege, self._role_grant(principal, privilege, draft, scopes)))
        if any(grant is None for _, _, grant in wanted):
            policies = await self._access_policies()
            subject = await self._subject(principal, policies)
            resources = await self._resources([d.urn or "" for d, _, grant in wanted if grant is None], policies)
            for draft, privilege, grant in wanted:
                if grant is not None:
                    continue
                narrowed = (
                    f"no write scope of {principal.actor} grants {draft.entity_type}.{draft.aspect_name}"
                    if scopes
                    and role_holds(principal.role, privilege, view_authorization=self.settings.view_authorization)
                    else None
                )
                decision = decide(
                    subject, privilege, resources.get(draft.urn or ""), policies, role_grant=None, role_lacks=narrowed
                )
                if not decision.allowed:
                    refused.append(Issue(decision.reason, draft.index, draft.urn, draft.aspect_name))
                elif draft.entity_type == POLICY_ENTITY:
                    refused.extend(await self._escalation(subject, policies, draft))
        if refused:
            self._failed("forbidden_write")
            raise Forbidden(f"{len(refused)} of {len(drafts)} writes are not allowed for {principal.actor}", refused)

    async def explain(self, asker: Principal, actor: str | None, privilege: str, resource: str | None) -> Decision:
        """The decision for `actor` (the asker by default: only an admin asks about another), with its reason. Another
        actor is judged with the role of its most privileged active token (a reader's when it has none)."""
        if actor is None or actor == asker.actor:
            return await self.decide(asker, privilege, resource)
        if asker.role < Role.ADMIN:
            raise Forbidden(
                f"only an admin may ask about another actor; {asker.actor} has the {asker.role.label} role",
                [Issue("another actor", path="$.query.actor", found=actor[:200])],
            )
        self._check_actor(actor)
        roles = [token.role for token in await self.repository.tokens(actor)]
        return await self.decide(Principal(actor, max(roles, default=Role.READER)), privilege, resource)

    def written(self, drafts: Sequence[Draft]) -> None:
        """After a commit: what this process trusted of what these drafts changed is read again at the next decision
        (other processes read it again within auth_cache_seconds)."""
        for draft in drafts:
            if draft.entity_type == POLICY_ENTITY:
                self._policies.forget()
            elif draft.aspect_name in GROUP_ASPECTS and draft.urn is not None:
                self._groups.pop(draft.urn, None)

    def _role_grant(
        self, principal: Principal, privilege: str, draft: Draft | None = None, scopes: Sequence[WriteScope] = ()
    ) -> str | None:
        if not role_holds(principal.role, privilege, view_authorization=self.settings.view_authorization):
            return None
        if principal.role < Role.ADMIN and scopes and draft is not None:
            scope = next((s for s in scopes if s.grants(draft.entity_type, draft.aspect_name)), None)
            if scope is None:  # a writer narrowed by its scopes holds only what they name
                return None
            return f"scope:{scope.id} (its write scope) grants {draft.entity_type}.{draft.aspect_name}"
        return f"role:{principal.role.label} (its role) holds {privilege}"

    def _policy_content_issues(self, draft: Draft) -> list[Issue]:
        if draft.aspect_name != POLICY_INFO or draft.change_type == ChangeType.DELETE.value:
            return []
        return [
            Issue(issue.message, draft.index, draft.urn, draft.aspect_name, path=issue.path, found=issue.found)
            for issue in policy_issues(draft.value)
        ]

    async def _escalation(self, subject: Subject, policies: Sequence[AccessPolicy], draft: Draft) -> list[Issue]:
        """No self-escalation: each privilege a policy written grants, its author must hold on every resource (by
        role, or by an ACTIVE policy for every resource that names the author)."""
        if draft.aspect_name != POLICY_INFO or draft.change_type == ChangeType.DELETE.value:
            return []
        if not isinstance(draft.value, Mapping):  # a patch: what it grants is known only once applied
            return [
                Issue(
                    "a policy is written whole (UPSERT) unless by an admin: what a patch grants is checked against "
                    "its author's privileges only then",
                    draft.index,
                    draft.urn,
                    draft.aspect_name,
                )
            ]
        granted = draft.value.get("privileges")
        held = {
            privilege
            for policy in policies
            if policy.active and policy.criteria is None and may_name(policy, subject, owners=False)
            for privilege in policy.privileges
        }
        lacking = sorted(
            privilege
            for privilege in (granted if isinstance(granted, list) else ())
            if isinstance(privilege, str)
            and privilege not in held
            and self._role_grant(subject.principal, privilege) is None
        )
        if not lacking:
            return []
        return [
            Issue(
                f"a policy may grant only privileges its author holds on every resource; {subject.principal.actor} "
                f"lacks {', '.join(lacking)}",
                draft.index,
                draft.urn,
                draft.aspect_name,
                path="$.aspect.privileges",
            )
        ]

    def _is_key_aspect(self, draft: Draft) -> bool:
        try:
            return self.registry.entity(draft.entity_type).key_aspect == draft.aspect_name
        except Exception:  # noqa: BLE001 - an unknown entity type is the validator's to report
            return False

    async def _scopes_of(self, actor: str) -> list[WriteScope]:
        return (await self._scopes.get()).get(actor, [])

    async def _load_scopes(self) -> dict[str, list[WriteScope]]:
        grouped: dict[str, list[WriteScope]] = {}
        for scope in await self._unless_down(self.repository.policies(), "write scopes"):
            grouped.setdefault(scope.actor, []).append(scope)
        return grouped

    async def _access_policies(self) -> list[AccessPolicy]:
        return await self._policies.get()

    async def _load_access_policies(self) -> list[AccessPolicy]:
        rows = await self._unless_down(self.repository.latest_of_type(POLICY_ENTITY, POLICY_INFO), "policies")
        return [parse_policy(row.urn, row.value) for row in rows if isinstance(row.value, Mapping)]

    async def _subject(self, principal: Principal, policies: Sequence[AccessPolicy]) -> Subject:
        """The principal with its groups, read only when a policy names groups (or owners, who may be groups)."""
        if not any(policy.groups or policy.all_groups or policy.resource_owners for policy in policies):
            return Subject(principal)
        cached = self._groups.get(principal.actor)
        if cached is not None and time.monotonic() - cached[1] < self._ttl:
            return Subject(principal, cached[0])
        rows = await self._unless_down(
            self.repository.latest([(principal.actor, aspect) for aspect in GROUP_ASPECTS]), "groups"
        )
        groups = frozenset(
            group
            for (_, aspect), row in rows.items()
            if isinstance(row.value, Mapping)
            for group in row.value.get(GROUP_ASPECTS[aspect]) or ()
            if isinstance(group, str)
        )
        self._groups[principal.actor] = (groups, time.monotonic())
        if len(self._groups) > _MAX_CACHED_TOKENS:
            self._groups.popitem(last=False)
        return Subject(principal, groups)

    async def _resources(self, urns: Iterable[str], policies: Sequence[AccessPolicy]) -> dict[str, Resource]:
        """Each entity with the facts the policies select by, its aspects read in one query (none when the policies
        select by type and URN only)."""
        needed: set[str] = set()
        for policy in policies:
            needed.update(FACT_ASPECTS[name] for name in policy.resource_fields if name in FACT_ASPECTS)
            if policy.resource_owners:
                needed.add(FACT_ASPECTS["OWNER"])
        entity_types = {urn: type_of(urn) for urn in set(urns)}
        rows: Mapping[tuple[str, str], Any] = {}
        if needed:
            rows = await self._unless_down(
                self.repository.latest([(urn, aspect) for urn in entity_types for aspect in needed]),
                "the resources' aspects",
            )
        return {urn: resource_of(urn, entity_type, rows) for urn, entity_type in entity_types.items()}

    @staticmethod
    async def _unless_down(read: Awaitable[Any], what: str) -> Any:
        try:
            return await read
        except (DBAPIError, OSError) as error:  # the database is down: retryable, never a 500
            raise ServiceUnavailable(
                f"the database is unreachable, {what} cannot be read: {type(error).__name__}"
            ) from None

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
    ) -> WriteScope:
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
            WriteScope(uuid.uuid4().hex, actor, entity_types, aspects, description, created_by)
        )
        self._scopes.forget()
        log.info("policy created", extra={"policy_id": policy.id, "actor": actor, "by": created_by})
        return policy

    async def policies(self) -> list[WriteScope]:
        return await self.repository.policies()

    async def delete_policy(self, policy_id: str, by: str) -> None:
        if not await self.repository.delete_policy(policy_id):
            raise NotFound(f"no policy with id {policy_id[:64]!r}")
        self._scopes.forget()
        log.info("policy deleted", extra={"policy_id": policy_id, "by": by})

    @staticmethod
    def _check_actor(actor: str) -> None:
        if not is_urn_of(actor, ("corpuser", "corpGroup")):
            raise ValidationFailed(
                "the actor must be a corpuser URN", [Issue("not a corpuser URN", path="$.actor", found=actor[:200])]
            )


def _is_token(verdict: Principal | str, token_id: str) -> bool:
    return isinstance(verdict, Principal) and verdict.token_id == token_id
