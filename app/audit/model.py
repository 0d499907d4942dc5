"""The audit log's entries, the actions they record, who they are attributed to, and the hash that chains them.

An entry's attribution beyond its actor — the token that authenticated the request and the surface (protocol) it came
through — is known where the request's principal is resolved (app.api.deps.authenticate), not where the write path
writes its rows: concurrent writes of several requests share one transaction (app.write.combiner), in a task of
their own. So `ATTRIBUTION` holds it for the request, `AuditStamp.now` (app.write.proposal) takes it into the stamp
that travels with each write, and the change log of each aspect change carries it to the write statement
(`OutboxRow.audited`), which inserts the entry beside the change log.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

# What an entry records. An aspect write of the runtime model set or of the processor pipeline is recorded under its
# own action (app.write.repository names the aspects): those writes are the model apply and the pipeline change.
ASPECT_WRITE = "aspect.write"
MODEL_APPLY = "model.apply"
PROCESSOR_CHANGE = "processor.change"
TOKEN_CREATE = "token.create"
TOKEN_REVOKE = "token.revoke"
RUN_ROLLBACK = "run.rollback"
WEB_SIGN_IN = "web.sign_in"
ACTIONS = (ASPECT_WRITE, MODEL_APPLY, PROCESSOR_CHANGE, TOKEN_CREATE, TOKEN_REVOKE, RUN_ROLLBACK, WEB_SIGN_IN)


@dataclass(frozen=True, slots=True)
class Attribution:
    """Who a change is attributed to beside its actor: the token of the request that made it (None: the system
    client, authentication off, or no request) and the surface it came through (v1, v3, restli, graphql, …;
    `internal` for work without a request: the Kafka consumers, the background workers)."""

    token_id: str | None
    surface: str


@dataclass(frozen=True, slots=True)
class AuditedChange:
    """What the audit entry of an aspect change records beside its change log's own columns: who made it, and the
    system metadata (new and previous) its change log carries, as the write decided them: the write statement reads
    the entry's run, trace, origin and versions from these instead of parsing each change log back."""

    caller: Attribution
    actor: str
    system_metadata: Mapping[str, Any]
    previous_system_metadata: Mapping[str, Any] | None


INTERNAL = Attribution(None, "internal")
ATTRIBUTION: ContextVar[Attribution] = ContextVar("metaledger_audit_attribution", default=INTERNAL)

# A request's surface by its path, first match (the Rest.li resources are the paths none of these claims).
_SURFACES = (
    ("/openapi/v3/", "v3"),
    ("/openapi/v2/", "v2"),
    ("/openapi/openlineage/", "openlineage"),
    ("/api/v1/lineage", "openlineage"),
    ("/openapi/v1/", "v1"),
    ("/api/graphql", "graphql"),
    ("/mcp", "mcp"),
    ("/schema-registry/", "schema-registry"),
)


def surface_of(path: str) -> str:
    for prefix, surface in _SURFACES:
        if path.startswith(prefix):
            return surface
    return "restli"


def attribute_request(token_id: str | None, path: str) -> None:
    """Attribute what the current request does (called where its principal is resolved)."""
    attribute(token_id, surface_of(path))


def attribute(token_id: str | None, surface: str) -> None:
    """Attribute what the current task does from here on: the web view's session (its pages are at DataHub's frontend
    paths, which name no surface), a Kafka consumer's loop (`kafka`: no request, no token)."""
    ATTRIBUTION.set(Attribution(token_id, surface))


def attribution() -> Attribution:
    return ATTRIBUTION.get()


@dataclass(slots=True)
class Entry:
    """One audit entry as it is recorded (the database adds its id, transaction and time; the chain its position
    and hash)."""

    action: str
    actor: str
    token_id: str | None = None  # None: the current request's (app.audit.repository.record)
    surface: str | None = None  # None: the current request's
    urn: str | None = None
    aspect: str | None = None
    change_type: str | None = None
    version_before: int | None = None
    version_after: int | None = None
    run_id: str | None = None
    trace_id: str | None = None
    detail: dict[str, Any] | None = None


# The columns an entry is recorded with, in `Entry`'s order, and those the hash covers (these, its id, time and
# position): an edit of any of them in SQL makes `verify` name the entry.
ENTRY_COLUMNS = (
    "action",
    "actor",
    "token_id",
    "surface",
    "urn",
    "aspect",
    "change_type",
    "version_before",
    "version_after",
    "run_id",
    "trace_id",
    "detail",
)
STORED_COLUMNS = ("id", "at", "seq", "hash", *ENTRY_COLUMNS)
GENESIS = ""  # the hash before the first entry
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def entry_hash(previous: str, row: Any) -> str:
    """The hash of a stored entry (a row of `STORED_COLUMNS`) chained to the one before it: SHA-256 of the previous
    hash and the entry's fields in a fixed order (its time as microseconds since the epoch)."""
    fields = [previous, row["seq"], row["id"], (row["at"] - _EPOCH) // _MICROSECOND]
    fields += [row[c] for c in ENTRY_COLUMNS]
    return hashlib.sha256(orjson.dumps(fields)).hexdigest()


def entry_json(row: Any) -> dict[str, Any]:
    """An entry as the API answers it."""
    at: datetime = row["at"]
    return {
        "id": row["id"],
        "position": row["seq"],
        "time": int(at.timestamp() * 1000),
        "action": row["action"],
        "actor": row["actor"],
        "tokenId": row["token_id"],
        "surface": row["surface"],
        "urn": row["urn"],
        "aspect": row["aspect"],
        "changeType": row["change_type"],
        "versionBefore": row["version_before"],
        "versionAfter": row["version_after"],
        "runId": row["run_id"],
        "traceId": row["trace_id"],
        "detail": orjson.loads(row["detail"]) if row["detail"] is not None else None,
        "hash": row["hash"],
    }
