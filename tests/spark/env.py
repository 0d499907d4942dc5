"""Settings as the `METALEDGER_*` environment a job process (or the command line under test) reads them from."""

from __future__ import annotations

from typing import Any


def metaledger_env(settings: Any, *names: str) -> dict[str, str]:
    return {f"METALEDGER_{name.upper()}": str(getattr(settings, name)) for name in names}
