"""Whether a keyed write committed, recorded by the write itself: the write path marks its writes' claims
`committed` inside their transaction (`mark_committed`, app.write.service), so the mark exists exactly when the write
does. A retry whose first attempt lost its reply (a COMMIT whose outcome the service could not learn, a process that
died after COMMIT) then learns that it was applied instead of applying it again.

The claim reaches the transaction by the write's audit stamp: `bind` (app.ingest.gateway, in the request's task,
where app.idempotency.route set `CLAIM`) notes the stamp's claim, and the transaction, perhaps shared by several
requests' writes (app.write.combiner), finds its writes' claims by their stamps."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from app.db import session_connection

Stamp = TypeVar("Stamp")
ClaimRef = tuple[str, str, uuid.UUID]  # actor, key, holder

CLAIM: ContextVar[ClaimRef | None] = ContextVar("idempotency_claim", default=None)
_BY_STAMP: dict[int, ClaimRef] = {}  # id(audit stamp) → its request's claim, while the request runs (`unbind`)

_MARK = """
    UPDATE idempotency_key AS k SET committed = true
      FROM unnest($1::text[], $2::text[], $3::uuid[]) AS c(actor, key, holder)
     WHERE k.actor = c.actor AND k.key = c.key AND k.holder = c.holder
"""


def bind(audit: Stamp) -> Stamp:
    """`audit` is the stamp of the current request's write: its transaction marks the request's claim, if any."""
    claim = CLAIM.get()
    if claim is not None:
        _BY_STAMP[id(audit)] = claim
    return audit


def unbind(claim: ClaimRef) -> None:
    """The request of `claim` is over: forget its stamps (their ids may be reused)."""
    for stamp_id in [s for s, c in _BY_STAMP.items() if c == claim]:
        del _BY_STAMP[stamp_id]


async def mark_committed(session: AsyncSession, writes: Sequence[tuple[Any, Any]]) -> None:
    """In the write transaction on `session`: mark the claims of `writes` (proposals, audit stamp) committed."""
    if not _BY_STAMP:  # no keyed write in this process: no statement
        return
    claims = [_BY_STAMP[id(audit)] for _, audit in writes if id(audit) in _BY_STAMP]
    if claims:
        conn = await session_connection(session)
        await conn.execute(_MARK, [c[0] for c in claims], [c[1] for c in claims], [c[2] for c in claims])
