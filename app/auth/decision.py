"""THE decision: may this actor (with its groups) use this privilege on this resource? Allowed by its role or by an
ACTIVE policy that names the privilege, the actor and the resource; otherwise denied, with the reason — the same
words in the explain answer and in every 403.

Pure: the caller (app.auth.service.AuthService) hands in the policies, the actor's groups and what the resource's
aspects say (its facts), read only when a policy needs them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.auth.model import Principal, Role
from app.auth.policies import ROLE_URNS, AccessPolicy
from app.auth.privileges import role_holds, satisfying


@dataclass(frozen=True, slots=True)
class Subject:
    """Who asks: the principal and the groups it is a member of (corpuser's groupMembership, nativeGroupMembership)."""

    principal: Principal
    groups: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Resource:
    """What a privilege is used on: an entity, and the facts policies select by (field → values; TYPE and URN always,
    the others as read from its aspects). `owners`: owner URN → its ownership types (URNs and legacy type names)."""

    urn: str
    entity_type: str
    facts: Mapping[str, frozenset[str]] = field(default_factory=dict)
    owners: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def values(self, name: str) -> frozenset[str]:
        if name == "TYPE":
            return frozenset({self.entity_type})
        if name == "URN":
            return frozenset({self.urn})
        if name == "OWNER":
            return frozenset(self.owners)
        return self.facts.get(name, frozenset())


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    privilege: str
    reason: str
    by: str | None = None  # what allowed it: "role:<name>", "scope:<id>" or a policy's URN

    def to_json(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "privilege": self.privilege, "reason": self.reason, "grantedBy": self.by}


def decide(
    subject: Subject,
    privilege: str,
    resource: Resource | None,
    policies: Iterable[AccessPolicy],
    *,
    role_grant: str | None,
    role_lacks: str | None = None,
) -> Decision:
    """`role_grant`: why the caller's role (and its write scopes) already holds the privilege here, or None;
    `role_lacks`: then why not, when it is more than the role itself (a writer's scopes)."""
    principal = subject.principal
    if role_grant is not None:
        return Decision(True, privilege, f"{principal.actor}'s {role_grant}", by=role_grant.split(" ")[0])
    wanted = satisfying(privilege)
    candidates = [policy for policy in policies if policy.privileges & wanted]
    target = "" if resource is None else " on this resource"
    lowest = next(role for role in Role if role_holds(role, privilege, view_authorization=False))
    if role_lacks is None and principal.role >= lowest:  # a view privilege, with view authorization on
        role_lacks = "with view authorization on, only a policy grants it"
    lacks = role_lacks or f"its {principal.role.label} role does not hold it (the {lowest.name} role does)"
    if not candidates:
        return Decision(False, privilege, f"no policy grants {privilege}{target} to {principal.actor}, and {lacks}")
    reasons = []
    for policy in candidates:
        why_not = _why_not(policy, subject, resource)
        if why_not is None:
            return Decision(True, privilege, f"{policy.label()} grants {privilege} to {principal.actor}", by=policy.urn)
        reasons.append(why_not)
    return Decision(
        False, privilege, f"{principal.actor} does not hold {privilege}{target} ({lacks}): " + "; ".join(reasons)
    )


def _why_not(policy: AccessPolicy, subject: Subject, resource: Resource | None) -> str | None:
    if not policy.active:
        return f"{policy.label()} is {policy.state}, not ACTIVE"
    actor_mismatch = _actor_mismatch(policy, subject, resource)
    if actor_mismatch is not None:
        return f"{policy.label()} grants it to {actor_mismatch}"
    if resource is not None and policy.criteria is not None:
        for criterion in policy.criteria:
            if not criterion.holds(resource.values(criterion.field)):
                return f"{policy.label()}'s resource filter does not select it ({criterion.describe()})"
    return None


def may_name(policy: AccessPolicy, subject: Subject, *, owners: bool = True) -> bool:
    """Whether the policy's actors may include the subject on some resource (`owners`: counting its grant to the
    resource's owners as a maybe, since the subject may own one)."""
    if owners and policy.resource_owners:
        return True
    return _actor_mismatch(policy, subject, None) is None


def _actor_mismatch(policy: AccessPolicy, subject: Subject, resource: Resource | None) -> str | None:
    """None when the policy's actors include the subject; otherwise whom it names instead."""
    principal = subject.principal
    if policy.all_users or principal.actor in policy.users or policy.groups & subject.groups:
        return None
    if policy.all_groups and subject.groups:
        return None
    if ROLE_URNS.get(int(principal.role)) in policy.roles:
        return None
    if policy.resource_owners and resource is not None and _owns(policy, subject, resource):
        return None
    named: list[str] = []
    if policy.users:
        named.append(f"users {_short(policy.users)}")
    if policy.groups:
        named.append(f"groups {_short(policy.groups)}")
    if policy.all_groups:
        named.append("members of any group")
    if policy.roles:
        named.append(f"roles {_short(policy.roles)}")
    if policy.resource_owners:
        kinds = f" of types {_short(policy.owner_types)}" if policy.owner_types else ""
        named.append(f"the resource's owners{kinds}")
    return f"{' or '.join(named) or 'no one'}, and {principal.actor} is none of them"


def _owns(policy: AccessPolicy, subject: Subject, resource: Resource) -> bool:
    for owner in (subject.principal.actor, *subject.groups):
        types = resource.owners.get(owner)
        if types is not None and (policy.owner_types is None or types & policy.owner_types):
            return True
    return False


def _short(values: Iterable[str], limit: int = 5) -> str:
    ordered: Sequence[str] = sorted(values)
    shown = ", ".join(ordered[:limit])
    return f"[{shown}{', …' if len(ordered) > limit else ''}]"
