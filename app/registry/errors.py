"""Typed errors of the entity registry. Every one is a :class:`RegistryError`.

The API layer maps them (see ``app/errors.py``): unknown entity / aspect and invalid payloads are client errors
(DataHub answers ``ValidationException`` → 422 on Rest.li, 400 on OpenAPI); :class:`RegistryConfigError` is a
start-up problem of the registry files themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class RegistryError(Exception):
    """Base class of every registry error."""


@dataclass(frozen=True, slots=True)
class FieldIssue:
    """One problem found in a payload.

    ``path`` is a JSON path relative to the validated value (``$`` is the value itself), e.g.
    ``$.fields[3].type.type`` or ``$.customProperties["my key"]``. ``expected``/``found`` are short descriptions
    (``"long"``, ``'string "abc"'``) when the issue is a type mismatch, else None.
    """

    path: str
    message: str
    expected: str | None = None
    found: str | None = None

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "message": self.message}
        if self.expected is not None:
            out["expected"] = self.expected
        if self.found is not None:
            out["found"] = self.found
        return out


def _summarize(issues: list[FieldIssue], limit: int = 5) -> str:
    shown = "; ".join(str(i) for i in issues[:limit])
    if len(issues) > limit:
        shown += f"; … and {len(issues) - limit} more"
    return shown


class RegistryConfigError(RegistryError):
    """The registry files (yml or .avsc) are inconsistent; ``problems`` lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid entity registry: " + "; ".join(self.problems))


class UnknownEntityError(RegistryError):
    def __init__(self, entity: str) -> None:
        self.entity = entity
        # DataHub's wording (ConfigEntityRegistry.getEntitySpec).
        super().__init__(f"Failed to find entity with name {entity} in EntityRegistry")


class UnknownAspectError(RegistryError):
    """The aspect name is not defined anywhere in the registry."""

    def __init__(self, entity: str, aspect: str, message: str | None = None) -> None:
        self.entity = entity
        self.aspect = aspect
        # DataHub's wording (ValidationApiUtils): "Unknown aspect %s for entity %s".
        super().__init__(message or f"Unknown aspect {aspect} for entity {entity}")


class AspectNotAllowedError(UnknownAspectError):
    """The aspect exists, but not on this entity. A subclass of UnknownAspectError (DataHub does not distinguish)."""

    def __init__(self, entity: str, aspect: str) -> None:
        super().__init__(
            entity,
            aspect,
            f"Unknown aspect {aspect} for entity {entity} (aspect {aspect} is not an aspect of {entity})",
        )


class AspectValidationError(RegistryError):
    """A payload does not conform to its aspect schema. ``issues`` holds every problem found (capped)."""

    def __init__(self, aspect: str, issues: list[FieldIssue], *, truncated: bool = False) -> None:
        self.aspect = aspect
        self.issues = list(issues)
        self.truncated = truncated
        n = len(self.issues)
        count = f"{n}{'+' if truncated else ''} issue{'s' if n != 1 else ''}"
        super().__init__(f"invalid value for aspect {aspect} ({count}): {_summarize(self.issues)}")


class UrnKeyError(RegistryError):
    """A URN does not map onto its entity's key aspect (or a key value does not make a URN).

    ``issues`` carries the key-schema problems when the key value itself is invalid (e.g. a bad FabricType)."""

    def __init__(self, message: str, issues: list[FieldIssue] | None = None) -> None:
        self.issues = list(issues or [])
        if self.issues:
            message = f"{message}: {_summarize(self.issues)}"
        super().__init__(message)


class KeyValidationError(UrnKeyError, AspectValidationError):
    """A key aspect value (from URN parts, or given to ``key_to_urn``) does not conform to its key schema.

    Both an :class:`UrnKeyError` and an :class:`AspectValidationError` (``aspect`` is the key aspect name,
    ``issues`` the key-schema problems, with paths such as ``$.origin``)."""

    def __init__(self, message: str, aspect: str, issues: list[FieldIssue], *, truncated: bool = False) -> None:
        self.aspect = aspect
        self.issues = list(issues)
        self.truncated = truncated
        Exception.__init__(self, f"{message}: {_summarize(self.issues)}")
