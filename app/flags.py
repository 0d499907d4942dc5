"""The one parser of the booleans a client sends: query parameters (app.api.http.Flag), Rest.li body flags
(`async`, `dryRun`), headers (`X-DataHub-Sync-Index-Update`). true/false, 1/0, yes/no in any case; anything else is
refused, naming where it was found (pydantic alone would also take `on`, `t`, `y`; a hand-made `== "true"` silently
took `yes` for false)."""

from __future__ import annotations

from typing import Any

from app.errors import Issue, ValidationFailed

_TRUE, _FALSE = frozenset({"true", "1", "yes"}), frozenset({"false", "0", "no"})


def strict_flag(raw: Any) -> bool:
    """true/false, 1/0, yes/no in any case; anything else (pydantic would also take `on`, `t`, `y`) is refused."""
    if isinstance(raw, bool):
        return raw
    flag = raw.strip().lower() if isinstance(raw, str) else None
    if flag in _TRUE:
        return True
    if flag in _FALSE:
        return False
    raise ValueError("must be true or false (1/0, yes/no)")


def parse_bool(raw: Any, default: bool, name: str | None = None) -> bool:
    """A boolean in a body or a header (a JSON boolean, or its text): `default` when absent or empty, else
    :func:`strict_flag`, a 400 naming `name` (`$.async`, `$X-DataHub-Sync-Index-Update`) otherwise."""
    if raw is None or raw == "":
        return default
    try:
        return strict_flag(raw)
    except ValueError:
        where = f"${name}" if name else None
        raise ValidationFailed(
            f"{name or 'a flag'} must be true or false", [Issue("not a boolean", path=where, found=str(raw)[:50])]
        ) from None
