"""Limits on what a client may send, checked before anything costly (a cache, a parse, a recursion, a query).

* `clip`: text that goes back to the client (error messages, echoed values) is cut to its first characters plus
  `…(N chars)`, so an error never echoes unbounded input.
* `too_deep` / `check_depth`: JSON nesting, walked level by level without recursion (so the check itself cannot
  overflow), costing one pass over the containers of a document; `METALEDGER_MAX_JSON_DEPTH` (100) is far above
  what any aspect needs (DataHub's deepest aspect schema is 10 records deep) and far below what the JSON encoder
  (255 levels) and Python's recursion limit allow.
* `check_long`: integers that reach Postgres (`bigint`) or Elasticsearch (`long`) stay within 64 bits.
"""

from __future__ import annotations

import re
from typing import Any

from app.errors import Issue, ValidationFailed, clip

__all__ = ["MAX_LONG", "MIN_LONG", "check_depth", "check_long", "clip", "too_deep"]

MIN_LONG, MAX_LONG = -(2**63), 2**63 - 1
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def too_deep(value: Any, limit: int) -> str | None:
    """The JSON path of the first container nested deeper than `limit` levels (`{}` and `[]` are one level), or
    None. The common case (not too deep) is one breadth-first pass over the containers, without recursion."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return _path_below(value, limit)
        below: list[Any] = []
        add = below.append
        for node in level:
            for child in node.values() if type(node) is dict else node:
                kind = type(child)
                if kind is dict or kind is list:
                    add(child)
        level = below
    return None


def _path_below(value: Any, limit: int) -> str:
    """The path to a container at depth `limit + 1` (the error path only: iterative, stops at the first one)."""
    stack: list[tuple[Any, str, int]] = [(value, "$", 1)]
    while stack:
        node, path, depth = stack.pop()
        if depth > limit:
            return path
        items = node.items() if type(node) is dict else enumerate(node)
        for key, child in items:
            if type(child) is dict or type(child) is list:
                if isinstance(key, int):  # a list's index (a JSON object's keys are text)
                    step = f"[{key}]"
                elif _IDENTIFIER.fullmatch(key):
                    step = f".{key}"
                else:
                    step = f'["{clip(key, 60)}"]'
                stack.append((child, path + step, depth + 1))
    return "$"


def check_depth(value: Any, limit: int, path: str = "$", *, index: int | None = None, what: str = "the JSON") -> None:
    """ValidationFailed naming where `value` (found at `path`) nests deeper than `limit` levels."""
    where = too_deep(value, limit)
    if where is None:
        return
    full = path + where[1:]
    message = f"{what} is nested more than {limit} levels deep (METALEDGER_MAX_JSON_DEPTH) at {clip(full)}"
    raise ValidationFailed(
        message,
        [Issue(f"nested more than {limit} levels deep", index, path=clip(full), expected=f"at most {limit} levels")],
    )


def check_long(value: int | None, name: str, *, minimum: int = MIN_LONG, path: str | None = None) -> int | None:
    """`value` if it fits a signed 64-bit integer (and is at least `minimum`); else ValidationFailed naming `name`."""
    if value is None or minimum <= value <= MAX_LONG:
        return value
    shown = clip(str(value), 40)
    raise ValidationFailed(
        f"`{name}` must be between {minimum} and {MAX_LONG}",
        [Issue(f"{name} is out of range", path=path or f"${name}", expected=f"{minimum}..{MAX_LONG}", found=shown)],
    )
