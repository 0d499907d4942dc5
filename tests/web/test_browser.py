"""The web view in a real browser: Debian's Chromium driven by Selenium (headless), against a real metaledger process,
with the catalog written by DataHub's real SDK (acryl-datahub, in the client's virtualenv, as
tests/client/test_mcp_server.py writes it). One browser and one server for the module; the tests run in order, as a
person would: sign in, search with a facet, open a dataset, read its schema and owners, edit its description (read
back through the SDK), sign out, and as a reader find no edit control and have a forged POST refused.

Every page is saved as a screenshot under `$METALEDGER_TEST_ARTIFACTS/web/` (else `build/test-artifacts/web/`, which
the module prints)."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.client.conftest import ROOT, DataHubClient, Metaledger, _client_env, _ensure_client_venv, metaledger_process
from tests.processes import service_token
from tests.web.axe import serious_violations
from tests.web.browsing import page_url

pytestmark = pytest.mark.client

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
RUN = "webcat"
ORDERS = f"urn:li:dataset:(urn:li:dataPlatform:snowflake,{RUN}.shop.orders,PROD)"
RAW = f"urn:li:dataset:(urn:li:dataPlatform:snowflake,{RUN}.shop.raw_orders,PROD)"
EVENTS = f"urn:li:dataset:(urn:li:dataPlatform:kafka,{RUN}.events,PROD)"
STAGING = f"urn:li:dataset:(urn:li:dataPlatform:snowflake,{RUN}.shop.staging,PROD)"
ALICE = f"urn:li:corpuser:{RUN}-alice"
PII = f"urn:li:tag:{RUN}-pii"
EDITED = "Every order a customer placed, cleaned (edited in the browser)"
EDITED_TWICE = EDITED + ", twice"

SEED = """
from datahub.emitter.mcp import MetadataChangeProposalWrapper as MCPW
from datahub.metadata import schema_classes as m
from datahub.sdk import DataHubClient, Dataset, Tag

client = DataHubClient(server=GMS, token=TOKEN)
client._graph.emit_mcp(MCPW(entityUrn=ALICE, aspect=m.CorpUserInfoClass(active=True, displayName="Alice Analyst")))
client.entities.upsert(Tag(name=f"{RUN}-pii", display_name="PII", description="personal data"))

def field(path, native, description, kind=m.StringTypeClass):
    return m.SchemaFieldClass(fieldPath=path, type=m.SchemaFieldDataTypeClass(type=kind()), nativeDataType=native,
                              description=description)

schema = [field("order_id", "NUMBER", "Order identifier", m.NumberTypeClass),
          field("customer", "STRUCT", "Who placed it", m.RecordTypeClass),
          field("customer.email", "VARCHAR", "The customer's e-mail address"),
          field("customer.name", "VARCHAR", "The customer's name"),
          field("amount", "NUMBER", "Order amount in EUR", m.NumberTypeClass)]
client.entities.upsert(Dataset(platform="snowflake", name=f"{RUN}.shop.raw_orders", description="Raw orders",
                               schema=[("order_id", "NUMBER")]))
client.entities.upsert(Dataset(platform="snowflake", name=f"{RUN}.shop.orders", display_name="orders",
                               description="Cleaned customer orders", schema=schema,
                               owners=[(ALICE, "TECHNICAL_OWNER")], tags=[PII], custom_properties={"team": "shop"}))
client.entities.upsert(Dataset(platform="kafka", name=f"{RUN}.events", description="Order events of the shop",
                               schema=[("event_id", "VARCHAR")]))
client.lineage.add_lineage(upstream=RAW, downstream=ORDERS)
client.lineage.add_lineage(upstream=EVENTS, downstream=RAW)
# a run of its own, to roll back from the browser
run = m.SystemMetadataClass(runId=f"{RUN}-staging-run")
client._graph.emit_mcp(MCPW(entityUrn=STAGING, aspect=m.DatasetPropertiesClass(name="staging", description="Staging"),
                            systemMetadata=run))
"""

READ_BACK = """
from datahub.metadata import schema_classes as m
from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
print(graph.get_aspect(URN, m.EditableDatasetPropertiesClass).description)
"""


@pytest.fixture(scope="module")
def service(make_database: Callable[..., str], migrated_template: str) -> Iterator[Metaledger]:
    yield from metaledger_process(make_database(template=migrated_template))


@pytest.fixture(scope="module")
def sdk(service: Metaledger, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataHubClient]:
    python = _ensure_client_venv()
    home = tmp_path_factory.mktemp("web-sdk-home")
    client = DataHubClient(python, _client_env(python, home, service.url, service.token), home)
    yield client
    client.close()


@pytest.fixture(scope="module")
def catalog(service: Metaledger, sdk: DataHubClient) -> Metaledger:
    """The catalog above, written through DataHub's SDK, once searchable."""
    sdk.script(SEED, RUN=RUN, ALICE=ALICE, ORDERS=ORDERS, RAW=RAW, EVENTS=EVENTS, PII=PII, STAGING=STAGING)
    query = "query q($q: String!) { searchAcrossEntities(input: {query: $q, count: 20}) { total } }"
    deadline = time.monotonic() + 60
    with service.http() as http:
        while (
            http.post("/api/graphql", json={"query": query, "variables": {"q": RUN}}).json()["data"][
                "searchAcrossEntities"
            ]["total"]
            < 3
        ):
            assert time.monotonic() < deadline, "the SDK's datasets never became searchable"
            time.sleep(0.2)
    return service


@pytest.fixture(scope="module")
def artifacts() -> Path:
    # Not a tmp_path: pytest removes a passing test's (pyproject's tmp_path_retention_policy), and these are kept.
    where = os.environ.get("METALEDGER_TEST_ARTIFACTS")
    folder = (Path(where) if where else ROOT / "build" / "test-artifacts") / "web"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nweb view screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def browser(artifacts: Path) -> Iterator[object]:
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.fail("Debian's chromium and chromedriver are needed: make chromium-bin")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


def shot(driver, artifacts: Path, name: str) -> None:
    """A screenshot of the whole page (its full height at the window's width), once axe-core found no serious
    violation in it."""
    violations = serious_violations(driver)
    assert not violations, f"{name}: {driver.current_url}\n" + "\n".join(violations)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, max(min(height + 140, 4000), 500))
    driver.save_screenshot(str(artifacts / f"{name}.png"))
    driver.set_window_size(width, 800)


def arrived(driver, where: Callable[[str], bool], timeout: float = 20) -> None:
    """Wait for the navigation a click started: on a loaded machine the click returns before the next page is in."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(
        lambda d: where(d.current_url) and d.execute_script("return document.readyState") == "complete",
        message=f"still at {driver.current_url}",
    )


def submitted(driver, button, where: Callable[[str], bool], timeout: float = 20) -> None:
    """Click a form's button and wait for the page it leads to, once the page it was on is gone: a form answered
    with the page it was sent from has the same address before and after, and `arrived` alone could read the old
    page."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")
    button.click()
    WebDriverWait(driver, timeout).until(expected_conditions.staleness_of(page), message="the form was not sent")
    arrived(driver, where, timeout)


def sign_in(driver, service: Metaledger, token: str, artifacts: Path | None = None) -> None:
    from selenium.webdriver.common.by import By

    driver.get(service.url + "/search?query=" + RUN)
    assert "/login?next=" in driver.current_url
    driver.find_element(By.ID, "token").send_keys(token)
    if artifacts is not None:
        shot(driver, artifacts, "01-sign-in")
    driver.find_element(By.CSS_SELECTOR, "form[action='/login'] button").click()
    arrived(driver, lambda url: url == service.url + "/search?query=" + RUN)


def test_sign_in_with_a_token(browser, catalog: Metaledger, artifacts: Path):
    from selenium.webdriver.common.by import By

    sign_in(browser, catalog, catalog.token, artifacts)
    assert browser.find_element(By.CSS_SELECTOR, ".who .actor").text == "datahub"
    cookie = browser.get_cookie("metaledger_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and not cookie["secure"]  # plain HTTP here
    assert browser.execute_script("return document.cookie").find("metaledger_session") < 0  # no script reads it


def test_search_with_a_facet(browser, catalog: Metaledger, artifacts: Path):
    from selenium.webdriver.common.by import By

    names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".hit-name")]
    assert {"orders", "raw_orders", "events"} <= {n.rsplit(".", 1)[-1] for n in names}, names
    shot(browser, artifacts, "02-search")
    kafka = browser.find_element(By.XPATH, "//section[@class='facet'][h3='Platform']//a[contains(., 'kafka')]")
    kafka.click()
    arrived(browser, lambda url: "filter_platform___false___EQUAL___0=" in url)
    names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".hit-name")]
    assert [n.rsplit(".", 1)[-1] for n in names] == ["events"], names
    shot(browser, artifacts, "03-search-facet")


def test_open_a_dataset_and_read_its_schema_and_owners(browser, catalog: Metaledger, artifacts: Path):
    from selenium.webdriver.common.by import By

    browser.get(catalog.url + "/search?query=" + RUN + ".shop.orders")
    browser.find_element(By.LINK_TEXT, "orders").click()
    arrived(browser, lambda url: url == catalog.url + page_url(ORDERS))
    assert browser.find_element(By.CSS_SELECTOR, ".tabs a.active").text == "Schema"
    rows = browser.find_elements(By.CSS_SELECTOR, "#schema-table tbody tr")
    assert [r.find_element(By.TAG_NAME, "th").text.lstrip("└ ") for r in rows] == [
        "order_id",
        "customer",
        "email",
        "name",
        "amount",
    ]
    nested = browser.find_element(By.CSS_SELECTOR, "tr[data-name='customer.email'] th")
    top = browser.find_element(By.CSS_SELECTOR, "tr[data-name='order_id'] th")
    assert nested.location["x"] == top.location["x"] and "depth-1" in nested.get_attribute("class")
    assert "The customer's e-mail address" in browser.find_element(By.ID, "schema-table").text
    owners = browser.find_element(By.CSS_SELECTOR, ".entity-side ul.owners").text
    assert f"{RUN}-alice" in owners
    assert "PII" in browser.find_element(By.CSS_SELECTOR, ".entity-side").text  # the tag by its name
    shot(browser, artifacts, "04-dataset-schema")
    search = browser.find_element(By.ID, "field-filter")
    search.send_keys("email")
    visible = [r.get_attribute("data-name") for r in rows if r.is_displayed()]
    assert visible == ["customer.email"]
    shot(browser, artifacts, "05-dataset-schema-filtered")


def test_other_tabs_at_datahubs_paths(browser, catalog: Metaledger, artifacts: Path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(catalog.url + page_url(ORDERS, "Lineage"))
    drawn = {n.get_attribute("textContent") for n in browser.find_elements(By.CSS_SELECTOR, "#lineage-svg .lg-name")}
    assert {"orders", "raw_orders", "events"} <= {name.rsplit(".", 1)[-1] for name in drawn}, drawn  # two hops up
    assert len(browser.find_elements(By.CSS_SELECTOR, "#lineage-svg .lg-edge")) >= 2
    shot(browser, artifacts, "06-dataset-lineage")
    nodes = browser.find_elements(By.CSS_SELECTOR, "#lineage-svg a.lg-node")
    events = [
        n for n in nodes if n.find_element(By.CSS_SELECTOR, ".lg-name").get_attribute("textContent").endswith("events")
    ]
    events[0].send_keys(Keys.ENTER)  # a node opens its page, from the keyboard too
    arrived(browser, lambda url: quote(EVENTS, safe="") in url)
    browser.get(catalog.url + page_url(ORDERS, "Aspects"))
    browser.find_element(By.XPATH, "//details[@class='aspect'][.//code='ownership']/summary").click()
    assert '"runId"' in browser.find_element(By.XPATH, "//details[@class='aspect'][.//code='ownership']/pre").text
    shot(browser, artifacts, "07-dataset-aspects")
    browser.get(catalog.url + page_url(ORDERS.replace("orders", "nothing")))
    assert "There is no dataset" in browser.find_element(By.TAG_NAME, "main").text
    shot(browser, artifacts, "08-not-found")


def test_edit_the_description_and_read_it_back_through_the_sdk(
    browser, catalog: Metaledger, sdk: DataHubClient, artifacts: Path
):
    from selenium.webdriver.common.by import By

    browser.get(catalog.url + page_url(ORDERS, "Documentation"))
    box = browser.find_element(By.ID, "description-input")
    box.clear()
    box.send_keys(EDITED)
    shot(browser, artifacts, "09-edit-description")
    button = browser.find_element(By.CSS_SELECTOR, ".edit-description button")
    submitted(browser, button, lambda url: url == catalog.url + page_url(ORDERS, "Documentation"))
    assert browser.find_element(By.ID, "description").text == EDITED
    read = sdk.script(READ_BACK, URN=ORDERS).stdout.strip()
    assert read == EDITED
    with catalog.http() as http:  # the change log names the person who signed in
        aspect = http.get(f"/openapi/v3/entity/dataset/{quote(ORDERS, safe='')}/editableDatasetProperties").json()
    assert aspect["value"]["description"] == EDITED


def test_compare_two_versions_in_history(browser, catalog: Metaledger, artifacts: Path):
    from selenium.webdriver.common.by import By

    browser.get(catalog.url + page_url(ORDERS, "Documentation"))
    box = browser.find_element(By.ID, "description-input")
    box.clear()
    box.send_keys(EDITED_TWICE)
    button = browser.find_element(By.CSS_SELECTOR, ".edit-description button")
    submitted(browser, button, lambda url: url == catalog.url + page_url(ORDERS, "Documentation"))
    browser.get(
        catalog.url + page_url(ORDERS, "History") + "?aspect=editableDatasetProperties&from=2&to=3"
    )  # 1: the SDK's
    diff = browser.find_element(By.CSS_SELECTOR, "table.diff-paths").text
    assert "description" in diff and EDITED in diff and EDITED_TWICE in diff, diff
    shot(browser, artifacts, "10-dataset-history")


def test_stats_tokens_and_operations_pages(browser, catalog: Metaledger, artifacts: Path):
    from selenium.webdriver.common.by import By

    browser.get(catalog.url + page_url(ORDERS, "Stats"))
    assert "no profiles" in browser.find_element(By.TAG_NAME, "main").text
    shot(browser, artifacts, "11-dataset-stats")
    browser.get(catalog.url + "/settings/tokens")
    assert browser.find_element(By.TAG_NAME, "h1").text
    shot(browser, artifacts, "12-tokens")
    browser.get(catalog.url + "/operations")  # an admin's session
    assert "Readiness" in browser.find_element(By.TAG_NAME, "main").text
    shot(browser, artifacts, "13-operations")


def test_roll_back_a_run_after_its_preview(browser, catalog: Metaledger, artifacts: Path):
    from selenium.webdriver.common.by import By

    run = f"{RUN}-staging-run"
    browser.get(catalog.url + "/runs")
    browser.find_element(By.LINK_TEXT, run).click()
    arrived(browser, lambda url: url.endswith("/runs/" + run))
    shot(browser, artifacts, "14-run")
    browser.get(catalog.url + f"/runs/{run}/rollback")
    assert "staging" in browser.find_element(By.TAG_NAME, "main").text  # the preview names what it would undo
    shot(browser, artifacts, "15-rollback-preview")
    with catalog.http() as http:  # the preview changed nothing
        assert http.get(f"/openapi/v3/entity/dataset/{quote(STAGING, safe='')}/datasetProperties").status_code == 200
    browser.find_element(By.CSS_SELECTOR, "form.roll-back button").click()
    arrived(browser, lambda url: f"/runs/{run}?done=" in url)
    assert "Rolled back" in browser.find_element(By.TAG_NAME, "main").text
    shot(browser, artifacts, "16-rolled-back")
    with catalog.http() as http:
        assert http.get(f"/openapi/v3/entity/dataset/{quote(STAGING, safe='')}/datasetProperties").status_code == 404


def test_phone_width(browser, catalog: Metaledger, artifacts: Path):
    from selenium.webdriver.common.by import By

    browser.set_window_size(390, 844)
    try:
        browser.get(catalog.url + "/search?query=" + RUN)
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= 390, f"the search page scrolls sideways on a phone: {width}px"
        driver_shot_phone(browser, artifacts, "17-phone-search")
        browser.get(catalog.url + page_url(ORDERS))
        assert browser.find_element(By.ID, "schema-table").is_displayed()
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= 390, (
            f"the dataset page scrolls sideways on a phone: {width}px (its table scrolls, not the page)"
        )
        driver_shot_phone(browser, artifacts, "18-phone-dataset")
    finally:
        browser.set_window_size(1280, 800)


def driver_shot_phone(driver, artifacts: Path, name: str) -> None:
    violations = serious_violations(driver)
    assert not violations, f"{name}: {driver.current_url}\n" + "\n".join(violations)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(390, max(min(height + 140, 3000), 844))
    driver.save_screenshot(str(artifacts / f"{name}.png"))
    driver.set_window_size(390, 844)


def test_keyboard_reaches_the_search_box_and_the_results(browser, catalog: Metaledger):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(catalog.url + "/search?query=" + RUN)
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)  # the skip link first
    assert browser.switch_to.active_element.text == "Skip to content"
    reached = []
    for _ in range(4):  # the skip link, the brand, then the search box
        browser.switch_to.active_element.send_keys(Keys.TAB)
        reached.append(browser.switch_to.active_element.get_attribute("id") or browser.switch_to.active_element.text)
    assert "top-query" in reached[:2], reached
    for control in browser.find_elements(By.CSS_SELECTOR, "input:not([type=hidden]), textarea"):
        label = browser.find_elements(By.CSS_SELECTOR, f"label[for='{control.get_attribute('id')}']")
        assert label, f"{control.get_attribute('outerHTML')} has no label"


def test_a_readers_session_shows_no_edit_control_and_its_forged_post_is_refused(
    browser, catalog: Metaledger, artifacts: Path
):
    from selenium.webdriver.common.by import By

    browser.find_element(By.CSS_SELECTOR, "form[action='/logout'] button").click()
    arrived(browser, lambda url: url.endswith("/login"))
    env = {"METALEDGER_DATABASE_URL": catalog.database_url, "METALEDGER_KAFKA_BOOTSTRAP_SERVERS": ""}
    reader = service_token(env, actor=f"urn:li:corpuser:{RUN}-reader", role="reader")
    sign_in(browser, catalog, reader)
    assert browser.find_element(By.CSS_SELECTOR, ".who .role").text == "reader"
    for tab in ("Documentation", "Schema"):
        browser.get(catalog.url + page_url(ORDERS, tab))
        assert not browser.find_elements(By.CSS_SELECTOR, "form[action='/web/description']")
        assert not browser.find_elements(By.CSS_SELECTOR, "details.edit")
    shot(browser, artifacts, "19-reader-dataset")
    # the form a writer's page would have, sent from the reader's own page with the reader's own CSRF token
    status = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const csrf = document.querySelector("form[action='/logout'] input[name=csrf_token]").value;
        const body = new URLSearchParams({csrf_token: csrf, urn: arguments[0], description: "forged"});
        fetch("/web/description", {method: "POST", body}).then(r => done(r.status));
        """,
        ORDERS,
    )
    assert status == 403
    browser.get(catalog.url + page_url(ORDERS, "Documentation"))
    assert browser.find_element(By.ID, "description").text == EDITED_TWICE  # the last writer's edit stands
    assert re.search("forged", browser.page_source) is None
