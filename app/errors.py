"""Typed errors the API answers with. Each maps to one HTTP status and a machine-readable body:

    {"error": "<kind>", "message": "<summary>", "issues": [{"index", "urn", "aspect", "path", "message", ...}]}

`index` is the position of the offending item in the request (batch endpoints), `path` a JSON path inside it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar


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
        return {k: v for k, v in asdict(self).items() if v is not None}


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
        return {"error": self.error, "message": self.message, "issues": [i.to_json() for i in self.issues]}


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


class ServiceUnavailable(MetaledgerError):
    """The database is unreachable or the transaction could not complete after its retries (retryable)."""

    status_code = 503
    error = "Service Unavailable"


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    cls.status_code: {"model": None, "description": cls.error}
    for cls in (ValidationFailed, NotFound, ExistenceConflict, PreconditionFailed, PayloadTooLarge, ServiceUnavailable)
}
