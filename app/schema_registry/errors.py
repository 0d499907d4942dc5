"""The registry's errors. Each carries Confluent's REST error code, so the HTTP routes answer exactly what a
Confluent Schema Registry answers (`{"error_code": <code>, "message": <message>}`)."""

from __future__ import annotations


class SchemaRegistryError(Exception):
    """Base of the registry's errors: `status` is the HTTP status, `error_code` Confluent's code."""

    status: int = 500
    error_code: int = 50001

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_json(self) -> dict[str, object]:
        return {"error_code": self.error_code, "message": self.message}


class UnknownSchema(SchemaRegistryError, LookupError):
    """No schema with this id (Confluent 40403)."""

    status = 404
    error_code = 40403


class SubjectNotFound(SchemaRegistryError, LookupError):
    status = 404
    error_code = 40401


class VersionNotFound(SchemaRegistryError, LookupError):
    status = 404
    error_code = 40402


class SchemaNotInSubject(UnknownSchema):
    """A lookup (`POST /subjects/{s}`) of a schema the subject does not hold (Confluent 40403)."""


class IncompatibleSchema(SchemaRegistryError):
    """The schema cannot be registered under the subject's compatibility level (Confluent 409)."""

    status = 409
    error_code = 409


class InvalidSchema(SchemaRegistryError, ValueError):
    """Not a valid Avro schema, or not a schema this registry accepts (Confluent 42201)."""

    status = 422
    error_code = 42201


class InvalidVersion(SchemaRegistryError, ValueError):
    status = 422
    error_code = 42202


class InvalidCompatibilityLevel(SchemaRegistryError, ValueError):
    status = 422
    error_code = 42203


class InvalidSubject(SchemaRegistryError, ValueError):
    status = 422
    error_code = 42208


class RegistryUnavailable(SchemaRegistryError, ConnectionError):
    """The registry (an external one, or the database behind the internal one) cannot answer now: retry later.
    Never a reason to treat a message as poison."""

    status = 503
    error_code = 50003


class MalformedRequest(SchemaRegistryError, ValueError):
    """A request body that is not JSON, or not the object the endpoint takes."""

    status = 400
    error_code = 400


class UnsupportedMediaType(SchemaRegistryError, ValueError):
    """A body whose content type is not one Confluent's registry consumes (Confluent answers 415 with code 415)."""

    status = 415
    error_code = 415


class UnprocessableRequest(SchemaRegistryError, ValueError):
    status = 422
    error_code = 422


class RequestTooLarge(SchemaRegistryError, ValueError):
    status = 413
    error_code = 413


class NotFound(SchemaRegistryError, LookupError):
    """No such endpoint (Confluent answers these with the HTTP status as the error code)."""

    status = 404
    error_code = 404


class ServedElsewhere(SchemaRegistryError, LookupError):
    """This metaledger uses an external registry (METALEDGER_SCHEMA_REGISTRY_URL): its own routes do not serve
    another registry's ids, which would disagree with the ones on the topics."""

    status = 404
    error_code = 40401
