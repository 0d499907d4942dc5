"""app.ops without a database: the backlog limit, the request-id middleware, bounded labels (write admission:
tests/unit/test_admission.py)."""

from __future__ import annotations

import pytest

from app.errors import Issue, TooManyRequests
from app.logs import REQUEST_ID
from app.ops.backpressure import WriteAdmission
from app.ops.metrics import method_label, validation_reason
from app.ops.middleware import OperationsMiddleware


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

    await OperationsMiddleware(inner, access_log=False)(
        {"type": "http", "method": method, "headers": headers}, receive, send
    )
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
