"""Asynchronous ingestion consumers: proposals (MCP) and legacy events (MCE) from Kafka → the ingest gateway.

One loop (`loop.Consumer`), for both; `McpConsumer` and `MceConsumer` only give it their record format
(`records.MCP` / `records.MCE`: topics, default group, how a record becomes drafts):

1. `getmany` up to `mcp_consumer_batch_size` records (consumer group, earliest offsets, manual commits);
2. each record is read on its own (`records.read_batch`: Avro or JSON through the process's `ValueCodec`, drafts
   located in the record, then `IngestGateway.prepare`: registry, schema, URN, proposal rules); a record that is
   neither JSON nor decodable Avro, not an MCP/MCE, or invalid becomes a dead letter;
3. the good records are applied in ONE transaction, with DataHub's system actor (`isolation.IsolatingWriter`). If
   that fails with a client error (a precondition, an existence conflict, a patch that does not apply, a too-large
   aspect...), the first failing record is dead-lettered, the records before it are committed together and the rest
   is tried again (after a few rounds, one by one): only the failing records are dead-lettered, everything else
   commits, in record order;
4. dead letters are produced to the failure topic (`FailedMetadataChangeProposal_v1` / `FailedMetadataChangeEvent_v4`),
   keyed by URN, and logged with urn, aspect and run id (`dead_letters.DeadLetterWriter`); then the offsets are
   committed.

A database outage (503, connection errors) is never dead-lettered: the batch is retried with backoff (partitions
paused, the group membership kept alive) and nothing is committed until it went through. Delivery is at least
once: a crash between the write and the offset commit re-applies the batch (UPSERTs are then no-ops).

Dead-letter records: DataHub's FailedMetadataChangeProposal / FailedMetadataChangeEvent in Avro (the default;
`source` inside each TraceException, a record that is not an MCP carried in a placeholder MCP), or with
`kafka_value_format=json`:

    {"metadataChangeProposal": <the MCP as received: an object, or the raw text when it was not JSON>,
     "error": "<JSON array of TraceException: [{message, exceptionClass, stackTrace, cause, status, body}]>",
     "source": {"topic", "partition", "offset", "timestamp"}}

`body` is metaledger's error body (`{"error", "message", "issues": [...]}`), `status` its HTTP status. MCE dead
letters carry `metadataChangeEvent` instead of `metadataChangeProposal` (details: `dead_letters`).
"""

from app.kafka.consumers.dead_letters import DeadLetterWriter, trace_exception
from app.kafka.consumers.isolation import MAX_ISOLATION_ROUNDS, IsolatingWriter, is_transient
from app.kafka.consumers.loop import Consumer, MceConsumer, McpConsumer
from app.kafka.consumers.records import MCE, MCP, MceFormat, McpFormat, RecordFormat, Unit, read_batch

__all__ = [
    "MAX_ISOLATION_ROUNDS",
    "MCE",
    "MCP",
    "Consumer",
    "DeadLetterWriter",
    "IsolatingWriter",
    "MceConsumer",
    "MceFormat",
    "McpConsumer",
    "McpFormat",
    "RecordFormat",
    "Unit",
    "is_transient",
    "read_batch",
    "trace_exception",
]
