"""The token and policy caches of app.auth.service: when an entry expires, the requests in flight share one read."""

from __future__ import annotations

import asyncio

import pytest

from app.auth.model import Principal, Role, TokenInfo, WriteScope
from app.auth.service import AuthService
from app.errors import Forbidden
from app.settings import Settings
from app.write.proposal import ChangeType, Draft

WRITER = "urn:li:corpuser:writer"


class SlowRepository:
    """The stored rows, each read counted and held for a moment (as a round trip to the database is)."""

    def __init__(self) -> None:
        self.rows: dict[str, TokenInfo] = {}
        self.policies_stored: list[WriteScope] = []
        self.token_reads = 0
        self.policy_reads = 0

    async def insert_token(self, token: TokenInfo, *, only_if_none_exist: bool = False) -> bool:
        self.rows[token.id] = token
        return True

    async def token(self, token_id: str) -> TokenInfo | None:
        self.token_reads += 1
        await asyncio.sleep(0.01)  # the round trip: the requests arriving meanwhile must share this read
        return self.rows.get(token_id)

    async def policies(self) -> list[WriteScope]:
        self.policy_reads += 1
        stored = list(self.policies_stored)
        await asyncio.sleep(0.01)  # the round trip: a policy created meanwhile is not in this read
        return stored

    async def insert_policy(self, policy: WriteScope) -> WriteScope:
        self.policies_stored.append(policy)
        return policy

    async def latest_of_type(self, entity_type: str, aspect: str) -> list:
        return []  # no access policy: the write scopes alone decide

    async def latest(self, keys: list) -> dict:
        return {}


@pytest.fixture
def auth(registry) -> AuthService:
    service = AuthService(Settings(auth_secret="s" * 32), None, registry)  # type: ignore[arg-type]
    service.repository = SlowRepository()  # type: ignore[assignment]
    return service


async def test_an_expired_token_is_read_once_for_the_requests_in_flight(auth):
    token, _ = await auth.create_token(WRITER, Role.WRITER, created_by="urn:li:corpuser:test")
    headers = {"authorization": f"Bearer {token}"}
    principals = await asyncio.gather(*(auth.authenticate(headers) for _ in range(50)))
    assert {p.actor for p in principals} == {WRITER}
    assert auth.repository.token_reads == 1

    auth._tokens.clear()  # expired, as after auth_cache_seconds
    waiting = [asyncio.ensure_future(auth.authenticate(headers)) for _ in range(20)]
    waiting[0].cancel()  # a request that goes away leaves the read to the others
    done = await asyncio.gather(*waiting, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert all(isinstance(p, Principal) and p.actor == WRITER for p in done[1:])
    assert auth.repository.token_reads == 2
    assert not auth._reading


async def test_a_policy_created_during_a_read_is_in_force_for_the_next_write(auth):
    writer = Principal(WRITER, Role.WRITER)
    tag = [Draft(0, "tag", "tagProperties", ChangeType.UPSERT.value, urn="urn:li:tag:t")]
    first = [asyncio.ensure_future(auth.authorize_writes(writer, tag)) for _ in range(10)]
    for _ in range(100):  # until the read has begun (it took the stored policies: none yet), and not ended
        if auth.repository.policy_reads:
            break
        await asyncio.sleep(0)
    assert auth.repository.policy_reads == 1 and not any(f.done() for f in first)
    await auth.create_policy(WRITER, ["dataset"], None, created_by="urn:li:corpuser:admin")
    await asyncio.gather(*first)  # read before the policy existed: allowed
    assert auth.repository.policy_reads == 1

    with pytest.raises(Forbidden):
        await auth.authorize_writes(writer, tag)  # not the read begun before the change: a new one
    assert auth.repository.policy_reads == 2
    await asyncio.gather(*(auth.authorize_writes(writer, tag) for _ in range(5)), return_exceptions=True)
    assert auth.repository.policy_reads == 2  # kept until auth_cache_seconds
