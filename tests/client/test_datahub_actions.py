"""A real DataHub Actions pipeline (`datahub actions -c pipeline.yml`, PyPI `acryl-datahub-actions`, in
`.venv-actions`) with its Kafka event source on metaledger's topics — `schema_registry_url` pointed at metaledger's
registry — and an action that records every event it gets (tests/client/actions_plugin/recording_action.py).

Writes made over HTTP (the real `datahub` client, and plain HTTP) → the pipeline receives their MetadataChangeLogs
(versioned and timeseries) and their Entity Change Events, decoded by DataHub's own code.

The source starts at the `latest` offsets (DataHub's default): the test writes warm-up changes until one is recorded,
so the pipeline is subscribed before the writes under test.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.client.helpers import ECE, MCL, of, propose, warm_up

pytestmark = pytest.mark.client


def kafka_source(server) -> dict:
    return {
        "type": "kafka",
        "config": {
            "connection": {"bootstrap": server.bootstrap, "schema_registry_url": server.registry_url},
            "topic_routes": {
                "mcl": server.topic("topic_mcl_versioned"),
                "mcl_timeseries": server.topic("topic_mcl_timeseries"),
                "pe": server.topic("topic_platform_event"),
            },
        },
    }


def test_actions_kafka_source_receives_mcls_and_entity_change_events(actions_pipeline, kafka_metaledger, kafka_datahub):
    tag = uuid.uuid4().hex[:8]
    urn = f"urn:li:dataset:(urn:li:dataPlatform:hive,actions.orders_{tag},PROD)"
    started = time.monotonic()
    pipeline = actions_pipeline(f"metaledger-recorder-{tag}", kafka_source(kafka_metaledger))
    warm_up(pipeline, kafka_metaledger, tag)
    subscribed_s = time.monotonic() - started

    # the real client (Rest.li emitter): properties, a tag, an owner, a profile (timeseries)
    kafka_datahub.script(
        """
        from datahub.emitter.mcp import MetadataChangeProposalWrapper
        from datahub.emitter.rest_emitter import DatahubRestEmitter
        from datahub.metadata.schema_classes import (DatasetProfileClass, DatasetPropertiesClass, GlobalTagsClass,
            OwnerClass, OwnershipClass, OwnershipTypeClass, TagAssociationClass)

        emitter = DatahubRestEmitter(GMS, token=TOKEN)
        emitter.emit(MetadataChangeProposalWrapper(entityUrn=URN, aspect=DatasetPropertiesClass(description="first")))
        emitter.emit(MetadataChangeProposalWrapper(entityUrn=URN, aspect=GlobalTagsClass(tags=[TagAssociationClass("urn:li:tag:gold")])))
        emitter.emit(MetadataChangeProposalWrapper(entityUrn=URN, aspect=OwnershipClass(
            owners=[OwnerClass(owner="urn:li:corpuser:jdoe", type=OwnershipTypeClass.DATAOWNER)])))
        emitter.emit(MetadataChangeProposalWrapper(entityUrn=URN, aspect=DatasetProfileClass(
            timestampMillis=1_700_000_000_000, rowCount=7, columnCount=2)))
        emitter.emit(MetadataChangeProposalWrapper(entityUrn=URN, aspect=DatasetPropertiesClass(description="second")))
        emitter.close()
        """,
        URN=urn,
    )
    # plain HTTP: the tag replaced (gold removed, silver added)
    propose(
        kafka_metaledger,
        {
            "entityType": "dataset",
            "entityUrn": urn,
            "changeType": "UPSERT",
            "aspectName": "globalTags",
            "aspect": {"value": {"tags": [{"tag": "urn:li:tag:silver"}]}, "contentType": "application/json"},
        },
    )

    # The source reads three topics; the consumer's order across them is not the order of the writes, so the last
    # write is complete only once both its Entity Change Events and its change log have arrived.
    def complete(events):
        eces = {(e["category"], e["operation"], e.get("modifier")) for e in of(events, urn, ECE)}
        versioned = [m["aspect"] for m in of(events, urn, MCL) if m["aspect"] != "datasetProfile"]
        return {("TAG", "REMOVE", "urn:li:tag:gold"), ("TAG", "ADD", "urn:li:tag:silver")} <= eces and (
            versioned.count("globalTags") == 2
        )

    pipeline.wait_for(complete, timeout=60, what="the TAG events and the change log of the second globalTags write")
    received_s = time.monotonic() - started
    events = pipeline.events()

    mcls = of(events, urn, MCL)
    assert [(m["aspect"], m["changeType"]) for m in mcls if m["aspect"] != "datasetProfile"] == [
        ("datasetKey", "UPSERT"),
        ("datasetProperties", "UPSERT"),
        ("globalTags", "UPSERT"),
        ("ownership", "UPSERT"),
        ("datasetProperties", "UPSERT"),
        ("globalTags", "UPSERT"),
    ]
    by_aspect = {}
    for m in mcls:
        by_aspect.setdefault(m["aspect"], []).append(m)
    first, second = by_aspect["datasetProperties"]
    assert first["value"]["value"]["description"] == "first" and first["previousValue"] is None
    assert second["value"]["value"]["description"] == "second"
    assert second["previousValue"]["value"]["description"] == "first"
    assert second["systemMetadata"]["version"] == "2" and second["previousSystemMetadata"]["version"] == "1"
    assert second["systemMetadata"]["properties"]["clientId"] == "acryl-datahub"
    assert second["created"]["actor"] == "urn:li:corpuser:datahub"
    assert all(
        m["topic"] == kafka_metaledger.topic("topic_mcl_versioned") for m in mcls if m["aspect"] != "datasetProfile"
    )
    [profile] = by_aspect["datasetProfile"]
    assert (
        profile["topic"] == kafka_metaledger.topic("topic_mcl_timeseries")
        and profile["value"]["value"]["rowCount"] == 7
    )

    eces = of(events, urn, ECE)
    seen = [(e["category"], e["operation"], e.get("modifier")) for e in eces]
    for expected in [
        ("LIFECYCLE", "CREATE", None),
        ("DOCUMENTATION", "ADD", None),
        ("TAG", "ADD", "urn:li:tag:gold"),
        ("OWNERSHIP", "ADD", "urn:li:corpuser:jdoe"),
        ("DOCUMENTATION", "MODIFY", None),
        ("TAG", "REMOVE", "urn:li:tag:gold"),
        ("TAG", "ADD", "urn:li:tag:silver"),
    ]:
        assert expected in seen, f"{expected} not in {seen}"
    tag_add = next(
        e for e in eces if (e["category"], e["operation"], e.get("modifier")) == ("TAG", "ADD", "urn:li:tag:gold")
    )
    assert tag_add["entityType"] == "dataset" and tag_add["topic"] == kafka_metaledger.topic("topic_platform_event")
    assert tag_add["parameters"]["tagUrn"] == "urn:li:tag:gold"
    assert tag_add["auditStamp"]["actor"] == "urn:li:corpuser:datahub" and tag_add["auditStamp"]["time"] > 0
    # nothing failed to decode: every message on the routed topics was an event for the action
    assert "Invalid magic byte" not in pipeline.log_tail(400) and "Traceback" not in pipeline.log_tail(400), (
        pipeline.log_tail()
    )
    print(
        f"\nDataHub Actions: subscribed after {subscribed_s:.1f}s, all events after {received_s:.1f}s "
        f"({len(events)} events recorded)"
    )
    print(json.dumps(eces[:2], indent=1))
