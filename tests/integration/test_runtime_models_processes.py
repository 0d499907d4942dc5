"""Issue 28's proof on real processes: `metaledger serve --workers 2` on the Kafka-protocol broker (Avro values, the
registry metaledger serves). An admin applies a new aspect of `dataset` and a new entity type through the API; within
5 s every API worker accepts writes of both and serves their v3 routes and OpenAPI document. An incompatible change is
refused naming the field and the rule. No process is restarted. One service start for all of it.

Not here yet: the background process publishing the new aspects' change logs as Avro on the broker. Checked here, it
failed in one run of three (no change log on the topic within 20 s, nothing in the service's log): being found."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import orjson

from app.embedded_pg import free_port
from tests.client.conftest import kafka_service_env
from tests.helpers import unique_topics
from tests.integration.test_runtime_models import DATASET, MODEL_SET, MODELS, RATING, with_rating
from tests.processes import SYSTEM_AUTH, start_service, stop_process, wait_healthy

TAKE_UP_S = 5.0  # the issue's bound: every worker accepts the new models within it
ROUND = 12  # requests per round, each on a connection of its own: both workers answer some (2^-11 that one does not)


async def fresh(base: str, method: str, path: str, **kwargs) -> httpx.Response:
    """One request on a new connection: the two API processes share the port, the kernel picks one per connection."""
    async with httpx.AsyncClient(base_url=base, headers=SYSTEM_AUTH, timeout=30) as http:
        return await http.request(method, path, **kwargs)


async def every_worker(requests: list) -> float:
    """Seconds until a whole round of `requests` (each sent ROUND / len(requests) times on fresh connections) all
    succeeded; fails past TAKE_UP_S."""
    started = time.monotonic()
    while True:
        answers = await asyncio.gather(*(request() for request in requests for _ in range(ROUND // len(requests))))
        if all(a.status_code in (200, 201) for a in answers):
            return time.monotonic() - started
        assert time.monotonic() - started < TAKE_UP_S, [(a.status_code, a.text[:200]) for a in answers if a.status_code >= 300]
        await asyncio.sleep(0.1)


async def test_serve_two_workers_take_up_runtime_models(make_database, migrated_template, kafka_broker, tmp_path):
    database_url = make_database(template=migrated_template)
    topics = unique_topics()
    tag = uuid.uuid4().hex[:8]
    audit_topic = f"mae5_{tag}.{{entity}}.{{aspect}}"
    env = kafka_service_env(database_url, kafka_broker.bootstrap_servers, topics)
    env.update({
        "METALEDGER_MODEL_REFRESH_S": "0.5",
        # dataset's existing status pair at start; the runtime aspect's pair joins when the set is taken up
        "METALEDGER_EVENTS_V5_ROUTES": orjson.dumps([{"entityTypes": ["dataset"], "aspects": ["status", "acmeRating"],
                                                      "auditTopic": audit_topic}]).decode(),
        "METALEDGER_EVENTS_V5_CHANGE_TOPIC": f"mce5_{tag}.{{entity}}.{{aspect}}",
        "METALEDGER_EVENTS_V5_FAILED_TOPIC": f"fmce5_{tag}.{{entity}}.{{aspect}}",
    })
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "metaledger.log"
    supervisor = start_service(env, port, workers=2, log=log)
    try:
        await wait_healthy(base, 90, supervisor)
        applied = await fresh(base, "POST", MODELS, json=MODEL_SET)
        assert applied.status_code == 200, applied.text

        widget = f"urn:li:acmeWidget:w{tag}"
        taken_up = await every_worker([
            lambda: fresh(base, "POST", f"/openapi/v3/entity/dataset/{DATASET}/acmeRating",
                          params={"createIfNotExists": "false"}, json={"value": {"stars": 4}}),
            lambda: fresh(base, "POST", "/openapi/v3/entity/acmeWidget", params={"async": "false"},
                          json=[{"urn": widget, "acmeRating": {"value": {"stars": 5}}}]),
            lambda: fresh(base, "GET", f"/openapi/v3/entity/acmeWidget/{widget}"),
        ])
        assert taken_up < TAKE_UP_S
        for _ in range(4):  # the OpenAPI document of each worker
            document = (await fresh(base, "GET", "/openapi.json")).json()
            assert "/openapi/v3/entity/acmeWidget/{urn}" in document["paths"]
            assert any("acmeRating" in name.lower() or "AcmeRating" in name for name in document["components"]["schemas"])

        refused = await fresh(base, "POST", MODELS, json=with_rating(
            fields=[{"name": "stars", "type": "string"}, RATING["fields"][1]]))
        assert refused.status_code == 400, refused.text
        issue = refused.json()["issues"][0]
        assert issue["message"].startswith("TypeChanged") and issue["path"] == "$.fields.stars.type"
        assert supervisor.poll() is None
    except BaseException:
        print("\n".join(line for line in log.read_text(errors="replace").splitlines()
                        if '"level":"INFO"' not in line)[-8000:])
        raise
    finally:
        stop_process(supervisor)
