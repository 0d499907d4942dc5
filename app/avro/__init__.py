"""DataHub's Kafka wire: the record schemas (`schemas`), JSON form ↔ Avro (`records`), Confluent framing and the
codec every producer and consumer shares (`wire`). Below `app.kafka` and `app.schema_registry`: imports neither."""

from app.avro.records import AvroEncodeError, from_avro, to_avro
from app.avro.schemas import CURRENT_SCHEMA_ID, DATAHUB_SCHEMA_IDS, parsed, schema_text
from app.avro.wire import ValueCodec, WireFormatError, WriterSchemas, frame, unframe

__all__ = [
    "CURRENT_SCHEMA_ID",
    "DATAHUB_SCHEMA_IDS",
    "AvroEncodeError",
    "ValueCodec",
    "WireFormatError",
    "WriterSchemas",
    "frame",
    "from_avro",
    "parsed",
    "schema_text",
    "to_avro",
    "unframe",
]
