"""What policies select by, read from the aspects that hold it: an entity's platform, instance, domains, container,
tags and owners (a `Resource`), and the groups an actor is a member of."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.auth.decision import Resource
from app.urns import InvalidUrnError, parse_urn

# resource field → the aspect that holds it (TYPE and URN come from the URN itself)
FACT_ASPECTS = {
    "PLATFORM": "dataPlatformInstance",
    "DATA_PLATFORM_INSTANCE": "dataPlatformInstance",
    "DOMAIN": "domains",
    "CONTAINER": "container",
    "TAG": "globalTags",
    "OWNER": "ownership",
}
# a corpuser's aspect → its member that lists the user's groups
GROUP_ASPECTS = {"groupMembership": "groups", "nativeGroupMembership": "nativeGroups"}
PLATFORM_PREFIX = "urn:li:dataPlatform:"
# entity types whose key names a tool (charts, dashboards, flows) rather than a platform URN
_TOOL_KEYED = frozenset({"chart", "dashboard", "dataFlow"})


def platform_of_urn(urn: str) -> str | None:
    """The platform an URN's key names: a dataset's platform URN, a chart's or flow's tool, a job's flow's."""
    try:
        parsed = parse_urn(urn)
    except InvalidUrnError:
        return None
    first = parsed.parts[0] if parsed.parts else ""
    if first.startswith(PLATFORM_PREFIX):
        return first
    if first.startswith("urn:li:"):
        return platform_of_urn(first)
    if parsed.entity_type in _TOOL_KEYED and first:
        return f"{PLATFORM_PREFIX}{first}"
    return None


def _value(rows: Mapping[tuple[str, str], Any], urn: str, aspect: str) -> Mapping[str, Any]:
    row = rows.get((urn, aspect))
    value = getattr(row, "value", None)
    return value if isinstance(value, Mapping) else {}


def _strings(values: Any, member: str | None = None) -> frozenset[str]:
    if not isinstance(values, list):
        return frozenset()
    if member is None:
        return frozenset(v for v in values if isinstance(v, str))
    return frozenset(v[member] for v in values if isinstance(v, Mapping) and isinstance(v.get(member), str))


def resource_of(urn: str, kind: str, rows: Mapping[tuple[str, str], Any]) -> Resource:
    """The entity `urn` (of type `kind`) with the facts its latest aspects in `rows` hold ((urn, aspect) → row)."""
    instance = _value(rows, urn, "dataPlatformInstance")
    platform = instance.get("platform") if isinstance(instance.get("platform"), str) else platform_of_urn(urn)
    owners: dict[str, frozenset[str]] = {}
    for owner in _value(rows, urn, "ownership").get("owners") or ():
        if isinstance(owner, Mapping) and isinstance(owner.get("owner"), str):
            kinds = {str(owner[k]) for k in ("typeUrn", "type") if isinstance(owner.get(k), str)}
            owners[owner["owner"]] = owners.get(owner["owner"], frozenset()) | frozenset(kinds)
    container = _value(rows, urn, "container").get("container")
    facts = {
        "PLATFORM": frozenset({platform}) if platform else frozenset(),
        "DATA_PLATFORM_INSTANCE": frozenset({instance["instance"]})
        if isinstance(instance.get("instance"), str)
        else frozenset(),
        "DOMAIN": _strings(_value(rows, urn, "domains").get("domains")),
        "CONTAINER": frozenset({container}) if isinstance(container, str) else frozenset(),
        "TAG": _strings(_value(rows, urn, "globalTags").get("tags"), "tag"),
    }
    return Resource(urn, kind, facts, owners)
