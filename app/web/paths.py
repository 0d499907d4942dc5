"""DataHub's frontend paths, so that the links DataHub's tools print (`{frontend}/dataset/<urn>/Schema`, the MCP
server's `url` fields) open here: the path name of each entity type (each entity's `getPathName()` in
datahub-web-react/src/app/entity/*/…Entity.tsx), the URN URL-encoded after it, then a tab name; and search's
`filter_<field>` query parameters (datahub-web-react/src/app/search/utils/filtersToQueryStringParams.ts)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

from app.api.urn_paths import restore_slashes

# entity type -> DataHub's path name
PATH_NAMES = {
    "dataset": "dataset",
    "dashboard": "dashboard",
    "chart": "chart",
    "dataFlow": "pipelines",
    "dataJob": "tasks",
    "container": "container",
    "domain": "domain",
    "dataProduct": "dataProduct",
    "glossaryTerm": "glossaryTerm",
    "glossaryNode": "glossaryNode",
    "tag": "tag",
    "corpuser": "user",
    "corpGroup": "group",
    "mlModel": "mlModels",
    "mlModelGroup": "mlModelGroup",
    "mlFeatureTable": "featureTables",
    "mlFeature": "features",
    "mlPrimaryKey": "mlPrimaryKeys",
    "notebook": "notebook",
    "dataPlatform": "platform",
    "businessAttribute": "business-attribute",
    "structuredProperty": "structuredProperty",
    "role": "role",
    "application": "application",
    "erModelRelationship": "erModelRelationship",
}
# DataHub's SDK writes a type's own name where its frontend path is not one of the SDK's few special cases
# (datahub.ingestion.graph.links.make_url_for_urn: `/mlModel/<urn>/`, `/dataPlatform/<urn>/`, …): those links open
# the same pages.
ENTITY_TYPES = {entity: entity for entity in PATH_NAMES} | {path: entity for entity, path in PATH_NAMES.items()}

# DataHub's tab names as they appear in the path; the first of each list is the type's default.
# DataHub has no History tab (its Timeline API has no page) and no Aspects tab: both are metaledger's.
SCHEMA, DOCUMENTATION, PROPERTIES, LINEAGE = "Schema", "Documentation", "Properties", "Lineage"
STATS, HISTORY, ASPECTS = "Stats", "History", "Aspects"
DATASET_TABS = (SCHEMA, DOCUMENTATION, PROPERTIES, LINEAGE, STATS, HISTORY, ASPECTS)
OTHER_TABS = (DOCUMENTATION, PROPERTIES, LINEAGE, HISTORY, ASPECTS)

FILTER_PREFIX = "filter_"
SEPARATOR = "___"  # DataHub's URL_PARAM_SEPARATOR: filter_<field>___<negated>___<condition>___<index>


def tabs_of(entity_type: str) -> tuple[str, ...]:
    return DATASET_TABS if entity_type == "dataset" else OTHER_TABS


def entity_url(urn: str, tab: str | None = None) -> str | None:
    """The page of `urn` at DataHub's path; None for an entity type without one."""
    entity_type = urn.split(":", 3)[2] if urn.count(":") >= 3 else ""
    path = PATH_NAMES.get(entity_type)
    if path is None:
        return None
    return f"/{path}/{quote(urn, safe='')}" + (f"/{tab}" if tab else "")


@dataclass(frozen=True, slots=True)
class EntityPath:
    urn: str
    tab: str | None  # as the path says it, not yet checked


_TAB = re.compile(r"[A-Za-z][A-Za-z0-9 _-]{0,60}")
# DataHub's tabs whose paths carry a sub-tab (`…/Quality/List`: the MCP server's links to an assertion)
TABS_WITH_SUB_TABS = frozenset({"Quality"})


def _whole_urn(head: str) -> bool:
    """`head` could be a whole URN: a tuple key's parentheses closed, and nothing after its last one."""
    if not head.startswith("urn:"):
        return False
    return "(" not in head or (head.endswith(")") and head.count("(") == head.count(")"))


def split_entity_path(rest: str) -> EntityPath:
    """`<urn>[/<Tab>[/<Sub-tab>]]` as the router hands it (decoded, a `%2F` of the URN as app.api.urn_paths routes
    it). A link may also carry a URN's `/` unencoded (an s3 key: `…s3,bucket/key,PROD)`), so the last segment is a
    tab only if it is a word and what comes before it is a whole URN; two segments are a tab and its sub-tab when
    the first is one of TABS_WITH_SUB_TABS."""
    segments = rest.rstrip("/").split("/")
    for depth in (2, 1):
        head, tail = "/".join(segments[:-depth]), segments[-depth:]
        if len(segments) <= depth or not all(_TAB.fullmatch(t) for t in tail):
            continue
        if (depth == 1 or tail[0] in TABS_WITH_SUB_TABS) and _whole_urn(head):
            return EntityPath(restore_slashes(head), "/".join(tail))
    return EntityPath(restore_slashes("/".join(segments)), None)


@dataclass(frozen=True, slots=True)
class Filter:
    field: str
    values: tuple[str, ...]
    negated: bool = False
    condition: str = "EQUAL"

    def to_graphql(self) -> dict:
        return {"field": self.field, "values": list(self.values), "negated": self.negated, "condition": self.condition}


def _decode_comma(value: str) -> str:
    return value.replace("%2C", ",")  # DataHub's decodeComma: a value's commas travel encoded


def parse_filters(params: list[tuple[str, str]]) -> list[Filter]:
    """DataHub's `filter_<field>___<negated>___<condition>___<index>` parameters (and the older `filter_<field>`),
    each a filter whose values are the parameter's repeated values; ANDed, as DataHub's search page does."""
    grouped: dict[str, list[str]] = {}
    for key, value in params:
        if key.startswith(FILTER_PREFIX) and value:
            grouped.setdefault(key, []).append(_decode_comma(value))
    filters = []
    for key, values in grouped.items():
        parts = key[len(FILTER_PREFIX) :].split(SEPARATOR)
        field = parts[0]
        if not field:
            continue
        negated = len(parts) > 1 and parts[1] == "true"
        condition = parts[2] if len(parts) > 2 and re.fullmatch(r"[A-Z_]{1,40}", parts[2]) else "EQUAL"
        filters.append(Filter(field, tuple(values), negated, condition))
    return filters


def filter_params(filters: list[Filter]) -> list[tuple[str, str]]:
    """`filters` as DataHub's search page writes them in its URL."""
    params: list[tuple[str, str]] = []
    for index, f in enumerate(filters):
        key = f"{FILTER_PREFIX}{f.field}{SEPARATOR}{str(f.negated).lower()}{SEPARATOR}{f.condition}{SEPARATOR}{index}"
        params.extend((key, value.replace(",", "%2C")) for value in f.values)
    return params
