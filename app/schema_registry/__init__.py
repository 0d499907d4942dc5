"""Schema registries: where the writer schema of an Avro-framed Kafka value is found by its id, and where
metaledger's producers register theirs.

- `InternalRegistry` (app.schema_registry.internal): the registry metaledger serves at `/schema-registry/api`,
  DataHub's schemas under DataHub's fixed ids plus the schemas producers register, stored in Postgres.
- `ConfluentRegistryClient` (app.schema_registry.confluent): an external Confluent-compatible registry, when
  `METALEDGER_SCHEMA_REGISTRY_URL` is set.

Both satisfy `SchemaRegistryClient`. This package imports `app.avro` (DataHub's schemas), never `app.kafka`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from app.schema_registry.errors import (
    IncompatibleSchema,
    InvalidSchema,
    RegistryUnavailable,
    SchemaRegistryError,
    UnknownSchema,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from app.settings import Settings

__all__ = [
    "IncompatibleSchema",
    "InvalidSchema",
    "RegistryUnavailable",
    "SchemaRegistryClient",
    "SchemaRegistryError",
    "UnknownSchema",
    "make_registry_client",
]


@runtime_checkable
class SchemaRegistryClient(Protocol):
    async def schema_by_id(self, schema_id: int) -> str:
        """The schema text registered under `schema_id`; raises UnknownSchema (a LookupError) when there is none,
        RegistryUnavailable (a ConnectionError) when the registry cannot answer now."""
        ...

    async def register(self, subject: str, schema: str) -> int:
        """Register `schema` under `subject` and return its id (the existing id when it is registered already);
        raises InvalidSchema, IncompatibleSchema or RegistryUnavailable."""
        ...

    async def aclose(self) -> None: ...


def make_registry_client(settings: Settings, engine: AsyncEngine) -> SchemaRegistryClient:
    """The external registry when `settings.schema_registry_url` is set, else the internal one on `engine`."""
    url = getattr(settings, "schema_registry_url", None)
    if url:
        from app.schema_registry.confluent import ConfluentRegistryClient

        return ConfluentRegistryClient(url, user_info=getattr(settings, "schema_registry_user_info", None))
    from app.schema_registry.internal import InternalRegistry

    return InternalRegistry(engine, settings)
