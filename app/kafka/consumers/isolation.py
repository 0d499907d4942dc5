"""A batch's units applied in one transaction, isolating the failing records.

All the good units of a batch go in ONE transaction, with DataHub's system actor. If it fails with a client error (a
precondition, an existence conflict, a patch that does not apply, a too-large aspect...), the first failing record
gets the error, the records before it are committed together and the rest is tried again (after
`MAX_ISOLATION_ROUNDS` rounds, one by one): only the failing records get an error, everything else commits, in
record order. A transient error (the database is down, restarting or overloaded: `is_transient`) is never a
record's: it propagates, and the batch is retried as a whole.

The batch is applied without its drafts: the issues keep the proposals' indices, which tell the failing record.
Only the failing record's error is then placed in its terms (`in_callers_terms` with its own drafts).
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db_faults import DatabaseFault, classify
from app.errors import MetaledgerError, ServiceUnavailable
from app.ingest.gateway import IngestGateway, in_callers_terms
from app.kafka.consumers.records import Unit, for_record
from app.write.proposal import SYSTEM_ACTOR, AuditStamp

log = logging.getLogger("metaledger.kafka.consumers")

# After this many "commit the prefix, drop the first failure, retry the rest" rounds in one batch, the rest of the
# batch is applied one record at a time (bounds the work when most of a batch fails).
MAX_ISOLATION_ROUNDS = 8


def is_transient(error: BaseException) -> bool:
    """Whether the batch is retried (never dead-lettered): the database is down, restarting, failing over or
    overloaded (app.db_faults decides, as for every HTTP answer), or a 503 was raised on the way. Never the record's
    fault."""
    return isinstance(error, (ServiceUnavailable, OSError)) or classify(error) is DatabaseFault.UNAVAILABLE


class IsolatingWriter:
    """Applies units through the ingest gateway, one transaction per attempt, isolating the failing ones."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession], gateway: IngestGateway) -> None:
        self.sessionmaker, self.gateway = sessionmaker, gateway

    async def commit(self, units: list[Unit]) -> None:
        """Apply the units' proposals in one transaction; on a client error isolate the failing units (in record
        order) so that only they get an error (`unit.error`) and everything else commits (`unit.applied`).
        Transient errors propagate."""
        remaining = units
        rounds = 0
        while remaining:
            try:
                await self._transaction(remaining)
                for unit in remaining:
                    unit.applied = True
                return
            except MetaledgerError as error:
                if is_transient(error):
                    raise
                batch_error: Exception = error
                owner = {p.index: u for u in remaining for p in u.proposals}
                failing_indices = sorted(i.index for i in error.issues if i.index in owner)
            except Exception as error:
                if is_transient(error):
                    raise
                batch_error, failing_indices = error, []
            if len(remaining) == 1:
                fail(remaining[0], batch_error)
                return
            rounds += 1
            if not failing_indices or rounds > MAX_ISOLATION_ROUNDS:
                for unit in remaining:
                    await self.commit([unit])
                return
            # The first failure is genuine (everything before it applied cleanly in the same transaction); what
            # follows it may have been judged against a state without it, so it is tried again.
            culprit = owner[failing_indices[0]]
            position = remaining.index(culprit)
            if position:
                await self.commit(remaining[:position])
            if len({id(owner[i]) for i in failing_indices}) > 1:
                # A batch error has one class for all its issues (e.g. 412 when a precondition and a conflict
                # failed together): the culprit alone gives its own, exact error.
                await self.commit([culprit])
            else:
                fail(culprit, batch_error)
            remaining = remaining[position + 1 :]

    async def _transaction(self, units: list[Unit]) -> None:
        # No drafts given: the issues keep the proposals' indices, which tell the failing record (see `fail`).
        async with self.sessionmaker() as session:
            await self.gateway.commit(session, [p for u in units for p in u.proposals], AuditStamp.now(SYSTEM_ACTOR))


def fail(unit: Unit, error: Exception) -> None:
    """The unit's error from a batch error: its own issues, placed in its record's terms, as a record's error."""
    if not isinstance(error, MetaledgerError):
        log.error(
            "unexpected error applying a record",
            exc_info=error,
            extra={"topic": unit.topic, "offset": unit.offset, "urn": unit.urn, "aspect": unit.aspect},
        )
        unit.error = error
        return
    mine = {p.index for p in unit.proposals}
    if any(i.index in mine for i in error.issues):
        error = in_callers_terms(error.with_issues([i for i in error.issues if i.index in mine]), unit.drafts)
    unit.error = for_record(error)
