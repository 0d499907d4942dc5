"""DataHub's Rest.li endpoints, as GMS serves them and DataHub's Python client (`acryl-datahub`) calls them."""

from app.api.restli.aspects import router as aspects_router
from app.api.restli.entities import router as entities_router
from app.api.restli.runs import router as runs_router

# Included one by one, not as one router of the three: the app's route index (app.api.route_index) files an included
# router under the path segments all its routes share, and /aspects, /entities and /runs share none, so one router of
# the three would be asked on every request of every path (a third of a v3 write's route matching).
routers = [aspects_router, entities_router, runs_router]
