"""The OpenAPI document's registry-derived parts: aspect schemas converted from Avro (:mod:`.avro`), the v3 bodies,
answers and error statuses built on them (:mod:`.document`). The operations themselves are declared by the routes
(app.api); app.main assembles the document from both."""

from app.openapi_spec.avro import API_PREFIX, aspect_components, canonical_name, schema_ref, upper_first
from app.openapi_spec.document import (
    URN_MAX_CHARS,
    add_registry_components,
    aspect_name_component,
    declare_statuses,
    dumps_spec,
    entity_component,
    entity_tags,
    json_body,
)

__all__ = [
    "API_PREFIX",
    "URN_MAX_CHARS",
    "add_registry_components",
    "aspect_components",
    "aspect_name_component",
    "canonical_name",
    "declare_statuses",
    "dumps_spec",
    "entity_component",
    "entity_tags",
    "json_body",
    "schema_ref",
    "upper_first",
]
