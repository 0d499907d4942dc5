"""DataHub Views (`viewUrn` of the entity searches): a saved scope of entity types and filters, stored in the
view's `dataHubViewInfo` aspect, applied as DataHub's SearchAcrossEntitiesResolver applies it: the types searched
are those asked for that the view allows, and every OR group of the search is ANDed with every OR group of the
view's filter.

Where DataHub is lax, metaledger is precise: a view that does not exist, or a PERSONAL view of another user, is an
error naming `viewUrn` (DataHub logs a warning and searches without the view, so a typo widens a search silently).
"""

from __future__ import annotations

from typing import Any

from app.auth.model import Permission
from app.errors import Issue, NotFound, ValidationFailed
from app.limits import clip
from app.urns import InvalidUrnError, entity_type_of

VIEW_PATH = "$input.viewUrn"


def _view_urn(urn: str) -> str:
    try:
        if entity_type_of(urn) == "dataHubView":
            return urn
    except InvalidUrnError:
        pass
    raise ValidationFailed(f"{clip(urn, 100)} is not a view URN (urn:li:dataHubView:<id>)",
                           [Issue("not a view urn", path=VIEW_PATH, found=clip(urn, 100))])


def _criterion(raw: dict[str, Any]) -> dict[str, Any]:
    """A stored criterion in the form of the GraphQL input's FacetFilterInput."""
    return {"field": raw.get("field", ""), "values": list(raw.get("values") or ()), "condition": raw.get("condition") or "EQUAL",
            "negated": bool(raw.get("negated"))}


def _view_groups(filter_: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The view's filter as orFilters: `or` of `and` groups (the deprecated `criteria` list is one group)."""
    if not filter_:
        return []
    if filter_.get("or"):
        return [{"and": [_criterion(c) for c in group.get("and") or ()]} for group in filter_["or"]]
    if filter_.get("criteria"):
        return [{"and": [_criterion(c) for c in filter_["criteria"]]}]
    return []


def combine(or_filters: list[dict[str, Any]], view_groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Both hold: each group of one ANDed with each group of the other (either empty: the other alone)."""
    if not view_groups:
        return or_filters
    if not or_filters:
        return view_groups
    return [{"and": [*(mine.get("and") or ()), *(theirs.get("and") or ())]} for mine in or_filters for theirs in view_groups]


async def apply_view(
    context: Any, view_urn: str, entity_names: list[str], or_filters: list[dict[str, Any]],
) -> tuple[list[str], list[dict[str, Any]]]:
    """The entity types and orFilters of a search inside the view `view_urn`."""
    urn = _view_urn(view_urn)
    info = await context.aspect(urn, "dataHubViewInfo")
    if info is None:
        raise NotFound(f"view {clip(urn, 100)} does not exist", [Issue("not found", path=VIEW_PATH, found=clip(urn, 100))])
    owner = ((info.get("created") or {}).get("actor"))
    if info.get("type") == "PERSONAL" and owner != context.caller.actor and not context.caller.allows(Permission.ADMIN):
        raise NotFound(f"view {clip(urn, 100)} does not exist", [Issue("not found", path=VIEW_PATH, found=clip(urn, 100))])
    definition = info.get("definition") or {}
    allowed = {name.lower() for name in definition.get("entityTypes") or ()}
    if allowed:
        entity_names = [name for name in entity_names if name.lower() in allowed]
    return entity_names, combine(or_filters, _view_groups(definition.get("filter")))
