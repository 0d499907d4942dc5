"""A request body is read after the route's policy, by one bounded parser (app.api.http.read_json), through the
route's one declaration of its body (app.api.deps.DeclaredBody: it parses and documents it): no route lets FastAPI
read its body first (it would, for a body it parses itself, before any dependency and with no bound: an anonymous
42 MB body took a worker from 193 MB to 1.27 GB before its 401), nor declares a body a second time in its OpenAPI
declaration. Held on a real `metaledger serve`: large anonymous bodies are answered 401 and cost the API process no
memory; an admin's are 413 or 400."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from app.api.deps import DeclaredBody
from app.api.entities import expanded
from app.embedded_pg import free_port
from tests.integration.test_request_heads import rss_mb
from tests.processes import service_token, start_service, stop_process, wait_healthy

# The routes whose body FastAPI parsed for them before this was fixed, and routes whose body was read by hand then.
BODY_ROUTES = [
    "/openapi/v1/models",
    "/openapi/v1/auth/tokens",
    "/openapi/v1/auth/policies",
    "/openapi/v1/trace/write/" + "0" * 32,
    "/openapi/v3/entity/scroll",
    "/openapi/v3/entity/dataset",
    "/openapi/v1/proposals",
    "/aspects?action=ingestProposalBatch",
    "/api/graphql",
    "/openapi/openlineage/api/v1/lineage",
]
BODY_MB = 24
CHUNK = 1 << 20


def _in_call_order(dependant):
    """The dependencies of `dependant` in the order FastAPI calls them: each one's own before it."""
    for dependency in dependant.dependencies:
        yield from _in_call_order(dependency)
        yield dependency


def test_no_route_has_its_body_read_before_its_policy_or_declared_twice(app):
    """FastAPI reads a body it parses itself (a pydantic parameter, `Body()`) before it solves any dependency: every
    body is a `DeclaredBody` dependency, called after the route's policy, and documented by it alone (a `requestBody`
    in `openapi_extra` would be a second declaration, which nothing keeps in step with the parsing)."""
    parsed_by_fastapi, declared_twice, read_first, declared_bodies = [], [], [], set()
    for context in iter_route_contexts(expanded(app.router.routes)):
        dependant = getattr(context, "dependant", None)
        if dependant is None:
            continue
        route = f"{sorted(context.methods)} {context.path_format}"
        if getattr(context, "body_field", None) is not None:
            parsed_by_fastapi.append(route)
        if "requestBody" in (context.openapi_extra or {}):
            declared_twice.append(route)
        calls = [d.call for d in _in_call_order(dependant)]
        bodies = [i for i, call in enumerate(calls) if isinstance(call, DeclaredBody)]
        if bodies:
            declared_bodies.add(context.path_format)
            policies = [i for i, call in enumerate(calls) if hasattr(call, "permission")]
            if not policies or policies[0] > bodies[0]:
                read_first.append(route)
    assert parsed_by_fastapi == []
    assert declared_twice == []
    assert read_first == []
    assert {
        "/openapi/v1/models",
        "/openapi/v1/auth/tokens",
        "/openapi/v1/trace/write/{traceId}",
        "/openapi/v3/entity/scroll",
        "/openapi/v1/proposals",
        "/api/graphql",
        "/openapi/openlineage/api/v1/lineage",
        "/api/v1/lineage",
        "/aspects",
        "/entities",
        "/runs",
        "/openapi/v3/entity/dataset",
        "/openapi/v3/entity/dataset/batchGet",
        "/openapi/v3/entity/dataset/{urn}/{aspectName}",
    } <= declared_bodies


def test_the_document_declares_each_json_body_by_its_model(app):
    document = app.openapi()
    for path, model in [
        ("/openapi/v1/auth/tokens", "TokenRequest"),
        ("/openapi/v1/models", "ModelSet"),
        ("/openapi/v1/trace/write/{traceId}", "TraceRequest"),
        ("/openapi/v3/entity/scroll", "ScrollEntitiesBody"),
    ]:
        body = document["paths"][path]["post"]["requestBody"]
        assert body["required"] is True
        assert body["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model}"}
        assert model in document["components"]["schemas"]


def test_the_document_declares_each_other_body_by_its_schema(app):
    """The bodies that are no pydantic model: a registry component, or a schema of their own."""
    document = app.openapi()

    def schema(path: str, method: str = "post") -> dict:
        body = document["paths"][path][method]["requestBody"]
        assert body["required"] is True
        return body["content"]["application/json"]["schema"]

    def array_of(component: str) -> dict:
        return {"type": "array", "items": {"$ref": f"#/components/schemas/{component}"}}

    assert schema("/openapi/v3/entity/dataset") == array_of("DatasetEntityRequest")
    assert schema("/openapi/v3/entity/dataset", "patch") == array_of("DatasetEntityPatchRequest")
    assert schema("/openapi/v3/entity/dataset/batchGet") == array_of("DatasetBatchGetRequest")
    aspect = "/openapi/v3/entity/dataset/{urn}/{aspectName}"
    assert schema(aspect) == {"$ref": "#/components/schemas/DatasetEntityAspectRequest"}
    assert schema(aspect, "patch") == {"$ref": "#/components/schemas/GenericJsonPatch"}
    assert schema("/openapi/v1/proposals") == array_of("MetadataChangeProposal")
    assert schema("/api/graphql")["required"] == ["query"]
    assert "oneOf" in schema("/api/v1/lineage")
    for action_route in ("/aspects", "/entities", "/runs"):
        assert schema(action_route) == {"type": "object"}


def _array_of_empty_objects(size: int) -> Iterator[bytes]:
    """A JSON array of empty objects, exactly `size` bytes, in chunks of about a MB."""
    n = (size - 4) // 3
    yield b"[" + b" " * (size - 4 - 3 * n)
    while n > 0:
        step = min(n, CHUNK // 3)
        yield b"{}," * step
        n -= step
    yield b"{}]"


def send_body(port: int, path: str, token: str | None, mb: int = BODY_MB) -> tuple[bytes, int]:
    """POST `path` with a JSON array of `mb` MB of empty objects (about 50 bytes of Python objects per 3 bytes sent),
    streamed until an answer arrives: the answer's first bytes and the bytes of the body sent."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {mb * CHUNK}\r\n"
    ).encode()
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n".encode()
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head + b"\r\n")
        sock.setblocking(False)
        for chunk in _array_of_empty_objects(mb * CHUNK):
            while chunk:
                try:
                    return _whole_answer(sock, sock.recv(4096)), sent
                except BlockingIOError:
                    pass
                try:
                    n = sock.send(chunk)
                    sent, chunk = sent + n, chunk[n:]
                except BlockingIOError:
                    time.sleep(0.001)
                except (BrokenPipeError, ConnectionResetError):
                    break
        return _whole_answer(sock, b""), sent


def _whole_answer(sock: socket.socket, received: bytes) -> bytes:
    """The answer whose first bytes are `received`: its head and its Content-Length's bytes of body."""
    sock.setblocking(True)
    sock.settimeout(60)
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.fixture
async def service(make_database, migrated_template):
    port = free_port()
    env = {
        "METALEDGER_DATABASE_URL": make_database(template=migrated_template),
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
    }
    process = start_service(env, port, workers=1)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", 90, process)
        yield process, port, env
    finally:
        stop_process(process)


async def test_large_anonymous_bodies_are_refused_unread_and_cost_no_memory(service):
    process, port, env = service
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        for _ in range(20):  # warm: the process has answered, its memory settled
            assert (await http.get("/health")).status_code == 200
    before = rss_mb(process)
    for path in BODY_ROUTES:
        answer, _ = await asyncio.to_thread(send_body, port, path, None)
        assert answer.startswith(b"HTTP/1.1 401 "), (path, answer[:300])
        assert rss_mb(process) - before < 50, (path, before, rss_mb(process))  # before the fix: +573 MB

    admin = await asyncio.to_thread(service_token, env)
    for path in BODY_ROUTES:  # past MAX_REQUEST_BYTES (16 MB by default): 413 naming it, never parsed
        answer, _ = await asyncio.to_thread(send_body, port, path, admin)
        assert answer.startswith(b"HTTP/1.1 413 "), (path, answer[:300])
        assert b"METALEDGER_MAX_REQUEST_BYTES" in answer
        assert rss_mb(process) - before < 50, (path, before, rss_mb(process))  # before the fix: +573 MB

    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=30, headers={"Authorization": f"Bearer {admin}"}
    ) as http:
        deep = "[" * 500 + "]" * 500  # past MAX_JSON_DEPTH (100), within what orjson parses (1024)
        for path in BODY_ROUTES:
            refused = await http.post(path, content=deep, headers={"content-type": "application/json"})
            assert refused.status_code == 400, (path, refused.text[:300])
            assert "METALEDGER_MAX_JSON_DEPTH" in refused.json()["message"]
        # The same bodies as models still parse and name what does not fit.
        malformed = await http.post("/openapi/v1/auth/tokens", json={"actor": "urn:li:corpuser:bob", "role": 3})
        assert malformed.status_code == 400
        assert [i["path"] for i in malformed.json()["issues"]] == ["$.role"]
        issued = await http.post("/openapi/v1/auth/tokens", json={"actor": "urn:li:corpuser:bob", "role": "reader"})
        assert issued.status_code == 201 and issued.json()["actor"] == "urn:li:corpuser:bob"
