"""The protocols metaledger speaks over HTTP, one module each: request bodies → drafts → the ingest gateway, and
outcomes → responses. Nothing else happens here."""

from app.api.audit import router as audit_router
from app.api.auth import authz_router
from app.api.auth import router as auth_router
from app.api.change_feed import router as change_feed_router
from app.api.entity_registry import router as entity_registry_router
from app.api.graphql import router as graphql_router
from app.api.model_sets import router as model_sets_router
from app.api.openlineage import router as openlineage_router
from app.api.per_aspect_events import router as per_aspect_events_router
from app.api.processors import router as processors_router
from app.api.proposals import MetadataChangeProposal
from app.api.proposals import router as proposals_router
from app.api.restli import routers as restli_routers
from app.api.schema_registry import router as schema_registry_router
from app.api.scroll import router as scroll_router
from app.api.search import router as search_router
from app.api.system import router as system_router
from app.api.timeline import router as timeline_router
from app.api.trace_write import router as trace_write_router

# Every router of the app but the v3 entity routes (app.api.entities.entity_routes: one set per entity type of the
# registry), which come after them: each has a literal entity path (`/openapi/v3/entity/dataset`) and skips other
# paths at the cost of a string comparison, so every other route is matched first and none of them pays for the 72
# entity types.
routers = [
    system_router,
    proposals_router,
    scroll_router,
    change_feed_router,
    *restli_routers,
    search_router,
    trace_write_router,
    schema_registry_router,
    auth_router,
    authz_router,
    audit_router,
    processors_router,
    per_aspect_events_router,
    timeline_router,
    entity_registry_router,
    graphql_router,
    openlineage_router,
    model_sets_router,
]

# A body the routes read themselves and refer to by name in their declarations (the `JsonBody` ones are found from
# the routes: app.main).
documented_models = [MetadataChangeProposal]
