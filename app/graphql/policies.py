"""DataHub's policy operations (policies.graphql): createPolicy, updatePolicy, deletePolicy and listPolicies over
`dataHubPolicy` entities and their `dataHubPolicyInfo` aspect, as DataHub's UpsertPolicyResolver,
DeletePolicyResolver and ListPoliciesResolver (with PolicyUpdateInputInfoMapper and PolicyInfoPolicyMapper) do them.

Each resolver first asks the authorizer for MANAGE_POLICIES (a 403 with the reason otherwise). A write is one
submission through the ingest gateway with the caller's principal, as every other write: its authorization,
validation, change log, audit log and trace apply. createPolicy writes `urn:li:dataHubPolicy:<a new UUID>`;
updatePolicy replaces the aspect whole (DataHub's upsert: a policy URN that has none yet is created); both stamp
`lastUpdatedTimestamp`. deletePolicy deletes the entity (a DELETE of its key aspect). Unlike DataHub, which answers a
server error for the first and deletes any entity for the second, an update or delete of an URN that is not a policy
is refused naming `$urn`.

listPolicies reads the latest `dataHubPolicyInfo` of every policy from the aspect store, not from the search index
DataHub's resolver asks: the index follows the change feed, and a policy just created would be missing from the list
the UI reloads after creating it. Policies are few (DataHub's authorizer, too, holds them all): `query` (words of the
name, in any case) and `orFilters` (on the fields DataHub's policy documents are filtered by) select among them, by
name, then the page is cut."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from app.auth.privileges import MANAGE_POLICIES, POLICY_ENTITY, POLICY_INFO
from app.errors import Forbidden, Issue, NotFound, ValidationFailed
from app.graphql.entities import FIELD_RESOLVERS, EntityRef, entity_ref
from app.graphql.paging import declare_paged
from app.limits import clip
from app.search.filters import InvalidFilter, Placed, json_path, placed_or_filters
from app.search.model import Criterion
from app.urns import InvalidUrnError, entity_type_of
from app.write.proposal import ChangeType, Draft
from app.write.reader import EntityReader

if TYPE_CHECKING:
    from app.graphql.resolvers import Context
    from app.write.repository import StoredAspect

log = logging.getLogger("metaledger.graphql")

DEFAULT_POLICIES = 20  # a page when `count` is not given (DataHub's ListPoliciesResolver)
declare_paged("listPolicies", "policies", DEFAULT_POLICIES)
# What the GraphQL enums answer: a stored value outside them (written through another API) cannot be listed.
POLICY_TYPES = frozenset({"METADATA", "PLATFORM"})
POLICY_STATES = frozenset({"DRAFT", "ACTIVE", "INACTIVE"})
# actors' URN lists: input field -> the entity type its URNs must name
ACTOR_URNS = {"users": "corpuser", "groups": "corpGroup", "resourceOwnersTypes": "ownershipType"}
OR_FILTERS_PATH = "$input.orFilters"
# A refusal of the write names the aspect's fields below ASPECT_PATH (app.ingest's validation, app.auth's policy
# checks): the input's fields they come from, where their names differ
ASPECT_PATH = "$.aspect"
INPUT_FIELDS = {"displayName": "name"}
FILTER_CONDITIONS = frozenset({"EQUAL", "IN", "IEQUAL"})  # IN is EQUAL with several values; IEQUAL ignores case


def _refuse(message: str, path: str, found: str | None = None) -> ValidationFailed:
    return ValidationFailed(message, [Issue(message, path=path, found=None if found is None else clip(found, 200))])


async def _require_manage_policies(context: Context) -> None:
    authorizer = context.gateway.authorizer
    if authorizer is None:  # a gateway without one (the CLI's) decides nothing: refuse rather than allow
        raise Forbidden(f"no authorizer decides {MANAGE_POLICIES}", [Issue(f"needs {MANAGE_POLICIES}")])
    await authorizer.require(context.caller, MANAGE_POLICIES)


def _policy_urn(urn: str, what: str) -> str:
    """`urn` when it names a policy; else a 400 naming `$urn`."""
    try:
        entity = entity_type_of(urn)
    except InvalidUrnError:
        raise _refuse(f"Failed to perform {what}: {clip(urn, 100)} is not a valid urn", "$urn", urn) from None
    if entity != POLICY_ENTITY:
        raise _refuse(
            f"Failed to perform {what} against {clip(urn, 100)}: it is not a {POLICY_ENTITY} urn", "$urn", urn
        )
    return urn


# --- input -> dataHubPolicyInfo (DataHub's PolicyUpdateInputInfoMapper) -------------------------------------------


def _actors(actors: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = {
        "resourceOwners": actors["resourceOwners"],
        "allUsers": actors["allUsers"],
        "allGroups": actors["allGroups"],
    }
    for key, entity in ACTOR_URNS.items():
        urns = actors.get(key)
        if urns is None:
            continue
        for i, urn in enumerate(urns):
            try:
                named = entity_type_of(urn)
            except InvalidUrnError:
                named = None
            if named != entity:
                raise _refuse(f"{clip(urn, 100)} is not a {entity} urn", f"$input.actors.{key}[{i}]", urn)
        value[key] = list(urns)
    return value


def _resources(resources: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = {}
    if resources.get("allResources") is not None:
        value["allResources"] = resources["allResources"]
    if resources.get("type") is not None:
        value["type"] = resources["type"]
    if resources.get("resources") is not None:
        value["resources"] = list(resources["resources"])
    if resources.get("filter") is not None:
        # the condition is the PolicyMatchCondition enum's: graphql-core refuses any other, naming its place
        criteria = resources["filter"].get("criteria") or []
        value["filter"] = {
            "criteria": [
                {"field": c["field"], "values": list(c["values"]), "condition": c["condition"]} for c in criteria
            ]
        }
    return value


def policy_info(input: dict[str, Any]) -> dict[str, Any]:
    """The dataHubPolicyInfo of a PolicyUpdateInput, stamped now; a 400 naming the field at fault. `type`, `state`
    and the filters' conditions are the schema's enums (graphql-core refuses other values); what the write path checks
    of a policy besides (app.auth.policies.policy_issues: its privileges, say) it refuses naming the input's field."""
    info: dict[str, Any] = {
        "displayName": input["name"],
        # DataHub's aspect requires a description, its input does not: none is the empty one
        "description": input.get("description") or "",
        "type": input["type"],
        "state": input["state"],
        "privileges": list(input["privileges"]),
        "actors": _actors(input["actors"]),
        "lastUpdatedTimestamp": int(time.time() * 1000),
    }
    if input.get("resources") is not None:
        info["resources"] = _resources(input["resources"])
    return info


# --- dataHubPolicyInfo -> Policy (DataHub's PolicyInfoPolicyMapper) ------------------------------------------------


def _refs(urns: Sequence[str] | None, entity: str) -> list[EntityRef] | None:
    if urns is None:
        return None
    return [ref for ref in (entity_ref(urn) for urn in urns) if ref is not None and ref.entity_name == entity]


def _answer(urn: str, info: dict[str, Any]) -> dict[str, Any]:
    actors = info.get("actors") or {}
    answer: dict[str, Any] = {
        "urn": urn,
        "type": info.get("type"),
        "name": info.get("displayName"),
        "state": info.get("state"),
        "description": info.get("description"),
        "privileges": info.get("privileges") or [],
        "editable": info.get("editable", True),
        "actors": {
            "users": actors.get("users"),
            "groups": actors.get("groups"),
            "roles": actors.get("roles"),
            "resourceOwners": bool(actors.get("resourceOwners")),
            "resourceOwnersTypes": actors.get("resourceOwnersTypes"),
            "resolvedOwnershipTypes": _refs(actors.get("resourceOwnersTypes"), "ownershipType"),
            "allUsers": bool(actors.get("allUsers")),
            "allGroups": bool(actors.get("allGroups")),
            "resolvedUsers": _refs(actors.get("users"), "corpuser"),
            "resolvedGroups": _refs(actors.get("groups"), "corpGroup"),
            "resolvedRoles": _refs(actors.get("roles"), "dataHubRole"),
        },
        "resources": None,
    }
    resources = info.get("resources")
    if resources is not None:
        criteria = (resources.get("filter") or {}).get("criteria")
        answer["resources"] = {
            "type": resources.get("type"),
            "resources": resources.get("resources"),
            "allResources": resources.get("allResources", False),
            "filter": None
            if resources.get("filter") is None
            else {
                "criteria": [
                    {
                        "field": c.get("field"),
                        "values": [{"value": v, "entity": entity_ref(v)} for v in c.get("values") or ()],
                        "condition": c.get("condition", "EQUALS"),
                    }
                    for c in criteria or ()
                ]
            },
        }
    return answer


def _listable(row: StoredAspect) -> bool:
    """Whether the stored policy fits the answer's non-null enums and fields (one written through another API with,
    say, a type DataHub does not have would fail the whole list): left out of it, and said in the log."""
    info = row.value
    fits = (
        info.get("type") in POLICY_TYPES
        and info.get("state") in POLICY_STATES
        and isinstance(info.get("displayName"), str)
        and isinstance(info.get("actors"), dict)
    )
    if not fits:
        log.warning("policy left out of listPolicies: not DataHub's shape", extra={"urn": row.urn})
    return fits


# --- orFilters on the fields DataHub indexes a policy by ----------------------------------------------------------


def _filter_values(info: dict[str, Any]) -> dict[str, list[str]]:
    actors = info.get("actors") or {}
    text = {
        "type": [info.get("type")],
        "state": [info.get("state")],
        "displayName": [info.get("displayName")],
        "description": [info.get("description")],
        "privileges": list(info.get("privileges") or ()),
        "users": list(actors.get("users") or ()),
        "groups": list(actors.get("groups") or ()),
        "roles": list(actors.get("roles") or ()),
    }
    flags = {
        "editable": info.get("editable", True),
        "allUsers": actors.get("allUsers", False),
        "allGroups": actors.get("allGroups", False),
    }
    values = {name: [v for v in found if isinstance(v, str)] for name, found in text.items()}
    values.update({name: ["true" if flag else "false"] for name, flag in flags.items()})
    return values


FILTER_FIELDS = frozenset(_filter_values({}))


def _filters(or_filters: Sequence[Any] | None) -> list[list[Placed]]:
    try:
        placed = placed_or_filters(list(or_filters or ()))
    except InvalidFilter as error:
        raise error.at(OR_FILTERS_PATH) from None
    for group in placed:
        for p in group:
            if p.criterion.field not in FILTER_FIELDS:
                raise _refuse(
                    f"policies are not filtered by {clip(p.criterion.field, 100)} "
                    f"(they are by {', '.join(sorted(FILTER_FIELDS))})",
                    json_path(OR_FILTERS_PATH, (*p.loc, "field")),
                    p.criterion.field,
                )
            if p.criterion.condition not in FILTER_CONDITIONS:
                raise _refuse(
                    f"condition {p.criterion.condition} is not supported on policies (EQUAL, IN and IEQUAL are)",
                    json_path(OR_FILTERS_PATH, (*p.loc, "condition")),
                    p.criterion.condition,
                )
    return placed


def _holds(criterion: Criterion, values: dict[str, list[str]]) -> bool:
    found = values[criterion.field]
    if criterion.condition == "IEQUAL":
        hit = bool({v.lower() for v in found} & {v.lower() for v in criterion.values})
    else:
        hit = bool(set(found) & set(criterion.values))
    return hit != criterion.negated


def _matches(groups: list[list[Placed]]) -> Callable[[dict[str, Any]], bool]:
    def match(info: dict[str, Any]) -> bool:
        if not groups:
            return True
        values = _filter_values(info)
        return any(all(_holds(p.criterion, values) for p in group) for group in groups)

    return match


# --- resolvers ----------------------------------------------------------------------------------------------------


def _input_issue(issue: Issue) -> Issue:
    """A refusal of the write naming a field of the aspect (`$.aspect.privileges[0]`) names the input's field it
    came from (`$input.privileges[0]`)."""
    path = issue.path or ""
    if not path.startswith(ASPECT_PATH):
        return issue
    rest = path.removeprefix(ASPECT_PATH)
    for aspect_field, input_field in INPUT_FIELDS.items():
        if rest.startswith(f".{aspect_field}"):
            rest = f".{input_field}{rest.removeprefix(f'.{aspect_field}')}"
    return replace(issue, path=f"$input{rest}", index=None)


async def _submit(context: Context, draft: Draft) -> None:
    try:
        await context.gateway.submit(context.session, [draft], context.caller, request_headers=context.request_headers)
    except ValidationFailed as error:
        raise error.with_issues([_input_issue(i) for i in error.issues]) from None
    finally:
        context.forget_aspects()


async def resolve_create_policy(_root: Any, info: Any, input: dict[str, Any]) -> str:
    context: Context = info.context
    await _require_manage_policies(context)
    value = policy_info(input)
    urn = f"urn:li:{POLICY_ENTITY}:{uuid.uuid4()}"  # DataHub's: UUID.randomUUID().toString()
    await _submit(context, Draft(0, POLICY_ENTITY, POLICY_INFO, ChangeType.UPSERT.value, urn=urn, value=value))
    log.info("policy created", extra={"urn": urn, "actor": context.caller.actor})
    return urn


async def resolve_update_policy(_root: Any, info: Any, urn: str, input: dict[str, Any]) -> str:
    context: Context = info.context
    await _require_manage_policies(context)
    _policy_urn(urn, "update")
    value = policy_info(input)
    await _submit(context, Draft(0, POLICY_ENTITY, POLICY_INFO, ChangeType.UPSERT.value, urn=urn, value=value))
    log.info("policy updated", extra={"urn": urn, "actor": context.caller.actor})
    return urn


async def resolve_delete_policy(_root: Any, info: Any, urn: str) -> str:
    context: Context = info.context
    await _require_manage_policies(context)
    _policy_urn(urn, "delete")
    if not await context.exists(urn):
        raise NotFound(
            f"policy {clip(urn, 100)} does not exist", [Issue("not found", path="$urn", found=clip(urn, 100))]
        )
    key_aspect = context.registry.entity(POLICY_ENTITY).key_aspect
    await _submit(context, Draft(0, POLICY_ENTITY, key_aspect, ChangeType.DELETE.value, urn=urn))
    log.info("policy deleted", extra={"urn": urn, "actor": context.caller.actor})
    return urn


def _page_bound(value: int | None, default: int, path: str) -> int:
    if value is None:
        return default
    if value < 0:
        raise _refuse(f"{path.rsplit('.', 1)[1]} must not be negative", path, str(value))
    return value


async def resolve_list_policies(_root: Any, info: Any, input: dict[str, Any]) -> dict[str, Any]:
    context: Context = info.context
    await _require_manage_policies(context)
    start = _page_bound(input.get("start"), 0, "$input.start")
    count = min(_page_bound(input.get("count"), DEFAULT_POLICIES, "$input.count"), context.max_count)
    words = (input.get("query") or "").strip().lower()
    words = "" if words == "*" else words
    match = _matches(_filters(input.get("orFilters")))
    async with context._lock:  # the request's session runs one statement at a time (Context's reads share it)
        rows = await EntityReader(context.session, context.registry, context.caller).latest_of_type(
            POLICY_ENTITY, POLICY_INFO
        )
    selected = [
        row for row in rows if _listable(row) and words in row.value["displayName"].lower() and match(row.value)
    ]
    selected.sort(key=lambda row: (row.value["displayName"].lower(), row.urn))
    page = selected[start : start + count]
    return {
        "start": start,
        "count": len(page),
        "total": len(selected),
        "policies": [_answer(row.urn, row.value) for row in page],
    }


async def _group_editable_properties(ref: EntityRef, info: Any) -> dict[str, Any] | None:
    value: dict[str, Any] | None = await info.context.aspect(ref.urn, "corpGroupEditableInfo")
    return value


async def _role_info(ref: EntityRef, info: Any) -> dict[str, Any]:
    return await info.context.aspect(ref.urn, "dataHubRoleInfo") or {}


async def _role_name(ref: EntityRef, info: Any) -> str:
    return str((await _role_info(ref, info)).get("name") or ref.urn.split(":", 3)[-1])


async def _role_description(ref: EntityRef, info: Any) -> str:
    return str((await _role_info(ref, info)).get("description") or "")


# This topic's fields of CorpGroup and DataHubRole, bound with the others (app.graphql.entities.bind_entities).
FIELD_RESOLVERS.setdefault("CorpGroup", {})["editableProperties"] = _group_editable_properties
FIELD_RESOLVERS.setdefault("DataHubRole", {}).update(name=_role_name, description=_role_description)

POLICY_MUTATIONS = {
    "createPolicy": resolve_create_policy,
    "updatePolicy": resolve_update_policy,
    "deletePolicy": resolve_delete_policy,
}
POLICY_QUERIES = {"listPolicies": resolve_list_policies}
