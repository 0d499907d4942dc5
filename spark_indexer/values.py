"""Change-log values as the Spark indexer reads them off Kafka: Confluent-framed Avro (metaledger's default, DataHub's
wire) or JSON, decoded into the MCL's JSON form with the service's own codec (`app.avro.wire.ValueCodec`).

Writer schemas: DataHub's fixed ids decode with the schemas of the installed acryl-datahub package, without a
registry. Any other id is fetched once per Python worker from the registry: the external one
(`METALEDGER_SCHEMA_REGISTRY_URL`, which then answers for every id) or metaledger's own
(`METALEDGER_SPARK_SCHEMA_REGISTRY_URL`, e.g. `http://metaledger:8080/schema-registry/api`). A registry that cannot be
reached fails the task (Spark retries it); an id no registry knows makes the record a dead letter.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app.avro.wire import ValueCodec, WireFormatError

__all__ = ["ValueDecoder", "WireFormatError", "decoder_for"]


class ValueDecoder:
    """raw value → the JSON form (a dict); WireFormatError with the reason when it is neither JSON nor Avro."""

    def __init__(self, settings: Any) -> None:
        self.url = settings.schema_registry_url or getattr(settings, "spark_schema_registry_url", None)
        self.codec = ValueCodec(settings, fetch_schema=self._fetch if self.url else None)
        # Credentials where the registry wants them: its own, or metaledger's system client (a metaledger registry
        # with METALEDGER_SCHEMA_REGISTRY_OPEN_READ=false).
        secret = getattr(settings, "system_client_secret", None)
        self.user_info = getattr(settings, "schema_registry_user_info", None) or (
            f"{settings.system_client_id}:{secret}" if secret else None
        )

    def _fetch(self, schema_id: int) -> str:
        from app.schema_registry.confluent import ConfluentRegistryClient

        url = self.url
        assert url is not None  # the codec fetches through here only when there is a registry (`__init__`)

        async def get() -> str:
            client = ConfluentRegistryClient(url, user_info=self.user_info)
            try:
                return await client.schema_by_id(schema_id)
            finally:
                await client.aclose()

        return asyncio.run(get())

    def __call__(self, raw: bytes | None) -> dict[str, Any]:
        return self.codec.decode_sync(raw)[0]


_decoders: dict[tuple[Any, ...], ValueDecoder] = {}


def decoder_for(settings: Any) -> ValueDecoder:
    """One decoder per Python worker and configuration (writer schemas cached in it)."""
    key = (
        settings.schema_registry_url,
        getattr(settings, "spark_schema_registry_url", None),
        settings.topic_mcl_versioned,
        settings.topic_mcl_timeseries,
    )
    decoder = _decoders.get(key)
    if decoder is None:
        decoder = _decoders[key] = ValueDecoder(settings)
    return decoder
