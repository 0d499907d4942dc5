"""The read rule: what a caller may read of the metadata stored. One rule, `may_read_aspect`, here; every read path
applies it, through the helpers below (a new read path calls one of them):

* entity and aspect reads: `app.write.reader.EntityReader` (every read of the aspect store for an answer goes through
  it: v3 GET/HEAD/batchGet, the v3 list and scroll, the v2 batch get, Rest.li `/aspects` and `/entitiesV2`, GraphQL's
  entities, `aspects(input:)` and `viewUrn`, the trace API), with `unreadable_entities`;
* searches: `ReadScopedBackend`, the search backend every route and GraphQL gets (app.api.deps.get_backend), which
  adds `search_scope` to the query itself;
* the change feed and DataHub's Events API: `readable_events`;
* anything else that looks at an entity it may not show (the timeline): `unreadable_entities`.

The rule has two parts. With view authorization on (METALEDGER_VIEW_AUTHORIZATION, DataHub's
VIEW_AUTHORIZATION_ENABLED), a caller that is not an admin sees only the entities an ACTIVE access policy grants it
VIEW_ENTITY_PAGE on (`ViewScope`, which the auth service puts on its principal): for an entity, the policy's resource
filter is checked on the entity's aspects (app.auth.facts); for a search, it is the query's own condition on the same
facts' document fields (so results, totals and facets agree).

And always: a DataHub View (`dataHubView`) whose `dataHubViewInfo` says `type: PERSONAL` is its creator's
(`created.actor`): to any other caller but an admin, that value may not be read, and neither may anything of the
entity it guards (its key aspect, its other aspects, its change logs: the view does not exist for them). A GLOBAL view
is everyone's. Admins (and the system client, and a service with authentication off) read everything.

What a refused read looks like, per surface, as DataHub answers what does not exist (never a 403: existence is not
revealed):
* one entity or aspect: absent (404 where absence is a 404; left out of a batch; the answer for an URN never
  written: Rest.li `/entitiesV2`'s key aspect from the URN, GraphQL's null, the trace API's UNKNOWN);
* a search: left out of the results and of the counts and facets (the condition is the query's own);
* the change feed and the Events API: the change logs and events of the entity are left out (the page's offset still
  moves past them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from app.auth.decision import Resource, Subject, decide, may_name
from app.auth.facts import FACT_ASPECTS, resource_of
from app.auth.model import Principal, Role
from app.auth.policies import NOT_EQUALS, STARTS_WITH, AccessPolicy
from app.auth.privileges import VIEW_ENTITY_PAGE
from app.search.filters import Groups
from app.search.model import MAX_FILTER_VALUES, Criterion, SearchBackend, SearchHit, SearchPage
from app.urns import InvalidUrnError, entity_type_of, type_of

VIEW_ENTITY = "dataHubView"
VIEW_INFO = "dataHubViewInfo"
PERSONAL = "PERSONAL"
# entity type -> the aspect whose value decides whether a caller may see the entity at all
GUARDS: Mapping[str, str] = {VIEW_ENTITY: VIEW_INFO}
# the search document fields that hold the guard's decisive values (dataHubViewInfo's Searchable annotations)
_VIEW_TYPE_FIELD, _VIEW_CREATOR_FIELD = "type", "createdBy"

Key = tuple[str, str]  # (urn, aspect)


class LatestRows(Protocol):
    """What the rule reads the guards from: app.write.repository.AspectRepository."""

    async def latest(self, keys: Iterable[Key]) -> Mapping[Key, Any]: ...


def sees_everything(principal: Principal) -> bool:
    return principal.role >= Role.ADMIN


# a policy's resource field → the search document field that holds the same fact (the aspects' Searchable names)
_SEARCH_FIELDS = {
    "URN": "urn",
    "PLATFORM": "platform",
    "DATA_PLATFORM_INSTANCE": "platformInstance",
    "DOMAIN": "domains",
    "CONTAINER": "container",
    "TAG": "tags",
    "OWNER": "owners",
}


@dataclass(frozen=True, slots=True)
class ViewScope:
    """What a caller may see with view authorization on: the entities the decision (app.auth.decision) lets it view.
    `subject`: the caller with its groups; `grants`: the ACTIVE policies granting VIEW_ENTITY_PAGE that name it,
    directly or as an owner of the resource (the only ones the decision could allow by)."""

    subject: Subject
    grants: tuple[AccessPolicy, ...]

    def aspects(self) -> set[str]:
        """The aspects whose facts the grants select by."""
        needed = {FACT_ASPECTS[f] for policy in self.grants for f in policy.resource_fields if f in FACT_ASPECTS}
        if any(policy.resource_owners for policy in self.grants):
            needed.add(FACT_ASPECTS["OWNER"])
        return needed

    def selects(self, resource: Resource) -> bool:
        return decide(self.subject, VIEW_ENTITY_PAGE, resource, self.grants, role_grant=None).allowed

    def search_condition(self, entity_type: str) -> Groups | None:
        """The grants as a search condition on `entity_type`'s documents (an OR of AND groups), or None when one of
        them selects every entity of the type."""
        groups: list[tuple[Criterion, ...]] = []
        owners = tuple(sorted({self.subject.principal.actor, *self.subject.groups}))
        for policy in self.grants:
            owned = not may_name(policy, self.subject, owners=False)  # it names the caller as an owner only
            group: list[Criterion] | None = []
            for criterion in policy.criteria or ():
                if criterion.field == "TYPE":  # decided here, for the type searched
                    if not criterion.holds(frozenset({entity_type})):
                        group = None
                        break
                    continue
                assert group is not None
                group.append(
                    Criterion(
                        _SEARCH_FIELDS[criterion.field],
                        tuple(sorted(criterion.values)),
                        negated=criterion.condition == NOT_EQUALS,
                        condition="START_WITH" if criterion.condition == STARTS_WITH else "EQUAL",
                    )
                )
            if group is None:
                continue
            if owned:
                if policy.owner_types is not None:  # the documents do not say which type each owner has
                    continue
                group.append(Criterion("owners", owners))
            if not group:
                return None
            groups.append(tuple(group))
        return tuple(groups)


def may_read_aspect(principal: Principal, entity_type: str, urn: str, aspect: str, value: Any) -> bool:
    """THE read rule: may `principal` read this value of `aspect` of `urn` (an entity of `entity_type`)? No for the
    `dataHubViewInfo` of a PERSONAL view created by someone else, unless `principal` is an admin; yes otherwise."""
    if sees_everything(principal) or entity_type != VIEW_ENTITY or aspect != VIEW_INFO:
        return True
    value = _value(value)  # a stored row, or its value
    if not isinstance(value, Mapping):
        return True
    if value.get("type") != PERSONAL:
        return True
    created = value.get("created")
    return isinstance(created, Mapping) and created.get("actor") == principal.actor


def _guard_of(urn: str) -> tuple[str, str] | None:
    """(entity type, guard aspect) of an URN whose entity type has a guard."""
    try:
        entity_type = entity_type_of(urn)
    except InvalidUrnError:
        return None
    guard = GUARDS.get(entity_type)
    return (entity_type, guard) if guard is not None else None


def _value(row: Any) -> Any:
    return getattr(row, "value", row)


async def unreadable_entities(
    principal: Principal,
    urns: Iterable[str],
    repo: LatestRows,
    *,
    in_hand: Mapping[Key, Any] | None = None,
    complete: Set[str] = frozenset(),
) -> set[str]:
    """The entities among `urns` the principal may not see at all: those whose guard aspect's latest value it may not
    read (`may_read_aspect`). The guards are read from `repo`, but for those `in_hand` (rows or values already read,
    by key) and the URNs in `complete` (every aspect of them is in hand: a guard not there does not exist). No query
    for an admin, nor for URNs of entity types without a guard."""
    if sees_everything(principal):
        return set()
    in_hand = in_hand or {}
    hidden = await _outside_view(principal.view, urns, repo, in_hand, complete) if principal.view else set()
    guarded: dict[Key, str] = {}
    for urn in urns:
        found = _guard_of(urn)
        if found is not None:
            guarded[(urn, found[1])] = found[0]
    if not guarded:
        return hidden
    missing = [key for key in guarded if key not in in_hand and key[0] not in complete]
    read = await repo.latest(missing) if missing else {}
    for key, entity_type in guarded.items():
        row = in_hand.get(key, read.get(key))
        if row is not None and not may_read_aspect(principal, entity_type, key[0], key[1], _value(row)):
            hidden.add(key[0])
    return hidden


async def _outside_view(
    view: ViewScope, urns: Iterable[str], repo: LatestRows, in_hand: Mapping[Key, Any], complete: Set[str]
) -> set[str]:
    """The entities among `urns` no VIEW_ENTITY_PAGE grant of `view` selects, their facts read in one query."""
    urns = set(urns)
    aspects = view.aspects()
    wanted = [(u, a) for u in urns for a in aspects if (u, a) not in in_hand and u not in complete]
    rows = {**in_hand, **(await repo.latest(wanted) if wanted else {})}
    return {urn for urn in urns if not view.selects(resource_of(urn, type_of(urn), rows))}


# --- searches -----------------------------------------------------------------------------------------------------


def search_scope(principal: Principal, entity_type: str) -> Groups | None:
    """The rule as a search condition (an OR of AND groups) on `entity_type`'s documents, or None when it does not
    restrict that type for `principal`: a view is found when it is not PERSONAL, or when the caller created it."""
    if sees_everything(principal):
        return None
    scope = principal.view.search_condition(entity_type) if principal.view is not None else None
    if entity_type != VIEW_ENTITY:
        return scope
    personal: Groups = (
        (Criterion(_VIEW_TYPE_FIELD, (PERSONAL,), negated=True),),
        (Criterion(_VIEW_CREATOR_FIELD, (principal.actor,)),),
    )
    return personal if scope is None else tuple(tuple(group) for group in _within(scope, personal))


def _within(any_of: Sequence[Sequence[Criterion]] | None, scope: Groups) -> Sequence[Sequence[Criterion]]:
    """`any_of` and the scope both hold (None: no condition; an empty list matches nothing and still does not)."""
    if any_of is None:
        return scope
    return tuple((*group, *extra) for group in any_of for extra in scope)


class ReadScopedBackend:
    """A search backend as one caller sees it: every search and autocomplete of an entity type the rule restricts
    carries `search_scope` (so results, totals, facets and cursors all agree); everything else is the backend's."""

    def __init__(self, backend: SearchBackend, principal: Principal) -> None:
        self._backend = backend
        self.principal = principal

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def search(
        self, entity_type: str, query: str, *, any_of: Sequence[Sequence[Criterion]] | None = None, **kwargs: Any
    ) -> SearchPage:
        scope = search_scope(self.principal, entity_type)
        if scope is not None:
            any_of = _within(any_of, scope)
        return await self._backend.search(entity_type, query, any_of=any_of, **kwargs)

    async def autocomplete(self, entity_type: str, prefix: str, *, limit: int = 10) -> list[SearchHit]:
        scope = search_scope(self.principal, entity_type)
        if scope is None:
            return await self._backend.autocomplete(entity_type, prefix, limit=limit)
        # the suggestions of readable entities: the backend's, then only those a scoped search by URN finds
        hits = await self._backend.autocomplete(entity_type, prefix, limit=min(max(limit * 4, 100), MAX_FILTER_VALUES))
        if not hits:
            return hits
        page = await self._backend.search(
            entity_type,
            "*",
            filters={"urn": [h.urn for h in hits], "removed": []},
            count=len(hits),
            any_of=scope,
            facets=False,
        )
        readable = {hit.urn for hit in page.hits}
        return [hit for hit in hits if hit.urn in readable][:limit]


def scoped_backend(backend: SearchBackend, principal: Principal) -> SearchBackend:
    """The backend every read route and GraphQL search through (app.api.deps.get_backend)."""
    return backend if sees_everything(principal) else ReadScopedBackend(backend, principal)


# --- the change feed and the Events API ---------------------------------------------------------------------------


class FeedRecord(Protocol):
    urn: str
    aspect: str
    payload: str


def _logged_values(payload: str) -> list[Any]:
    """The aspect values a change log carries (its value and its previous value), as JSON; none for an event."""
    try:
        record = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return []
    values = []
    for member in ("aspect", "previousAspectValue"):
        held = record.get(member) if isinstance(record, dict) else None
        raw = held.get("value") if isinstance(held, dict) else None
        if isinstance(raw, str):
            try:
                values.append(orjson.loads(raw))
            except orjson.JSONDecodeError:
                continue
        elif isinstance(raw, dict):
            values.append(raw)
    return values


async def readable_events(principal: Principal, events: Sequence[Any], repo: LatestRows) -> list[Any]:
    """The feed records (change logs and platform events, with `urn`, `aspect` and `payload`) the principal may read:
    none of an entity it may not see now (`unreadable_entities`), nor a change log carrying a guard value it may not
    read (a view that was someone's PERSONAL one then)."""
    if sees_everything(principal) or not events:
        return list(events)
    hidden = await unreadable_entities(principal, {e.urn for e in events}, repo)
    kept = []
    for event in events:
        if event.urn in hidden:
            continue
        guard = _guard_of(event.urn)
        if (
            guard is not None
            and event.aspect == guard[1]
            and not all(
                may_read_aspect(principal, guard[0], event.urn, event.aspect, value)
                for value in _logged_values(event.payload)
            )
        ):
            continue
        kept.append(event)
    return kept
