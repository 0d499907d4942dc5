"""DataHub Views (`viewUrn` of the entity searches): a saved scope of entity types and filters, stored in the
view's `dataHubViewInfo` aspect, applied as DataHub's SearchAcrossEntitiesResolver applies it: the types searched
are those asked for that the view allows, and every OR group of the search is ANDed with every OR group of the
view's filter.

Where DataHub is lax, metaledger is precise: a view that does not exist, or a PERSONAL view of another user (which
the read rule, app.auth.reads, makes absent to the caller), is an error naming `viewUrn` (DataHub logs a warning and
searches without the view, so a typo widens a search silently).
"""

from __future__ import annotations

from typing import Any

from app.auth.reads import VIEW_ENTITY, VIEW_INFO, may_read_aspect
from app.errors import Issue, NotFound, ValidationFailed
from app.limits import clip
from app.search.filters import Groups, InvalidFilter, stored_filter_groups
from app.urns import InvalidUrnError, entity_type_of

VIEW_PATH = "$input.viewUrn"


def _view_urn(urn: str) -> str:
    try:
        if entity_type_of(urn) == VIEW_ENTITY:
            return urn
    except InvalidUrnError:
        pass
    raise ValidationFailed(
        f"{clip(urn, 100)} is not a view URN (urn:li:dataHubView:<id>)",
        [Issue("not a view urn", path=VIEW_PATH, found=clip(urn, 100))],
    )


async def apply_view(context: Any, view_urn: str, entity_names: list[str]) -> tuple[list[str], Groups]:
    """The entity types of a search inside the view `view_urn` (those of `entity_names` it allows), and the view's
    filter, which the search's own must be ANDed with (`app.search.filters.both`)."""
    urn = _view_urn(view_urn)
    info = await context.aspect(urn, VIEW_INFO)
    if info is None:
        raise NotFound(
            f"view {clip(urn, 100)} does not exist", [Issue("not found", path=VIEW_PATH, found=clip(urn, 100))]
        )
    if not may_read_aspect(context.caller, VIEW_ENTITY, urn, VIEW_INFO, info):  # the read rule (app.auth.reads)
        raise NotFound(
            f"view {clip(urn, 100)} does not exist", [Issue("not found", path=VIEW_PATH, found=clip(urn, 100))]
        )
    definition = info.get("definition") or {}
    allowed = {name.lower() for name in definition.get("entityTypes") or ()}
    if allowed:
        entity_names = [name for name in entity_names if name.lower() in allowed]
    try:
        groups = stored_filter_groups(definition.get("filter"))
    except InvalidFilter as error:  # the stored view is at fault, wherever in its filter
        message = f"view {clip(urn, 100)}: {error}"
        raise ValidationFailed(
            message, [Issue(message, path=VIEW_PATH, expected=error.expected, found=error.found)]
        ) from None
    return entity_names, groups
