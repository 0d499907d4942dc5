"""Helpers shared by the Rest.li endpoints."""

from __future__ import annotations

import re
from typing import Any, TypeVar
from urllib.parse import unquote

from app.errors import Issue, MetaledgerError, ValidationFailed
from app.registry import EntityRegistry
from app.registry.errors import RegistryError
from app.urns import InvalidUrnError, parse_urn

E = TypeVar("E", bound=MetaledgerError)

_DRAFT_PATH = re.compile(r"^\$\[(\d+)\]")

# The request body of every Rest.li action is a JSON object; documented per action in the route's description.
ACTION_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}}


def relocate(error: E, prefix: str, *, batch: bool) -> E:
    """Re-express issue paths of `parse_proposals`/`prepare` (`$[i].x`, or `$.x` inside proposal i) inside the
    Rest.li body: `$.proposals[i].x` for a batch, `$.proposal.x` for a single proposal."""
    issues = []
    for issue in error.issues:
        path = issue.path
        base = f"{prefix}[{issue.index}]" if batch and issue.index is not None else prefix
        if path is not None:
            match = _DRAFT_PATH.match(path)
            if match:
                path = (f"{prefix}[{match.group(1)}]" if batch else prefix) + path[match.end():]
            elif path.startswith("$"):
                path = base + path[1:]
        else:
            path = base
        issues.append(Issue(issue.message, issue.index, issue.urn, issue.aspect, path, issue.expected, issue.found))
    return type(error)(error.message, issues)


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValidationFailed("the body of a Rest.li action must be a JSON object", [Issue("expected an object", path="$")])
    return body


def require_urn(body: dict[str, Any], key: str = "urn") -> str:
    urn = body.get(key)
    if not isinstance(urn, str) or not urn:
        raise ValidationFailed(f"`{key}` is required", [Issue(f"missing required string field {key!r}", path=f"$.{key}")])
    return urn


def entity_of(registry: EntityRegistry, urn: str, path: str = "$.urn") -> str:
    """The registry's entity name of an URN (400 when the URN is malformed or its entity type unknown)."""
    try:
        return registry.entity(parse_urn(urn).entity_type).name
    except InvalidUrnError as error:
        raise ValidationFailed(str(error), [Issue(str(error), urn=urn, path=path)]) from None
    except RegistryError as error:
        raise ValidationFailed(str(error), [Issue(str(error), urn=urn, path=path)]) from None


def optional_int(body: dict[str, Any], key: str) -> int | None:
    raw = body.get(key)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or (isinstance(raw, str) and not raw.lstrip("-").isdigit()):
        raise ValidationFailed(f"`{key}` must be an integer", [Issue("expected an integer", path=f"$.{key}", found=repr(raw)[:100])])
    return int(raw)


def parse_restli_list(raw: str | None) -> list[str] | None:
    """Rest.li 2.0 list syntax in a query parameter: `List(a,b,c)` (items percent-encoded); a bare `a,b` too."""
    if raw is None or raw == "":
        return None
    text = raw.strip()
    if text.startswith("List(") and text.endswith(")"):
        text = text[5:-1]
    return [unquote(item) for item in text.split(",") if item]
