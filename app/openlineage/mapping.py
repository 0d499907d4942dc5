"""OpenLineage events → DataHub aspects, as DataHub's `OpenLineageToDataHub` and `DatahubJob` map them, plus what
they miss (ownership and tags facets, JobEvent and DatasetEvent, unknown producers).

    job namespace + name          → DataFlow  urn:li:dataFlow:(<orchestrator>,<flow>,<job namespace>)
                                    flow: the parent facet's job name, else the job name up to its first dot
                                  → DataJob   urn:li:dataJob:(<flow urn>,<job name>): dataJobInfo,
                                    dataJobInputOutput (dataset edges, the parent job's edge, column lineage)
    run.runId                     → DataProcessInstance urn:li:dataProcessInstance:<runId>: properties, input,
                                    output, relationships (job, parent run), dataProcessInstanceRunEvent
    inputs / outputs / dataset    → Dataset urn:li:dataset:(urn:li:dataPlatform:<platform>,<name>,PROD): status,
                                    schema → schemaMetadata, documentation → datasetProperties.description,
                                    ownership → ownership, tags → globalTags

Orchestrator: the `processing_engine` run facet's name, else what the producer URI names (`…/integration/<x>`,
apache/airflow, trinodb/trino), else the job namespace: an unknown producer is never refused.

Lineage edges merge: every event PATCHes `dataJobInputOutput` (DataHub's template: edges keyed by URN, column
lineage keyed by downstream and upstream), so an event that carries fewer edges (a RUNNING event with none) erases
nothing. The one exception is a COMPLETE RunEvent with inputs or outputs: its datasets and column lineage are the
job's final ones and replace the dataset edges and column lineage (parent-job edges still merge). A run's own aspects
merge the same way, inside the write transaction (a keyed PATCH of DataProcessInstance input, output and relationships,
a generic PATCH of its properties after a create-if-absent), so that events of one run written at the same moment lose
none of each other's additions. Replaying an event writes the same values: every versioned aspect comes back
UNCHANGED (or, for the create-if-absent, FILTERED).

An event's writes are made one by one as they are asked for (`map_event` is a generator), each with its place in the
event, so that whoever counts them (app.api.openlineage, with a `WriteBudget`: the writes of several events to one
aspect count once) stops the mapping at the first one past its limit (`TooManyWrites`, naming the member of the event
that made the most of them): what the mapping holds is bounded whatever an event lists.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import orjson

from app.urns import InvalidUrnError, validate_urn

SYSTEM_ACTOR = "urn:li:corpuser:datahub"  # DataHub's OpenLineage converter stamps runs with it
ENV = "PROD"
NATIVE_RESULT_TYPE = "openlineage"

# Dataset namespace scheme (or bare namespace) → DataHub platform. Any other scheme is the platform as it is.
PLATFORMS = {
    "postgres": "postgres",
    "postgresql": "postgres",
    "redshift": "redshift",
    "mysql": "mysql",
    "mariadb": "mariadb",
    "sqlserver": "mssql",
    "mssql": "mssql",
    "oracle": "oracle",
    "db2": "db2",
    "teradata": "teradata",
    "snowflake": "snowflake",
    "bigquery": "bigquery",
    "awsathena": "athena",
    "athena": "athena",
    "trino": "trino",
    "presto": "presto",
    "hive": "hive",
    "spark": "spark",
    "databricks": "databricks",
    "clickhouse": "clickhouse",
    "kafka": "kafka",
    "mongodb": "mongodb",
    "cassandra": "cassandra",
    "glue": "glue",
    "iceberg": "iceberg",
    "s3": "s3",
    "s3a": "s3",
    "s3n": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "abfs": "abs",
    "abfss": "abs",
    "wasb": "abs",
    "wasbs": "abs",
    "hdfs": "hdfs",
    "dbfs": "dbfs",
    "file": "file",
}
# Platforms whose namespace authority (a bucket, a container) is part of the dataset's path: s3://bucket + key/x
# is DataHub's `bucket/key/x`. For the others (a database server) the name alone names the dataset.
PATH_PLATFORMS = frozenset({"s3", "gcs", "abs", "hdfs", "dbfs"})
# The producer URIs of the OpenLineage integrations that name their orchestrator.
_PRODUCER_ORCHESTRATORS = (
    (re.compile(r"github\.com/apache/airflow(/|$)", re.I), "airflow"),
    (re.compile(r"github\.com/trinodb/trino(/|$)", re.I), "trino"),
    (re.compile(r"github\.com/openlineage/openlineage/(?:(?:blob|tree)/[^/]+/)?integration/([a-z0-9_-]+)", re.I), None),
)
_RUN_STATUS = {  # eventType → (DataProcessRunStatus, RunResultType)
    "START": ("STARTED", None),
    "RUNNING": ("STARTED", None),
    "COMPLETE": ("COMPLETE", "SUCCESS"),
    "FAIL": ("COMPLETE", "FAILURE"),
    "ABORT": ("COMPLETE", "SKIPPED"),
}
_OWNERSHIP_TYPES = frozenset(
    {
        "TECHNICAL_OWNER",
        "BUSINESS_OWNER",
        "DATA_STEWARD",
        "NONE",
        "DATAOWNER",
        "DEVELOPER",
        "PRODUCER",
        "DELEGATE",
        "CONSUMER",
        "STAKEHOLDER",
    }
)
_NOT_URN_SAFE = re.compile(r"[^A-Za-z0-9_.\-]+")
# Native type (its leading word, lower case) → DataHub's SchemaFieldDataType; anything else is a StringType.
_FIELD_TYPES = {
    **dict.fromkeys(
        (
            "int",
            "integer",
            "int2",
            "int4",
            "int8",
            "smallint",
            "bigint",
            "tinyint",
            "long",
            "short",
            "byte",
            "float",
            "float4",
            "float8",
            "double",
            "real",
            "decimal",
            "numeric",
            "number",
            "serial",
            "bigserial",
            "money",
        ),
        "NumberType",
    ),
    **dict.fromkeys(("bool", "boolean"), "BooleanType"),
    **dict.fromkeys(("date",), "DateType"),
    **dict.fromkeys(("timestamp", "timestamptz", "datetime", "time", "timetz", "interval"), "TimeType"),
    **dict.fromkeys(("bytes", "binary", "bytea", "blob", "varbinary"), "BytesType"),
    **dict.fromkeys(("array", "list"), "ArrayType"),
    **dict.fromkeys(("map",), "MapType"),
    **dict.fromkeys(("struct", "record", "row", "object", "json", "jsonb"), "RecordType"),
}


# A create-if-absent: DataHub's CREATE with `If-None-Match: *` is dropped (FILTERED) when the aspect exists.
IF_ABSENT = {"If-None-Match": "*"}


Place = tuple[str | int, ...]  # a place in an event: its members and indexes, outermost first


@dataclass(frozen=True, slots=True)
class Change:
    """One aspect write an event makes: `value` is the aspect (UPSERT, CREATE) or the patch operations (PATCH).
    `array_keys` makes a PATCH DataHub's generic keyed patch (`arrayPrimaryKeys`; empty: `forceGenericPatch`), for
    aspects DataHub has no patch template for; None, the aspect's template. `place`: what of the event made it
    (`("inputs", 3)`, `("job",)`, `("run",)`)."""

    entity_type: str
    urn: str
    aspect: str
    value: Any
    change_type: str = "UPSERT"
    array_keys: dict[str, list[str]] | None = None
    headers: dict[str, str] | None = None
    place: Place = ()

    def key(self) -> tuple[str, ...]:
        """What makes changes one aspect write (app.api.openlineage merges them): the aspect and the change type; a
        timeseries point, its value too (each point is written)."""
        if self.aspect == "dataProcessInstanceRunEvent":
            return self.urn, self.aspect, orjson.dumps(self.value).decode()
        return self.urn, self.aspect, self.change_type

    def document(self) -> Any:
        """The value a proposal carries: the aspect, or the patch document."""
        if self.change_type != "PATCH" or self.array_keys is None:
            return self.value
        if self.array_keys:
            return {"patch": self.value, "arrayPrimaryKeys": self.array_keys}
        return {"patch": self.value, "forceGenericPatch": True}


def run_urn(run_id: str) -> str:
    return f"urn:li:dataProcessInstance:{run_id}"


class TooManyWrites(Exception):
    """The events map to more aspect writes than the budget's limit: `count` when the mapping stopped (the limit + 1),
    and where: `place`, the member of the event being mapped whose datasets (`inputs`, `outputs`, `dataset`) made the
    most of its writes, or the event itself (`()`) when its job and run made more; `by_place` of them, and `items`,
    how many datasets that member lists (None: not a list)."""

    def __init__(self, limit: int, count: int, place: Place, by_place: int, items: int | None) -> None:
        super().__init__(f"more than {limit} aspect writes")
        self.limit, self.count, self.place, self.by_place, self.items = limit, count, place, by_place, items


class WriteBudget:
    """The distinct aspect writes (`Change.key`) of a request's events, counted as the mapping makes them (`spend`
    each): the one past `limit` raises TooManyWrites. Holds the keys counted (at most `limit` + 1)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._keys: set[tuple[str, ...]] = set()
        self._event: dict[str, Any] = {}
        self._by_member: Counter[str] = Counter()

    def start(self, event: Any) -> None:
        """The next event's mapping begins (what is counted by member is the event's own)."""
        self._event = event if isinstance(event, dict) else {}
        self._by_member.clear()

    def spend(self, change: Change) -> None:
        key = change.key()
        if key in self._keys:
            return
        self._keys.add(key)
        self._by_member[str(change.place[0]) if change.place else ""] += 1
        if len(self._keys) > self.limit:
            most, by_place = self._by_member.most_common(1)[0]
            if most not in ("inputs", "outputs", "dataset"):  # the job's and run's few writes: the event is the place
                raise TooManyWrites(self.limit, len(self._keys), (), sum(self._by_member.values()), None)
            listed = self._event.get(most)
            raise TooManyWrites(
                self.limit, len(self._keys), (most,), by_place, len(listed) if isinstance(listed, list) else None
            )


def map_event(event: dict[str, Any]) -> Iterator[Change]:
    """The aspect writes of one event (already checked against the spec: app.openlineage.validation), made as they
    are asked for: a caller that stops early (a `WriteBudget` past its limit) makes no more."""
    event = _live(event)
    if "job" not in event:  # a DatasetEvent
        dataset = event["dataset"]
        return iter(_dataset_changes(dataset, dataset_urn(dataset["namespace"], dataset["name"]), ("dataset",)))
    return _JobEvent(event).changes()


def _live(event: dict[str, Any]) -> dict[str, Any]:
    """The event without its deleted facets (`{"_deleted": true}`: the spec check skips them, the mapping too)."""

    def kept(holder: dict[str, Any], *members: str) -> dict[str, Any]:
        holder = dict(holder)
        for member in members:
            if isinstance(holder.get(member), dict):
                holder[member] = {
                    k: v for k, v in holder[member].items() if not (isinstance(v, dict) and v.get("_deleted") is True)
                }
        return holder

    event = dict(event)
    for member in ("run", "job"):
        if isinstance(event.get(member), dict):
            event[member] = kept(event[member], "facets")
    for side, extra in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
        if isinstance(event.get(side), list):
            event[side] = [kept(dataset, "facets", extra) for dataset in event[side]]
    if isinstance(event.get("dataset"), dict):
        event["dataset"] = kept(event["dataset"], "facets")
    return event


def urn_errors(event: dict[str, Any]) -> Iterator[tuple[Place, str]]:
    """The places of a spec-conforming event whose names make no DataHub URN (empty, too long, a NUL or ␟ in them:
    datasets, jobs, columns, owners, tags),
    with why: the event is refused naming them rather than the aspects it would have become."""

    def checked(place: Place, urn: str) -> Iterator[tuple[Place, str]]:
        try:
            validate_urn(urn)
        except InvalidUrnError as error:
            yield place, f"names no DataHub URN: {error}"[:300]

    def owners_and_tags(place: Place, facets: dict[str, Any]) -> Iterator[tuple[Place, str]]:
        for where, urn, _ in _owners(facets):
            yield from checked((*place, "facets", *where), urn)
        for where, urn in _tags(facets):
            yield from checked((*place, "facets", *where), urn)

    def datasets(place: Place, dataset: dict[str, Any]) -> Iterator[tuple[Place, str]]:
        urn = dataset_urn(dataset["namespace"], dataset["name"])
        yield from checked(place, urn)
        yield from owners_and_tags(place, dataset.get("facets") or {})
        lineage = (dataset.get("facets") or {}).get("columnLineage")
        for column, spec in (lineage.get("fields") or {}).items() if isinstance(lineage, dict) else ():
            where = (*place, "facets", "columnLineage", "fields", column)
            yield from checked(where, schema_field_urn(urn, column))
            for j, source in enumerate(spec.get("inputFields") or []):
                upstream = schema_field_urn(dataset_urn(source["namespace"], source["name"]), source["field"])
                yield from checked((*where, "inputFields", j), upstream)

    event = _live(event)
    if "job" not in event:
        yield from datasets(("dataset",), event["dataset"])
        return
    job = _JobEvent(event)
    yield from checked(("job",), job.flow)
    yield from checked(("job",), job.job)
    yield from owners_and_tags(("job",), job.job_facets)
    parent = job.parent_job_urn()
    if parent is not None:
        yield from checked(("run", "facets", "parent", "job"), parent)
    for side in ("inputs", "outputs"):
        for i, dataset in enumerate(event.get(side) or []):
            yield from datasets((side, i), dataset)


# ---------------------------------------------------------------------------------------------------------------


def dataset_urn(namespace: str, name: str) -> str:
    platform, path = dataset_platform_and_name(namespace, name)
    return f"urn:li:dataset:(urn:li:dataPlatform:{platform},{_tuple_part(path)},{ENV})"


def dataset_platform_and_name(namespace: str, name: str) -> tuple[str, str]:
    """The DataHub platform and dataset name of an OpenLineage dataset (PLATFORMS, PATH_PLATFORMS)."""
    if "://" in namespace:
        parts = urlsplit(namespace)
        scheme = parts.scheme.lower()
        platform = PLATFORMS.get(scheme, _urn_safe(scheme))
        if platform in PATH_PLATFORMS and parts.netloc:
            return platform, f"{parts.netloc}/{name.lstrip('/')}"
        return platform, name
    bare = namespace.split(":", 1)[0].lower()  # `bigquery`, `hive`, `arn:aws:glue:…` spelt as a scheme
    return PLATFORMS.get(bare, _urn_safe(bare) or "openlineage"), name


def schema_field_urn(dataset: str, field_path: str) -> str:
    return f"urn:li:schemaField:({dataset},{_tuple_part(field_path)})"


def orchestrator(event: dict[str, Any]) -> str:
    engine = ((event.get("run") or {}).get("facets") or {}).get("processing_engine") or {}
    if isinstance(engine.get("name"), str) and engine["name"].strip():
        return _urn_safe(engine["name"].strip().lower())
    producer = event.get("producer", "")
    for pattern, name in _PRODUCER_ORCHESTRATORS:
        found = pattern.search(producer)
        if found:
            return name or found.group(1).lower()
    return _urn_safe(event["job"]["namespace"].lower()) or "openlineage"


def _urn_safe(text: str) -> str:
    """A platform-like URN part: DataHub parses `,` `(` `)` as URN structure."""
    return _NOT_URN_SAFE.sub("_", text).strip("_")


def _tuple_part(text: str) -> str:
    """A free-text URN tuple part (a namespace, a job name): DataHub's URN syntax has no escape for `,()`."""
    return text.replace(",", "%2C").replace("(", "%28").replace(")", "%29")


def _millis(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp).timestamp() * 1000)


def _pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _dataset_changes(dataset: dict[str, Any], urn: str, place: Place) -> list[Change]:
    """The aspects of a dataset an event names (`urn`: its URN), at `place`."""
    facets = dataset.get("facets") or {}
    changes = [Change("dataset", urn, "status", {"removed": False}, place=place)]
    schema = facets.get("schema")
    if isinstance(schema, dict) and isinstance(schema.get("fields"), list) and not schema.get("_deleted"):
        platform, name = dataset_platform_and_name(dataset["namespace"], dataset["name"])
        changes.append(Change("dataset", urn, "schemaMetadata", _schema_metadata(schema, platform, name), place=place))
    doc = facets.get("documentation")
    if isinstance(doc, dict) and isinstance(doc.get("description"), str):
        changes.append(
            _patch(
                "dataset",
                urn,
                "datasetProperties",
                [{"op": "add", "path": "/description", "value": doc["description"]}],
                place,
            )
        )
    changes.extend(_ownership_and_tags("dataset", urn, facets, place))
    return changes


def _schema_metadata(schema: dict[str, Any], platform: str, name: str) -> dict[str, Any]:
    fields: list[dict[str, Any]] = []
    _schema_fields(schema["fields"], "", fields)
    return {
        "schemaName": name,
        "platform": f"urn:li:dataPlatform:{platform}",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.OtherSchema": {"rawSchema": ""}},
        "fields": fields,
    }


def _schema_fields(items: list[Any], prefix: str, out: list[dict[str, Any]]) -> None:
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            continue
        declared = item.get("type")
        native = declared if isinstance(declared, str) else ""
        word = re.split(r"[^a-z0-9]", native.lower(), maxsplit=1)[0]
        kind = "RecordType" if item.get("fields") else _FIELD_TYPES.get(word, "StringType")
        described = {"description": item["description"]} if isinstance(item.get("description"), str) else {}
        path = f"{prefix}{item['name']}"
        out.append(
            {
                "fieldPath": path,
                "nativeDataType": native or "unknown",
                "nullable": True,
                "type": {"type": {f"com.linkedin.schema.{kind}": {}}},
                **described,
            }
        )
        if isinstance(item.get("fields"), list):
            _schema_fields(item["fields"], f"{path}.", out)


def _owner_urn(name: str) -> str:
    if name.startswith("urn:li:"):
        return name
    kind, _, rest = name.partition(":")
    if rest and kind.lower() in ("team", "group"):
        return f"urn:li:corpGroup:{rest}"
    return f"urn:li:corpuser:{rest if rest and kind.lower() == 'user' else name}"


def _owners(facets: dict[str, Any]) -> Iterator[tuple[Place, str, str]]:
    """The ownership facet's owners: their place in the facets, URN and DataHub ownership type."""
    for k, owner in enumerate((facets.get("ownership") or {}).get("owners") or []):
        if isinstance(owner, dict) and isinstance(owner.get("name"), str) and owner["name"]:
            kind = str(owner.get("type") or "").upper().replace(" ", "_")
            yield (
                ("ownership", "owners", k, "name"),
                _owner_urn(owner["name"]),
                (kind if kind in _OWNERSHIP_TYPES else "TECHNICAL_OWNER"),
            )


def _tags(facets: dict[str, Any]) -> Iterator[tuple[Place, str]]:
    """The tags facet's tags of the whole entity (not of a field): their place in the facets and URN."""
    for k, tag in enumerate((facets.get("tags") or {}).get("tags") or []):
        if isinstance(tag, dict) and isinstance(tag.get("key"), str) and tag["key"] and not tag.get("field"):
            value = tag.get("value")
            name = tag["key"] if value in (None, "", tag["key"]) else f"{tag['key']}:{value}"
            yield ("tags", "tags", k), f"urn:li:tag:{name}"


def _ownership_and_tags(entity_type: str, urn: str, facets: dict[str, Any], place: Place) -> list[Change]:
    changes = []
    ops = [
        {"op": "add", "path": f"/owners/{_pointer(owner_urn)}/{kind}", "value": {"owner": owner_urn, "type": kind}}
        for _, owner_urn, kind in _owners(facets)
    ]
    if ops:
        changes.append(_patch(entity_type, urn, "ownership", ops, place))
    ops = [
        {"op": "add", "path": f"/tags/{_pointer(tag_urn)}", "value": {"tag": tag_urn}} for _, tag_urn in _tags(facets)
    ]
    if ops:
        changes.append(_patch(entity_type, urn, "globalTags", ops, place))
    return changes


def _patch(entity_type: str, urn: str, aspect: str, ops: list[dict[str, Any]], place: Place = ()) -> Change:
    return Change(entity_type, urn, aspect, ops, "PATCH", place=place)


class _JobEvent:
    """A RunEvent or a JobEvent: the DataFlow, the DataJob, its datasets, and for a RunEvent the run."""

    def __init__(self, event: dict[str, Any]) -> None:
        self.event = event
        job = event["job"]
        self.job_facets = job.get("facets") or {}
        self.run = event.get("run")
        self.run_facets = (self.run or {}).get("facets") or {}
        self.orchestrator = orchestrator(event)
        parent = self.run_facets.get("parent")
        if not isinstance(parent, dict):
            parent = {}
        self.parent_job = parent.get("job") if isinstance(parent.get("job"), dict) else None
        self.parent_run = (parent.get("run") or {}).get("runId") if isinstance(parent.get("run"), dict) else None
        # a job name with no text before its first dot is its own flow
        self.flow_name = self.parent_job["name"] if self.parent_job else job["name"].split(".", 1)[0] or job["name"]
        self.flow = self._flow_urn(self.flow_name, job["namespace"])
        self.job = f"urn:li:dataJob:({self.flow},{_tuple_part(job['name'])})"

    def _flow_urn(self, flow_name: str, namespace: str) -> str:
        return f"urn:li:dataFlow:({self.orchestrator},{_tuple_part(flow_name)},{_tuple_part(namespace)})"

    def parent_job_urn(self) -> str | None:
        if self.parent_job is None:
            return None
        flow = self._flow_urn(self.parent_job["name"], self.parent_job["namespace"])
        return f"urn:li:dataJob:({flow},{_tuple_part(self.parent_job['name'])})"

    def changes(self) -> Iterator[Change]:
        """The flow's and job's writes, then each dataset's, then the run's: made as they are asked for."""
        job = self.event["job"]
        inputs = [(dataset_urn(d["namespace"], d["name"]), d) for d in self.event.get("inputs") or []]
        outputs = [(dataset_urn(d["namespace"], d["name"]), d) for d in self.event.get("outputs") or []]
        place: Place = ("job",)
        yield _patch(
            "dataFlow", self.flow, "dataFlowInfo", [{"op": "add", "path": "/name", "value": self.flow_name}], place
        )
        yield Change("dataFlow", self.flow, "status", {"removed": False}, place=place)
        yield _patch("dataJob", self.job, "dataJobInfo", self._job_info_ops(job), place)
        yield Change("dataJob", self.job, "status", {"removed": False}, place=place)
        yield from _ownership_and_tags("dataJob", self.job, self.job_facets, place)
        io = self._input_output_ops(inputs, outputs)
        if io:
            yield _patch("dataJob", self.job, "dataJobInputOutput", io, place)
        for side, datasets in (("inputs", inputs), ("outputs", outputs)):
            for i, (urn, dataset) in enumerate(datasets):
                yield from _dataset_changes(dataset, urn, (side, i))
        if self.run is not None:
            yield from self._run_changes(self.run, [u for u, _ in inputs], [u for u, _ in outputs])

    def _job_info_ops(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        ops = [
            {"op": "add", "path": "/name", "value": job["name"]},
            {"op": "add", "path": "/type", "value": {"string": "COMMAND"}},
            {"op": "add", "path": "/flowUrn", "value": self.flow},
        ]
        doc = self.job_facets.get("documentation")
        if isinstance(doc, dict) and isinstance(doc.get("description"), str):
            ops.append({"op": "add", "path": "/description", "value": doc["description"]})
        properties = {"openlineage.namespace": job["namespace"]}
        job_type = self.job_facets.get("jobType")
        if isinstance(job_type, dict):
            properties.update(
                {
                    f"openlineage.jobType.{k}": str(job_type[k])
                    for k in ("processingType", "integration", "jobType")
                    if job_type.get(k)
                }
            )
        sql = self.job_facets.get("sql")
        if isinstance(sql, dict) and isinstance(sql.get("query"), str):
            properties["sql"] = sql["query"]
        location = self.job_facets.get("sourceCodeLocation")
        if isinstance(location, dict) and isinstance(location.get("url"), str):
            properties["sourceCodeLocation"] = location["url"]
        ops.extend({"op": "add", "path": f"/customProperties/{_pointer(k)}", "value": v} for k, v in properties.items())
        return ops

    def _input_output_ops(
        self, inputs: list[tuple[str, dict[str, Any]]], outputs: list[tuple[str, dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        final = self.event.get("eventType") == "COMPLETE" and bool(inputs or outputs)
        edges = {
            side: {urn: {"destinationUrn": urn} for urn, _ in datasets}
            for side, datasets in (("inputDatasetEdges", inputs), ("outputDatasetEdges", outputs))
        }
        lineage = _fine_grained(outputs)
        ops: list[dict[str, Any]] = []
        if final:  # the job's final datasets and column lineage (module docstring)
            ops.extend({"op": "add", "path": f"/{side}", "value": value} for side, value in edges.items())
            ops.append(
                {
                    "op": "add",
                    "path": "/fineGrainedLineages",
                    "value": {
                        "TRANSFORM": {
                            downstream: {"NONE": {upstream: _FGL_INFO for upstream in upstreams}}
                            for downstream, upstreams in lineage.items()
                        }
                    },
                }
            )
        else:
            ops.extend(
                {"op": "add", "path": f"/{side}/{_pointer(urn)}", "value": edge}
                for side, value in edges.items()
                for urn, edge in value.items()
            )
            ops.extend(
                {
                    "op": "add",
                    "path": f"/fineGrainedLineages/TRANSFORM/{_pointer(downstream)}/NONE/{_pointer(upstream)}",
                    "value": _FGL_INFO,
                }
                for downstream, upstreams in lineage.items()
                for upstream in upstreams
            )
        parent = self.parent_job_urn()
        if parent is not None and parent != self.job:
            ops.append(
                {"op": "add", "path": f"/inputDatajobEdges/{_pointer(parent)}", "value": {"destinationUrn": parent}}
            )
        return ops

    def _run_changes(self, run: dict[str, Any], inputs: list[str], outputs: list[str]) -> list[Change]:
        run_id = run["runId"]
        urn = run_urn(run_id)
        changes = [*self._run_properties(urn, run_id)]
        for aspect, side, datasets in (
            ("dataProcessInstanceInput", "inputs", inputs),
            ("dataProcessInstanceOutput", "outputs", outputs),
        ):
            edges = f"{side[:-1]}Edges"
            # no datasets: no operation, the aspect is created empty if the run has none yet
            ops = [
                op
                for u in datasets
                for op in (
                    {"op": "add", "path": f"/{side}/{_pointer(u)}", "value": u},
                    {"op": "add", "path": f"/{edges}/{_pointer(u)}", "value": {"destinationUrn": u}},
                )
            ]
            changes.append(
                Change(
                    "dataProcessInstance",
                    urn,
                    aspect,
                    ops,
                    "PATCH",
                    array_keys={side: [], edges: ["destinationUrn"]},
                    place=RUN,
                )
            )
        ops = [{"op": "add", "path": "/parentTemplate", "value": self.job}]
        if self.parent_run:
            parent = run_urn(self.parent_run)
            ops += [
                {"op": "add", "path": "/parentInstance", "value": parent},
                {"op": "add", "path": f"/upstreamInstances/{_pointer(parent)}", "value": parent},
            ]
        changes.append(
            Change(
                "dataProcessInstance",
                urn,
                "dataProcessInstanceRelationships",
                ops,
                "PATCH",
                array_keys={"upstreamInstances": []},
                place=RUN,
            )
        )
        event_type = self.event.get("eventType")
        if event_type in _RUN_STATUS:
            status, result = _RUN_STATUS[event_type]
            point: dict[str, Any] = {"timestampMillis": _millis(self.event["eventTime"]), "status": status}
            if result is not None:
                point["result"] = {"type": result, "nativeResultType": NATIVE_RESULT_TYPE}
            changes.append(Change("dataProcessInstance", urn, "dataProcessInstanceRunEvent", point, place=RUN))
        return changes

    def _run_properties(self, urn: str, run_id: str) -> list[Change]:
        """The run's properties: created when the run started (its nominal start, else its START event, else the
        first event written of it: the create-if-absent), custom properties merged over the run's events."""
        nominal = (self.run_facets.get("nominalTime") or {}).get("nominalStartTime")
        time = _millis(nominal or self.event["eventTime"])
        custom = self._run_custom_properties()
        created = {"time": time, "actor": SYSTEM_ACTOR}
        first = {
            "name": run_id,
            "created": created,
            "customProperties": custom,
            "type": "BATCH_SCHEDULED" if nominal else "BATCH_AD_HOC",
        }
        ops: list[dict[str, Any]] = [{"op": "add", "path": "/name", "value": run_id}]
        if nominal or self.event.get("eventType") == "START":
            ops.append({"op": "add", "path": "/created", "value": created})
        if nominal:
            ops.append({"op": "add", "path": "/type", "value": "BATCH_SCHEDULED"})
        ops.extend({"op": "add", "path": f"/customProperties/{_pointer(k)}", "value": v} for k, v in custom.items())
        return [
            Change(
                "dataProcessInstance",
                urn,
                "dataProcessInstanceProperties",
                first,
                "CREATE",
                headers=IF_ABSENT,
                place=RUN,
            ),
            Change("dataProcessInstance", urn, "dataProcessInstanceProperties", ops, "PATCH", array_keys={}, place=RUN),
        ]

    def _run_custom_properties(self) -> dict[str, str]:
        custom = {"openlineage.producer": self.event["producer"]}
        nominal = self.run_facets.get("nominalTime")
        if isinstance(nominal, dict):
            custom.update({k: str(nominal[k]) for k in ("nominalStartTime", "nominalEndTime") if nominal.get(k)})
        error = self.run_facets.get("errorMessage")
        if isinstance(error, dict):
            custom.update({k: str(error[k]) for k in ("message", "programmingLanguage", "stackTrace") if error.get(k)})
            if "message" in custom:
                custom["errorMessage"] = custom.pop("message")
        engine = self.run_facets.get("processing_engine")
        if isinstance(engine, dict):
            custom.update(
                {
                    f"processingEngine.{k}": str(engine[k])
                    for k in ("name", "version", "openlineageAdapterVersion")
                    if engine.get(k)
                }
            )
        return custom


RUN: Place = ("run",)
_FGL_INFO = {"confidenceScore": 1.0, "upstreamType": "FIELD_SET", "downstreamType": "FIELD"}


def _fine_grained(outputs: list[tuple[str, dict[str, Any]]]) -> dict[str, list[str]]:
    """The outputs' columnLineage facets: downstream schema field URN → its upstream schema field URNs."""
    lineage: dict[str, dict[str, None]] = {}
    for urn, dataset in outputs:
        facet = (dataset.get("facets") or {}).get("columnLineage")
        if not isinstance(facet, dict) or not isinstance(facet.get("fields"), dict):
            continue
        for column, spec in facet["fields"].items():
            upstreams = lineage.setdefault(schema_field_urn(urn, column), {})  # a set in order: no O(n²) on repeats
            for source in spec.get("inputFields") or []:
                upstreams[schema_field_urn(dataset_urn(source["namespace"], source["name"]), source["field"])] = None
    return {downstream: list(upstreams) for downstream, upstreams in lineage.items() if upstreams}
