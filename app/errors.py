"""Typed errors the API answers with. Each maps to one HTTP status and a machine-readable body:

    {"error": "<kind>", "message": "<summary>", "issues": [{"index", "urn", "aspect", "path", "message", ...}]}

`index` is the position of the offending item in the request (batch endpoints), `path` a JSON path inside it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

# What an error body echoes at most: a message, and each of an issue's other fields (a URN, a path, a value found).
MESSAGE_CHARS = 500
ECHO_CHARS = 200


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """`text`, or its first `limit` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}…({len(text)} chars)"


@dataclass(frozen=True, slots=True)
class Issue:
    message: str
    index: int | None = None
    urn: str | None = None
    aspect: str | None = None
    path: str | None = None
    expected: str | None = None
    found: str | None = None

    def to_json(self) -> dict[str, Any]:
        # Never echo unbounded input: URNs, paths and values a client sent are cut (`…(N chars)` says how long).
        return {
            k: (clip(v, MESSAGE_CHARS if k == "message" else ECHO_CHARS) if isinstance(v, str) else v)
            for k, v in asdict(self).items()
            if v is not None
        }


@dataclass(frozen=True, slots=True)
class Location:
    """Where one proposal sits in what the caller sent, so that its issues speak the caller's terms.

    The write pipeline reports paths inside a Metadata Change Proposal (`$.aspect.value.name`, `$.entityUrn`,
    `$.changeType`) and the proposal's index in the batch. A protocol that received something else (a v3 entity
    batch, a Rest.li action body, an MCE snapshot, a Kafka record) gives each draft a Location; `place` is the one
    place where an issue is re-expressed: `index` is the item's position as the caller counts it (None: the
    document is the item, as a Kafka record), `base` the path of the proposal itself, and `value`, `urn`, `fields`
    the paths of the aspect value, of the URN and of the other MCP fields where the caller's shape differs from an
    MCP (a v3 body has no `aspect.value`, only `<aspect>.value`)."""

    index: int | None
    base: str = "$"
    value: str | None = None
    urn: str | None = None
    fields: str | None = None

    def path(self, mcp_path: str | None) -> str | None:
        if mcp_path is None or mcp_path == "$":
            # An issue about the item as a whole points at the item (nowhere when the item is the whole document).
            where = self.base if self.fields is None else self.fields
            return mcp_path if where == "$" else where
        if self.value is not None and mcp_path.startswith("$.aspect.value"):
            return self.value + mcp_path[len("$.aspect.value") :]
        if self.urn is not None and mcp_path.startswith(("$.entityUrn", "$.entityKeyAspect")):
            return self.urn
        if self.fields is not None and mcp_path.startswith("$."):
            return self.fields
        if mcp_path.startswith("$"):
            return self.base + mcp_path[1:]
        return mcp_path

    def place(self, issue: Issue) -> Issue:
        return replace(issue, index=self.index, path=self.path(issue.path))


@dataclass
class MetaledgerError(Exception):
    """Base of every error a client can cause. Never a 500."""

    message: str
    issues: list[Issue] = field(default_factory=list)
    status_code: ClassVar[int] = 400
    error: ClassVar[str] = "Bad Request"

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)

    def to_json(self) -> dict[str, Any]:
        return {
            "error": self.error,
            "message": clip(self.message, MESSAGE_CHARS),
            "issues": [i.to_json() for i in self.issues],
        }

    def headers(self) -> dict[str, str] | None:
        """Response headers this error adds (WWW-Authenticate, Retry-After)."""
        return None

    def with_issues(self, issues: list[Issue], message: str | None = None) -> MetaledgerError:
        """The same kind of error about other issues (relocated, or a part of a batch's)."""
        return type(self)(self.message if message is None else message, issues)


class ValidationFailed(MetaledgerError):
    status_code = 400
    error = "Validation Error"


class NotFound(MetaledgerError):
    status_code = 404
    error = "Not Found"


class ExistenceConflict(MetaledgerError):
    """CREATE on an existing aspect, CREATE_ENTITY on an existing entity, UPDATE of a missing aspect.
    DataHub answers 400 here; metaledger answers 409 so clients can tell a conflict from a bad payload."""

    status_code = 409
    error = "Conflict"


class PreconditionFailed(MetaledgerError):
    status_code = 412
    error = "Precondition Error"


class PayloadTooLarge(MetaledgerError):
    status_code = 413
    error = "Payload Too Large"


class UnsupportedMediaType(MetaledgerError):
    status_code = 415
    error = "Unsupported Media Type"


class Unauthorized(MetaledgerError):
    """No credentials, or credentials that are not valid (unknown, expired, revoked, badly signed)."""

    status_code = 401
    error = "Unauthorized"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="metaledger"'}


class Forbidden(MetaledgerError):
    """Authenticated, but the actor's role or policies do not grant the permission the request needs."""

    status_code = 403
    error = "Forbidden"


@dataclass
class Backpressure(MetaledgerError):
    """Retryable refusals that carry when to retry: the client's retry policy honours `Retry-After`."""

    retry_after_s: int = 1

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}

    def with_issues(self, issues: list[Issue], message: str | None = None) -> MetaledgerError:
        return type(self)(self.message if message is None else message, issues, self.retry_after_s)


class TooManyRequests(Backpressure):
    """Too many writes in flight, or a change-log backlog past its limit: the service sheds load instead of queueing."""

    status_code = 429
    error = "Too Many Requests"


class ServiceUnavailable(Backpressure):
    """The database is unreachable or the transaction could not complete after its retries (retryable)."""

    status_code = 503
    error = "Service Unavailable"


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    cls.status_code: {
        "description": cls.error,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }
    for cls in (
        ValidationFailed,
        Unauthorized,
        Forbidden,
        NotFound,
        ExistenceConflict,
        PreconditionFailed,
        PayloadTooLarge,
        UnsupportedMediaType,
        TooManyRequests,
        ServiceUnavailable,
    )
}
