"""The internal form of a Metadata Change Proposal, shared by every endpoint that writes."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from app.audit.model import INTERNAL, Attribution, attribution
from app.errors import Location

DEFAULT_RUN_ID = "no-run-id-provided"
DEFAULT_ACTOR = "urn:li:corpuser:datahub"
SYSTEM_ACTOR = "urn:li:corpuser:__datahub_system"
JSON_CONTENT_TYPE = "application/json"
JSON_PATCH_CONTENT_TYPE = "application/json-patch+json"

# The conditional-write headers, lower-cased: MCP header names are case-insensitive.
IF_VERSION_MATCH = "if-version-match"
IF_MODIFIED_SINCE = "if-modified-since"
IF_UNMODIFIED_SINCE = "if-unmodified-since"
IF_NONE_MATCH = "if-none-match"
CONDITIONAL_HEADERS = (IF_VERSION_MATCH, IF_MODIFIED_SINCE, IF_UNMODIFIED_SINCE, IF_NONE_MATCH)
# The ones that make the v3 single-aspect route's `createIfNotExists` default false (If-None-Match asks for a create).
PRECONDITION_HEADERS = (IF_VERSION_MATCH, IF_MODIFIED_SINCE, IF_UNMODIFIED_SINCE)


class ChangeType(str, enum.Enum):
    UPSERT = "UPSERT"
    CREATE = "CREATE"
    CREATE_ENTITY = "CREATE_ENTITY"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    PATCH = "PATCH"
    RESTATE = "RESTATE"


# RESTATE is what the change log says for a replay or a no-op; nobody proposes it.
PROPOSABLE_CHANGE_TYPES = frozenset(ChangeType) - {ChangeType.RESTATE}


@dataclass(frozen=True, slots=True)
class AuditStamp:
    time: int
    actor: str
    # the token and surface of the request that made the write, for its audit entries (app.audit); not DataHub's
    caller: Attribution = field(default=INTERNAL, compare=False)
    # the Idempotency-Key claim of the request that made the write, which its transaction marks committed
    # (app.idempotency.commit); None: no key
    claim: tuple[str, str, UUID] | None = field(default=None, compare=False)  # actor, key, holder

    @classmethod
    def now(cls, actor: str | None = None) -> AuditStamp:
        return cls(int(time.time() * 1000), actor or DEFAULT_ACTOR, attribution())

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "actor": self.actor}


@dataclass(slots=True)
class Draft:
    """A proposal as an endpoint parsed it, before the registry has seen it. Exactly one of `urn` and
    `entity_key_aspect` identifies the entity."""

    index: int
    entity_type: str
    aspect_name: str
    change_type: str = ChangeType.UPSERT.value
    urn: str | None = None
    entity_key_aspect: dict[str, Any] | None = None
    value: Any = None
    content_type: str | None = None
    system_metadata: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    location: Location | None = None  # where it sits in the caller's request (None: report MCP paths as they are)


@dataclass(slots=True)
class Proposal:
    """One aspect of one entity, after parsing and registry resolution.

    `value` is the validated, normalized aspect (None for DELETE and, until it is applied, for PATCH: the patch
    document then sits in `patch`). `headers` keep the names as sent; look them up with `header()`.
    """

    index: int
    entity_type: str
    urn: str
    aspect_name: str
    change_type: ChangeType
    value: dict[str, Any] | None = None
    patch: Any = None
    system_metadata: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    entity_key_aspect: dict[str, Any] | None = None
    is_timeseries: bool = False
    is_key: bool = False

    def header(self, name: str) -> str | None:
        """Case-insensitive lookup; `name` is given lower-case."""
        for key, value in self.headers.items():
            if key.lower() == name:
                return value
        return None

    @property
    def run_id(self) -> str:
        return self.system_metadata.get("runId") or DEFAULT_RUN_ID
