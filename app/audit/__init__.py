"""The audit log: who changed what, through which token and surface, in Postgres in the transaction of what it
records, chained by hashes so that an edit or a delete in SQL is found (`GET /openapi/v1/audit/verify`).

`model` the entries, their attribution and hash; `repository` all of its SQL; `service` the reads, sealing and
retention. The write path inserts its entries in its own write statement (app.write.repository.write_changes)."""
