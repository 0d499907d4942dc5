"""Authentication, actor attribution and authorization: every route's policy (walked from the app itself, so a new
route without one fails here), tokens (issued, expired, revoked — on a second process too), the system client and
impersonation, write policies, admin-only deletes, the schema registry's open reads, and the docs."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import jwt
import orjson
import pytest
from fastapi.routing import iter_route_contexts

from app.api.entities import expanded
from app.auth.model import Permission
from app.embedded_pg import free_port
from app.main import create_app
from app.settings import Settings
from tests.helpers import TEST_ACTOR, mcp, mint_token
from tests.processes import start_service, stop_process, wait_healthy

URN = "urn:li:dataset:(urn:li:dataPlatform:hive,auth.orders,PROD)"
ALICE = "urn:li:corpuser:alice"


def routes_with_policies(app) -> list[tuple[str, str, Permission | None]]:
    """(method, path, the permission its policy needs) for every HTTP route of the app, the included routers'
    (as FastAPI serves them, with their router's dependencies) and the app's own (docs)."""
    found = []

    def walk(route) -> None:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is not None:  # an included router (FastAPI ≥ 0.160 includes lazily)
            for context in contexts():
                walk(context)
            return
        dependant = getattr(route, "dependant", None)
        if dependant is None:
            return  # the static docs assets (a Mount)
        # A router's policy and a route's own may both apply (the registry's admin routes): the strictest counts.
        policies = {d.call: d.call.permission for d in _flatten(dependant) if hasattr(d.call, "permission")}
        assert policies, f"{route.path} {sorted(route.methods)} declares no policy"
        strictest = max(policies.values(), key=lambda p: 0 if p.value is None else p.value)
        for method in sorted(route.methods):
            found.append((method, route.path, strictest))

    for route in expanded(app.router.routes):  # every entity type's routes too, made here if they were not
        walk(route)
    return found


def web_routes(app) -> set[tuple[str, str]]:
    """(method, path) of the web view's routes (app.web): their policies say `web`, a session (a cookie) allows them,
    and a bearer token never does (the pages answer as their own kind: a redirect to sign in, or a 403 page)."""
    found = set()
    for context in iter_route_contexts(expanded(app.router.routes)):
        dependant = getattr(context, "dependant", None)
        if dependant is not None and any(getattr(d.call, "web", False) for d in _flatten(dependant)):
            found.update((method, context.path) for method in context.methods or ())
    return found


def _flatten(dependant):
    for dependency in dependant.dependencies:
        yield dependency
        yield from _flatten(dependency)


SAMPLE_PARAMS = {
    "entity_name": "dataset",
    "entityName": "dataset",
    "urn": URN,
    "aspect_name": "status",
    "aspectName": "status",
    "aspect": "status",
    "subject": "auth-test-value",
    "version": "1",
    "schema_id": "1",
    "rest": "nothing-here",
    "token_id": "0" * 32,
    "policy_id": "0" * 32,
    "run_id": "auth-test-run",
    "traceId": "0" * 32,
}


def concrete(path: str) -> str:
    return re.sub(r"\{(\w+)(?::path)?\}", lambda m: SAMPLE_PARAMS[m.group(1)], path)


# The v3 entity routes are one declaration per entity type (app.api.entities): each has its policy (checked above for
# all of them), and a few types' routes are enough to prove the policies are enforced.
ENFORCED_ENTITY_TYPES = ("dataset", "tag", "schemaField")


def _enforcement_sample(path: str) -> bool:
    if not path.startswith("/openapi/v3/entity/"):
        return True
    entity = path.removeprefix("/openapi/v3/entity/").split("/", 1)[0]
    return entity in ENFORCED_ENTITY_TYPES or entity.startswith("{") or entity == "scroll"


async def test_every_route_declares_a_policy_and_enforces_it(app, anonymous, client):
    every_route = routes_with_policies(app)  # each declares a policy, or this fails
    # Tracing a write reads what it traces: a reader's (DataHub's TraceController checks READ on the URNs).
    assert ("POST", "/openapi/v1/trace/write/{traceId}", Permission.READ) in every_route
    assert len(every_route) > 500
    routes = [r for r in every_route if _enforcement_sample(r[1])]
    reader = {"Authorization": f"Bearer {await mint_token(app, 'reader', ALICE)}"}
    writer = {"Authorization": f"Bearer {await mint_token(app, 'writer', ALICE)}"}
    public = set()
    web = web_routes(app)
    assert {("GET", "/search"), ("GET", "/dataset/{rest:path}"), ("POST", "/web/description")} <= web
    for method, path, permission in routes:
        url = concrete(path)
        body = {} if method in ("POST", "PUT", "PATCH") else None
        response = await anonymous.request(method, url, json=body)
        if (method, path) in web:
            # a page without a session: redirected to sign in (GET) or refused (a form's POST), with or without a
            # bearer token; the sign-in form itself is open
            for headers in ({}, reader, writer):
                response = await anonymous.request(method, url, data={}, headers=headers)
                if permission is Permission.PUBLIC:  # the sign-in form (its POST checks the form's CSRF token)
                    assert response.status_code == (200 if method == "GET" else 403), f"{method} {path}"
                elif method == "GET":
                    assert response.status_code == 303, f"{method} {path} without a session: {response.status_code}"
                    assert response.headers["location"].startswith("/login?next=/")
                else:
                    assert response.status_code == 403, f"{method} {path} without a session: {response.status_code}"
            continue
        registry_read = path.startswith("/schema-registry/") and permission is Permission.READ
        if permission is Permission.PUBLIC or registry_read:
            assert response.status_code != 401, f"{method} {path} is public but answered 401"
            public.add(path)
            continue
        assert response.status_code == 401, f"{method} {path} without credentials: {response.status_code}"
        assert response.headers["www-authenticate"].startswith("Bearer")
        if permission in (Permission.WRITE, Permission.ADMIN):
            refused = await anonymous.request(method, url, json=body, headers=reader)
            assert refused.status_code == 403, f"{method} {path} as a reader: {refused.status_code}"
            assert permission.name in refused.json()["message"]
        if permission is Permission.ADMIN:
            refused = await anonymous.request(method, url, json=body, headers=writer)
            assert refused.status_code == 403, f"{method} {path} as a writer: {refused.status_code}"
        if permission is Permission.READ:
            allowed = await anonymous.request(method, url, json=body, headers=reader)
            assert allowed.status_code not in (401, 403), f"{method} {path} as a reader: {allowed.status_code}"
    assert {"/health", "/config"} <= public
    assert not any(p.startswith("/openapi/") for p in public), "no data route is public"


async def test_unauthenticated_requests_learn_nothing_about_what_exists(client, anonymous):
    assert (
        await client.post("/openapi/v1/proposals", json=[mcp("status", {"removed": False}, URN)])
    ).status_code == 200
    missing = URN.replace("orders", "nothing")
    answers = [await anonymous.get(f"/openapi/v3/entity/dataset/{urn}") for urn in (URN, missing)] + [
        await anonymous.head(f"/openapi/v3/entity/dataset/{urn}") for urn in (URN, missing)
    ]
    assert {r.status_code for r in answers} == {401}
    assert answers[0].json() == answers[1].json()


@pytest.mark.parametrize(
    ("authorization", "reason"),
    [
        ("Bearer not-a-token", "not valid"),
        (
            "Bearer " + jwt.encode({"iss": "metaledger", "sub": ALICE, "jti": "x" * 32}, "another-key" * 4, "HS256"),
            "Signature verification failed",
        ),
        ("Basic __datahub_system:wrong", "system client credentials are not valid"),
        ("Digest abc", "unsupported authorization scheme"),
    ],
)
async def test_bad_credentials_are_401_with_the_reason(anonymous, authorization, reason):
    response = await anonymous.post("/openapi/v1/proposals", json=[], headers={"Authorization": authorization})
    assert response.status_code == 401, response.text
    assert reason in response.json()["message"]
    assert response.headers["www-authenticate"] == 'Bearer realm="metaledger"'


async def test_a_token_not_issued_here_is_refused_even_when_signed_with_the_key(app, anonymous):
    key = await app.state.auth.key()
    forged = jwt.encode({"iss": "metaledger", "sub": ALICE, "jti": "f" * 32, "role": "admin"}, key, "HS256")
    response = await anonymous.get("/openapi/v1/auth/me", headers={"Authorization": f"Bearer {forged}"})
    assert response.status_code == 401 and "not known" in response.json()["message"]


async def test_expired_token_is_refused(app, anonymous):
    token = await mint_token(app, "writer", ALICE, ttl="3s")
    headers = {"Authorization": f"Bearer {token}"}
    assert (await anonymous.get("/openapi/v1/auth/me", headers=headers)).status_code == 200
    await asyncio.sleep(3.1)  # the token's lifetime passing is the behaviour (3 s is the shortest a TTL says)
    app.state.auth._tokens.clear()  # past the verified-token cache, as every process is after auth_cache_seconds
    response = await anonymous.get("/openapi/v1/auth/me", headers=headers)
    assert response.status_code == 401 and "expired" in response.json()["message"]


async def test_reader_reads_but_cannot_write(app, anonymous, client):
    await client.post("/openapi/v1/proposals", json=[mcp("status", {"removed": False}, URN)])
    reader = {"Authorization": f"Bearer {await mint_token(app, 'reader', ALICE)}"}
    assert (await anonymous.get(f"/openapi/v3/entity/dataset/{URN}", headers=reader)).status_code == 200
    series = await anonymous.post(
        "/aspects?action=getTimeseriesAspectValues",
        headers=reader,
        json={"urn": URN, "entity": "dataset", "aspect": "datasetProfile"},
    )
    assert series.status_code == 200, series.text
    for method, url, body in [
        ("POST", "/openapi/v1/proposals", [mcp("status", {"removed": True}, URN)]),
        ("POST", "/aspects?action=ingestProposal", {"proposal": mcp("status", {"removed": True}, URN)}),
        ("POST", "/openapi/v3/entity/dataset?async=false", [{"urn": URN, "status": {"value": {"removed": True}}}]),
    ]:
        response = await anonymous.request(method, url, json=body, headers=reader)
        assert response.status_code == 403, (url, response.text)
        assert "needs the WRITE permission" in response.json()["message"]
    stored = (await client.get(f"/openapi/v3/entity/dataset/{URN}/status")).json()
    assert stored["value"] == {"removed": False}


async def test_policies_narrow_a_writer_to_entity_types_and_aspects(app, anonymous, client, db):
    created = await client.post(
        "/openapi/v1/auth/policies", json={"actor": ALICE, "entityTypes": ["dataset"], "aspects": ["globalTags"]}
    )
    assert created.status_code == 201, created.text
    alice = {"Authorization": f"Bearer {await mint_token(app, 'writer', ALICE)}"}
    tags = {"tags": [{"tag": "urn:li:tag:pii"}]}
    allowed = await anonymous.post("/openapi/v1/proposals", json=[mcp("globalTags", tags, URN)], headers=alice)
    assert allowed.status_code == 200, allowed.text

    chart = "urn:li:chart:(looker,auth)"
    refused = await anonymous.post(
        "/openapi/v1/proposals",
        headers=alice,
        json=[
            mcp("globalTags", tags, URN),
            mcp("datasetProperties", {"name": "x"}, URN),
            mcp("globalTags", tags, chart, entity="chart"),
        ],
    )
    assert refused.status_code == 403, refused.text
    issues = refused.json()["issues"]
    assert [(i["index"], i["aspect"]) for i in issues] == [(1, "datasetProperties"), (2, "globalTags")]
    assert "no write scope of urn:li:corpuser:alice grants dataset.datasetProperties" in issues[0]["message"]
    # all or nothing: the allowed first item of the refused batch was not written either
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", chart) == 0
    assert (
        await db.fetchval(
            "SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'datasetProperties'", URN
        )
        == 0
    )

    # Policies take effect within the cache time; deleting the last one gives the writer its whole role back.
    policy_id = created.json()["id"]
    assert (await client.delete(f"/openapi/v1/auth/policies/{policy_id}")).status_code == 200
    again = await anonymous.post(
        "/openapi/v1/proposals", json=[mcp("datasetProperties", {"name": "x"}, URN)], headers=alice
    )
    assert again.status_code == 200, again.text


async def test_policy_names_must_exist_in_the_registry(client):
    response = await client.post("/openapi/v1/auth/policies", json={"actor": ALICE, "aspects": ["globalTagz"]})
    assert response.status_code == 400
    assert (
        response.json()["issues"][0]["path"] == "$.aspects" and "globalTagz" in response.json()["issues"][0]["message"]
    )


async def test_deleting_whole_entities_and_references_is_admin_only(app, anonymous, client, db):
    await client.post(
        "/openapi/v1/proposals",
        json=[mcp("status", {"removed": False}, URN), mcp("globalTags", {"tags": [{"tag": "urn:li:tag:t"}]}, URN)],
    )
    writer = {"Authorization": f"Bearer {await mint_token(app, 'writer', ALICE)}"}
    for method, url, body in [
        ("DELETE", f"/openapi/v3/entity/dataset/{URN}", None),
        ("POST", "/entities?action=delete", {"urn": URN}),
        ("POST", "/entities?action=deleteReferences", {"urn": "urn:li:tag:t", "dryRun": False}),
        ("POST", "/openapi/v1/proposals", [mcp("datasetKey", None, URN, change_type="DELETE")]),
        ("POST", "/runs?action=rollback", {"runId": "r", "dryRun": False, "safe": False}),
        ("POST", "/runs?action=describe", {"runId": "r"}),
        ("POST", "/runs?action=list", {}),
    ]:
        response = await anonymous.request(method, url, json=body, headers=writer)
        assert response.status_code == 403, (url, response.text)
        assert "ADMIN" in response.text
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", URN) == 3
    # a writer deletes an aspect; an admin the entity
    aspect = await anonymous.delete(f"/openapi/v3/entity/dataset/{URN}/globalTags", headers=writer)
    assert aspect.status_code == 200, aspect.text
    assert (await client.delete(f"/openapi/v3/entity/dataset/{URN}")).status_code == 200
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", URN) == 0


async def test_the_actor_of_the_token_is_on_the_row_the_change_log_the_event_and_the_history(app, anonymous, db):
    alice = {"Authorization": f"Bearer {await mint_token(app, 'writer', ALICE)}"}
    for tag in ("urn:li:tag:a", "urn:li:tag:b"):
        response = await anonymous.post(
            "/openapi/v1/proposals", headers=alice, json=[mcp("globalTags", {"tags": [{"tag": tag}]}, URN)]
        )
        assert response.status_code == 200, response.text
    rows = await db.fetch(
        "SELECT version, createdby, systemmetadata FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'globalTags' "
        "ORDER BY version",
        URN,
    )
    assert [(r["version"], r["createdby"]) for r in rows] == [(0, ALICE), (1, ALICE)]  # latest and history
    assert orjson.loads(rows[0]["systemmetadata"])["aspectModified"]["actor"] == ALICE
    outbox = [
        orjson.loads(r["payload"])
        for r in await db.fetch("SELECT payload FROM change_log_outbox WHERE aspect = 'globalTags' ORDER BY id")
    ]
    logs = [p for p in outbox if "changeType" in p]
    events = [p for p in outbox if "changeType" not in p]
    assert [log["created"]["actor"] for log in logs] == [ALICE, ALICE]
    assert events and all(orjson.loads(e["payload"]["value"])["auditStamp"]["actor"] == ALICE for e in events)


async def test_impersonation_only_by_the_system_client(app, anonymous, db, monkeypatch):
    monkeypatch.setattr(app.state.auth.settings, "system_client_secret", "s3cret-system")
    alice = {
        "Authorization": f"Bearer {await mint_token(app, 'admin', ALICE)}",
        "X-DataHub-Actor": "urn:li:corpuser:bob",
    }
    refused = await anonymous.post(
        "/openapi/v1/proposals", json=[mcp("status", {"removed": False}, URN)], headers=alice
    )
    assert refused.status_code == 403 and "reserved for the system client" in refused.json()["message"]
    for system in ("Basic __datahub_system:s3cret-system", "Basic X19kYXRhaHViX3N5c3RlbTpzM2NyZXQtc3lzdGVt"):
        on_behalf = {"Authorization": system, "X-DataHub-Actor": "urn:li:corpuser:bob"}
        response = await anonymous.post(
            "/openapi/v1/proposals", json=[mcp("status", {"removed": False}, URN)], headers=on_behalf
        )
        assert response.status_code == 200, response.text
    assert (
        await db.fetchval(
            "SELECT createdby FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'status' AND version = 0", URN
        )
        == "urn:li:corpuser:bob"
    )
    me = await anonymous.get("/openapi/v1/auth/me", headers={"Authorization": "Basic __datahub_system:s3cret-system"})
    assert me.json() == {"actor": "urn:li:corpuser:__datahub_system", "role": "admin", "tokenId": None, "via": "system"}


async def test_token_management_over_http(client, anonymous):
    created = await client.post(
        "/openapi/v1/auth/tokens", json={"actor": ALICE, "role": "writer", "ttl": "2h", "description": "ci"}
    )
    assert created.status_code == 201, created.text
    issued = created.json()
    assert issued["actor"] == ALICE and issued["role"] == "writer"
    assert issued["expiresAt"] - issued["createdAt"] == 2 * 3600 * 1000
    headers = {"Authorization": f"Bearer {issued['token']}"}
    assert (await anonymous.get("/openapi/v1/auth/me", headers=headers)).json()["actor"] == ALICE
    listed = (await client.get("/openapi/v1/auth/tokens", params={"actor": ALICE})).json()["tokens"]
    assert [t["id"] for t in listed] == [issued["id"]] and "token" not in listed[0]
    revoked = await client.delete(f"/openapi/v1/auth/tokens/{issued['id']}")
    assert revoked.status_code == 200
    refused = await anonymous.get("/openapi/v1/auth/me", headers=headers)  # this process forgot it at once
    assert refused.status_code == 401 and "revoked" in refused.json()["message"]
    assert (await client.get("/openapi/v1/auth/tokens", params={"actor": ALICE})).json()["tokens"] == []
    bad = await client.post("/openapi/v1/auth/tokens", json={"actor": "alice", "role": "owner", "ttl": "forever"})
    assert bad.status_code == 400
    assert (await client.delete("/openapi/v1/auth/tokens/nope")).status_code == 404


async def test_a_revoked_token_is_refused_by_another_process_within_the_cache_time(app, client, database_url):
    token = await mint_token(app, "writer", ALICE)
    token_id = (await client.get("/openapi/v1/auth/me", headers={"Authorization": f"Bearer {token}"})).json()["tokenId"]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    other = start_service(
        {
            "METALEDGER_DATABASE_URL": database_url,
            "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
            "METALEDGER_AUTH_CACHE_SECONDS": "2",
        },
        port,
    )
    try:
        await wait_healthy(base, process=other)
        async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
            assert (await http.get("/openapi/v1/auth/me")).status_code == 200  # verified and cached there
            assert (await client.delete(f"/openapi/v1/auth/tokens/{token_id}")).status_code == 200  # revoked here
            revoked_at = time.monotonic()
            while (status := (await http.get("/openapi/v1/auth/me")).status_code) == 200:
                assert time.monotonic() - revoked_at < 2.5, "the other process still accepts the revoked token"
                await asyncio.sleep(0.05)
            assert status == 401
    finally:
        stop_process(other)


async def test_cli_issues_a_token_on_its_last_line(app, anonymous, database_url):
    from tests.processes import issue_token

    token = await asyncio.to_thread(issue_token, {"METALEDGER_DATABASE_URL": database_url}, ALICE, "reader", "1d")
    me = await anonymous.get("/openapi/v1/auth/me", headers={"Authorization": f"Bearer {token}"})
    assert me.status_code == 200 and me.json()["actor"] == ALICE and me.json()["role"] == "reader"


async def test_first_start_prints_one_admin_token_and_only_its_hash_is_stored(database_url, registry, db, capsys):
    settings = Settings(database_url=database_url, apply_migrations_on_start=False)
    for start in (1, 2):
        application = create_app(settings, registry)
        async with application.router.lifespan_context(application):
            printed = capsys.readouterr().err
            if start == 2:
                assert "first admin token" not in printed
                continue
            token = re.search(r"^\s+(\S+\.\S+\.\S+)$", printed, re.M).group(1)
            assert "DATAHUB_GMS_TOKEN=<token> datahub" in printed
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://m") as http:
                me = await http.get("/openapi/v1/auth/me", headers={"Authorization": f"Bearer {token}"})
            assert me.json()["actor"] == TEST_ACTOR and me.json()["role"] == "admin"
    stored = await db.fetch("SELECT * FROM auth_token")
    assert len(stored) == 1 and stored[0]["expires_at"] is None
    assert token not in repr(dict(stored[0]))  # only the SHA-256 of it


@pytest.mark.parametrize("settings_overrides", [{"auth_enabled": False}])
async def test_auth_can_be_turned_off_for_a_trusted_loopback_setup(anonymous, db):
    response = await anonymous.post("/openapi/v1/proposals", json=[mcp("status", {"removed": False}, URN)])
    assert response.status_code == 200
    assert await db.fetchval("SELECT createdby FROM metadata_aspect_v2 WHERE aspect = 'status'") == TEST_ACTOR


async def test_schema_registry_reads_are_open_and_changes_need_an_admin(app, anonymous, client):
    registry = "/schema-registry/api"
    assert (await anonymous.get(f"{registry}/subjects")).status_code == 200
    assert (await anonymous.get(f"{registry}/schemas/ids/4")).status_code == 200
    datahub_schema = (await anonymous.get(f"{registry}/schemas/ids/4")).json()["schema"]
    # re-registering what the subject has is a lookup (Confluent's serializers do it): open
    again = await anonymous.post(
        f"{registry}/subjects/PlatformEvent_v1-value/versions", json={"schema": datahub_schema}
    )
    assert again.status_code == 200 and again.json() == {"id": 4}
    new = orjson.dumps({"type": "record", "name": "AuthTest", "fields": [{"name": "a", "type": "string"}]}).decode()
    refused = await anonymous.post(f"{registry}/subjects/auth-test-value/versions", json={"schema": new})
    assert refused.status_code == 401 and refused.json()["error_code"] == 401
    reader = {"Authorization": f"Bearer {await mint_token(app, 'reader', ALICE)}"}
    forbidden = await anonymous.post(
        f"{registry}/subjects/auth-test-value/versions", json={"schema": new}, headers=reader
    )
    assert forbidden.status_code == 403 and "ADMIN" in forbidden.json()["message"]
    assert (await anonymous.put(f"{registry}/config", json={"compatibility": "NONE"})).status_code == 401
    assert (await client.post(f"{registry}/subjects/auth-test-value/versions", json={"schema": new})).status_code == 200


@pytest.mark.parametrize("settings_overrides", [{"schema_registry_open_read": False}])
async def test_schema_registry_reads_can_require_a_token(anonymous, client):
    assert (await anonymous.get("/schema-registry/api/subjects")).status_code == 401
    assert (await client.get("/schema-registry/api/subjects")).status_code == 200


@pytest.mark.parametrize("settings_overrides", [{"auth_public_docs": False}])
async def test_docs_follow_the_policy(anonymous, client):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert (await anonymous.get(path)).status_code == 401
        assert (await client.get(path)).status_code == 200
    spec = (await client.get("/openapi.json")).json()
    assert spec["security"] == [{"bearerAuth": []}]
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"


async def test_docs_are_public_by_default(anonymous):
    assert (await anonymous.get("/openapi.json")).status_code == 200
    assert (await anonymous.get("/docs")).status_code == 200
