"""Events derived from the change logs at publish time: per-aspect events ("Metadata Events (v5)") for the routed
entity/aspect pairs, and the legacy audit event (MAE v4) when it is turned on.

Neither adds a row to the outbox: the relay (app.kafka.relay) derives them from a versioned change log row as it
publishes it, and marks the row delivered only once the broker acknowledged the change log *and* what was derived
from it. They share the change log's guarantees: committed with the write, at least once, in per-URN order (same key,
the URN, published in feed order by the one relay that holds the URN's lane). With both families off (the default)
the relay does nothing more per row than a dictionary lookup.

Per-aspect audit events (app.avro.per_aspect has the records), for a pair routed by `METALEDGER_EVENTS_V5_ROUTES`:
- an UPSERT or CREATE → `MetadataAuditEvent {urn, oldValue: the value before (absent for a first write), newValue}`;
- a DELETE → a tombstone: a record with the URN as key and no value (compaction then drops the URN's older
  events; a consumer sees "this aspect of this URN is gone");
- a RESTATE (a no-op write logged with ALWAYS_EMIT_CHANGE_LOG) → nothing: the value did not change.

MAE v4 (DataHub's `MetadataAuditEvent` record, topic `MetadataAuditEvent_v4`): snapshots hold only the aspect the
change touched, as the design document says; `oldSnapshot` is absent for a first write; a DELETE has a
`newSnapshot` with no aspects. Entities without a snapshot in DataHub's record (most of the newer ones) and aspects
their snapshot cannot carry are not published (counted in `skipped_mae`).
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from app.avro import per_aspect, records, schemas
from app.avro.wire import ValueCodec, frame
from app.kafka.topics import create_missing_topics
from app.registry import EntityRegistry
from app.schema_registry import IncompatibleSchema, InvalidSchema
from app.settings import Settings
from app.urns import InvalidUrnError, entity_type_of

log = logging.getLogger("metaledger.kafka.per_aspect")

TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # Kafka's legal topic names
ROUTE_KEYS = frozenset({"entityTypes", "aspects", "auditTopic", "changeTopic", "failedTopic", "sharedTopic"})


class EventRoutingError(ValueError):
    """METALEDGER_EVENTS_V5_ROUTES is not valid: the service refuses to start, naming every problem."""


class PairRefused(ValueError):
    """A change log of a pair whose event schemas the schema registry refused: its events cannot be framed."""


@dataclass(slots=True)
class PairRoute:
    """One routed entity/aspect pair: its topics, its generated schemas and (once registered) their ids."""

    entity: str
    aspect: str
    audit_topic: str
    change_topic: str
    failed_topic: str
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # record short name → schema document
    ids: dict[str, int] = field(default_factory=dict)  # record short name → schema id in the registry
    refusal: str | None = None  # why the registry refused one of the schemas (then its events are never framed)
    _codecs: dict[str, records.Codecs] = field(default_factory=dict)

    def topic(self, record: str) -> str:
        return {
            per_aspect.CHANGE: self.change_topic,
            per_aspect.AUDIT: self.audit_topic,
            per_aspect.FAILED: self.failed_topic,
        }[record]

    def codecs(self, record: str) -> records.Codecs:
        found = self._codecs.get(record)
        if found is None:
            found = self._codecs[record] = records.Codecs(self.schemas[record])
        return found

    def encode(self, record: str, value: Mapping[str, Any], avro: bool) -> bytes:
        """The record as published: Confluent-framed Avro with its registered id, or its JSON text."""
        if not avro:
            return orjson.dumps(value)
        return frame(self.ids[record], self.codecs(record).encode(value))

    def describe(self) -> dict[str, Any]:
        return {
            "entityType": self.entity,
            "aspectName": self.aspect,
            "topics": {record: self.topic(record) for record in per_aspect.FAMILY},
            "subjects": {record: f"{self.topic(record)}-value" for record in per_aspect.FAMILY},
            "schemaIds": dict(self.ids),
            "recordNames": {
                record: f"{per_aspect.namespace(self.entity, self.aspect)}.{record}" for record in per_aspect.FAMILY
            },
        }


def resolve_routes(settings: Settings, registry: EntityRegistry) -> dict[tuple[str, str], PairRoute]:
    """The routed pairs (entity, aspect) → their route, checked: known keys, legal topic names, each route matching
    some pair, no two pairs on one topic unless every route involved says `sharedTopic: true`. The first route that
    matches a pair wins. Raises EventRoutingError listing every problem."""
    problems: list[str] = []
    routed: dict[tuple[str, str], PairRoute] = {}
    shared_ok: dict[tuple[str, str], bool] = {}
    pairs = [(entity.name, aspect) for entity in registry.entities.values() for aspect in entity.aspects_in_order]
    for index, route in enumerate(settings.events_v5_routes):
        where = f"METALEDGER_EVENTS_V5_ROUTES[{index}]"
        if not isinstance(route, dict):
            problems.append(f"{where}: a route is an object, found {type(route).__name__}")
            continue
        unknown = sorted(set(route) - ROUTE_KEYS)
        if unknown:
            problems.append(f"{where}: unknown key(s) {unknown}; known: {sorted(ROUTE_KEYS)}")
        patterns = {}
        for key in ("entityTypes", "aspects"):
            value = route.get(key, ["*"])
            if not (isinstance(value, list) and value and all(isinstance(p, str) and p for p in value)):
                problems.append(f"{where}.{key}: a non-empty list of entity/aspect name patterns")
                value = []
            patterns[key] = value
        matched = [
            (e, a)
            for e, a in pairs
            if any(fnmatch.fnmatchcase(e, p) for p in patterns["entityTypes"])
            and any(fnmatch.fnmatchcase(a, p) for p in patterns["aspects"])
        ]
        if not matched and patterns["entityTypes"] and patterns["aspects"]:
            problems.append(f"{where}: matches no entity/aspect pair of the registry")
        for entity, aspect in matched:
            if (entity, aspect) in routed:
                continue
            topics = {}
            for key, template in (
                ("auditTopic", settings.events_v5_audit_topic),
                ("changeTopic", settings.events_v5_change_topic),
                ("failedTopic", settings.events_v5_failed_topic),
            ):
                name = str(route.get(key, template)).replace("{entity}", entity).replace("{aspect}", aspect)
                if not TOPIC_NAME.match(name) or name in (".", ".."):
                    problems.append(
                        f"{where}.{key}: {name!r} is not a legal Kafka topic name (1 to 249 of [A-Za-z0-9._-])"
                    )
                topics[key] = name
            routed[(entity, aspect)] = PairRoute(
                entity, aspect, topics["auditTopic"], topics["changeTopic"], topics["failedTopic"]
            )
            shared_ok[(entity, aspect)] = bool(route.get("sharedTopic", False))
    by_topic: dict[str, list[tuple[str, str]]] = {}
    for pair, pair_route in routed.items():
        for record in per_aspect.FAMILY:
            by_topic.setdefault(pair_route.topic(record), []).append(pair)
    for topic, on_it in by_topic.items():
        if len(on_it) > 1 and not all(shared_ok[pair] for pair in on_it):
            named = ", ".join(f"{e}.{a}" for e, a in on_it[:5]) + (" ..." if len(on_it) > 5 else "")
            problems.append(
                f"topic {topic!r} would carry the events of {len(on_it)} pairs ({named}): several "
                "schemas on one topic; give each pair its own topic, or set sharedTopic: true"
            )
    if problems:
        raise EventRoutingError("; ".join(problems))
    return routed


class LegacyAuditEvents:
    """MAE v4 records: which snapshot an entity has in DataHub's record, and how its aspects are named in it."""

    def __init__(self, registry: EntityRegistry) -> None:
        members: dict[str, set[str]] = {}  # snapshot full name → its aspect union's members (Avro full names)
        for branch in schemas.schema(schemas.MAE)["fields"][1]["type"]:  # oldSnapshot: defines every snapshot
            if isinstance(branch, dict):
                name = schemas.full_name(branch["name"], branch.get("namespace"))
                aspects = next(f for f in branch["fields"] if f["name"] == "aspects")["type"]["items"]
                members[name] = {
                    item if isinstance(item, str) else schemas.full_name(item["name"], item.get("namespace"))
                    for item in aspects
                }
        self.snapshots: dict[str, tuple[str, dict[str, str]]] = {}  # entity → (snapshot, aspect name → member)
        for entity in registry.entities.values():
            key = _avro_name(registry.aspect_spec(entity.key_aspect).record_name)
            snapshot = next((s for s, m in members.items() if key in m), None)
            if snapshot is None:
                continue
            carried = {a: _avro_name(registry.aspect_spec(a).record_name) for a in entity.aspect_names}
            self.snapshots[entity.name] = (snapshot, {a: m for a, m in carried.items() if m in members[snapshot]})

    def record(self, entity: str, mcl: Mapping[str, Any]) -> dict[str, Any] | None:
        """The MAE's JSON form for a change log, or None when DataHub's record cannot carry it."""
        found = self.snapshots.get(entity)
        if found is None:
            return None
        snapshot, members = found
        aspect_name = mcl.get("aspectName")
        member = members.get(aspect_name) if aspect_name is not None else None
        if member is None:
            return None
        urn = mcl["entityUrn"]
        old, new = _value(mcl.get("previousAspectValue")), _value(mcl.get("aspect"))
        event: dict[str, Any] = {
            "newSnapshot": {snapshot: {"urn": urn, "aspects": [{member: new}] if new is not None else []}}
        }
        if old is not None:
            event["oldSnapshot"] = {snapshot: {"urn": urn, "aspects": [{member: old}]}}
        return event


def _avro_name(pegasus_name: str) -> str:
    return pegasus_name.replace("com.linkedin.", "com.linkedin.pegasus2avro.", 1)


def _value(generic_aspect: Any) -> Any:
    if not isinstance(generic_aspect, dict) or generic_aspect.get("value") is None:
        return None
    value = generic_aspect["value"]
    return orjson.loads(value) if isinstance(value, (str, bytes)) else value


class DerivedEvents:
    """What the relay publishes besides a change log row: `for_row(row)` → [(topic, value or None for a
    tombstone)]. `start` registers the per-aspect schemas not registered yet (once per process, and again for the
    pairs of a runtime model set; retried by the caller).

    The routes follow the registry (`EntityRegistry.on_change`): a runtime model set's new aspects and entities that
    METALEDGER_EVENTS_V5_ROUTES matches get their pairs, a changed aspect schema its pair's new records. The new routes
    take effect in the next `start` (the relay calls it before each batch), once their topics are created and their
    schemas registered: between two batches, and never under a row being encoded (a route without its ids cannot
    frame its records). A set whose pairs the routes cannot take (two pairs on one topic) is logged and the routes in
    force are kept.
    Whether the per-aspect events or MAE v4 are published at all is decided at start."""

    def __init__(self, settings: Settings, registry: EntityRegistry, codec: ValueCodec) -> None:
        self.settings = settings
        self.registry = registry
        self.codec = codec
        self.versioned_topic = settings.topic_mcl_versioned
        self.mae_topic = settings.topic_mae
        self.routes: dict[tuple[str, str], PairRoute] = self._routes_of(registry, {})
        self.legacy = LegacyAuditEvents(registry) if settings.mae_v4_enabled else None
        self.enabled = bool(self.routes) or self.legacy is not None
        self.skipped_mae = 0
        # registry swaps seen, and the one the routes in force were built at (their topics exist, their ids are in)
        self._swaps = self._routed_at = 0
        self.registered = False
        self.stop_following = registry.on_change(self._follow)

    def _routes_of(
        self, registry: EntityRegistry, kept_routes: dict[tuple[str, str], PairRoute]
    ) -> dict[tuple[str, str], PairRoute]:
        """The registry's routes; a pair whose schemas did not change keeps the ids `kept_routes` registered."""
        routes = resolve_routes(self.settings, registry)
        for pair, route in routes.items():  # generated from the aspect's own schema, as the registry has it now
            route.schemas = per_aspect.event_schemas(
                route.entity, route.aspect, registry.aspect_spec(route.aspect).schema
            )
            kept = kept_routes.get(pair)
            if kept is not None and kept.schemas == route.schemas:
                route.ids, route.refusal = dict(kept.ids), kept.refusal
        return routes

    def _follow(self, registry: EntityRegistry) -> None:
        self._swaps += 1
        self.registered = False

    def topics(self) -> list[str]:
        """The topics these events use: each routed pair's three, and MAE v4's when it is on."""
        names = [route.topic(record) for route in self.routes.values() for record in per_aspect.FAMILY]
        return names + ([self.mae_topic] if self.legacy is not None else [])

    async def start(self) -> None:
        """Bring the routes in force up to the registry: a swapped registry's new pairs get their topics (when the
        service creates topics; the relay created those of the routes in force when it started), every pair its
        three schemas registered under `<topic>-value` (the ids the audit events are framed with and the consumers
        read by), then the new routes take effect. A pair whose schemas the registry refuses (incompatible with the
        subject's versions, or invalid) takes effect refused: `for_row` raises PairRefused for its change logs, so
        that the relay keeps them with the reason. Raises while the broker or the registry cannot answer; the next
        call takes it up again from the routes in force."""
        while not self.registered:
            swaps = self._swaps
            routes, legacy = self.routes, self.legacy
            if swaps != self._routed_at:
                try:
                    routes = self._routes_of(self.registry, self.routes)
                    legacy = LegacyAuditEvents(self.registry) if self.settings.mae_v4_enabled else None
                except EventRoutingError as error:
                    log.error(
                        "the runtime model set's pairs cannot be routed; the routes in force are kept",
                        extra={"generation": self.registry.generation, "error": str(error)},
                    )
            new_topics = [
                route.topic(r) for pair, route in routes.items() if pair not in self.routes for r in per_aspect.FAMILY
            ]
            if new_topics and self.settings.create_topics_on_start:
                await create_missing_topics(self.settings, new_topics)
            pending = [
                route for route in routes.values() if route.refusal is None and len(route.ids) < len(per_aspect.FAMILY)
            ]
            if pending and self.codec.avro:
                await self._register(pending)
            self.routes, self.legacy, self._routed_at = routes, legacy, swaps
            self.registered = self._swaps == swaps  # else a set taken up meanwhile: its routes in the next turn

    async def _register(self, routes: list[PairRoute]) -> None:
        register = getattr(self.codec.registry, "register", None)
        if register is None:
            raise RuntimeError("per-aspect events need a schema registry to register their schemas in")
        for route in routes:
            for record in per_aspect.FAMILY:
                subject = f"{route.topic(record)}-value"
                try:
                    route.ids[record] = await register(subject, orjson.dumps(route.schemas[record]).decode())
                except (IncompatibleSchema, InvalidSchema) as error:
                    route.refusal = f"the schema registry refused {subject}: {type(error).__name__}: {error}"
                    log.error(
                        "a per-aspect event schema was refused; the pair's change logs are kept unpublished",
                        extra={"entity": route.entity, "aspect": route.aspect, "error": route.refusal},
                    )
                    break
        log.info("per-aspect event schemas registered", extra={"pairs": len(routes)})

    def for_row(self, topic: str, key: str, aspect: str, payload: bytes) -> list[tuple[str, bytes | None]]:
        if topic != self.versioned_topic:
            return []
        try:
            entity = entity_type_of(key)
        except InvalidUrnError:
            return []
        route = self.routes.get((entity, aspect))
        if route is None and self.legacy is None:
            return []
        if route is not None and route.refusal is not None:
            raise PairRefused(f"the {entity}.{aspect} events cannot be framed: {route.refusal}")
        mcl = orjson.loads(payload)
        derived: list[tuple[str, bytes | None]] = []
        change_type = mcl.get("changeType")
        if route is not None and change_type != "RESTATE":
            if change_type == "DELETE":
                derived.append((route.audit_topic, None))
            else:
                event = {
                    "urn": mcl["entityUrn"],
                    "oldValue": _value(mcl.get("previousAspectValue")),
                    "newValue": _value(mcl.get("aspect")),
                }
                derived.append((route.audit_topic, route.encode(per_aspect.AUDIT, event, self.codec.avro)))
        if self.legacy is not None and change_type != "RESTATE":
            mae = self.legacy.record(entity, mcl)
            if mae is None:
                self.skipped_mae += 1
            else:
                derived.append((self.mae_topic, self.codec.encode("mae", mae)))
        return derived


def pair_routes(settings: Settings, registry: EntityRegistry, *, every_pair: bool = False) -> list[PairRoute]:
    """The routed pairs with their generated schemas; with `every_pair`, every entity/aspect pair of the registry
    (routed or not, on the default topic templates): what a team looks at before asking for a route."""
    if every_pair:
        settings = settings.model_copy(update={"events_v5_routes": [{"entityTypes": ["*"], "aspects": ["*"]}]})
    routes = list(resolve_routes(settings, registry).values()) if settings.events_v5_routes else []
    for route in routes:
        route.schemas = per_aspect.event_schemas(route.entity, route.aspect, registry.aspect_spec(route.aspect).schema)
    return routes


def export_schemas(routes: list[PairRoute], directory: Path) -> list[Path]:
    """Each route's three schemas as `<namespace>.<record>.avsc` files in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for route in routes:
        for record in per_aspect.FAMILY:
            path = directory / f"{per_aspect.namespace(route.entity, route.aspect)}.{record}.avsc"
            path.write_bytes(orjson.dumps(route.schemas[record], option=orjson.OPT_INDENT_2) + b"\n")
            written.append(path)
    return written
