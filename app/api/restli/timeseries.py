"""Timeseries reads for `POST /aspects?action=getTimeseriesAspectValues`: DataHub's filter (`{"or": [{"and":
[criterion...]}]}`) checked and matched, points read from the search backend's timeseries store."""

from __future__ import annotations

from typing import Any

import orjson

from app.errors import Issue, ValidationFailed
from app.search.model import TimeseriesQuery

DEFAULT_LIMIT = 10_000  # DataHub's default for this action
SUPPORTED_CONDITIONS = (
    "EQUAL",
    "IN",
    "NOT_EQUAL",
    "EXISTS",
    "GREATER_THAN",
    "GREATER_THAN_OR_EQUAL_TO",
    "LESS_THAN",
    "LESS_THAN_OR_EQUAL_TO",
)


def _field_value(value: dict[str, Any], field: str) -> Any:
    """A top-level field of the aspect value (a dotted path reaches nested fields)."""
    node: Any = value
    for part in field.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    return str(value)


def _number(raw: Any) -> float | None:
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def _criterion_matches(value: dict[str, Any], criterion: dict[str, Any]) -> bool:
    field = criterion.get("field")
    condition = str(criterion.get("condition") or "EQUAL").upper()
    values = criterion.get("values")
    if values is None:
        values = [criterion["value"]] if "value" in criterion else []
    wanted = [_as_text(v) for v in values]
    found = _field_value(value, field) if isinstance(field, str) else None
    found_texts = (
        [_as_text(v) for v in found] if isinstance(found, list) else ([] if found is None else [_as_text(found)])
    )
    if condition == "EXISTS":
        matched = found is not None
    elif condition in ("EQUAL", "IN"):
        matched = any(t in wanted for t in found_texts)
    elif condition == "NOT_EQUAL":
        matched = not any(t in wanted for t in found_texts)
    else:
        left, right = _number(found), _number(wanted[0]) if wanted else None
        if left is None or right is None:
            matched = False
        elif condition == "GREATER_THAN":
            matched = left > right
        elif condition == "GREATER_THAN_OR_EQUAL_TO":
            matched = left >= right
        elif condition == "LESS_THAN":
            matched = left < right
        else:
            matched = left <= right
    return not matched if criterion.get("negated") else matched


def check_filter(raw: Any) -> list[list[dict[str, Any]]]:
    """DataHub's Filter: `{"or": [{"and": [criterion, ...]}, ...]}` (or the legacy `{"criteria": [...]}`) as a
    disjunction of conjunctions. `{}` or no filter matches everything."""
    if raw is None or raw == {}:
        return []
    if not isinstance(raw, dict):
        raise ValidationFailed("filter must be an object", [Issue("expected {or: [{and: [...]}]}", path="$.filter")])
    groups: list[list[dict[str, Any]]] = []
    if raw.get("or") is not None:
        for i, group in enumerate(raw["or"]):
            criteria = group.get("and") if isinstance(group, dict) else None
            if not isinstance(criteria, list):
                raise ValidationFailed("bad filter", [Issue("expected {and: [...]}", path=f"$.filter.or[{i}]")])
            groups.append(criteria)
    if raw.get("criteria") is not None:
        groups.append(raw["criteria"])
    for g, criteria in enumerate(groups):
        for c, criterion in enumerate(criteria):
            if not isinstance(criterion, dict) or not isinstance(criterion.get("field"), str):
                raise ValidationFailed(
                    "bad filter criterion", [Issue("a criterion needs a `field`", path=f"$.filter.or[{g}].and[{c}]")]
                )
            condition = str(criterion.get("condition") or "EQUAL").upper()
            if condition not in SUPPORTED_CONDITIONS:
                raise ValidationFailed(
                    f"filter condition {condition!r} is not supported on timeseries reads",
                    [
                        Issue(
                            f"supported: {', '.join(SUPPORTED_CONDITIONS)}", path=f"$.filter.or[{g}].and[{c}].condition"
                        )
                    ],
                )
    return groups


def filter_matches(groups: list[list[dict[str, Any]]], value: dict[str, Any]) -> bool:
    if not groups:
        return True
    return any(all(_criterion_matches(value, c) for c in criteria) for criteria in groups)


async def timeseries_from_backend(
    backend: Any,
    urn: str,
    aspect: str,
    *,
    start: int | None,
    end: int | None,
    limit: int,
    groups: list[list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """Up to `limit` points from the search backend's timeseries store (`SearchBackend.timeseries`), newest first,
    as `{"aspect": {"value": "<JSON text>", "contentType"}, "systemMetadata"}`. A filter is matched here, over the
    range's points."""
    if limit <= 0:
        return []
    # Filter values come as strings (DataHub's Criterion); the backends compare typed values, so only an absent
    # filter goes to the backend as is and every filter is matched here, over the range's points.
    equals: dict[str, Any] | None = None if groups else {}
    if equals is not None:
        points = await backend.timeseries(
            TimeseriesQuery(urn=urn, aspect=aspect, start_ms=start, end_ms=end, limit=limit, equals=equals)
        )
    else:
        candidates = await backend.timeseries(
            TimeseriesQuery(urn=urn, aspect=aspect, start_ms=start, end_ms=end, limit=max(limit, DEFAULT_LIMIT) * 10)
        )
        points = [p for p in candidates if filter_matches(groups, p.value)][:limit]
    values = []
    for p in points[:limit]:
        item: dict[str, Any] = {"aspect": {"value": orjson.dumps(p.value).decode(), "contentType": "application/json"}}
        if p.system_metadata is not None:
            item["systemMetadata"] = p.system_metadata
        values.append(item)
    return values
