"""One tool call: who makes it, the services of the request it came in, and DataHub's GraphQL executed in-process as
that caller (app.graphql.service.run: the same limits, cost and policies as `POST /api/graphql`)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request

from app.api.deps import get_backend
from app.auth.model import Permission, Principal
from app.errors import Forbidden, Issue, MetaledgerError, NotFound, ValidationFailed
from app.graphql.resolvers import Context
from app.graphql.service import GraphQLRequest, run
from app.ingest.gateway import AttributedGateway, IngestGateway
from app.registry import EntityRegistry
from app.search.model import SearchBackend
from app.settings import Settings
from app.write.reader import EntityReader

# Where a write records its origin: its system metadata's `properties`, beside DataHub's `telemetryTraceId` (the
# request's trace, app.ingest.trace) and the change processors' `metaledger.cause.*` (app.write.processors). The
# change log carries the system metadata, so it names the tool beside the actor.
GQL_DIR = Path(__file__).with_name("gql")


@functools.cache
def operation(file: str) -> str:
    """A GraphQL document of DataHub's MCP server (app/mcp/gql, copied from mcp-server-datahub 0.8.0 unchanged), as
    that server sends it to a DataHub without DataHub Cloud and older than its `#[NEWER_GMS]` fields: the lines
    marked for those commented out."""
    lines = (GQL_DIR / file).read_text().split("\n")
    return "\n".join("# " + line if "#[CLOUD]" in line or "#[NEWER_GMS]" in line else line for line in lines)


class GraphQLFailed(MetaledgerError):
    """The GraphQL operation answered errors: the tool error says them as DataHub's errors say them."""


@dataclass(slots=True)
class ToolCall:
    name: str
    request: Request  # the HTTP request that carried the call: its app's services, its headers
    caller: Principal
    session: AsyncSession

    @property
    def settings(self) -> Settings:
        return cast(Settings, self.request.app.state.settings)

    @property
    def registry(self) -> EntityRegistry:
        return cast(EntityRegistry, self.request.app.state.registry)

    @property
    def origin(self) -> str:
        return f"mcp:{self.name}"

    @property
    def gateway(self) -> IngestGateway:
        # Stands for the gateway it wraps (app.graphql.resolvers and app.runs take an IngestGateway).
        return cast(IngestGateway, AttributedGateway(self.request.app.state.gateway, self.origin))

    @property
    def reader(self) -> EntityReader:
        """The aspect store as the caller may read it (its read rule)."""
        return EntityReader(self.session, self.registry, self.caller)

    async def backend(self) -> SearchBackend:
        return await get_backend(self.request)

    def require(self, permission: Permission) -> None:
        self.caller.require(permission)

    async def require_write_access(self) -> None:
        """A writing tool's gate, as every write surface's: a writer, or a reader an access policy grants an edit
        (each write the tool makes is then decided by the ingest gateway)."""
        await self.request.app.state.auth.require_write_access(self.caller)

    async def graphql(self, query: str, variables: Mapping[str, Any], operation_name: str) -> dict[str, Any]:
        """`data` of the operation, run as the caller; its errors as one tool error (a refused mutation's 403 names
        the permission the caller lacks)."""
        context = Context(
            self.session,
            self.registry,
            self.gateway,
            self.caller,
            functools.partial(get_backend, self.request),
            self.settings.graphql_max_count,
            self.request.headers,
        )
        body, status = await run(GraphQLRequest(query, dict(variables), operation_name), context, self.settings)
        errors = body.get("errors") or []
        if errors:
            raise _error(operation_name, errors)
        return cast(dict[str, Any], body.get("data") or {})


def _error(operation_name: str, errors: Iterable[dict[str, Any]]) -> MetaledgerError:
    errors = list(errors)
    codes = {(e.get("extensions") or {}).get("code") for e in errors}
    message = "; ".join(str(e.get("message")) for e in errors[:5])
    issues = [
        Issue(str(e.get("message"))[:500], path=".".join(str(p) for p in e.get("path") or []) or None) for e in errors
    ]
    if 403 in codes:
        return Forbidden(message, issues)
    if 404 in codes:
        return NotFound(message, issues)
    if codes <= {400}:
        return ValidationFailed(f"{operation_name}: {message}", issues)
    return GraphQLFailed(f"{operation_name}: {message}", issues)
