"""DataHub's access policies as stored (`dataHubPolicyInfo` of a `dataHubPolicy` entity): parsed once into
`AccessPolicy`, checked when written (`policy_issues`), and matched against an actor and a resource.

A policy grants its privileges to its actors (users, groups, the resource's owners, everyone) on its resources (all,
a list of URNs and entity types, or a filter: criteria on TYPE, URN, PLATFORM, DATA_PLATFORM_INSTANCE, DOMAIN,
CONTAINER, TAG, OWNER, all of which must hold). Policies only allow (DataHub has no deny policy); an INACTIVE one
grants nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.auth.privileges import KNOWN_PRIVILEGES, PLATFORM_PRIVILEGES
from app.errors import Issue
from app.urns import is_urn_of

ACTIVE, INACTIVE, DRAFT = "ACTIVE", "INACTIVE", "DRAFT"  # only an ACTIVE policy grants
METADATA, PLATFORM = "METADATA", "PLATFORM"
EQUALS, NOT_EQUALS, STARTS_WITH = "EQUALS", "NOT_EQUALS", "STARTS_WITH"
# DataHub's EntityFieldType names (RESOURCE_TYPE and RESOURCE_URN are its deprecated spellings), plus PLATFORM
FIELDS = frozenset({"TYPE", "URN", "PLATFORM", "DATA_PLATFORM_INSTANCE", "DOMAIN", "CONTAINER", "TAG", "OWNER"})
_ALIASES = {"RESOURCE_TYPE": "TYPE", "RESOURCE_URN": "URN"}
# DataHub's roles, as metaledger's token roles stand for them in a policy's `actors.roles`
ROLE_URNS = {1: "urn:li:dataHubRole:Reader", 2: "urn:li:dataHubRole:Editor", 3: "urn:li:dataHubRole:Admin"}


@dataclass(frozen=True, slots=True)
class Criterion:
    field: str
    values: frozenset[str]
    condition: str = EQUALS

    def holds(self, found: frozenset[str]) -> bool:
        if self.condition == NOT_EQUALS:
            return not (found & self.values)
        if self.condition == STARTS_WITH:
            return any(value.startswith(prefix) for value in found for prefix in self.values)
        return bool(found & self.values)

    def describe(self) -> str:
        return f"{self.field} {self.condition} {sorted(self.values)}"


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    urn: str
    name: str
    type: str
    state: str
    privileges: frozenset[str]
    # actors
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    roles: frozenset[str] = frozenset()
    all_users: bool = False
    all_groups: bool = False
    resource_owners: bool = False
    owner_types: frozenset[str] | None = None  # None: any ownership type
    # resources: None for every resource
    criteria: tuple[Criterion, ...] | None = None
    editable: bool = True
    resource_fields: frozenset[str] = field(default=frozenset())

    @property
    def active(self) -> bool:
        return self.state == ACTIVE

    def label(self) -> str:
        return f"{self.urn} ({self.name!r})"


def _strings(value: Any) -> frozenset[str]:
    return frozenset(v for v in value if isinstance(v, str)) if isinstance(value, list) else frozenset()


def parse_policy(urn: str, info: Mapping[str, Any]) -> AccessPolicy:
    """The policy a stored `dataHubPolicyInfo` value holds (checked by `policy_issues` when written)."""
    actors: Mapping[str, Any] = info["actors"] if isinstance(info.get("actors"), Mapping) else {}
    criteria: list[Criterion] | None = None
    resources = info.get("resources")
    if isinstance(resources, Mapping) and not resources.get("allResources"):
        criteria = []
        if isinstance(resources.get("type"), str) and resources["type"]:  # the deprecated single type
            criteria.append(Criterion("TYPE", frozenset({resources["type"]})))
        if isinstance(resources.get("resources"), list) and resources["resources"]:
            criteria.append(Criterion("URN", _strings(resources["resources"])))
        match = resources.get("filter")
        for raw in match.get("criteria") or () if isinstance(match, Mapping) else ():
            if isinstance(raw, Mapping):
                name = str(raw.get("field", "")).upper()
                criteria.append(
                    Criterion(
                        _ALIASES.get(name, name), _strings(raw.get("values")), str(raw.get("condition") or EQUALS)
                    )
                )
        if not criteria:  # a resource filter that names nothing: DataHub reads it as every resource
            criteria = None
    owner_types = actors.get("resourceOwnersTypes")
    return AccessPolicy(
        urn=urn,
        name=str(info.get("displayName") or urn),
        type=str(info.get("type") or METADATA),
        state=str(info.get("state") or ACTIVE),
        privileges=_strings(info.get("privileges")),
        users=_strings(actors.get("users")),
        groups=_strings(actors.get("groups")),
        roles=_strings(actors.get("roles")),
        all_users=bool(actors.get("allUsers")),
        all_groups=bool(actors.get("allGroups")),
        resource_owners=bool(actors.get("resourceOwners")),
        owner_types=_strings(owner_types) if isinstance(owner_types, list) and owner_types else None,
        criteria=tuple(criteria) if criteria is not None else None,
        editable=info.get("editable", True) is not False,
        resource_fields=frozenset(c.field for c in criteria or ()),
    )


def policy_issues(info: Any, path: str = "$.aspect") -> list[Issue]:
    """What is wrong with a `dataHubPolicyInfo` value beyond its schema (which the validator checks): an unknown type,
    state, resource field or condition, actors that are not users or groups, privileges of the other kind."""
    if not isinstance(info, Mapping):
        return []
    issues: list[Issue] = []
    kind = info.get("type")
    if kind not in (METADATA, PLATFORM):
        issues.append(Issue(f"type must be {METADATA} or {PLATFORM}", path=f"{path}.type", found=str(kind)[:100]))
    if info.get("state") not in (ACTIVE, INACTIVE, DRAFT):
        issues.append(
            Issue(
                f"state must be {ACTIVE}, {INACTIVE} or {DRAFT}",
                path=f"{path}.state",
                found=str(info.get("state"))[:100],
            )
        )
    privileges = info["privileges"] if isinstance(info.get("privileges"), list) else []
    for index, privilege in enumerate(privileges):
        where = f"{path}.privileges[{index}]"
        if privilege not in KNOWN_PRIVILEGES:
            issues.append(Issue("not a privilege metaledger knows", path=where, found=str(privilege)[:100]))
        elif kind == PLATFORM and privilege not in PLATFORM_PRIVILEGES:
            issues.append(Issue("a PLATFORM policy grants platform privileges only", path=where, found=privilege))
        elif kind == METADATA and privilege in PLATFORM_PRIVILEGES:
            issues.append(Issue("a METADATA policy grants resource privileges only", path=where, found=privilege))
    actors: Mapping[str, Any] = info["actors"] if isinstance(info.get("actors"), Mapping) else {}
    for member, kinds in (("users", ("corpuser",)), ("groups", ("corpGroup",)), ("roles", ("dataHubRole",))):
        for index, actor in enumerate(actors.get(member) or ()):
            if not is_urn_of(actor, kinds):
                issues.append(
                    Issue(f"not a {kinds[0]} URN", path=f"{path}.actors.{member}[{index}]", found=str(actor)[:200])
                )
    resources = info.get("resources")
    match = resources.get("filter") if isinstance(resources, Mapping) else None
    criteria = match.get("criteria") if isinstance(match, Mapping) else None
    for index, criterion in enumerate(criteria if isinstance(criteria, list) else ()):
        if not isinstance(criterion, Mapping):
            continue
        where = f"{path}.resources.filter.criteria[{index}]"
        name = str(criterion.get("field", "")).upper()
        if _ALIASES.get(name, name) not in FIELDS:
            issues.append(
                Issue(
                    f"not a resource field: one of {', '.join(sorted(FIELDS))}", path=f"{where}.field", found=name[:100]
                )
            )
        if criterion.get("condition", EQUALS) not in (EQUALS, NOT_EQUALS, STARTS_WITH):
            issues.append(
                Issue("not a condition", path=f"{where}.condition", found=str(criterion.get("condition"))[:100])
            )
    return issues
