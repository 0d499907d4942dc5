"""The read rule itself (app.auth.reads): who may read a view's dataHubViewInfo, and the same rule as a search
condition, checked against the same table."""

from __future__ import annotations

import pytest

from app.auth.model import SYSTEM_PRINCIPAL, UNAUTHENTICATED_ADMIN, Principal, Role
from app.auth.reads import ReadScopedBackend, may_read_aspect, scoped_backend, search_scope, unreadable_entities
from app.search.model import SearchPage

ALICE = Principal("urn:li:corpuser:alice", Role.WRITER)
BOB = Principal("urn:li:corpuser:bob", Role.READER)
ADMIN = Principal("urn:li:corpuser:root", Role.ADMIN)
VIEW = "urn:li:dataHubView:v"


def info(kind: str, creator: str = ALICE.actor) -> dict:
    return {
        "name": "v",
        "type": kind,
        "definition": {"entityTypes": [], "filter": {"or": []}},
        "created": {"time": 1, "actor": creator},
        "lastModified": {"time": 1, "actor": creator},
    }


@pytest.mark.parametrize(
    "caller, kind, readable",
    [
        (ALICE, "PERSONAL", True),
        (BOB, "PERSONAL", False),
        (ADMIN, "PERSONAL", True),
        (SYSTEM_PRINCIPAL, "PERSONAL", True),
        (UNAUTHENTICATED_ADMIN, "PERSONAL", True),
        (ALICE, "GLOBAL", True),
        (BOB, "GLOBAL", True),
        (ADMIN, "GLOBAL", True),
    ],
)
def test_a_personal_view_is_its_creators_and_the_admins(caller, kind, readable):
    assert may_read_aspect(caller, "dataHubView", VIEW, "dataHubViewInfo", info(kind)) is readable
    # the search condition says the same of the view's document (`type`, `createdBy`)
    scope = search_scope(caller, "dataHubView")
    document = {"type": kind, "createdBy": ALICE.actor}
    found = scope is None or any(
        all((document.get(c.field) in c.values) != c.negated for c in group) for group in scope
    )
    assert found is readable


def test_the_rule_does_not_fire_elsewhere():
    # other aspects and entity types, a view without a creator stamp of a PERSONAL type is nobody's
    assert may_read_aspect(BOB, "dataset", "urn:li:dataset:x", "dataHubViewInfo", info("PERSONAL"))
    assert may_read_aspect(BOB, "dataHubView", VIEW, "dataHubViewKey", {"id": "v"})
    assert not may_read_aspect(BOB, "dataHubView", VIEW, "dataHubViewInfo", {**info("PERSONAL"), "created": None})
    assert search_scope(BOB, "dataset") is None and search_scope(ADMIN, "dataHubView") is None


class Rows:
    def __init__(self, rows: dict) -> None:
        self.rows, self.asked = rows, []

    async def latest(self, keys):
        keys = list(keys)
        self.asked.append(keys)
        return {k: self.rows[k] for k in keys if k in self.rows}


async def test_unreadable_entities_reads_only_the_guards_it_lacks():
    rows = Rows({(VIEW, "dataHubViewInfo"): info("PERSONAL")})
    assert await unreadable_entities(BOB, [VIEW, "urn:li:dataset:x", "not a urn"], rows) == {VIEW}
    assert rows.asked == [[(VIEW, "dataHubViewInfo")]]
    assert await unreadable_entities(ADMIN, [VIEW], rows) == set() and len(rows.asked) == 1
    assert await unreadable_entities(BOB, [VIEW], rows, in_hand={(VIEW, "dataHubViewInfo"): info("GLOBAL")}) == set()
    assert await unreadable_entities(BOB, [VIEW], rows, complete={VIEW}) == set()  # every aspect in hand: no info
    assert len(rows.asked) == 1


async def test_the_scoped_backend_puts_the_rule_in_the_query():
    class Backend:
        async def search(self, entity_type, query, *, any_of=None, **kw):
            self.any_of = any_of
            return SearchPage([], 0, None)

    backend = Backend()
    assert scoped_backend(backend, ADMIN) is backend
    scoped = scoped_backend(backend, BOB)
    assert isinstance(scoped, ReadScopedBackend)
    await scoped.search("dataset", "*")
    assert backend.any_of is None
    await scoped.search("dataHubView", "*")
    assert backend.any_of == search_scope(BOB, "dataHubView")
    await scoped.search("dataHubView", "*", any_of=())  # matches nothing: still nothing
    assert backend.any_of == ()
