"""The History tab."""

from __future__ import annotations

from app.web.tabs import Tab

TAB = Tab()
