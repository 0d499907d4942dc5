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

# The DataHub version metaledger claims. At >= 1.0.1 the Python SDK v2 (`DataHubClient`) writes through the OpenAPI
# v3 endpoints, which metaledger serves as the SDK sends them (POST/PATCH /openapi/v3/entity/{entity}, verified with
# acryl-datahub 1.7.0.17 in tests/client). Below 1.7.0: from there, ingestion sources send `status` as a PATCH, which
# works too but is not covered by the client tests yet.
REPORTED_DATAHUB_VERSION = "v1.3.0"


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
