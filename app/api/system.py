"""Service status (`/health`: alive; `/ready`: able to serve, app.ops.readiness; `/metrics`: Prometheus) and DataHub's
`/config` (what the `datahub` client reads before it writes)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from sqlalchemy import text

from app import __version__
from app.api.deps import ALLOW_PUBLIC, ALLOW_READ, Engine, Ops, Registry
from app.api.http import json_response
from app.ops import CONTENT_TYPE as METRICS_CONTENT_TYPE

OPEN: dict[str, Any] = {"security": []}  # the spec says these need no credentials
router = APIRouter(tags=["system"])  # each route declares its policy: the probes and /config are open

# The DataHub server version whose API metaledger serves (docs/datahub-compatibility.md): DataHub's clients decide
# what to send, and which of their features to offer, by it (`versions["acryldata/datahub"].version`, with
# `datahub.serverEnv: core`, a DataHub core server, and no `baseUrl`, which only DataHub Cloud reports):
# * acryl-datahub 1.7.0.17 (tests/client/test_reported_version.py): >= 1.0.1, the Python SDK v2 (`DataHubClient`)
#   writes through the OpenAPI v3 endpoints, which metaledger serves as the SDK sends them; >= 1.7.0, ingestion
#   sources send `status` as a PATCH, and >= 1.7.0.1 the `assertionNote` aspect: not claimed until the client tests
#   cover them. Nothing between changes.
# * mcp-server-datahub 0.8.0: its user, document, history and curation tools (`get_me`, `save_document`,
#   `add_tags`, …) are listed from 1.4.0 only.
# 1.5.0: the DataHub release whose APIs metaledger's follow (issue 41 takes its GraphQL schema, datahub-graphql-core,
# as the reference); what metaledger does not serve of them is documented.
REPORTED_DATAHUB_VERSION = "v1.5.0"


@router.get("/health", summary="Liveness and database reachability", dependencies=[ALLOW_PUBLIC], openapi_extra=OPEN)
async def health(engine: Engine):
    try:
        async with engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
        database = "ok"
    except Exception as error:  # noqa: BLE001 - health reports any failure as a status
        database = f"unavailable: {type(error).__name__}"
    status = "ok" if database == "ok" else "degraded"
    return json_response(
        {"status": status, "database": database, "version": __version__}, 200 if status == "ok" else 503
    )


@router.get(
    "/ready",
    summary="Readiness: database, migrations at head, broker, registries",
    responses={503: {"description": "Not ready: `checks` names the part that is not ready"}},
    dependencies=[ALLOW_PUBLIC],
    openapi_extra=OPEN,
)
async def ready(ops: Ops):
    is_ready, body = await ops.ready()
    return json_response(body, 200 if is_ready else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics (text format)",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "The Prometheus text exposition"}},
    dependencies=[ALLOW_READ],
)
async def metrics(ops: Ops):
    return Response(await ops.metrics(), media_type=METRICS_CONTENT_TYPE)


@router.get("/config", summary="DataHub-style server configuration", dependencies=[ALLOW_PUBLIC], openapi_extra=OPEN)
async def config(registry: Registry):
    return json_response(
        {
            "noCode": "true",
            "retention": "true",
            "statefulIngestionCapable": True,
            "patchCapable": True,
            "supportsImpactAnalysis": False,
            "timeZone": "UTC",
            "versions": {
                "acryldata/datahub": {"version": REPORTED_DATAHUB_VERSION, "commit": f"metaledger-{__version__}"}
            },
            "telemetry": {"enabledCli": False, "enabledIngestion": False},
            "managedIngestion": {"enabled": False, "defaultCliVersion": "1.7.0.17"},
            "datahub": {"serverType": "metaledger", "serverEnv": "core"},
            "datasetUrnNameCasing": False,
            "models": {},
            "metaledger": {"version": __version__, "registry": registry.counts()},
        }
    )
