"""The Stats tab against the app (httpx, real Postgres, the embedded search backend's timeseries store): profiles
written through the API drawn as SVG charts (one point per profile) with the same numbers in tables, null counts per
field, operations, the time range and field chosen by GET parameters, and a dataset without profiles."""

from __future__ import annotations

import re
import time

import httpx
import pytest_asyncio

from app.web.charts import line_chart
from tests.helpers import ds, mcp, propose
from tests.web.browsing import page_url, sign_in

ORDERS = ds("stats.orders")
EMPTY = ds("stats.empty")
BOB = "urn:li:corpuser:bob"
NOW = int(time.time() * 1000)
DAY = 86_400_000
# (days ago, rows, columns, nulls of order_id, nulls of customer.email)
PROFILES = [(40, 1000, 3, 0, 12), (20, 1500, 3, 0, 30), (5, 2400, 4, 1, 7), (1, 3100, 4, 0, 4)]


def profile(days_ago: int, rows: int, columns: int, ids: int, emails: int) -> dict:
    return {
        "timestampMillis": NOW - days_ago * DAY,
        "rowCount": rows,
        "columnCount": columns,
        "fieldProfiles": [
            {"fieldPath": "order_id", "nullCount": ids, "uniqueCount": rows},
            {"fieldPath": "customer.email", "nullCount": emails},
        ],
    }


def operation(days_ago: int, kind: str, rows: int | None, actor: str = BOB, **extra) -> dict:
    value = {
        "timestampMillis": NOW - days_ago * DAY,
        "lastUpdatedTimestamp": NOW - days_ago * DAY - 60_000,
        "operationType": kind,
        "actor": actor,
        "sourceType": "DATA_PLATFORM",
        **extra,
    }
    if rows is not None:
        value["numAffectedRows"] = rows
    return value


@pytest_asyncio.fixture
async def profiled(client: httpx.AsyncClient) -> None:
    await propose(
        client,
        mcp("datasetProperties", {"name": "orders"}, ORDERS, sync=True),
        mcp("datasetProperties", {"name": "empty"}, EMPTY, sync=True),
        *[mcp("datasetProfile", profile(*p), ORDERS, sync=True) for p in PROFILES],
        mcp("operation", operation(3, "INSERT", 700), ORDERS, sync=True),
        mcp("operation", operation(2, "CUSTOM", None, customOperationType="VACUUM"), ORDERS, sync=True),
    )


def svg(html: str, chart_id: str) -> str:
    found = re.search(rf'<svg[^>]*aria-labelledby="{chart_id}-title {chart_id}-desc".*?</svg>', html, re.S)
    assert found, f"no chart {chart_id}"
    return found.group(0)


def table(html: str, css_class: str) -> list[list[str]]:
    """The rows of a table as the text of their cells."""
    found = re.search(rf'<table class="{css_class}">.*?</table>', html, re.S)
    assert found, f"no table {css_class}"
    rows = re.findall(r"<tr>(.*?)</tr>", found.group(0), re.S)
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)]
        for r in rows
    ]


async def test_profiles_are_charts_with_one_point_each_and_a_table_of_the_numbers(app, profiled):
    browser = await sign_in(app, role="reader")
    page = await browser.get(page_url(ORDERS, "Stats"))
    assert page.status_code == 200, page.text
    assert 'href="/web/static/stats.css"' in page.text
    rows = svg(page.text, "stats-rows")
    assert rows.count('<circle class="point"') == len(PROFILES)
    assert '<title id="stats-rows-title">Row count</title>' in rows
    assert "4 points from" in rows and "rows from 1,000 to 3,100, latest 3,100." in rows  # its <desc>
    assert "3,100 rows</title>" in rows  # each point's own title
    assert svg(page.text, "stats-columns").count('<circle class="point"') == len(PROFILES)
    # newest first, the same numbers
    assert [r[1:] for r in table(page.text, "profiles")[1:]] == [
        ["3,100", "4"],
        ["2,400", "4"],
        ["1,500", "3"],
        ["1,000", "3"],
    ]
    assert 'style="' not in page.text and "<script>" not in page.text  # the CSP allows neither


async def test_null_counts_per_field_every_field_or_the_one_chosen(app, profiled):
    browser = await sign_in(app, role="reader")
    page = await browser.get(page_url(ORDERS, "Stats"))
    assert '<label for="stats-field">' in page.text and '<option value="customer.email">' in page.text
    first, second = svg(page.text, "stats-nulls-0"), svg(page.text, "stats-nulls-1")
    assert "Null count of order_id" in first and "Null count of customer.email" in second
    assert second.count('<circle class="point"') == len(PROFILES)
    nulls = table(page.text, "nulls")
    assert nulls[0] == ["Time", "order_id", "customer.email"]
    assert [r[1:] for r in nulls[1:]] == [["0", "4"], ["1", "7"], ["0", "30"], ["0", "12"]]

    chosen = await browser.get(page_url(ORDERS, "Stats"), params={"field": "customer.email"})
    assert '<option value="customer.email" selected>' in chosen.text
    assert "Null count of customer.email" in svg(chosen.text, "stats-nulls-0")
    assert "stats-nulls-1" not in chosen.text
    assert table(chosen.text, "nulls")[0] == ["Time", "customer.email"]

    unknown = await browser.get(page_url(ORDERS, "Stats"), params={"field": "<script>" * 500})
    assert unknown.status_code == 200 and "stats-nulls-1" in unknown.text  # not a field: every field


async def test_the_time_range_bounds_the_profiles_and_operations(app, profiled):
    browser = await sign_in(app, role="reader")
    week = await browser.get(page_url(ORDERS, "Stats"), params={"range": "7d"})
    assert '<option value="7d" selected>' in week.text
    assert svg(week.text, "stats-rows").count('<circle class="point"') == 2
    assert [r[1] for r in table(week.text, "profiles")[1:]] == ["3,100", "2,400"]
    month = await browser.get(page_url(ORDERS, "Stats"), params={"range": "30d"})
    assert svg(month.text, "stats-rows").count('<circle class="point"') == 3
    bogus = await browser.get(page_url(ORDERS, "Stats"), params={"range": "'; drop"})
    assert bogus.status_code == 200 and svg(bogus.text, "stats-rows").count('<circle class="point"') == 4


async def test_operations_are_listed_with_type_actor_rows_and_source(app, profiled):
    browser = await sign_in(app, role="reader")
    page = await browser.get(page_url(ORDERS, "Stats"))
    operations = table(page.text, "operations")
    assert operations[0] == ["Time", "Type", "Actor", "Rows affected", "Source"]
    assert [r[1:] for r in operations[1:]] == [
        ["VACUUM", "bob", "—", "DATA_PLATFORM"],
        ["INSERT", "bob", "700", "DATA_PLATFORM"],
    ]
    assert 'href="/user/urn%3Ali%3Acorpuser%3Abob"' in page.text


async def test_a_dataset_without_profiles_says_so(app, profiled):
    browser = await sign_in(app, role="reader")
    page = await browser.get(page_url(EMPTY, "Stats"))
    assert page.status_code == 200
    assert "This dataset has no profiles." in page.text and "No operations were reported" in page.text
    assert "<svg" not in page.text
    narrowed = await browser.get(page_url(ORDERS, "Stats"), params={"range": "7d"})
    assert "no profiles" not in narrowed.text
    none_this_week = await browser.get(page_url(EMPTY, "Stats"), params={"range": "7d"})
    assert "no profiles in this range (last 7 days)" in none_this_week.text


async def test_what_a_profile_holds_is_shown_escaped(app, client):
    hostile = '<img src=x onerror="alert(1)">'
    await propose(
        client,
        mcp("datasetProperties", {"name": "odd"}, ORDERS, sync=True),
        mcp(
            "datasetProfile",
            {"timestampMillis": NOW, "rowCount": 5, "fieldProfiles": [{"fieldPath": hostile, "nullCount": 1}]},
            ORDERS,
            sync=True,
        ),
    )
    page = await (await sign_in(app, role="reader")).get(page_url(ORDERS, "Stats"))
    assert hostile not in page.text and "&lt;img src=x onerror=" in page.text
    assert svg(page.text, "stats-columns").count("<circle") == 0 and "No columns recorded" in page.text


def test_a_chart_of_one_point_and_its_axes():
    one = line_chart("c", "Rows", "rows", [(NOW, 0)])
    assert len(one.marks) == 1 and one.marks[0].x == (one.left + one.right) / 2 and one.marks[0].y == one.bottom
    assert [t.label for t in one.y_ticks] == ["0", "1"]  # a scale of counts, never 0 to 0
    big = line_chart("c", "Rows", "rows", [(NOW - DAY * 10, 1_200_000), (NOW, 2_900_000)])
    assert [t.label for t in big.y_ticks] == ["0", "1M", "2M", "3M"]
    assert big.marks[0].x == big.left and big.marks[-1].x == big.right
    assert all(big.top <= m.y <= big.bottom for m in big.marks)
    assert len(big.x_ticks) == 3 and re.fullmatch(r"\d{4}-\d\d-\d\d", big.x_ticks[0].label)
