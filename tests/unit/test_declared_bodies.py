"""The Rest.li action bodies (app.api.restli.common.ActionBody), without a database: an action the route does not
serve is refused with its body unread, a write's body is read only once the write admission is granted (a write
refused with 429 is never parsed), a read's without it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from types import SimpleNamespace

import pytest
from starlette.requests import Request

from app.api.restli.aspects import _BODY as ASPECT_ACTIONS
from app.auth.model import UNAUTHENTICATED_ADMIN
from app.errors import TooManyRequests, ValidationFailed


class Admission:
    """The write admission, granting or refusing every write; records what it admitted and what it gave back."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse, self.admitted, self.released = refuse, 0, 0

    @asynccontextmanager
    async def admit_before_body(self, caller: str, body_bytes: int) -> AsyncIterator[None]:
        if self.refuse:
            raise TooManyRequests("over the caller's share")
        self.admitted += 1
        try:
            yield
        finally:
            self.released += 1


class ActionRequest:
    """A `POST /aspects?action=...` with `body`, as the dependency sees it, and what was received of the body."""

    def __init__(self, action: str, body: bytes, admission: Admission) -> None:
        self.received = 0
        self.exit_stack = AsyncExitStack()  # the request's, which FastAPI closes after the response
        state = SimpleNamespace(
            settings=SimpleNamespace(max_request_bytes=1 << 20, max_json_depth=100),
            gateway=SimpleNamespace(admission=admission),
            auth=SimpleNamespace(authenticate=self._authenticate),
        )
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/aspects",
            "query_string": f"action={action}".encode(),
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "app": SimpleNamespace(state=state),
            "fastapi_inner_astack": self.exit_stack,
        }
        self.body = body
        self.request = Request(scope, self._receive)

    async def _authenticate(self, headers: object) -> object:
        return UNAUTHENTICATED_ADMIN

    async def _receive(self) -> dict:
        self.received += 1
        return {"type": "http.request", "body": self.body, "more_body": False}


async def test_a_write_is_admitted_before_its_body_is_read_and_held_until_the_request_ends():
    admission = Admission()
    write = ActionRequest("ingestProposal", b'{"proposal": {}}', admission)
    assert await ASPECT_ACTIONS(write.request) == {"proposal": {}}
    assert (admission.admitted, admission.released) == (1, 0)
    await write.exit_stack.aclose()
    assert admission.released == 1


async def test_a_write_refused_with_429_is_received_and_never_parsed():
    write = ActionRequest("ingestProposalBatch", b"not JSON at all", Admission(refuse=True))
    with pytest.raises(TooManyRequests):
        await ASPECT_ACTIONS(write.request)
    assert write.received == 1  # dropped as it arrived: the 429 comes after the whole request


async def test_a_read_is_not_admitted():
    read = ActionRequest("getTimeseriesAspectValues", b'{"urn": "urn:li:dataset:x"}', Admission(refuse=True))
    assert await ASPECT_ACTIONS(read.request) == {"urn": "urn:li:dataset:x"}


async def test_an_action_the_route_does_not_serve_is_refused_unread():
    unknown = ActionRequest("bogus", b"[1]", Admission())
    with pytest.raises(ValidationFailed) as refused:
        await ASPECT_ACTIONS(unknown.request)
    assert refused.value.message == "unknown action 'bogus' on /aspects"
    assert [i.path for i in refused.value.issues] == ["$action"]
    assert unknown.received == 0


async def test_an_action_body_is_a_json_object():
    listed = ActionRequest("getTimeseriesAspectValues", b"[1]", Admission())
    with pytest.raises(ValidationFailed) as refused:
        await ASPECT_ACTIONS(listed.request)
    assert [(i.message, i.path) for i in refused.value.issues] == [("expected an object", "$")]
