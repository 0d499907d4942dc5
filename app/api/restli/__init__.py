"""DataHub's Rest.li endpoints, as GMS serves them and DataHub's Python client (`acryl-datahub`) calls them."""

from fastapi import APIRouter

from app.api.restli.aspects import router as aspects_router
from app.api.restli.entities import router as entities_router
from app.api.restli.runs import router as runs_router

router = APIRouter()
router.include_router(aspects_router)
router.include_router(entities_router)
router.include_router(runs_router)
