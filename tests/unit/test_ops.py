"""app.ops without a database: write admission, the request-id middleware, bounded labels."""

from __future__ import annotations

import asyncio

import pytest

from app.errors import Issue, TooManyRequests
from app.logs import REQUEST_ID
from app.ops.backpressure import WriteAdmission
from app.ops.metrics import method_label, validation_reason
from app.ops.middleware import OperationsMiddleware


async def test_admission_is_first_come_first_served_and_refuses_after_the_wait():
    admission = WriteAdmission(2, 0.2)
    await admission.acquire()
    await admission.acquire()
    assert admission.in_flight == 2
    order: list[int] = []

    async def wait(n: int) -> None:
        await admission.acquire()
        order.append(n)

    waiters = [asyncio.create_task(wait(n)) for n in range(2)]
    await asyncio.sleep(0.01)
    assert admission.waiting == 2
    admission.release()
    admission.release()
    await asyncio.gather(*waiters)
    assert order == [0, 1] and admission.in_flight == 2
    with pytest.raises(TooManyRequests) as refused:
        await admission.acquire()  # nobody releases within 0.2 s
    assert refused.value.status_code == 429 and refused.value.headers() == {"Retry-After": "1"}
    assert admission.waiting == 0 and admission.in_flight == 2
    admission.release()
    admission.release()
    assert admission.in_flight == 0


async def test_a_cancelled_waiter_does_not_leak_its_slot():
    admission = WriteAdmission(1, 5.0)
    await admission.acquire()
    waiter = asyncio.create_task(admission.acquire())
    await asyncio.sleep(0.01)
    admission.release()  # handed to the waiter ...
    waiter.cancel()  # ... which is cancelled before it runs: the slot goes back
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.in_flight == 0
    async with admission:
        assert admission.in_flight == 1
    assert admission.in_flight == 0


def test_backlog_limit():
    backlog = {"rows": 10}
    admission = WriteAdmission(1, 0.1, backlog_limit=10, backlog=lambda: backlog["rows"], retry_after_s=3)
    admission.check_backlog()  # at the limit: allowed
    backlog["rows"] = 11
    with pytest.raises(TooManyRequests) as refused:
        admission.check_backlog()
    assert refused.value.headers() == {"Retry-After": "3"} and "11 rows" in refused.value.message
    WriteAdmission(1, 0.1, backlog_limit=0, backlog=lambda: 10**9).check_backlog()  # 0: off
    WriteAdmission(1, 0.1, backlog_limit=5, backlog=lambda: None).check_backlog()  # not sampled yet


async def _call(headers: list[tuple[bytes, bytes]], method: str = "GET") -> tuple[dict, list[str | None]]:
    seen: list[str | None] = []
    sent: list[dict] = []

    async def inner(scope, receive, send):
        seen.append(REQUEST_ID.get())
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive():
        return {"type": "http.request"}

    async def send(message):
        sent.append(message)

    await OperationsMiddleware(inner, access_log=False)({"type": "http", "method": method, "headers": headers}, receive, send)
    return dict(sent[0]["headers"]), seen


async def test_request_id_kept_when_sane_replaced_otherwise_and_reset_after():
    headers, seen = await _call([(b"x-request-id", b"abc-1.2:3_4")])
    assert headers[b"x-request-id"] == b"abc-1.2:3_4" and seen == ["abc-1.2:3_4"]
    for bad in (b"", b"a" * 65, b"a b", "é".encode(), b"a\nb"):
        headers, seen = await _call([(b"x-request-id", bad)])
        assert headers[b"x-request-id"] != bad and seen[0] == headers[b"x-request-id"].decode()
    assert REQUEST_ID.get() is None


def test_labels_are_bounded():
    assert method_label("POST") == "POST" and method_label("BREW") == "other"
    assert validation_reason(Issue("x", path="$.aspect.value.name")) == "aspect_value"
    assert validation_reason(Issue("x", path="$.aspectName")) == "aspect_name"
    assert validation_reason(Issue("x", path="$.entityKeyAspect")) == "urn"
    assert validation_reason(Issue("x", path="$.changeType")) == "change_type"
    assert validation_reason(Issue("IfVersionMatch: expected 1")) == "rule"
    assert validation_reason(Issue("x", path="$.systemMetadata")) == "other"
