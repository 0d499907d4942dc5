"""Whether a keyed write committed, recorded by the write itself: the write path marks its writes' claims
`committed` inside their transaction (`mark_committed`, app.write.service), so the mark exists exactly when the write
does. A retry whose first attempt lost its reply (a COMMIT whose outcome the service could not learn, a process that
died after COMMIT) then learns that it was applied instead of applying it again.

The claim reaches the transaction on the write's audit stamp (`AuditStamp.claim`): `bind` (app.ingest.gateway, in the
request's task, where app.idempotency.route set `CLAIM`) puts it there, and the transaction, perhaps shared by several
requests' writes (app.write.combiner), reads its writes' claims from their stamps."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from app.db import session_connection

ClaimRef = tuple[str, str, uuid.UUID]  # actor, key, holder (app.write.proposal.AuditStamp.claim's type)


class Stamp(Protocol):
    """What this module needs of app.write.proposal.AuditStamp (which it does not import: app.write calls it)."""

    @property
    def claim(self) -> ClaimRef | None: ...


S = TypeVar("S", bound=Stamp)

CLAIM: ContextVar[ClaimRef | None] = ContextVar("idempotency_claim", default=None)

_MARK = """
    UPDATE idempotency_key AS k SET committed = true
      FROM unnest($1::text[], $2::text[], $3::uuid[]) AS c(actor, key, holder)
     WHERE k.actor = c.actor AND k.key = c.key AND k.holder = c.holder
"""


def bind(audit: S) -> S:
    """`audit`, the stamp of the current request's write, with the request's claim (if any) for its transaction to
    mark."""
    claim = CLAIM.get()
    return audit if claim is None else dataclasses.replace(audit, claim=claim)  # type: ignore[type-var]


async def mark_committed(session: AsyncSession, writes: Sequence[tuple[Any, Stamp]]) -> None:
    """In the write transaction on `session`: mark the claims of `writes` (proposals, audit stamp) committed."""
    claims = {audit.claim for _, audit in writes if audit.claim is not None}
    if not claims:  # no keyed write among them: no statement
        return
    conn = await session_connection(session)
    await conn.execute(_MARK, [c[0] for c in claims], [c[1] for c in claims], [c[2] for c in claims])
