"""OpenLineage events checked against the OpenLineage JSON schema shipped in app/openlineage/spec (OpenLineage 2-0-2
and its standard facets, from github.com/OpenLineage/OpenLineage `spec/`, Apache-2.0: spec/LICENSE, spec/NOTICE.txt),
never fetched at run time.

Every event is checked against the core schema of its kind (RunEvent, JobEvent, DatasetEvent: the kind is told by
the members it has, as the spec's `oneOf` does, so that an error names the field and not "valid under none of the
three"), and each standard facet against its own schema, by its name and where it sits (`schema` in a dataset's
`facets`, `parent` in the run's). A facet the spec does not define is only held to the base facet's rules (the core
schema's `BaseFacet`): unknown facets and unknown producers are accepted. Whatever `schemaURL` an event names, the
shipped 2-0-x schema is the one applied: the 1-x and 2-x RunEvent shapes are the same.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Iterator
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource

from app.errors import Issue, ValidationFailed
from app.openlineage.mapping import urn_errors

SPEC_DIR = Path(__file__).parent / "spec"
CORE_ID = "https://openlineage.io/spec/2-0-2/OpenLineage.json"
# Where a facet sits in an event → the core schema's definition its facets extend.
FACET_KINDS = ("RunFacet", "JobFacet", "DatasetFacet", "InputDatasetFacet", "OutputDatasetFacet")
# What a refused batch reports at most: a batch of a thousand bad events is answered with its first issues.
MAX_ISSUES = 20

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_FORMATS = FormatChecker(formats=())


@_FORMATS.checks("uuid", raises=ValueError)
def _is_uuid(value: object) -> bool:
    return not isinstance(value, str) or str(uuid.UUID(value)) == value.lower()


@_FORMATS.checks("date-time", raises=ValueError)
def _is_date_time(value: object) -> bool:
    # RFC 3339 as the clients write it (Python's isoformat, Java's ISO_OFFSET_DATE_TIME): a date, a time, a zone
    return not isinstance(value, str) or (datetime.fromisoformat(value).tzinfo is not None and "T" in value.upper())


@_FORMATS.checks("uri")
def _is_uri(value: object) -> bool:
    return not isinstance(value, str) or bool(_SCHEME.match(value))


class _Spec:
    """The core event validators (one per kind) and the facet validators (per kind, per facet name)."""

    def __init__(self) -> None:
        core = json.loads((SPEC_DIR / "OpenLineage.json").read_text())
        facet_files = [json.loads(p.read_text()) for p in sorted((SPEC_DIR / "facets").glob("*.json"))]
        registry = Registry().with_resources(
            (doc["$id"], Resource.from_contents(doc)) for doc in [core, *facet_files]
        )
        self.events = {
            kind: self._validator({"$ref": f"{CORE_ID}#/$defs/{kind}"}, registry)
            for kind in ("RunEvent", "JobEvent", "DatasetEvent")
        }
        self.base_facets = {kind: self._validator({"$ref": f"{CORE_ID}#/$defs/{kind}"}, registry) for kind in FACET_KINDS}
        self.facets: dict[str, dict[str, Draft202012Validator]] = {kind: {} for kind in FACET_KINDS}
        for doc in facet_files:
            for name, schema in doc["properties"].items():
                # a facet is one definition, or (`lineage`) one per place it may sit in
                for ref in [schema["$ref"]] if "$ref" in schema else [part["$ref"] for part in schema["anyOf"]]:
                    definition = doc["$defs"][ref.removeprefix("#/$defs/")]
                    for kind in _extended_kinds(definition):
                        self.facets[kind][name] = self._validator({"$ref": f"{doc['$id']}{ref}"}, registry)

    @staticmethod
    def _validator(schema: dict[str, Any], registry: Registry) -> Draft202012Validator:
        return Draft202012Validator(schema, registry=registry, format_checker=_FORMATS)


def _extended_kinds(definition: dict[str, Any]) -> list[str]:
    refs = [part.get("$ref", "") for part in definition.get("allOf", [])]
    return [kind for kind in FACET_KINDS if any(ref.endswith(f"/$defs/{kind}") for ref in refs)]


@cache
def _spec() -> _Spec:
    return _Spec()


def event_kind(event: dict[str, Any]) -> str:
    """RunEvent, JobEvent or DatasetEvent, by the members the spec's `oneOf` tells them apart by."""
    if "run" in event or "eventType" in event:
        return "RunEvent"
    if "job" in event:
        return "JobEvent"
    if "dataset" in event:
        return "DatasetEvent"
    return "RunEvent"  # neither: the RunEvent's missing members are what the caller is told about


def validate_events(body: Any) -> tuple[list[dict[str, Any]], bool]:
    """The events of a request body (one event, or a JSON array of them), and whether it was an array.
    ValidationFailed naming each refused field as a path into the body (`$[3].run.runId`, `$.job.name`)."""
    batch = isinstance(body, list)
    events = body if batch else [body]
    issues: list[Issue] = []
    for index, event in enumerate(events):
        base = f"$[{index}]" if batch else "$"
        for path, message in _event_errors(event):
            issues.append(Issue(message, index=index if batch else None, path=base + path))
            if len(issues) >= MAX_ISSUES:
                break
        if len(issues) >= MAX_ISSUES:
            break
    if issues:
        refused = len({i.index for i in issues})
        what = f"{refused} of the {len(events)} events" if batch else "the event"
        raise ValidationFailed(f"{what} do not conform to the OpenLineage spec" if batch
                               else "the event does not conform to the OpenLineage spec", issues)
    return events, batch


def _event_errors(event: Any) -> Iterator[tuple[str, str]]:
    if not isinstance(event, dict):
        yield "", f"an OpenLineage event is a JSON object, not {_json_type(event)}"
        return
    spec = _spec()
    core = list(spec.events[event_kind(event)].iter_errors(event))
    yield from (_described(e) for e in sorted(core, key=lambda e: list(e.absolute_path)))
    if core:
        return  # the facets of a malformed event are not looked at: where they sit may be wrong too
    facets = list(_all_facet_errors(spec, event))
    yield from facets
    if not facets:  # the names are looked at in a conforming event only: the mapping relies on the spec's shapes
        yield from ((_path(place), message) for place, message in urn_errors(event))


def _all_facet_errors(spec: _Spec, event: dict[str, Any]) -> Iterator[tuple[str, str]]:
    run, job = event.get("run") or {}, event.get("job") or {}
    yield from _facet_errors(spec, run.get("facets"), "RunFacet", ".run.facets")
    yield from _facet_errors(spec, job.get("facets"), "JobFacet", ".job.facets")
    for side, kind, extra in (("inputs", "InputDatasetFacet", "inputFacets"), ("outputs", "OutputDatasetFacet", "outputFacets")):
        for i, dataset in enumerate(event.get(side) or []):
            yield from _facet_errors(spec, dataset.get("facets"), "DatasetFacet", f".{side}[{i}].facets")
            yield from _facet_errors(spec, dataset.get(extra), kind, f".{side}[{i}].{extra}")
    if "dataset" in event:
        yield from _facet_errors(spec, event["dataset"].get("facets"), "DatasetFacet", ".dataset.facets")


def _facet_errors(spec: _Spec, facets: dict[str, Any] | None, kind: str, base: str) -> Iterator[tuple[str, str]]:
    for name, facet in (facets or {}).items():
        if isinstance(facet, dict) and facet.get("_deleted") is True:
            continue  # a deleted facet is only `{"_deleted": true}`
        validator = spec.facets[kind].get(name) or spec.base_facets[kind]
        for error in validator.iter_errors(facet):
            path, message = _described(error)
            yield f"{base}{_member(name)}{path}", message


def _described(error: ValidationError) -> tuple[str, str]:
    """The JSON path of an error (in the caller's terms) and a message that does not echo large values."""
    while error.validator in ("anyOf", "oneOf") and error.context:
        error = best_match(error.context)  # the facets maps' one-branch anyOf: the branch's own error
    path = _path(error.absolute_path)
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return path + _member(missing), "required"
    if error.validator == "not":
        return path, "a JobEvent has no `run`, a DatasetEvent neither `run` nor `job`"
    if error.validator == "type":
        return path, f"expected {error.validator_value}, found {_json_type(error.instance)}"
    if error.validator == "format":
        return path, f"not a valid {error.validator_value}"
    if error.validator == "enum":
        return path, f"expected one of {', '.join(map(str, error.validator_value))}"
    return path, error.message[:200]


def _path(place: Iterable[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else _member(p) for p in place)


def _member(name: str) -> str:
    return f".{name}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f"[{json.dumps(name)}]"


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)
