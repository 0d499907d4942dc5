"""The History tab against the app (httpx, real Postgres, no mocks): each aspect's kept versions with who wrote them,
in which run and trace; the diff between two versions (by default the latest against the one before); the
Timeline's change list by category; query parameters that name nothing; a reader's read-only page; an entity type
other than a dataset."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import quote

import httpx
import pytest_asyncio

from tests.helpers import ds, mcp, mint_token, propose
from tests.web.browsing import page_url, sign_in

ORDERS = ds("history.orders")
PII = "urn:li:tag:pii"
ALICE = "urn:li:corpuser:alice"
BOB = "urn:li:corpuser:bob"
ADMIN = "urn:li:corpuser:datahub"  # the `client` fixture's actor
TRACES = {run: f"{n:032x}" for n, run in enumerate(("run-1", "run-2", "run-3", "run-tags", "run-owners"), 0xA0)}


def traced(run: str) -> dict[str, str]:
    """Headers that make the write's trace id a known one (W3C traceparent)."""
    return {"traceparent": f"00-{TRACES[run]}-00f067aa0ba902b7-01"}


def written(aspect: str, value: dict, run: str, urn: str = ORDERS, entity: str = "dataset") -> dict:
    return mcp(aspect, value, urn, entity=entity, systemMetadata={"runId": run})


@pytest_asyncio.fixture
async def history(app, client: httpx.AsyncClient) -> None:
    """ORDERS: globalTags and ownership written once each, then datasetProperties three times (by the admin, by
    bob, by the admin), each write in its own run and trace."""
    bob = {"Authorization": f"Bearer {await mint_token(app, 'writer', BOB)}"}
    await propose(client, written("globalTags", {"tags": [{"tag": PII}]}, "run-tags"), headers=traced("run-tags"))
    owners = {"owners": [{"owner": ALICE, "type": "DATAOWNER"}]}
    await propose(client, written("ownership", owners, "run-owners"), headers=traced("run-owners"))
    first = {"name": "orders", "description": "first"}
    await propose(client, written("datasetProperties", first, "run-1"), headers=traced("run-1"))
    second = {"name": "orders", "description": "second"}
    await propose(client, written("datasetProperties", second, "run-2"), headers={**traced("run-2"), **bob})
    third = {**second, "customProperties": {"tier": "1"}}
    await propose(client, written("datasetProperties", third, "run-3"), headers=traced("run-3"))


# --- reading the page


class _Page(HTMLParser):
    """The text of each element with an id, and the rows (cell texts) of each table, by the nearest id around it."""

    VOID = {"input", "br", "meta", "link", "img", "hr"}

    def __init__(self, html: str) -> None:
        super().__init__()
        self.open: list[tuple[str, str | None]] = []
        self.texts: dict[str, list[str]] = {}
        self.rows: dict[str, list[list[str]]] = {}
        self.forms: list[dict[str, str | None]] = []
        self.cell: list[str] | None = None
        self.feed(html)

    def _ids(self) -> list[str]:
        return [i for _, i in self.open if i]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "form":
            self.forms.append(found)
        if tag in self.VOID:
            return
        self.open.append((tag, found.get("id")))
        if found.get("id"):
            self.texts[found["id"]] = []
        if tag == "tr":
            for i in self._ids():
                self.rows.setdefault(i, []).append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None:
            for i in self._ids():
                if self.rows.get(i):
                    self.rows[i][-1].append(" ".join("".join(self.cell).split()))
            self.cell = None
        while self.open:
            closed, _ = self.open.pop()
            if closed == tag:
                break

    def handle_data(self, data: str) -> None:
        for i in self._ids():
            self.texts[i].append(data)
        if self.cell is not None:
            self.cell.append(data)

    def text(self, element_id: str) -> str:
        return " ".join("".join(self.texts[element_id]).split())

    def table(self, element_id: str) -> list[list[str]]:
        """The rows of the tables in the element, without their head rows."""
        return [row for row in self.rows.get(element_id, []) if row and row[0] not in ("", "Version", "When", "Change")]


def problems_of(html: str) -> list[str]:
    found = re.findall(r'<p class="history-problem" role="alert">(.*?)</p>', html, re.S)
    return [" ".join(re.sub(r"<[^>]+>", "", p).replace("&lt;", "<").replace("&gt;", ">").split()) for p in found]


async def history_page(browser: httpx.AsyncClient, urn: str = ORDERS, **params: str | list[str]) -> _Page:
    answer = await browser.get(page_url(urn, "History"), params=params)
    assert answer.status_code == 200, answer.text
    return _Page(answer.text)


# --- the versions


async def test_each_version_is_listed_newest_first_with_its_actor_run_and_trace(app, history):
    page = await history_page(await sign_in(app))
    rows = page.table("versions-datasetProperties")
    assert [row[:5] for row in rows] == [
        ["3 current", _when(rows[0][1]), "datahub", "run-3", TRACES["run-3"]],
        ["2", _when(rows[1][1]), "bob", "run-2", TRACES["run-2"]],
        ["1", _when(rows[2][1]), "datahub", "run-1", TRACES["run-1"]],
    ]
    assert rows[0][1] >= rows[1][1] >= rows[2][1]  # newest first
    assert [row[5] for row in rows] == [
        "2 → 3 of datasetProperties", "1 → 2 of datasetProperties", "oldest kept"
    ]  # fmt: skip
    assert page.table("versions-ownership")[0][2:5] == ["datahub", "run-owners", TRACES["run-owners"]]
    assert "3 kept versions" in page.text("versions-datasetProperties")


def _when(text: str) -> str:
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text), text
    return text


async def test_the_actor_links_to_its_page_and_a_version_to_its_diff(app, history):
    answer = await (await sign_in(app)).get(page_url(ORDERS, "History"))
    assert f'href="/user/{quote(BOB, safe="")}">bob</a>' in answer.text
    assert "?aspect=datasetProperties&amp;from=1&amp;to=2#diff" in answer.text


async def test_versions_past_a_page_are_a_link_away(app, client, history):
    for n in range(10):  # 13 versions in all: ten on the first page
        await propose(client, written("datasetProperties", {"name": "orders", "description": f"d{n}"}, "run-1"))
    browser = await sign_in(app)
    page = await history_page(browser)
    assert [row[0] for row in page.table("versions-datasetProperties")] == [
        "13 current", "12", "11", "10", "9", "8", "7", "6", "5", "4"
    ]  # fmt: skip
    assert "Versions 1–10 of 13 kept" in page.text("versions-datasetProperties")
    answer = await browser.get(page_url(ORDERS, "History"))
    older = re.search(r'href="([^"]*before=4[^"]*)">Older versions of datasetProperties', answer.text)
    assert older and "aspect=datasetProperties" in older.group(1)
    second = _Page((await browser.get(older.group(1).replace("&amp;", "&"))).text)
    assert [row[0] for row in second.table("versions-datasetProperties")] == ["3", "2", "1"]
    assert "Newest versions of datasetProperties" in second.text("versions-datasetProperties")
    assert len(second.table("versions-ownership")) == 1  # `before` pages only the chosen aspect


# --- the diff


async def test_the_default_diff_is_the_latest_version_of_the_aspect_changed_last_against_the_one_before(app, history):
    page = await history_page(await sign_in(app))
    diff = page.text("diff")
    assert "datasetProperties: version 2 → version 3" in diff
    assert page.table("diff")[2:] == [["+ added", "customProperties.tier", "", '"1"']]
    assert [row[:2] + row[3:] for row in page.table("diff")[:2]] == [
        ["From", "2", "bob", "run-2", TRACES["run-2"]],
        ["To", "3 current", "datahub", "run-3", TRACES["run-3"]],
    ]


async def test_list_elements_are_matched_by_what_names_them_not_by_their_place(app, client, history):
    both = {"owners": [{"owner": BOB, "type": "DATAOWNER"}, {"owner": ALICE, "type": "DATAOWNER"}]}
    await propose(client, written("ownership", both, "run-owners"))  # bob put in front of alice
    await propose(client, written("globalTags", {"tags": []}, "run-tags"))
    browser = await sign_in(app)
    owners = await history_page(browser, aspect="ownership")
    assert owners.table("diff")[2:] == [
        ["+ added", f'owners[owner="{BOB}"]', "", f'{{"owner":"{BOB}","type":"DATAOWNER"}}']
    ]
    tags = await history_page(browser, aspect="globalTags")
    assert tags.table("diff")[2:] == [["− removed", f'tags[tag="{PII}"]', f'{{"tag":"{PII}"}}', ""]]
    assert "TAG REMOVE" in tags.text("diff")


async def test_a_chosen_diff_shows_exactly_the_changed_field(app, history):
    browser = await sign_in(app)
    page = await history_page(browser, aspect="datasetProperties", **{"from": "1", "to": "2"})
    assert page.table("diff")[2:] == [["± changed", "description", '"first"', '"second"']]
    assert "DOCUMENTATION MODIFY" in page.text("diff")  # the Timeline's words for it
    answer = await browser.get(page_url(ORDERS, "History"), params={"aspect": "datasetProperties", "from": 1, "to": 2})
    assert '<span class="line-del">-  &#34;description&#34;: &#34;first&#34;,' in answer.text
    assert '<span class="line-add">+  &#34;description&#34;: &#34;second&#34;,' in answer.text
    assert '<option value="1" selected>' in answer.text and '<option value="2" selected>' in answer.text
    backwards = await history_page(browser, aspect="datasetProperties", **{"from": "3", "to": "1"})
    assert {row[1] for row in backwards.table("diff")[2:]} == {"description", "customProperties.tier"}
    same = await history_page(browser, aspect="datasetProperties", **{"from": "2", "to": "2"})
    assert "No differences" in same.text("diff")


async def test_the_diff_forms_are_labelled_gets(app, history):
    answer = await (await sign_in(app)).get(page_url(ORDERS, "History"))
    for control in ("diff-aspect", "diff-from", "diff-to", "changes-since"):
        assert f'<label for="{control}">' in answer.text and f'id="{control}"' in answer.text
    tab = page_url(ORDERS, "History")
    forms = [f for f in _Page(answer.text).forms if (f.get("action") or "").startswith(tab)]
    assert [(f.get("method"), f.get("action")) for f in forms] == [
        ("get", f"{tab}#diff"), ("get", f"{tab}#diff"), ("get", f"{tab}#changes")
    ]  # fmt: skip


async def test_one_version_has_nothing_to_compare(app, history):
    answer = await (await sign_in(app)).get(page_url(ORDERS, "History"), params={"aspect": "ownership"})
    assert problems_of(answer.text) == [
        "Version 1 is the oldest kept version of ownership: there is none before it to compare with."
    ]
    assert len(_Page(answer.text).table("versions-ownership")) == 1


# --- hostile parameters


async def test_parameters_that_name_nothing_are_said_on_the_page(app, history):
    browser = await sign_in(app)
    cases = [
        ({"aspect": "noSuchAspect"}, "“noSuchAspect” is not an aspect of this entity"),
        ({"aspect": "<script>x</script>"}, "is not an aspect of this entity"),
        ({"aspect": "datasetProperties", "from": "abc"}, "“abc” is not a version number"),
        ({"aspect": "datasetProperties", "to": "-1"}, "“-1” is not a version number"),
        ({"aspect": "datasetProperties", "to": "99"}, "Version 99 of datasetProperties is not kept (kept: 1, 2, 3)"),
        ({"aspect": "datasetProperties", "from": "9" * 40}, "is not a version number"),
        ({"aspect": "datasetProperties", "from": "²"}, "is not a version number"),
        ({"aspect": "datasetProperties", "before": "x"}, "“x” is not a version number"),
        ({"aspect": "datasetProperties", "before": "1"}, "No kept version of datasetProperties is older than 1"),
        ({"category": "NOPE"}, "unknown categories: NOPE"),
        ({"since": "forever"}, "“forever” is not a period"),
    ]
    for params, said in cases:
        answer = await browser.get(page_url(ORDERS, "History"), params=params)
        assert answer.status_code == 200, (params, answer.text)
        problems = " ".join(problems_of(answer.text))
        assert said in problems, (params, problems)
        assert "<script>x" not in answer.text
        assert "versions-datasetProperties" in answer.text  # the rest of the tab still shows
    assert problems_of((await browser.get(page_url(ORDERS, "History"))).text) == []


# --- the change list


async def test_the_change_list_has_a_tag_and_an_owner_added_in_their_categories(app, history):
    browser = await sign_in(app)
    page = await history_page(browser)
    rows = page.table("changes")
    events = " | ".join(row[3] for row in rows)
    assert "TAG ADD Tag 'pii' added" in events
    assert "OWNERSHIP ADD" in events and "alice" in events.split("OWNERSHIP ADD", 1)[1]
    assert "DOCUMENTATION" in events
    assert rows[0][0] >= rows[-1][0]  # newest first
    tags = await history_page(browser, category="TAG")
    tag_events = " | ".join(row[3] for row in tags.table("changes"))
    assert "TAG ADD" in tag_events and "OWNERSHIP" not in tag_events and "DOCUMENTATION" not in tag_events
    owners = await history_page(browser, category="OWNER")  # DataHub's older name of OWNERSHIP
    owner_events = " | ".join(row[3] for row in owners.table("changes"))
    assert "OWNERSHIP ADD" in owner_events and "TAG" not in owner_events
    both = await history_page(browser, category=["TAG", "OWNERSHIP"])
    assert len(both.table("changes")) == 2
    answer = await browser.get(page_url(ORDERS, "History"), params={"category": "TAG"})
    assert 'name="category" value="TAG" checked' in answer.text
    assert 'name="category" value="OWNERSHIP">' in answer.text
    # the diff's forms carry the change list's choice, and the change list's form the diff's
    assert '<input type="hidden" name="category" value="TAG">' in answer.text
    chosen = await browser.get(page_url(ORDERS, "History"), params={"aspect": "ownership"})
    assert '<input type="hidden" name="aspect" value="ownership">' in chosen.text


async def test_the_change_list_period_leaves_out_older_changes(app, history, db):
    await db.execute(
        "UPDATE metadata_aspect_v2 SET createdon = createdon - interval '3 days' WHERE urn = $1 AND aspect = $2",
        ORDERS,
        "globalTags",
    )
    browser = await sign_in(app)
    events = " | ".join(row[3] for row in (await history_page(browser, since="day")).table("changes"))
    assert "OWNERSHIP ADD" in events and "TAG ADD" not in events
    events = " | ".join(row[3] for row in (await history_page(browser, since="week")).table("changes"))
    assert "TAG ADD" in events


# --- who sees it, and where


async def test_a_reader_sees_the_history_and_no_form_that_changes_anything(app, history):
    reader = await sign_in(app, role="reader", actor="urn:li:corpuser:carol")
    answer = await reader.get(page_url(ORDERS, "History"))
    assert answer.status_code == 200
    page = _Page(answer.text)
    assert len(page.table("versions-datasetProperties")) == 3 and page.table("changes")
    posts = [f for f in page.forms if (f.get("method") or "get").lower() == "post"]
    assert [f.get("action") for f in posts] == ["/logout"]  # signing out is the only POST of the page
    assert answer.text.count('name="csrf_token"') == 1
    assert "<script>" not in answer.text and "style=" not in answer.text  # the CSP: no inline script or style
    assert '<link rel="stylesheet" href="/web/static/history.css">' in answer.text
    assert (await reader.get("/web/static/history.css")).status_code == 200


async def test_without_a_session_the_tab_is_the_sign_in_form(anonymous, history):
    answer = await anonymous.get(page_url(ORDERS, "History"), params={"aspect": "ownership"})
    assert answer.status_code == 303 and answer.headers["location"].startswith("/login?next=")


async def test_an_entity_other_than_a_dataset_has_the_tab(app, client):
    tag = "urn:li:tag:history-pii"
    await propose(client, written("tagProperties", {"name": "pii"}, "run-1", tag, "tag"), headers=traced("run-1"))
    changed = {"name": "pii", "description": "Personal data"}
    await propose(client, written("tagProperties", changed, "run-2", tag, "tag"), headers=traced("run-2"))
    browser = await sign_in(app, role="reader")
    answer = await browser.get(f"/tag/{quote(tag, safe='')}/History")
    assert answer.status_code == 200
    page = _Page(answer.text)
    assert [row[:5] for row in page.table("versions-tagProperties")] == [
        ["2 current", page.table("versions-tagProperties")[0][1], "datahub", "run-2", TRACES["run-2"]],
        ["1", page.table("versions-tagProperties")[1][1], "datahub", "run-1", TRACES["run-1"]],
    ]
    assert "tagProperties: version 1 → version 2" in page.text("diff")
    assert page.table("diff")[2:] == [["+ added", "description", "", '"Personal data"']]
    assert 'aria-current="page" class="active">History' in answer.text
