"""Write admission (app.ops.backpressure) without a database: cost accounting, fair shares between callers,
Retry-After from the caller's own queue, and admission given back however a write ends."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from app import urns
from app.auth.model import SYSTEM_PRINCIPAL, UNAUTHENTICATED_ADMIN
from app.errors import TooManyRequests
from app.ingest.gateway import caller_key
from app.ops import backpressure
from app.ops.activity import SharedActivity, create_activity_file
from app.ops.backpressure import CLIENT_ADDRESS, ESTIMATED_PROPOSAL_BYTES, REQUEST_GRANT, WriteAdmission
from app.registry import AspectValidationError
from app.registry.schema import MISSING, Array, Field, Primitive, Record
from app.registry.validator import _URN_CHECKERS, compile_validator
from app.urns import URN_CACHE_ENTRIES, parse_urn, validate_urn
from tests.helpers import eventually


async def settle() -> None:
    """Let every task that can run, run (waiters wake up on the next turns of the loop)."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_write_costs_its_proposals_and_its_bytes():
    admission = WriteAdmission(10, 1.0, budget=2000, cost_bytes=65_536)
    assert admission.cost(1000) == 1000
    assert admission.cost(1, body_bytes=3 * 65_536 + 5) == 4
    assert admission.cost(0) == 1  # a write costs something, whatever it carries
    # before its body is parsed, from its size alone
    assert admission.estimate(0) == admission.estimate(ESTIMATED_PROPOSAL_BYTES - 1) == 1
    assert admission.estimate(1000 * ESTIMATED_PROPOSAL_BYTES) == 1000 + 1000 * ESTIMATED_PROPOSAL_BYTES // 65_536


async def test_a_write_admitted_on_its_estimate_is_charged_its_cost_once_parsed():
    admission = WriteAdmission(10, 5.0, budget=100, caller_share=1.0)
    async with admission.admit_before_body("a", 80 * ESTIMATED_PROPOSAL_BYTES) as grant:
        assert REQUEST_GRANT.get() is grant and admission.cost_in_flight == 80
        waiter = asyncio.create_task(admission.acquire("b", 30))
        await settle()
        assert not waiter.done()
        admission.resize(grant, 5)  # it carries less than estimated: the rest goes to the waiting write
        other = await waiter
        assert admission.cost_in_flight == 35
        admission.resize(grant, 90)  # more: charged at once, as it is admitted already
        assert admission.cost_in_flight == 120
        late = asyncio.create_task(admission.acquire("b", 1))  # and the budget is used until it is given back
        await settle()
        assert not late.done()
        admission.release(other)
    assert REQUEST_GRANT.get() is None
    admission.release(await late)
    assert (admission.in_flight, admission.cost_in_flight, admission.waiting) == (0, 0, 0)


async def test_the_budget_counts_cost_not_writes():
    admission = WriteAdmission(100, 5.0, budget=1000)
    first = await admission.acquire("a", 600)
    second = await admission.acquire("b", 400)
    assert admission.cost_in_flight == 1000 and admission.in_flight == 2
    third = asyncio.create_task(admission.acquire("c", 1))  # two writes of 100 allowed, but no cost left
    await settle()
    assert not third.done() and admission.waiting == 1
    admission.release(second)
    grant = await third
    assert admission.cost_in_flight == 601 and grant.cost == 1
    admission.release(first)
    admission.release(grant)
    assert (admission.in_flight, admission.cost_in_flight, admission.waiting) == (0, 0, 0)


async def test_a_write_costlier_than_a_share_is_charged_the_share_and_runs():
    admission = WriteAdmission(10, 0.05, budget=1000, caller_share=0.5)
    other = await admission.acquire("single", 1)  # another caller is active: the shares apply
    grant = await admission.acquire("flood", 10_000)
    assert grant.cost == 500 and admission.cost_in_flight == 501
    with pytest.raises(TooManyRequests):  # its caller's share is used: the next one waits, and gives up
        await admission.acquire("flood", 1)
    admission.release(other)
    admission.release(grant)


async def test_a_caller_alone_may_hold_every_slot_but_never_more_than_its_share_of_the_budget():
    admission = WriteAdmission(40, 0.5, budget=2000, caller_share=0.5)
    grants = [await admission.acquire("ingestion", 1) for _ in range(40)]  # every slot: twice its share, nobody else
    assert admission.in_flight == 40
    late = asyncio.create_task(admission.acquire("ingestion", 1))  # waits its turn (no early refusal alone)
    await settle()
    assert admission.waiting == 1
    admission.release(grants.pop())
    grants.append(await late)
    for grant in grants:
        admission.release(grant)
    big = await admission.acquire("ingestion", 1000)
    with pytest.raises(TooManyRequests):  # the other half of the budget is kept for whoever comes next
        await admission.acquire("ingestion", 1000)
    admission.release(big)
    assert (admission.in_flight, admission.cost_in_flight, admission.waiting) == (0, 0, 0)


async def test_one_caller_holds_at_most_its_share_and_another_is_admitted_at_once():
    admission = WriteAdmission(40, 2.0, budget=2000, caller_share=0.5)
    anchor = await admission.acquire("single", 1)  # another caller is active: the shares apply
    held = [await admission.acquire("flood", 1000)]
    flood = [asyncio.create_task(admission.acquire("flood", 1000)) for _ in range(3)]
    await settle()
    assert admission.waiting == 3 and admission.cost_in_flight == 1001  # the share (1000) is used; the rest waits
    singles = [await admission.acquire("single", 1) for _ in range(19)]  # none of them waits for the flood
    assert admission.cost_in_flight == 1020
    for grant in singles:
        admission.release(grant)
    admission.release(held.pop())
    held.append(await flood[0])  # first come, first served within a caller
    assert not flood[1].done()
    for task in flood[1:]:
        task.cancel()
    await asyncio.gather(*flood[1:], return_exceptions=True)
    admission.release(held.pop())
    admission.release(anchor)
    assert (admission.in_flight, admission.cost_in_flight, admission.waiting) == (0, 0, 0)


async def test_a_flood_does_not_starve_another_caller_waiting_with_it():
    # no share held back (the whole budget to one caller): the other still goes first when the budget frees,
    # as it has less in flight, though the flood's writes waited longer
    admission = WriteAdmission(10, 5.0, budget=100, caller_share=1.0)
    held = await admission.acquire("flood", 100)
    flood = [asyncio.create_task(admission.acquire("flood", 100)) for _ in range(3)]
    await settle()
    single = asyncio.create_task(admission.acquire("single", 1))
    await settle()
    admission.release(held)
    await settle()
    assert single.done() and not any(t.done() for t in flood)
    admission.release(single.result())
    await settle()
    assert flood[0].done() and not flood[1].done()  # then the flood, in its own order
    for task in flood[1:]:
        task.cancel()
    await asyncio.gather(*flood[1:], return_exceptions=True)
    admission.release(flood[0].result())
    assert (admission.in_flight, admission.cost_in_flight, admission.waiting) == (0, 0, 0)


async def test_retry_after_is_when_the_callers_queue_as_it_is_now_drains():
    admission = WriteAdmission(10, 0.05, budget=100, caller_share=1.0, retry_after_s=1)
    paced = await admission.acquire("flood", 10)
    await asyncio.sleep(0.2)  # the flood's pace: at least 20 ms a unit
    admission.release(paced)

    async def retry_after(caller: str, cost: int) -> int:
        with pytest.raises(TooManyRequests) as refused:
            await admission.acquire(caller, cost)
        return int(refused.value.headers()["Retry-After"])

    held = [await admission.acquire("flood", 50)]
    one_ahead = [await retry_after("flood", 60) for _ in range(20)]  # its queue would not drain within the wait
    assert len(set(one_ahead)) == 1 and one_ahead[0] >= 1, one_ahead  # refusals do not pile up later turns
    held.append(await admission.acquire("flood", 50))
    two_ahead = await retry_after("flood", 1)
    assert two_ahead > one_ahead[0] and two_ahead >= 2, (two_ahead, one_ahead)  # twice the queue, later
    assert await retry_after("single", 1) == 1  # another caller, nothing of its own queued: the least wait
    assert admission.rejected == 22
    for grant in held:
        admission.release(grant)


async def test_a_callers_pace_is_its_own_and_kept_while_it_has_nothing_in_flight():
    admission = WriteAdmission(10, 0.05, budget=100, caller_share=0.5, retry_after_s=1)
    paced = await admission.acquire("flood", 10)
    await asyncio.sleep(0.2)  # at least 20 ms a unit
    admission.release(paced)  # nothing in flight or waiting now: its queue is gone, its pace is not
    held = [await admission.acquire("flood", 50), await admission.acquire("single", 50)]
    with pytest.raises(TooManyRequests) as flood:
        await admission.acquire("flood", 1)
    assert int(flood.value.headers()["Retry-After"]) >= 2  # 50 units at its own pace
    with pytest.raises(TooManyRequests) as single:  # as much in flight, no pace of its own yet: not the flood's
        await admission.acquire("single", 1)
    assert single.value.headers() == {"Retry-After": "1"}
    for grant in held:
        admission.release(grant)


async def test_while_another_caller_is_active_a_write_rests_as_long_as_it_took():
    admission = WriteAdmission(40, 2.0, budget=200, caller_share=0.5, duty=0.5)
    admission.release(await admission.acquire("single", 1))  # another caller wrote just now
    flood = await admission.acquire("flood", 100)
    await asyncio.sleep(0.2)  # the write takes 0.2 s: its rest is as long (the duration is the behaviour)
    admission.release(flood)  # over, but resting: still charged to its caller (its whole share) ...
    assert admission.cost_in_flight == 0  # ... not to the process: the other caller is admitted at once
    admission.release(await admission.acquire("single", 100))
    loop = asyncio.get_running_loop()
    asked = loop.time()
    nxt = await admission.acquire("flood", 100)  # waits out the rest: about as long as the write took
    assert 0.15 <= loop.time() - asked < 1.0
    admission.release(nxt)
    # its rest, if any, ends: then the admission forgets the caller
    await eventually(
        lambda: asyncio.sleep(0, not admission._callers), timeout=5, interval=0.02, what="the flood's last rest to end"
    )
    assert (admission.in_flight, admission.cost_in_flight, admission.waiting) == (0, 0, 0)


async def test_a_resting_callers_refusal_counts_its_rest_in_retry_after():
    admission = WriteAdmission(40, 0.05, budget=200, caller_share=0.5, duty=0.5, retry_after_s=1)
    single = await admission.acquire("single", 1)
    flood = await admission.acquire("flood", 100)
    await asyncio.sleep(1.2)  # the write takes 1.2 s (the duration is the behaviour: it rests as long)
    admission.release(single)
    admission.release(flood)  # rests 1.2 s: past the wait
    with pytest.raises(TooManyRequests) as refused:
        await admission.acquire("flood", 100)
    assert int(refused.value.headers()["Retry-After"]) == 3  # its pace counts the rest: ceil(100 x 2.4 s / 100)
    assert "100 resting" in str(refused.value)


async def test_a_caller_alone_or_without_a_duty_cycle_never_rests(monkeypatch):
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(backpressure, "ACTIVE_WINDOW_S", 0.05)
    for duty, others_wrote in ((0.5, False), (0.5, True), (1.0, True)):
        admission = WriteAdmission(40, 2.0, budget=200, caller_share=0.5, duty=duty)
        if others_wrote:
            admission.release(await admission.acquire("single", 1))
            if duty < 1:
                await asyncio.sleep(0.1)  # longer ago than the window: no longer active
        flood = await admission.acquire("flood", 100)
        await asyncio.sleep(0.2)  # a write of 0.2 s: one that would rest as long, were it to rest
        admission.release(flood)
        asked = loop.time()
        admission.release(await admission.acquire("flood", 100))
        assert loop.time() - asked < 0.05, (duty, others_wrote)
        assert (admission.in_flight, admission.cost_in_flight, admission.waiting) == (0, 0, 0)


async def test_another_callers_writes_in_another_process_make_a_write_rest(tmp_path):
    path = create_activity_file()
    try:
        # a single writer's connection in another worker process, writing there all along (a real process: the file
        # is what they share, with time.monotonic()); marking until stopped, so that a loaded machine's delays
        # cannot age its last mark past the active window before this process looks
        single = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, time; from app.ops.activity import SharedActivity; "
                "a = SharedActivity(sys.argv[1])\nwhile True: a.mark('single', time.monotonic()); time.sleep(0.02)",
                str(path),
            ]
        )
        try:
            shared = SharedActivity(path)
            deadline = time.monotonic() + 30
            while not shared.others_since("flood", time.monotonic() - 0.5):  # the writer's first mark
                assert single.poll() is None and time.monotonic() < deadline, "no mark of the single writer's process"
                await asyncio.sleep(0.02)
            here = WriteAdmission(40, 2.0, budget=200, caller_share=0.5, duty=0.5, shared=shared)
            flood = await here.acquire("flood", 100)
            await asyncio.sleep(0.2)  # a write of 0.2 s: it rests as long
            here.release(flood)
            asked = asyncio.get_running_loop().time()
            here.release(await here.acquire("flood", 100))
            assert asyncio.get_running_loop().time() - asked >= 0.15  # it rested, though no one else wrote here
        finally:
            single.kill()
            single.wait()
        # the flood's own marks, from any process, are not someone else's
        shared = SharedActivity(path)
        alone = WriteAdmission(40, 2.0, budget=200, caller_share=0.5, duty=0.5, shared=shared)
        # the killed writer's last mark ages past the active window
        await eventually(
            lambda: asyncio.sleep(0, not shared.others_since("flood", time.monotonic() - backpressure.ACTIVE_WINDOW_S)),
            timeout=backpressure.ACTIVE_WINDOW_S + 5,
            interval=0.05,
            what="the single writer's last mark to age",
        )
        flood = await alone.acquire("flood", 100)
        await asyncio.sleep(0.1)  # a write of 0.1 s: one that would rest as long, were it to rest
        alone.release(flood)
        asked = asyncio.get_running_loop().time()
        alone.release(await alone.acquire("flood", 100))
        assert asyncio.get_running_loop().time() - asked < 0.05
    finally:
        path.unlink()


async def test_admission_is_given_back_when_the_write_fails_or_is_cancelled():
    admission = WriteAdmission(2, 5.0, budget=10)
    with pytest.raises(RuntimeError):
        async with admission.admit("a", 10):
            raise RuntimeError("the transaction failed")
    assert admission.in_flight == 0 and admission.cost_in_flight == 0

    started = asyncio.Event()

    async def write() -> None:
        async with admission.admit("a", 10):
            started.set()
            await asyncio.sleep(10)  # a write still running when the client goes away (cancelled long before)

    task = asyncio.create_task(write())
    await started.wait()
    task.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await task
    assert admission.in_flight == 0 and admission.cost_in_flight == 0


async def test_a_waiter_cancelled_as_it_is_granted_hands_its_admission_on():
    admission = WriteAdmission(1, 5.0, budget=10)
    held = await admission.acquire("a", 10)
    waiter = asyncio.create_task(admission.acquire("a", 10))
    await settle()
    admission.release(held)  # granted to the waiter ...
    waiter.cancel()  # ... which is cancelled before it runs: given back
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (admission.in_flight, admission.cost_in_flight, admission.waiting) == (0, 0, 0)
    async with admission.admit("b", 10):
        assert admission.in_flight == 1


async def test_waiters_that_give_up_together_as_one_is_granted_leave_nothing_behind():
    # Both waits end on the same turn (their timeouts, or their clients gone): the first hands its admission on
    # while the second's wait is already over but not yet handled; nothing is granted to it.
    admission = WriteAdmission(2, 5.0, budget=10)
    held = await admission.acquire("a", 10)
    first = asyncio.create_task(admission.acquire("b", 10))
    second = asyncio.create_task(admission.acquire("c", 10))
    await settle()
    admission.release(held)  # granted to the first
    first.cancel()
    second.cancel()
    for waiter in (first, second):
        with pytest.raises(asyncio.CancelledError):
            await waiter
    assert (admission.in_flight, admission.cost_in_flight, admission.waiting) == (0, 0, 0)
    assert not admission._callers


async def test_a_write_that_gives_up_waiting_leaves_nothing_behind():
    admission = WriteAdmission(10, 0.05, budget=10)
    held = await admission.acquire("a", 10)
    with pytest.raises(TooManyRequests) as refused:
        await admission.acquire("b", 5)
    assert refused.value.status_code == 429 and "b has writes" in refused.value.message
    assert admission.waiting == 0 and admission.in_flight == 1
    admission.release(held)
    assert admission.in_flight == 0 and not admission._callers


async def test_contended_while_writes_of_two_callers_are_in_flight_not_while_one_caller_has_many():
    admission = WriteAdmission(10, 5.0, budget=100)
    assert not admission.contended()
    first, second = await admission.acquire("a", 10), await admission.acquire("a", 10)
    assert not admission.contended()  # one caller's many writes (an ingestion job's threads) run at full speed
    other = await admission.acquire("b", 1)
    assert admission.contended()
    admission.release(other)
    assert not admission.contended()
    waiter = asyncio.create_task(admission.acquire("c", 90))  # waiting, not in flight: its turn comes when one ends
    await settle()
    assert not admission.contended()
    admission.release(first)
    await settle()
    assert admission.contended()
    admission.release(second)
    admission.release(await waiter)


async def test_memory_is_given_back_once_after_writes_and_never_while_one_runs(monkeypatch):
    given_back = []  # whether the URN caches went too, each time
    monkeypatch.setattr(backpressure, "give_memory_back", lambda caches: given_back.append(caches))
    admission = WriteAdmission(2, 0.01, budget=URN_CACHE_ENTRIES)
    assert not admission.settle_memory()  # nothing happened yet
    held = await admission.acquire("a", 10)
    with pytest.raises(TooManyRequests):
        await admission.acquire("b", URN_CACHE_ENTRIES)
    assert not admission.settle_memory() and given_back == []  # a write is in flight
    admission.release(held)
    assert admission.settle_memory() and given_back == [False]  # a small write: the URN caches stay warm
    assert not admission.settle_memory() and given_back == [False]  # once: nothing since
    # writes of as many items as the URN caches hold, ended since the last time: the caches go with them
    for cost in (URN_CACHE_ENTRIES // 2, URN_CACHE_ENTRIES - URN_CACHE_ENTRIES // 2):
        admission.release(await admission.acquire("a", cost))
    assert admission.settle_memory() and given_back == [False, True]
    admission.release(await admission.acquire("a", 10))
    assert admission.settle_memory() and given_back == [False, True, False]  # counted from the last time


def test_giving_memory_back_after_a_flood_forgets_the_cached_urns():
    flood = [f"urn:li:dataset:(urn:li:dataPlatform:hive,flood.t{i},PROD)" for i in range(50)]
    for urn in flood:
        parse_urn(urn)
        validate_urn(urn)
    lineage = Record(
        "record",
        name="Lineage",
        fields=[
            Field(
                "upstreams",
                Array("array", items=Primitive("string")),
                optional=False,
                default=MISSING,
                annotations={},
                urn_entity="dataset",
                urn_is_array=True,
            )
        ],
    )
    validate = compile_validator(lineage, label="lineage", strict_urns=False)
    validate({"upstreams": flood})
    assert urns._parse_cached.cache_info().currsize >= 50 and urns._validate_cached.cache_info().currsize >= 50
    assert set(flood) <= _URN_CHECKERS[False].cache.keys()
    backpressure.give_memory_back(caches=False)
    assert urns._parse_cached.cache_info().currsize >= 50 and set(flood) <= _URN_CHECKERS[False].cache.keys()
    backpressure.give_memory_back(caches=True)
    assert urns._parse_cached.cache_info().currsize == urns._validate_cached.cache_info().currsize == 0
    assert not _URN_CHECKERS[False].cache and not _URN_CHECKERS[True].cache
    # the compiled validator still checks URNs (it holds the emptied dict), and fills it again
    with pytest.raises(AspectValidationError, match="expected a urn of entity type dataset"):
        validate({"upstreams": ["urn:li:corpuser:x"]})
    validate({"upstreams": flood[:1]})
    assert list(_URN_CHECKERS[False].cache) == ["urn:li:corpuser:x", flood[0]]


def test_the_caller_is_the_actor_or_without_auth_the_client_address():
    assert caller_key(SYSTEM_PRINCIPAL) == SYSTEM_PRINCIPAL.actor
    token = CLIENT_ADDRESS.set("10.0.0.7")
    try:
        assert caller_key(UNAUTHENTICATED_ADMIN) == "address:10.0.0.7"
        assert caller_key(SYSTEM_PRINCIPAL) == SYSTEM_PRINCIPAL.actor  # a token's actor, wherever it calls from
    finally:
        CLIENT_ADDRESS.reset(token)
