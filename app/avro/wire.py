"""Values on metaledger's topics: Confluent-framed Avro (DataHub's wire) or JSON, written and read through one codec.

A framed value is `0x00`, the writer schema's id (4 bytes, big-endian), then the record's Avro binary encoding
(`confluent_kafka/schema_registry/common/serde.py`, DataHub's producers and consumers). Keys are not encoded here
(they stay plain UTF-8 strings).

`ValueCodec` is built once per process and shared by the relay, the producers and the consumers:

* `encode(role, value)` - what metaledger publishes on a topic of that role (`"mcl_versioned"`, `"mcp"`, `"fmcp"`...:
  `schemas.ROLE_RECORD`): with `kafka_value_format="avro"` (the default) the JSON form converted and framed with the
  role's schema id - DataHub's fixed id, or, with an external registry (`schema_registry_url`), the id that registry
  gave the schema under `<topic>-value` (`await start()` registers them); with `"json"` the JSON text unchanged.
* `await decode(raw)` - any value a consumer reads, in either format: a JSON object (first byte `{`) or a framed
  Avro value whose writer schema is found by id: DataHub's fixed ids from the local schemas (unless an external
  registry is configured: then every id is the registry's), any other id from the registry (fetched once per id,
  cached). The result is the JSON form. A value that is neither (empty, a wrong magic byte, a truncated frame, an id
  no registry knows, bytes that do not decode with the writer schema) raises `WireFormatError` with that reason; a
  registry that cannot be reached raises SchemaFetchFailed (not the record's fault: the caller retries).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from app.avro import records, schemas

if TYPE_CHECKING:
    from app.settings import Settings

log = logging.getLogger("metaledger.avro")

MAGIC = 0
HEADER_BYTES = 5
MAX_SCHEMA_ID = (1 << 32) - 1
UNKNOWN_ID_RETRY_S = 10.0  # an id the registry did not know is asked for again after this long


class WireFormatError(ValueError):
    """A value that is neither a JSON object nor a decodable Confluent-framed Avro record; the message says why."""


class WriterSchemas(Protocol):
    """Where writer schemas are found by id (the schema registry client satisfies it). Raises a LookupError for an id
    it does not know."""

    async def schema_by_id(self, schema_id: int) -> str: ...


def frame(schema_id: int, payload: bytes) -> bytes:
    """`0x00` + the schema id (4 bytes, big-endian) + the Avro payload."""
    if not 0 <= schema_id <= MAX_SCHEMA_ID:
        raise ValueError(f"schema id {schema_id} does not fit the 4-byte frame")
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def unframe(raw: bytes) -> tuple[int, bytes]:
    """(schema id, Avro payload) of a framed value; WireFormatError when it is not one."""
    if not raw:
        raise WireFormatError("empty value (no bytes)")
    if raw[0] != MAGIC:
        raise WireFormatError(f"wrong magic byte 0x{raw[0]:02x}: a Confluent-framed Avro value starts with 0x00")
    if len(raw) < HEADER_BYTES:
        raise WireFormatError(f"truncated frame: {len(raw)} bytes, the 0x00 + 4-byte schema id header alone is 5")
    return int.from_bytes(raw[1:HEADER_BYTES], "big"), bytes(raw[HEADER_BYTES:])


class SchemaFetchFailed(ConnectionError):
    """The registry could not be asked for a writer schema (unreachable, an error of its own): not the value's fault."""


class UnknownSchemaId(WireFormatError):
    """An id that is not one of DataHub's and that no registry (configured or reachable) knows."""

    def __init__(self, schema_id: int, message: str) -> None:
        self.schema_id = schema_id
        super().__init__(message)


def topic_roles(settings: Settings) -> dict[str, str]:
    """Topic name → role, for every topic metaledger writes or reads (the first role wins for a shared name)."""
    roles: dict[str, str] = {}
    for setting, role in (
        ("topic_mcl_versioned", "mcl_versioned"),
        ("topic_mcl_timeseries", "mcl_timeseries"),
        ("topic_platform_event", "platform_event"),
        ("topic_mcp", "mcp"),
        ("topic_fmcp", "fmcp"),
        ("topic_mce", "mce"),
        ("topic_fmce", "fmce"),
        ("topic_mae", "mae"),
    ):
        roles.setdefault(getattr(settings, setting), role)
    return roles


def _json_text(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return orjson.dumps(value)


class ValueCodec:
    """Encodes what metaledger produces and decodes what it consumes (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        registry: WriterSchemas | None = None,
        *,
        fetch_schema: Callable[[int], str] | None = None,
    ) -> None:
        """`registry`: where `decode` finds writer schemas by id (and `start` registers, for an external one);
        `fetch_schema`: the same for `decode_sync` (a blocking lookup by id raising LookupError for an unknown id),
        for callers without an event loop (the Spark indexer's tasks)."""
        self.settings = settings
        self.fetch_schema = fetch_schema
        self.format = settings.kafka_value_format
        self.avro = self.format == "avro"
        self.registry = registry
        # With an external registry every id is that registry's; otherwise DataHub's fixed ids are decoded locally.
        self.external = bool(settings.schema_registry_url)
        self.roles = topic_roles(settings)
        self._topics = {role: topic for topic, role in reversed(list(self.roles.items()))}
        self._ids: dict[str, int] = dict(schemas.CURRENT_SCHEMA_ID)
        self._headers: dict[str, bytes] = {}
        self._encoders: dict[str, Any] = {}
        self._by_id: dict[int, records.Codecs] = {}
        self._unknown: dict[int, tuple[float, str]] = {}  # id → (when asked, why unknown)
        self._fetch_locks: dict[int, asyncio.Lock] = {}
        self.registered = not (self.avro and self.external)
        self.registry_fetches = 0  # writer schemas fetched from the registry (a figure: 0 per message when warm)

    # --- producing ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """With an external registry: register metaledger's schemas under `<topic>-value` and frame with the ids it
        gives (once; raises while the registry is unreachable, so the caller retries). Otherwise nothing to do."""
        if self.registered:
            return
        register = getattr(self.registry, "register", None)
        if register is None:
            raise RuntimeError("an external schema registry is configured but the codec has no client to register with")
        for role, topic in self._topics.items():
            record = schemas.ROLE_RECORD[role]
            self._ids[role] = await register(f"{topic}-value", schemas.schema_text(record))
        self._headers.clear()
        self.registered = True
        log.info("schemas registered", extra={"registry": self.settings.schema_registry_url, "ids": dict(self._ids)})

    def schema_id(self, role: str) -> int:
        return self._ids[role]

    def role_of(self, topic: str) -> str | None:
        """The role of one of metaledger's topics (None for a topic it does not know)."""
        return self.roles.get(topic)

    def encode(self, role: str, value: Any) -> bytes:
        """The value to publish on a topic of this role: `value` is the JSON form (an object, or its JSON text as
        str/bytes). JSON format: the JSON text. Avro: framed; AvroEncodeError (a ValueError) when it does not fit the
        role's record, ValueError when the text is not JSON."""
        if not self.avro:
            return _json_text(value)
        header = self._headers.get(role)
        if header is None:
            if not self.registered:
                raise RuntimeError("the codec's schemas are not registered yet (await codec.start())")
            self._encoders[role] = records.encoder_into(schemas.ROLE_RECORD[role])
            header = self._headers[role] = frame(self._ids[role], b"")
        if isinstance(value, (bytes, str)):
            value = orjson.loads(value)
        buf = bytearray(header)
        self._encoders[role](value, buf)
        return bytes(buf)

    # --- consuming ---------------------------------------------------------------------------------------------
    def decode_known(self, raw: bytes | None) -> tuple[dict[str, Any], int | None]:
        """`decode` without a registry round trip: UnknownSchemaId for an id not known locally yet."""
        if raw is None or not raw:
            raise WireFormatError("empty value (no bytes)")
        first = raw[0]
        if first in b'{[" \t\r\n':
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError as error:
                raise WireFormatError(f"not valid JSON: {error}") from None
            if not isinstance(value, dict):
                raise WireFormatError(f"a JSON {type(value).__name__}, not an object")
            return value, None
        if first != MAGIC:
            try:
                orjson.loads(raw)
                why = "JSON, but not an object"
            except orjson.JSONDecodeError as error:
                why = f"not valid JSON: {error}"
            raise WireFormatError(
                f"neither a JSON object ({why}) nor Confluent-framed Avro (wrong magic byte 0x{first:02x}: Avro values "
                "start with 0x00)"
            )
        schema_id, payload = unframe(raw)
        codecs = self._by_id.get(schema_id)
        if codecs is None:
            codecs = self._local(schema_id)
        try:
            value = codecs.read(payload)
        except ValueError as error:
            name = codecs.record_name or "the writer schema"
            raise WireFormatError(f"undecodable Avro value for schema id {schema_id} ({name}): {error}") from None
        if not isinstance(value, dict):
            raise WireFormatError(f"schema id {schema_id} is not a record schema")
        return value, schema_id

    def _local(self, schema_id: int) -> records.Codecs:
        if not self.external and schema_id in schemas.DATAHUB_SCHEMA_IDS:
            codecs = self._by_id[schema_id] = records.codecs(schemas.DATAHUB_SCHEMA_IDS[schema_id])
            return codecs
        if self.registry is None and self.fetch_schema is None:
            raise UnknownSchemaId(
                schema_id, f"unknown schema id {schema_id}: not one of DataHub's ids and no schema registry to ask"
            )
        unknown = self._unknown.get(schema_id)
        if unknown is not None and time.monotonic() - unknown[0] < UNKNOWN_ID_RETRY_S:
            raise UnknownSchemaId(schema_id, unknown[1])
        raise UnknownSchemaId(schema_id, f"schema id {schema_id} is not cached yet")

    async def decode(self, raw: bytes | None) -> tuple[dict[str, Any], int | None]:
        """The JSON form of a value and its writer schema id (None for JSON). WireFormatError when it is neither a
        JSON object nor decodable framed Avro; SchemaFetchFailed when the registry cannot be asked (retry later)."""
        try:
            return self.decode_known(raw)
        except UnknownSchemaId as error:
            if self.registry is None or error.schema_id in self._by_id:
                raise
            unknown = self._unknown.get(error.schema_id)
            if unknown is not None and time.monotonic() - unknown[0] < UNKNOWN_ID_RETRY_S:
                raise
            await self.fetch(error.schema_id)
        return self.decode_known(raw)

    def decode_sync(self, raw: bytes | None) -> tuple[dict[str, Any], int | None]:
        """`decode` for callers without an event loop: writer schemas not known yet come from `fetch_schema`."""
        try:
            return self.decode_known(raw)
        except UnknownSchemaId as error:
            schema_id = error.schema_id
            unknown = self._unknown.get(schema_id)
            if self.fetch_schema is None or (
                unknown is not None and time.monotonic() - unknown[0] < UNKNOWN_ID_RETRY_S
            ):
                raise
            self.registry_fetches += 1
            try:
                text = self.fetch_schema(schema_id)
            except LookupError as lookup:
                self._unknown[schema_id] = (
                    time.monotonic(),
                    f"unknown schema id {schema_id}: the schema registry does not know it ({lookup})",
                )
            else:
                self.add_schema(schema_id, text)
        return self.decode_known(raw)

    async def fetch(self, schema_id: int) -> None:
        """The writer schema of an id from the registry, cached (an id it does not know is remembered for a while)."""
        lock = self._fetch_locks.setdefault(schema_id, asyncio.Lock())
        async with lock:
            if schema_id in self._by_id:
                return
            assert self.registry is not None
            self.registry_fetches += 1
            try:
                text = await self.registry.schema_by_id(schema_id)
            except LookupError as error:
                self._unknown[schema_id] = (
                    time.monotonic(),
                    f"unknown schema id {schema_id}: the schema registry does not know it ({error})",
                )
                return
            except Exception as error:  # noqa: BLE001 - unreachable, or failing: the caller retries later
                raise SchemaFetchFailed(
                    f"the schema registry could not be asked for schema id {schema_id} "
                    f"({type(error).__name__}: {error})"
                ) from error
            self.add_schema(schema_id, text)

    def add_schema(self, schema_id: int, text: str) -> None:
        """Cache a writer schema (its JSON text) under an id."""
        try:
            codecs = records.Codecs(orjson.loads(text))
            codecs.parsed  # noqa: B018 - parse now: a schema that is not valid Avro is the id's problem
        except Exception as error:  # noqa: BLE001
            self._unknown[schema_id] = (
                time.monotonic(),
                f"schema id {schema_id}: the registry's schema is not valid Avro ({type(error).__name__}: {error})",
            )
            return
        self._unknown.pop(schema_id, None)
        self._by_id[schema_id] = codecs
