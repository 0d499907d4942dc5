"""The Spark indexer's per-batch planning rules (pure logic, no Spark): what is applied, what is superseded, what
goes to the dead letter and why."""

from __future__ import annotations

import orjson
import pytest

from app.registry import load_registry
from app.settings import Settings
from spark_indexer.batch import DeadLetter, Record, plan

VERSIONED, TIMESERIES = "mclv", "mclt"
URN = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"
OTHER = "urn:li:dataset:(urn:li:dataPlatform:hive,db.users,PROD)"


@pytest.fixture(scope="module")
def registry():
    return load_registry(Settings().registry_path)


def mcl(
    aspect: str, version: int, urn: str = URN, change_type: str = "UPSERT", value: dict | None = None, **extra
) -> dict:
    body = {"entityType": "dataset", "entityUrn": urn, "aspectName": aspect, "changeType": change_type, **extra}
    if change_type == "DELETE":
        body["previousSystemMetadata"] = {"version": str(version)}
    else:
        body["aspect"] = {
            "value": orjson.dumps(value or {"description": f"v{version}"}).decode(),
            "contentType": "application/json",
        }
        body["systemMetadata"] = {"version": str(version)}
    return body


def records(*bodies, topic: str = VERSIONED, start: int = 0) -> list[Record]:
    return [
        Record(
            topic,
            0,
            start + i,
            b.get("entityUrn", "").encode() if isinstance(b, dict) else None,
            b if isinstance(b, bytes) else orjson.dumps(b),
        )
        for i, b in enumerate(bodies)
    ]


def kept(result) -> list[tuple[str, str, int, str]]:
    return [(p.mcl["entityUrn"], p.mcl["aspectName"], p.version, p.mcl["changeType"]) for p in result.to_apply]


def test_newest_version_per_aspect_wins_and_order_is_the_topics(registry):
    result = plan(
        records(
            mcl("datasetProperties", 1),
            mcl("status", 1, value={"removed": False}),
            mcl("datasetProperties", 2),
            mcl("datasetProperties", 3, urn=OTHER),
        ),
        registry,
        TIMESERIES,
    )
    assert kept(result) == [
        (URN, "status", 1, "UPSERT"),
        (URN, "datasetProperties", 2, "UPSERT"),
        (OTHER, "datasetProperties", 3, "UPSERT"),
    ]
    assert result.superseded == 1 and result.dead == []


def test_a_duplicate_of_an_older_version_published_later_never_wins(registry):
    # the relay is at-least-once: v1 may be published again after v2
    result = plan(
        records(mcl("datasetProperties", 1), mcl("datasetProperties", 2), mcl("datasetProperties", 1)),
        registry,
        TIMESERIES,
    )
    assert kept(result) == [(URN, "datasetProperties", 2, "UPSERT")]


def test_delete_of_the_same_version_comes_after_its_upsert(registry):
    result = plan(
        records(mcl("datasetProperties", 5), mcl("datasetProperties", 5, change_type="DELETE")), registry, TIMESERIES
    )
    assert kept(result) == [(URN, "datasetProperties", 5, "DELETE")]


def test_timeseries_points_are_all_kept(registry):
    points = [mcl("datasetProfile", 1000 + i, value={"timestampMillis": 1000 + i, "rowCount": i}) for i in range(3)]
    result = plan(records(*points, topic=TIMESERIES), registry, TIMESERIES)
    assert len(result.to_apply) == 3 and all(p.timeseries for p in result.to_apply)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"{not json", "unparseable change log"),
        (b"[1, 2]", "a JSON list, not an object"),
        (orjson.dumps({"aspectName": "status", "changeType": "UPSERT"}), "without entityUrn"),
        (orjson.dumps({"entityUrn": URN, "changeType": "UPSERT"}), "without aspectName"),
        (
            orjson.dumps({"entityType": "spaceship", "entityUrn": "urn:li:spaceship:x", "aspectName": "status"}),
            "entity type 'spaceship' is not in the entity registry",
        ),
        (
            orjson.dumps({"entityType": "dataset", "entityUrn": URN, "aspectName": "warpDrive"}),
            "aspect 'warpDrive' is not an aspect of entity 'dataset'",
        ),
    ],
)
def test_bad_records_become_dead_letters_with_the_reason(registry, value, reason):
    result = plan(
        [Record(VERSIONED, 3, 42, b"k", value), *records(mcl("status", 1, value={"removed": True}))],
        registry,
        TIMESERIES,
    )
    assert len(result.dead) == 1
    dead = result.dead[0]
    assert isinstance(dead, DeadLetter) and reason in dead.reason
    assert (dead.record.partition, dead.record.offset, dead.record.value) == (3, 42, value)
    assert kept(result) == [(URN, "status", 1, "UPSERT")]  # the stream goes on


def test_entity_type_is_taken_from_the_urn_when_missing(registry):
    body = mcl("status", 1, value={"removed": False})
    del body["entityType"]
    parsed = plan(records(body), registry, TIMESERIES)
    assert not parsed.dead and parsed.to_apply[0].mcl["entityType"] == "dataset"


# --- writing: what the backend refuses is dead-lettered with its reason, the rest is applied ------------------------


class _Runtime:
    """A `WorkerRuntime` stand-in: runs coroutines, holds a backend that refuses the changes of `refuse` (for their
    data: IndexRefused) and can be made unavailable (IndexUnavailable: transient)."""

    def __init__(self, registry, refuse: str | None = None) -> None:
        import asyncio

        from app.settings import Settings

        self.registry, self.settings, self.refuse = registry, Settings(), refuse
        self.unavailable = False
        self.applied: list = []
        self.loop = asyncio.new_event_loop()
        runtime = self

        class Backend:
            async def apply(self, changes):
                from app.search.model import IndexRefused, IndexUnavailable

                if runtime.unavailable:
                    raise IndexUnavailable("busy (test)")
                if any(getattr(c, "urn", None) == runtime.refuse for c in changes):
                    raise IndexRefused("search bulk refused 1 documents (test)")
                runtime.applied.extend(changes)

        self.backend = Backend()

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def started_backend(self):
        return self.backend

    def reset_backend(self) -> None:
        pass


def test_a_refused_change_log_is_dead_lettered_and_the_rest_applied(registry):
    from spark_indexer.batch import IndexTask

    runtime = _Runtime(registry, refuse=OTHER)
    task = IndexTask(runtime, chunk=100)
    result = task.run(
        records(
            mcl("datasetProperties", 1, value={"name": "a\u0000b"}),
            mcl("datasetProperties", 1, urn=OTHER),
            mcl("status", 1, value={"removed": False}),
        ),
        TIMESERIES,
    )
    assert [(d.urn, d.aspect) for d in result.dead] == [(OTHER, "datasetProperties")]
    assert (
        result.dead[0].reason
        == "search backend refused the change: IndexRefused: search bulk refused 1 documents (test)"
    )
    assert result.dead[0].record.offset == 1  # the record itself, for the dead-letter table
    names = [c.fields.get("name") for c in runtime.applied if getattr(c, "aspect", None) == "datasetProperties"]
    assert names == ["ab"]  # the NUL is stripped in the index copy: nothing refused, nothing dead-lettered


def test_a_backend_that_is_unavailable_fails_the_task_instead_of_dead_lettering(registry, monkeypatch):
    import spark_indexer.batch as batch

    monkeypatch.setattr(batch.time, "sleep", lambda s: None)
    runtime = _Runtime(registry)
    runtime.unavailable = True
    with pytest.raises(Exception, match="busy"):
        batch.IndexTask(runtime, chunk=100).run(records(mcl("datasetProperties", 1)), TIMESERIES)
