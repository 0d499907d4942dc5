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

import hashlib
import json
import re
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import orjson
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
        docs = {doc["$id"]: doc for doc in [core, *facet_files]}
        registry = Registry().with_resources((uri, Resource.from_contents(doc)) for uri, doc in docs.items())
        self._inliner = _Inliner(docs)
        self.events = {
            kind: self._validator({"$ref": f"{CORE_ID}#/$defs/{kind}"}, registry)
            for kind in ("RunEvent", "JobEvent", "DatasetEvent")
        }
        self.base_facets = {
            kind: self._validator({"$ref": f"{CORE_ID}#/$defs/{kind}"}, registry) for kind in FACET_KINDS
        }
        self.facets: dict[str, dict[str, Draft202012Validator]] = {kind: {} for kind in FACET_KINDS}
        for doc in facet_files:
            for name, schema in doc["properties"].items():
                # a facet is one definition, or (`lineage`) one per place it may sit in
                for ref in [schema["$ref"]] if "$ref" in schema else [part["$ref"] for part in schema["anyOf"]]:
                    definition = doc["$defs"][ref.removeprefix("#/$defs/")]
                    for kind in _extended_kinds(definition):
                        self.facets[kind][name] = self._validator({"$ref": f"{doc['$id']}{ref}"}, registry)

    def _validator(self, schema: dict[str, Any], registry: Registry) -> Draft202012Validator:
        return Draft202012Validator(self._inliner.inlined(schema, ""), registry=registry, format_checker=_FORMATS)


class _Inliner:
    """A schema with its references replaced by what they name (a third of a check's time went to looking them up),
    except a reference back into a definition being inlined (the subset conditions nest): it stays, made absolute,
    for the registry to resolve."""

    def __init__(self, docs: dict[str, dict[str, Any]]) -> None:
        self.docs = docs

    def inlined(self, node: Any, base: str, within: tuple[str, ...] = ()) -> Any:
        if isinstance(node, list):
            return [self.inlined(item, base, within) for item in node]
        if not isinstance(node, dict):
            return node
        out = {k: self.inlined(v, base, within) for k, v in node.items() if k != "$ref"}
        if "$ref" not in node:
            return out
        target = urljoin(base, node["$ref"]) if base else node["$ref"]
        if target in within:
            return {**out, "$ref": target}
        uri, _, pointer = target.partition("#")
        resolved = self.docs[uri]
        for token in filter(None, pointer.split("/")):
            resolved = resolved[token]
        inlined = self.inlined(resolved, uri, (*within, target))
        siblings = {k: v for k, v in out.items() if k not in ("description", "example")}
        return {"allOf": [inlined], **siblings} if siblings else inlined


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
        raise ValidationFailed(
            f"{what} do not conform to the OpenLineage spec"
            if batch
            else "the event does not conform to the OpenLineage spec",
            issues,
        )
    return events, batch


def _event_errors(event: Any) -> Iterator[tuple[str, str]]:
    if not isinstance(event, dict):
        yield "", f"an OpenLineage event is a JSON object, not {_json_type(event)}"
        return
    spec = _spec()
    core = list(spec.events[event_kind(event)].iter_errors(_without_facets(event)))
    yield from (_described(e) for e in sorted(core, key=lambda e: list(e.absolute_path)))
    if core:
        return  # the facets of a malformed event are not looked at: where they sit may be wrong too
    facets = list(_all_facet_errors(spec, event))
    yield from facets
    if not facets:  # the names are looked at in a conforming event only: the mapping relies on the spec's shapes
        yield from ((_path(place), message) for place, message in urn_errors(event))


def _without_facets(event: dict[str, Any]) -> dict[str, Any]:
    """The event with its facets maps emptied (a map that is no object is kept, for the core check to name): each facet
    is checked once, by its own schema, which holds the core's facet rules too (`allOf` the core's facet kind)."""

    def emptied(holder: Any, *members: str) -> Any:
        if not isinstance(holder, dict) or not any(isinstance(holder.get(m), dict) for m in members):
            return holder
        return {**holder, **{m: {} for m in members if isinstance(holder.get(m), dict)}}

    core = dict(event)
    for member in ("run", "job", "dataset"):
        if member in core:
            core[member] = emptied(core[member], "facets")
    for side, extra in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
        if isinstance(core.get(side), list):
            core[side] = [emptied(dataset, "facets", extra) for dataset in core[side]]
    return core


def _all_facet_errors(spec: _Spec, event: dict[str, Any]) -> Iterator[tuple[str, str]]:
    run, job = event.get("run") or {}, event.get("job") or {}
    yield from _facet_errors(spec, run.get("facets"), "RunFacet", ".run.facets")
    yield from _facet_errors(spec, job.get("facets"), "JobFacet", ".job.facets")
    for side, kind, extra in (
        ("inputs", "InputDatasetFacet", "inputFacets"),
        ("outputs", "OutputDatasetFacet", "outputFacets"),
    ):
        for i, dataset in enumerate(event.get(side) or []):
            yield from _facet_errors(spec, dataset.get("facets"), "DatasetFacet", f".{side}[{i}].facets")
            yield from _facet_errors(spec, dataset.get(extra), kind, f".{side}[{i}].{extra}")
    if "dataset" in event:
        yield from _facet_errors(spec, event["dataset"].get("facets"), "DatasetFacet", ".dataset.facets")


def _facet_errors(spec: _Spec, facets: dict[str, Any] | None, kind: str, base: str) -> Iterator[tuple[str, str]]:
    for name, facet in (facets or {}).items():
        if isinstance(facet, dict) and facet.get("_deleted") is True:
            continue  # a deleted facet is only `{"_deleted": true}`
        yield from (
            (f"{base}{_member(name)}{path}", message) for path, message in _checked_facet(spec, kind, name, facet)
        )


# How many facets' outcomes are remembered: a run's events carry the same facets again (a START's schema, its
# COMPLETE's), a batch its datasets' facets once per event that names them.
FACET_MEMO_SIZE = 4096
_facet_memo: OrderedDict[bytes, tuple[tuple[str, str], ...]] = OrderedDict()


def _checked_facet(spec: _Spec, kind: str, name: str, facet: Any) -> tuple[tuple[str, str], ...]:
    """The errors of one facet (paths inside it), remembered by a digest of its kind, name and JSON text."""
    try:
        text = orjson.dumps([kind, name, facet])
    except (orjson.JSONEncodeError, TypeError):  # an integer past 64 bits: checked every time
        text = None
    key = hashlib.blake2b(text, digest_size=16).digest() if text is not None else None
    if key is not None and key in _facet_memo:
        _facet_memo.move_to_end(key)
        return _facet_memo[key]
    validator = spec.facets[kind].get(name) or spec.base_facets[kind]
    errors = tuple(_described(error) for error in validator.iter_errors(facet))
    if key is not None:
        _facet_memo[key] = errors
        if len(_facet_memo) > FACET_MEMO_SIZE:
            _facet_memo.popitem(last=False)
    return errors


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
    # a schema's enum is a JSON list; only an error built without a value (jsonschema's Unset) would fall to the message
    if error.validator == "enum" and isinstance(error.validator_value, list):
        return path, f"expected one of {', '.join(map(str, error.validator_value))}"
    return path, error.message[:200]


def _path(place: Iterable[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else _member(p) for p in place)


def _member(name: str) -> str:
    return f".{name}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f"[{json.dumps(name)}]"


def _json_type(value: Any) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)
