"""DataHub's GraphQL endpoint: `POST /api/graphql` with `{"query", "variables"?, "operationName"?}` (what
DataHubGraph.execute_graphql sends). Reads need READ (the route's policy); mutations check WRITE themselves, and
their writes go through the ingest gateway with the caller's principal (which applies the write policies)."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response

from app.api.deps import DeclaredBody, Reader, Session, get_backend, get_read_session
from app.api.http import json_response
from app.errors import ERROR_RESPONSES
from app.graphql.resolvers import Context
from app.graphql.service import GraphQLRequest, read_request, run

router = APIRouter(tags=["graphql"])

_BODY = {
    "type": "object",
    "required": ["query"],
    "properties": {
        "query": {"type": "string", "description": "A GraphQL document (DataHub's schema, the subset served)"},
        "variables": {"type": "object", "additionalProperties": True},
        "operationName": {"type": "string"},
    },
}


class GraphQLBody(DeclaredBody[GraphQLRequest]):
    """`{"query", "variables"?, "operationName"?}`: anything else is a 400 (app.graphql.service.read_request)."""

    def request_body_schema(self) -> dict[str, Any]:
        return _BODY

    async def parse(self, document: Any, request: Request) -> GraphQLRequest:
        return read_request(document)


_RESULT = {
    "type": "object",
    "properties": {
        "data": {"type": "object", "additionalProperties": True, "nullable": True},
        "errors": {"type": "array", "items": {"type": "object", "additionalProperties": True}},
    },
}


@router.post(
    "/api/graphql",
    responses={
        **ERROR_RESPONSES,
        200: {
            "description": "The GraphQL result: `data` and/or `errors` (query errors "
            "are answered 200, as DataHub does; an operation over "
            "METALEDGER_GRAPHQL_MAX_COST, or whose answer grows past "
            "METALEDGER_GRAPHQL_MAX_RESPONSE_BYTES, is a 400 in the "
            "same form)",
            "content": {"application/json": {"schema": _RESULT}},
        },
    },
    summary="DataHub's GraphQL API: the searches, entity lookups and tag mutations DataHub's client calls",
    operation_id="graphql",
)
async def graphql(
    request: Request,
    caller: Reader,  # the route's policy, before the body is read
    session: Session,
    operation: Annotated[GraphQLRequest, Depends(GraphQLBody())],
) -> Response:
    # The app's registry, gateway and settings taken from its state here, not as three more dependencies: FastAPI
    # solves each of a route's dependencies on every request (40-60 µs of CPU each), and every GraphQL query, the web
    # view's among them, comes this way.
    state = request.app.state
    settings = state.settings
    context = Context(
        session,
        state.registry,
        state.gateway,
        caller,
        partial(get_backend, request),
        settings.graphql_max_count,
        request.headers,
        read_session=partial(get_read_session, request),
    )
    return json_response(*await run(operation, context, settings))
