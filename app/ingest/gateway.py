"""The ingest gateway: the one path every write takes, whatever protocol brought it.

    drafts → authorize (the caller's role and policies) → prepare (registry, schema, URN, proposal rules) → queue (async, with Kafka) | apply (one transaction)
           → sync index (when a proposal or the request asks for it) → Submission

The protocols (app.api.*, the Kafka consumers) only turn what they received into drafts and the outcome into
their answer. Every error leaves here in the caller's terms: each draft's `Location` re-expresses the write
pipeline's MCP paths and indices as paths into the JSON the caller sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import asyncpg
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.model import Principal
from app.db import WRITE_DEADLINE
from app.errors import MetaledgerError, ServiceUnavailable
from app.idempotency.commit import bind
from app.ingest.mcp import parse_proposals_in_turns, proposal_to_mcp
from app.ingest.trace import stamp_trace
from app.ops.backpressure import CLIENT_ADDRESS, REQUEST_GRANT, WriteAdmission
from app.ops.metrics import count_writes, write_refused
from app.replicas import note_commit
from app.search.service import IndexOutcome, SearchRuntime, sync_index, wants_sync_index
from app.turns import TimeSlice
from app.write.combiner import WriteCombiner
from app.write.proposal import AuditStamp, Draft, Proposal
from app.write.service import CommitResult, WriteService

# Drafts validated between two looks at the time slice when a write prepares many (~1 ms of CPU): the writes beside
# a large batch are served while it is validated, not after.
PREPARE_CHUNK = 10


class ProposalQueue(Protocol):
    """Where asynchronous proposals go (app.kafka.producer.ProposalProducer: the MCP topic)."""

    async def send(self, proposals: list[dict[str, Any]]) -> None: ...


@dataclass(slots=True)
class Submission:
    """What became of a submission: queued (async, nothing committed yet) or applied, and the sync index outcome."""

    drafts: list[Draft]
    proposals: list[Proposal]
    result: CommitResult | None = None  # None when queued
    index: IndexOutcome | None = None  # None unless a sync index update was asked for
    queued: list[tuple[Draft, Proposal]] = field(default_factory=list)

    @property
    def response_headers(self) -> dict[str, str] | None:
        return self.index.headers() if self.index is not None else None


def in_callers_terms(error: MetaledgerError, drafts: Sequence[Draft]) -> MetaledgerError:
    """The pipeline's issues (MCP paths, draft indices) placed where each draft sits in the caller's request."""
    where = {draft.index: draft.location for draft in drafts if draft.location is not None}
    if not where:
        return error
    return error.with_issues([where[i.index].place(i) if i.index in where else i for i in error.issues])


class WriteAuthorizer(Protocol):
    """Whether a caller may make these writes (app.auth.service.AuthService): Forbidden naming the refused ones."""

    async def authorize_writes(self, principal: Principal, drafts: Sequence[Draft]) -> None: ...

    async def require(self, principal: Principal, privilege: str, resource: str | None = None) -> None: ...

    async def require_write_access(self, principal: Principal) -> None: ...

    def written(self, drafts: Sequence[Draft]) -> None:
        """After the drafts' commit: forget what they changed of what the decisions trust (policies, groups)."""


def caller_key(principal: Principal) -> str:
    """Whose share a write is charged to: the token's actor, or without authentication the client's address."""
    if principal.via == "disabled":
        return f"address:{CLIENT_ADDRESS.get() or 'unknown'}"
    return principal.actor


class IngestGateway:
    def __init__(
        self,
        writer: WriteService,
        search: SearchRuntime | None = None,
        queue: ProposalQueue | None = None,
        authorizer: WriteAuthorizer | None = None,
        admission: WriteAdmission | None = None,
        combiner: WriteCombiner | None = None,
    ) -> None:
        self.writer = writer
        self.combiner = combiner  # HTTP writes share transactions with their concurrent ones (app.write.combiner)
        self.search = search
        self.queue = queue
        self.authorizer = authorizer
        self.admission = admission  # backpressure on `submit` (app.ops.backpressure); None: no limit

    @property
    def registry(self):
        return self.writer.registry

    @property
    def settings(self):
        return self.writer.settings

    def prepare(self, drafts: Sequence[Draft]) -> list[Proposal]:
        try:
            return self.writer.prepare(drafts)
        except MetaledgerError as error:
            write_refused(error, drafts)
            raise in_callers_terms(error, drafts) from None

    async def parse_in_turns(self, body: Any, base: str = "$") -> list[Draft]:
        """A JSON array of MCPs (at `base` in the request's body) → drafts (app.ingest.mcp.parse_proposals), in the
        event loop's turns."""
        return await parse_proposals_in_turns(body, base, self._contended)

    @property
    def _contended(self) -> Callable[[], bool] | None:
        return self.admission.contended if self.admission is not None else None

    async def prepare_in_turns(self, drafts: Sequence[Draft]) -> list[Proposal]:
        """`prepare`, `PREPARE_CHUNK` drafts at a time with a turn of the event loop whenever its time slice is over
        (app.turns). A chunk with a bad draft prepares the whole batch again at once, for `prepare`'s one error
        naming every bad draft."""
        if len(drafts) <= PREPARE_CHUNK:
            return self.prepare(drafts)
        proposals: list[Proposal] = []
        cpu = TimeSlice()
        for start in range(0, len(drafts), PREPARE_CHUNK):
            await cpu.pause_if_over(self._contended)
            try:
                proposals.extend(self.writer.prepare(drafts[start : start + PREPARE_CHUNK]))
            except MetaledgerError:
                return self.prepare(drafts)
        return proposals

    async def commit(
        self,
        session: AsyncSession,
        proposals: Sequence[Proposal],
        audit: AuditStamp,
        drafts: Sequence[Draft] = (),
        *,
        combine: bool = False,
        deadline: float | None = None,
    ) -> CommitResult:
        """The transaction: the session's own, or with `combine` (and a combiner that takes a write this size) the next
        shared one. With a `deadline` (the event loop's time) the transaction is over by then: committed, or 503 and
        nothing committed."""
        try:
            if combine and self.combiner is not None and self.combiner.takes(proposals):
                result = await self.combiner.commit(proposals, audit, deadline)
            else:
                if deadline is not None:
                    session.info[WRITE_DEADLINE] = deadline
                result = await self.writer.commit(session, proposals, audit, self._contended)
        except MetaledgerError as error:
            write_refused(error, drafts or proposals)
            raise in_callers_terms(error, drafts) from None
        except asyncpg.exceptions.QueryCanceledError as error:  # the deadline's statement_timeout (app.db)
            raise ServiceUnavailable(
                f"the write of {len(proposals)} proposals did not finish within its deadline of "
                f"{self.settings.write_deadline_ms} ms; nothing was committed, retry",
                retry_after_s=self.settings.backpressure_retry_after_s,
            ) from error
        count_writes(proposals, result.items)
        note_commit()  # the answer carries the primary's position after it (app.replicas: read-your-writes)
        return result

    async def authorize(self, caller: Principal, drafts: Sequence[Draft]) -> None:
        if self.authorizer is not None:
            try:
                await self.authorizer.authorize_writes(caller, drafts)
            except MetaledgerError as error:
                raise in_callers_terms(error, drafts) from None

    async def submit(
        self,
        session: AsyncSession,
        drafts: list[Draft],
        caller: Principal,
        *,
        queue: bool = False,
        request_headers: Mapping[str, str] | None = None,
    ) -> Submission:
        """Prepare, then queue (`queue=True` and a proposal queue configured) or apply and sync-index.
        Without a queue an asynchronous write is applied now (documented: 200 means committed)."""
        stamp_trace(drafts)  # the request's trace id kept with each write (app.ingest.trace)
        await self.authorize(caller, drafts)
        if self.admission is not None:
            self.admission.check_backlog()  # 429 while the outbox backlog is over its limit
        proposals = await self.prepare_in_turns(drafts)
        if queue and self.queue is not None:
            try:
                await self.writer.check_before_queueing(session, proposals)
            except MetaledgerError as error:
                write_refused(error, drafts)
                raise in_callers_terms(error, drafts) from None
            by_index = {draft.index: draft for draft in drafts}
            pairs = [(by_index[p.index], p) for p in proposals]
            await self.queue.send([proposal_to_mcp(draft, proposal) for draft, proposal in pairs])
            return Submission(drafts, proposals, queued=pairs)
        async with self._admit(caller, proposals, request_headers):  # 429 when the caller is over its share
            result = await self.commit(
                session, proposals, bind(caller.audit_stamp()), drafts, combine=True, deadline=self._deadline()
            )
        if self.authorizer is not None:
            self.authorizer.written(drafts)
        index = None
        if wants_sync_index(request_headers, proposals):
            index = await sync_index(self.search, result.outbox)
        return Submission(drafts, proposals, result, index)

    def _admit(
        self,
        caller: Principal,
        proposals: Sequence[Proposal],
        request_headers: Mapping[str, str] | None,
    ) -> AbstractAsyncContextManager[object]:
        if self.admission is None:
            return nullcontext()
        body_bytes = int((request_headers or {}).get("content-length") or 0)  # the HTTP server checked it is a number
        cost = self.admission.cost(len(proposals), body_bytes)
        held = REQUEST_GRANT.get()
        if held is not None:  # admitted before its body was read (app.api.deps): now charged what it carries
            self.admission.resize(held, cost)
            return nullcontext()
        return self.admission.admit(caller_key(caller), cost)

    def _deadline(self) -> float | None:
        if not self.settings.write_deadline_ms:
            return None
        return asyncio.get_running_loop().time() + self.settings.write_deadline_ms / 1000


ORIGIN_KEY = "metaledger.origin"  # systemMetadata.properties: which surface made a write (an MCP tool, the web view)


class AttributedGateway:
    """The ingest gateway as one surface uses it: every draft it submits records `origin` under ORIGIN_KEY, so the
    change log says what made the write. Everything else is the gateway's own (authorization, admission, the write
    path)."""

    def __init__(self, gateway: IngestGateway, origin: str) -> None:
        self._gateway = gateway
        self._origin = origin

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gateway, name)

    async def submit(self, session: AsyncSession, drafts: list[Draft], caller: Principal, **options: Any) -> Submission:
        for draft in drafts:
            system_metadata = draft.system_metadata if isinstance(draft.system_metadata, dict) else {}
            properties = system_metadata.get("properties")
            properties = properties if isinstance(properties, dict) else {}
            draft.system_metadata = {**system_metadata, "properties": {**properties, ORIGIN_KEY: self._origin}}
        return await self._gateway.submit(session, drafts, caller, **options)
