"""The web view's Lineage tab (app.web.lineage_graph) drawing a neighbourhood of about 500 entities, in Debian's
headless Chromium (issue 42: a 500-node lineage neighbourhood drawn in at most 1 s).

    .venv/bin/python bench/web_lineage.py [--runs 7] [--upstream 6,5,3] [--downstream 8,6,7] [--screenshots DIR]

A throwaway Postgres and metaledger (bench/harness.py: one process, the embedded Postgres search backend) with a
neighbourhood around one dataset written through `/openapi/v1/proposals` (the sync-index header): a fan-in of
`--upstream` entities per entity and hop (6, 5, 3: 6 + 30 + 90 upstream over 3 hops) and a fan-out of `--downstream`
(8, 6, 7: 8 + 48 + 336 downstream), on a few platforms, with a cross edge from every fourth entity of the last hops
to a second parent, and a column-level edge (fineGrainedLineages) along every edge. Every dataset has
datasetProperties (a name) and an upstreamLineage.

Chromium (`/usr/bin/chromium` and `/usr/bin/chromedriver` through Selenium, 1280×800) signs in with the writer's
token, then opens the tab `--runs` times per variant (after one warm-up): the default (auto: grouped by platform past
150 entities), every entity drawn (`collapse=none`), and every entity with its column-level edges. Printed per
variant: the nodes and edges drawn, the page's bytes, and p50/max of
- drawn: navigation start to the `lineage-drawn` mark (app/web/static/lineage.js sets it in the first animation frame
  after it has set the graph up: the page parsed, laid out, its script run, the graph on screen);
- received, parsed: navigation start to the page's last byte, and to the document parsed (domInteractive);
- load: navigation start to the load event's end;
- server: the page's server time, as the browser's Navigation Timing sees it (requestStart to responseStart), and as
  a client on loopback sees it (httpx with the same session cookie: the full answer);
- CPU per page: the CPU time the browser's processes spent on one page (navigation to drawn), and the service's and
  its Postgres's per page (the httpx requests): on a busy machine the times above wait for a CPU, these do not.
The load average is printed with each variant: the machine's other work shows in the times.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Service, throwaway_service  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SYNC = {"X-DataHub-Sync-Index-Update": "true"}
PLATFORMS_UP = ("snowflake", "postgres", "s3", "kafka")
PLATFORMS_DOWN = ("hive", "bigquery", "hive", "looker")
CENTER = "urn:li:dataset:(urn:li:dataPlatform:hive,bench.center,PROD)"


def dataset(platform: str, name: str) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:{platform},{name},PROD)"


def field(urn: str, path: str) -> str:
    return f"urn:li:schemaField:({urn},{path})"


def neighbourhood(up: list[int], down: list[int]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(urn -> name, downstream urn -> its upstream urns): a fan-in of `up[h]` per entity at hop h+1 upstream and a
    fan-out of `down[h]` downstream, with a cross edge from every fourth entity past the first hop."""
    names = {CENTER: "center"}
    parents: dict[str, list[str]] = {}
    for side, fans, platforms in (("up", up, PLATFORMS_UP), ("down", down, PLATFORMS_DOWN)):
        level = [CENTER]
        for hop, fan in enumerate(fans, start=1):
            following: list[str] = []
            for i, near in enumerate(level):
                for k in range(fan):
                    name = f"bench.{side}{hop}_{i}_{k}"
                    urn = dataset(platforms[(hop + k) % len(platforms)] if hop > 1 else platforms[0], name)
                    names[urn] = name
                    if side == "up":
                        parents.setdefault(near, []).append(urn)
                    else:
                        parents.setdefault(urn, []).append(near)
                    if hop > 1 and len(following) % 4 == 3 and len(level) > 1:
                        other = level[(i + 1) % len(level)]
                        if side == "up":
                            parents.setdefault(other, []).append(urn)
                        else:
                            parents[urn].append(other)
                    following.append(urn)
            level = following
    return names, parents


def proposals(names: dict[str, str], parents: dict[str, list[str]]) -> list[dict]:
    def proposal(urn: str, aspect: str, value: dict) -> dict:
        return {"entityType": "dataset", "entityUrn": urn, "changeType": "UPSERT", "aspectName": aspect,
                "aspect": {"contentType": "application/json", "value": orjson.dumps(value).decode()}}  # fmt: skip

    out = [proposal(urn, "datasetProperties", {"name": name}) for urn, name in names.items()]
    for urn, ups in parents.items():
        fine = [
            {"upstreamType": "FIELD_SET", "upstreams": [field(u, "id")], "downstreamType": "FIELD",
             "downstreams": [field(urn, "id")]}
            for u in ups
        ]  # fmt: skip
        value = {"upstreams": [{"dataset": u, "type": "TRANSFORMED"} for u in ups], "fineGrainedLineages": fine}
        out.append(proposal(urn, "upstreamLineage", value))
    return out


def load(base: str, headers: dict[str, str], body: list[dict]) -> float:
    started = time.perf_counter()
    with httpx.Client(base_url=base, headers={**headers, **SYNC}, timeout=600) as http:
        for start in range(0, len(body), 500):
            http.post("/openapi/v1/proposals", content=orjson.dumps(body[start : start + 500])).raise_for_status()
    return time.perf_counter() - started


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def sign_in(driver, base: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(base + "/login?next=/search")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "form[action='/login'] button").click()
    deadline = time.monotonic() + 30
    while not driver.current_url.startswith(base + "/search"):
        if time.monotonic() > deadline:
            raise SystemExit(f"signing in failed: at {driver.current_url}")
        time.sleep(0.05)


TIMING = """
const done = arguments[arguments.length - 1];
function check() {
  const drawn = performance.getEntriesByName("lineage-drawn")[0];
  const nav = performance.getEntriesByType("navigation")[0];
  if (!drawn || !nav || !nav.loadEventEnd) { setTimeout(check, 10); return; }
  done({drawn: drawn.startTime, load: nav.loadEventEnd, server: nav.responseStart - nav.requestStart,
        received: nav.responseEnd, parsed: nav.domInteractive,
        bytes: nav.transferSize, nodes: document.querySelectorAll("#lineage-svg .lg-node").length,
        edges: document.querySelectorAll("#lineage-svg path[data-from]").length});
}
check();
"""


def summary(values: list[float]) -> str:
    return f"p50 {statistics.median(values):.0f} ms, max {max(values):.0f} ms"


def browser_cpu_seconds(driver) -> float:
    """CPU time (user + system) of the browser's processes so far (chromedriver's children: the browser, its
    renderer and GPU processes)."""
    total = 0.0
    for p in psutil.Process(driver.service.process.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            times = p.cpu_times()
            total += times.user + times.system
    return total


def measure(driver, service: Service, path: str, runs: int, screenshot: Path | None) -> None:
    base = service.base
    driver.set_script_timeout(60)
    driver.get(base + path)  # warm-up: the static files cached, the server's first-query plans made
    driver.execute_async_script(TIMING)
    seen: list[dict] = []
    browser_cpu: list[float] = []
    for _ in range(runs):
        before = browser_cpu_seconds(driver)
        driver.get(base + path)
        seen.append(driver.execute_async_script(TIMING))
        browser_cpu.append((browser_cpu_seconds(driver) - before) * 1000)
    if screenshot is not None:
        driver.save_screenshot(str(screenshot))
    cookie = {"metaledger_session": driver.get_cookie("metaledger_session")["value"]}
    loopback: list[float] = []
    server_cpu = service.cpu_seconds() + service.postgres_cpu_seconds()
    with httpx.Client(base_url=base, cookies=cookie, timeout=60) as http:
        for _ in range(runs):
            started = time.perf_counter()
            http.get(path).raise_for_status()
            loopback.append((time.perf_counter() - started) * 1000)
    server_cpu = (service.cpu_seconds() + service.postgres_cpu_seconds() - server_cpu) * 1000 / runs
    last = seen[-1]
    print(
        f"  {last['nodes']} nodes, {last['edges']} edges drawn, {last['bytes'] / 1000:.0f} kB\n"
        f"  received: {summary([s['received'] for s in seen])}; parsed: {summary([s['parsed'] for s in seen])}\n"
        f"  drawn:  {summary([s['drawn'] for s in seen])}\n"
        f"  load:   {summary([s['load'] for s in seen])}\n"
        f"  server: {summary([s['server'] for s in seen])} (Navigation Timing); {summary(loopback)} (httpx)\n"
        f"  CPU per page: browser {summary(browser_cpu)}; server {server_cpu:.0f} ms (service and Postgres, mean)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--upstream", default="6,5,3", help="fan-in per entity at each upstream hop")
    parser.add_argument("--downstream", default="8,6,7", help="fan-out per entity at each downstream hop")
    parser.add_argument("--screenshots", type=Path, help="a directory for a screenshot of each variant")
    args = parser.parse_args()
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        raise SystemExit("Debian's chromium and chromedriver are needed: make chromium-bin")
    up = [int(n) for n in args.upstream.split(",")]
    down = [int(n) for n in args.downstream.split(",")]
    names, parents = neighbourhood(up, down)
    hops = max(len(up), len(down))
    edges = sum(len(p) for p in parents.values())
    if args.screenshots:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    with throwaway_service() as service:
        seconds = load(service.base, service.headers, proposals(names, parents))
        print(f"load: {len(names) - 1} entities around one, {edges} edges, {hops} hops, in {seconds:.1f}s", flush=True)
        driver = browser()
        try:
            sign_in(driver, service.base, service.headers["authorization"].removeprefix("Bearer "))
            tab = f"/dataset/{quote(CENTER, safe='')}/Lineage?hops={hops}"
            for label, query in (
                ("default (grouped by platform past 150 entities)", ""),
                ("every entity (collapse=none)", "&collapse=none"),
                ("every entity with column-level edges (collapse=none&columns=1)", "&collapse=none&columns=1"),
            ):
                print(f"{label}, {args.runs} runs (load average {os.getloadavg()[0]:.1f}):", flush=True)
                shot = (
                    args.screenshots / f"lineage{query.replace('&', '_').replace('=', '-')}.png"
                    if args.screenshots
                    else None
                )
                measure(driver, service, tab + query, args.runs, shot)
        finally:
            driver.quit()
        problems = service.log_problems()
        if problems:
            print(f"service log: {problems}")


if __name__ == "__main__":
    main()
