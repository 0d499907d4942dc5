"""Write combining: the concurrent writes of one process share transactions.

A single-aspect write costs a transaction: BEGIN, the lock statement, the write statement, COMMIT and its WAL flush
(fsync on), most of it fixed cost. Under load many such writes are waiting at the same moment; instead of each
taking a connection and a commit of its own, they queue here and up to `flushers` transactions at a time each take
every write waiting (up to `max_group_proposals` proposals) and apply them together with
`WriteService.commit_group`: in arrival order, each seeing the rows as the writes before it left them, as if committed
one after the other. Nothing waits for a group to fill: a write that arrives while a flusher is free starts a
transaction at once, so an idle service answers as fast as without combining, and a busy one commits in groups.

A group is all or nothing, but a write's refusal must stay its own: when a group fails (a precondition, a conflict,
a rule, text Postgres cannot store), its writes are applied again one by one, each answered with its own result or
error (the bulk-then-one-by-one fallback of Data.Rentgen's consumers).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db import WRITE_DEADLINE
from app.write.proposal import AuditStamp, Proposal
from app.write.service import CommitOutcomeUnknown, CommitResult, WriteService


@dataclass(slots=True)
class _Waiting:
    proposals: Sequence[Proposal]
    audit: AuditStamp
    done: asyncio.Future
    deadline: float | None  # the event loop's time by which its transaction must be over (app.db.WRITE_DEADLINE)


# A write of more proposals than this has its own transaction, beside the combiner: its fixed cost is already spread
# over its proposals, and in a shared transaction it would hold a flusher, and the small writes grouped with it or
# queued behind it, for as long as it runs (single writes beside a flood of 1,000-proposal batches waited for them).
SHARED_MAX_PROPOSALS = 100


class WriteCombiner:
    def __init__(
        self,
        writer: WriteService,
        sessionmaker: async_sessionmaker[AsyncSession],
        *,
        flushers: int = 2,
        max_group_proposals: int = 1000,
        contended: Callable[[], bool] | None = None,
    ) -> None:
        self.writer = writer
        self.contended = contended  # other callers' writes in flight: a large group's decision gives them time
        self.sessionmaker = sessionmaker
        self.flushers = max(1, flushers)
        self.max_group_proposals = max_group_proposals
        self._waiting: deque[_Waiting] = deque()
        self._running = 0
        self._tasks: set[asyncio.Task] = set()
        # figures (tests, bench/): transactions, writes they carried, groups refused and applied one by one
        self.groups = 0
        self.writes = 0
        self.fallbacks = 0

    @staticmethod
    def takes(proposals: Sequence[Proposal]) -> bool:
        return len(proposals) <= SHARED_MAX_PROPOSALS

    async def commit(
        self, proposals: Sequence[Proposal], audit: AuditStamp, deadline: float | None = None
    ) -> CommitResult:
        """Apply one write (a batch of proposals) in the next transaction that has room; its result or its error."""
        done = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(proposals, audit, done, deadline))
        if self._running < self.flushers:
            self._running += 1
            # A task of its own: a caller that goes away (a client disconnect cancels its request) does not cancel
            # the transaction that carries other callers' writes. An empty context: its log lines carry no request
            # id (they are several requests'); each caller logs its own outcome under its own.
            task = asyncio.create_task(self._flush(), name="write-combiner", context=contextvars.Context())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await done

    async def _flush(self) -> None:
        try:
            while self._waiting:
                await self._commit_group(self._take())
        finally:
            self._running -= 1

    def _take(self) -> list[_Waiting]:
        """The waiting writes, oldest first, up to `max_group_proposals` proposals (at least one write)."""
        group = [self._waiting.popleft()]
        size = len(group[0].proposals)
        while self._waiting and size + len(self._waiting[0].proposals) <= self.max_group_proposals:
            size += len(self._waiting[0].proposals)
            group.append(self._waiting.popleft())
        return group

    async def _commit_group(self, group: list[_Waiting]) -> None:
        self.groups += 1
        self.writes += len(group)
        try:
            async with self.sessionmaker() as session:
                deadlines = [w.deadline for w in group if w.deadline is not None]
                if len(deadlines) == len(group):  # the group's transaction runs until its latest write's deadline
                    session.info[WRITE_DEADLINE] = max(deadlines)
                results = await self.writer.commit_group(
                    session, [(w.proposals, w.audit) for w in group], self.contended
                )
        except Exception as error:  # noqa: BLE001 - answered write by write below
            if len(group) == 1 or isinstance(error, CommitOutcomeUnknown):
                # An unknown outcome is every write's: applied again one by one, a write that landed would be
                # answered as if it had not (a CREATE as a conflict).
                for waiting in group:
                    _settle(waiting.done, error=error)
                return
            # One write's refusal (a precondition, a rule, text Postgres cannot store) must stay its own: apply the
            # writes again one by one (when the database itself is down, each learns it on its own, quickly).
            self.fallbacks += 1
            await self._one_by_one(group)
            return
        except BaseException as error:  # cancelled at shutdown: every write of the group learns it
            for waiting in group:
                _settle(waiting.done, error=error)
            raise
        for waiting, result in zip(group, results):
            _settle(waiting.done, result=result)

    async def _one_by_one(self, group: list[_Waiting]) -> None:
        for waiting in group:
            try:
                async with self.sessionmaker() as session:
                    if waiting.deadline is not None:
                        session.info[WRITE_DEADLINE] = waiting.deadline
                    result = await self.writer.commit(session, waiting.proposals, waiting.audit)
            except Exception as error:  # noqa: BLE001 - the caller's error, raised in the caller's task
                _settle(waiting.done, error=error)
            else:
                _settle(waiting.done, result=result)


def _settle(done: asyncio.Future, *, result: CommitResult | None = None, error: BaseException | None = None) -> None:
    if done.done():  # the caller went away (cancelled); its write was applied or refused all the same
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
