"""Structured properties over HTTP against the real Postgres: values checked against their definitions on every
entry (OpenAPI proposals, v3 entities, Rest.li, PATCH), definition changes checked against DataHub's rules and the
stored values, and a soft-deleted definition's values hidden on read."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from tests.helpers import DATASET, eventually, mcp, propose, restli_propose, stored

TIER = "urn:li:structuredProperty:io.acryl.tier"
OTHER = "urn:li:dataset:(urn:li:dataPlatform:hive,db.customers,PROD)"


async def stored_value(db, urn: str, aspect: str) -> dict[str, Any]:
    return (await stored(db, urn, aspect))["value"]


def definition(**overrides: Any) -> dict[str, Any]:
    return {
        "qualifiedName": "io.acryl.tier",
        "valueType": "urn:li:dataType:datahub.string",
        "entityTypes": ["urn:li:entityType:datahub.dataset"],
        "allowedValues": [{"value": {"string": "gold"}}, {"value": {"string": "silver"}}],
        **overrides,
    }


def define(**overrides: Any) -> dict[str, Any]:
    return mcp("propertyDefinition", definition(**overrides), urn=TIER, entity="structuredProperty")


def values(*assigned: tuple[str, list[dict[str, Any]]], urn: str = DATASET, **kw: Any) -> dict[str, Any]:
    return mcp(
        "structuredProperties", {"properties": [{"propertyUrn": p, "values": v} for p, v in assigned]}, urn=urn, **kw
    )


def gold(urn: str = DATASET) -> dict[str, Any]:
    return values((TIER, [{"string": "gold"}]), urn=urn)


async def test_a_valid_value_is_stored_and_a_bad_one_is_a_400_naming_the_property_and_field(client, db):
    await propose(client, define())
    await propose(client, gold())
    assert (await stored_value(db, DATASET, "structuredProperties"))["properties"][0]["values"] == [{"string": "gold"}]

    body = await propose(client, mcp("status", {"removed": False}), values((TIER, [{"string": "bronze"}])), expect=400)
    (issue,) = body["issues"]
    assert issue["index"] == 1 and issue["path"] == "$[1].aspect.value.properties[0].values[0]"
    assert TIER in issue["message"] and "should be one of" in issue["message"]
    # nothing of the batch was written
    assert (await stored_value(db, DATASET, "structuredProperties"))["properties"][0]["values"] == [{"string": "gold"}]


async def test_wrong_type_two_values_for_single_other_entity_type_and_no_definition_are_400s(client):
    await propose(client, define())
    cases = [
        (values((TIER, [{"double": 1.0}])), "should be a string"),
        (
            values((TIER, [{"string": "gold"}, {"string": "silver"}])),
            "has cardinality 1, but multiple values were assigned",
        ),
        (
            values((TIER, [{"string": "gold"}]), urn="urn:li:chart:(looker,c1)", entity="chart"),
            "cannot be applied to entity type chart",
        ),
        (
            values(("urn:li:structuredProperty:nope", [{"string": "x"}])),
            "Unexpected null value found for urn:li:structuredProperty:nope",
        ),
    ]
    for proposal, reason in cases:
        (issue,) = (await propose(client, proposal, expect=400))["issues"]
        assert reason in issue["message"] and "urn:li:structuredProperty:" in issue["message"], issue


async def test_v3_entities_and_restli_take_the_same_checks(client, db):
    await propose(client, define())
    bad = {"properties": [{"propertyUrn": TIER, "values": [{"string": "bronze"}]}]}
    response = await client.post(
        "/openapi/v3/entity/dataset?async=false", json=[{"urn": DATASET, "structuredProperties": {"value": bad}}]
    )
    assert response.status_code == 400, response.text
    (issue,) = response.json()["issues"]
    assert TIER in issue["message"] and issue["path"] == "$[0].structuredProperties.value.properties[0].values[0]"

    response = await restli_propose(client, mcp("structuredProperties", bad, encode=True))
    assert response.status_code == 400, response.text
    (issue,) = response.json()["issues"]
    assert TIER in issue["message"] and "should be one of" in issue["message"], issue
    assert await stored(db, DATASET, "structuredProperties") is None  # neither refused value was written
    response = await restli_propose(client, gold())
    assert response.status_code == 200, response.text
    assert (await stored_value(db, DATASET, "structuredProperties"))["properties"] == [
        {"propertyUrn": TIER, "values": [{"string": "gold"}]}
    ]


async def test_a_patch_goes_through_the_same_checks(client, db):
    await propose(client, define())
    path = f"/properties/{TIER}"

    def patch(value: str) -> dict[str, Any]:
        return mcp(
            "structuredProperties",
            [{"op": "add", "path": path, "value": {"propertyUrn": TIER, "values": [{"string": value}]}}],
            change_type="PATCH",
        )

    (issue,) = (await propose(client, patch("bronze"), expect=400))["issues"]
    assert TIER in issue["message"] and "should be one of" in issue["message"]
    await propose(client, patch("silver"))
    assert (await stored_value(db, DATASET, "structuredProperties"))["properties"][0]["values"] == [
        {"string": "silver"}
    ]


async def test_a_definition_and_its_values_in_one_batch_are_checked_in_order(client):
    assert [r["status"] for r in (await propose(client, define(), gold()))["results"]] == ["CREATED", "CREATED"]


async def test_definition_changes_follow_datahubs_rules(client):
    await propose(client, define())
    for change, reason in [
        (define(valueType="urn:li:dataType:datahub.number"), "Value type cannot be changed"),
        (define(allowedValues=[{"value": {"string": "gold"}}]), "Cannot restrict values that were previously allowed"),
        (define(qualifiedName="io.acryl.renamed"), "Cannot change the fully qualified name"),
    ]:
        (issue,) = (await propose(client, change, expect=400))["issues"]
        assert reason in issue["message"]
    widened = definition(allowedValues=[*definition()["allowedValues"], {"value": {"string": "bronze"}}])
    await propose(client, mcp("propertyDefinition", widened, urn=TIER, entity="structuredProperty"))
    await propose(client, values((TIER, [{"string": "bronze"}])))


async def test_a_version_bump_may_narrow_only_when_no_stored_value_breaks(client, db):
    await propose(client, define(version="20240101000000"))
    await propose(client, gold())
    await propose(client, values((TIER, [{"string": "silver"}]), urn=OTHER))
    narrowed = define(version="20250101000000", allowedValues=[{"value": {"string": "gold"}}])
    (issue,) = (await propose(client, narrowed, expect=400))["issues"]
    assert "would invalidate stored values" in issue["message"] and OTHER in issue["message"]
    assert DATASET not in issue["message"] and issue["urn"] == TIER
    assert (await stored_value(db, TIER, "propertyDefinition"))["version"] == "20240101000000"  # rolled back

    await propose(client, values((TIER, [{"string": "gold"}]), urn=OTHER))
    await propose(client, narrowed)
    assert (await stored_value(db, TIER, "propertyDefinition"))["version"] == "20250101000000"


async def test_a_soft_deleted_definition_hides_its_values_on_read_and_refuses_new_ones(client):
    await propose(client, define())
    kept = "urn:li:structuredProperty:io.acryl.kept"
    await propose(
        client,
        mcp(
            "propertyDefinition",
            definition(qualifiedName="io.acryl.kept", allowedValues=None),
            urn=kept,
            entity="structuredProperty",
        ),
    )
    await propose(client, values((TIER, [{"string": "gold"}]), (kept, [{"string": "x"}])))
    await propose(client, mcp("status", {"removed": True}, urn=TIER, entity="structuredProperty"))

    def shown(properties: dict[str, Any]) -> list[str]:
        return [a["propertyUrn"] for a in properties["properties"]]

    aspect = await client.get(f"/openapi/v3/entity/dataset/{quote(DATASET, safe='')}/structuredProperties")
    assert shown(aspect.json()["value"]) == [kept]
    entity = await client.get(f"/openapi/v3/entity/dataset/{quote(DATASET, safe='')}")
    assert shown(entity.json()["structuredProperties"]["value"]) == [kept]
    restli = await client.get(
        f"/aspects/{quote(DATASET, safe='')}?aspect=structuredProperties&version=0",
        headers={"X-RestLi-Protocol-Version": "2.0.0"},
    )
    assert shown(restli.json()["aspect"]["com.linkedin.structured.StructuredProperties"]) == [kept]

    (issue,) = (await propose(client, values((TIER, [{"string": "gold"}])), expect=400))["issues"]
    assert f"Cannot apply a soft deleted Structured Property value: {TIER}" in issue["message"]


async def test_an_asynchronous_write_s_values_are_checked_before_it_is_queued(kafka_broker, database_url, registry):
    """With Kafka, `async=true` queues the write for the MCP consumer; a bad value is a 400 now, as DataHub answers
    at proposal time, not a failed-MCP record later. What the stored rows cannot tell yet (a property the batch itself
    defines) is queued and left to the consumer's transaction."""
    import httpx

    from app.main import create_app
    from app.settings import Settings
    from tests.helpers import bearer, create_topics, decode_value, kafka_overrides, read_topic, unique_topics

    topics = unique_topics("topic_mcp", "topic_fmcp", "topic_mce", "topic_fmce")
    await create_topics(kafka_broker.bootstrap_servers, *topics.values())
    settings = Settings(
        database_url=database_url,
        apply_migrations_on_start=False,
        **kafka_overrides(kafka_broker.bootstrap_servers, topics),
    )
    app = create_app(settings, registry)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://metaledger", headers=await bearer(app)
        ) as client:
            assert (await client.post("/openapi/v1/proposals?async=false", json=[define()])).status_code == 200
            bad = await client.post(
                "/openapi/v1/proposals?async=true",
                json=[mcp("status", {"removed": False}), values((TIER, [{"string": "bronze"}]))],
            )
            assert bad.status_code == 400, bad.text
            (issue,) = bad.json()["issues"]
            assert issue["index"] == 1 and issue["path"] == "$[1].aspect.value.properties[0].values[0]"
            assert TIER in issue["message"] and "should be one of" in issue["message"]
            bad_v3 = await client.post(
                "/openapi/v3/entity/dataset",
                json=[
                    {
                        "urn": DATASET,
                        "structuredProperties": {
                            "value": {
                                "properties": [
                                    {"propertyUrn": TIER, "values": [{"string": "gold"}, {"string": "silver"}]}
                                ]
                            }
                        },
                    }
                ],
            )
            assert bad_v3.status_code == 400 and "has cardinality 1" in bad_v3.text, bad_v3.text

            fresh = "urn:li:structuredProperty:io.acryl.fresh"
            queued = await client.post(
                "/openapi/v1/proposals?async=true",
                json=[
                    gold(),
                    mcp(
                        "propertyDefinition",
                        definition(qualifiedName="io.acryl.fresh", allowedValues=None),
                        urn=fresh,
                        entity="structuredProperty",
                    ),
                    values((fresh, [{"string": "anything"}]), urn=OTHER),
                ],
            )
            assert queued.status_code == 202, queued.text
            records = await read_topic(kafka_broker.bootstrap_servers, topics["topic_mcp"], expect=3)
            assert [decode_value(r.value)["aspectName"] for r in records] == [
                "structuredProperties",
                "propertyDefinition",
                "structuredProperties",
            ]  # the refused ones never got there


# --- deleting a definition removes its values (DataHub's PropertyDefinitionDeleteSideEffect) --------------------------
def named(name: str, **overrides: Any) -> tuple[str, dict[str, Any]]:
    urn = f"urn:li:structuredProperty:io.acryl.{name}"
    return urn, mcp(
        "propertyDefinition",
        definition(qualifiedName=f"io.acryl.{name}", allowedValues=None, **overrides),
        urn=urn,
        entity="structuredProperty",
    )


def held(row: dict[str, Any] | None) -> dict[str, list[dict[str, Any]]]:
    return {a["propertyUrn"]: a["values"] for a in row["value"]["properties"]} if row else {}


async def test_hard_deleting_a_definition_removes_its_values_from_every_entity_a_version_and_change_log_each(
    client, db
):
    """Each entry deletes one property: v3 DELETE of the entity, v3 DELETE of its definition aspect, Rest.li delete.
    A soft-deleted property's values stay (hidden on read), and do not stop the removal of another's."""
    (by_entity, d1), (by_aspect, d2), (by_restli, d3), (soft, d4), (kept, d5) = (
        named(n) for n in ("entity", "aspect", "restli", "soft", "kept")
    )
    await propose(client, d1, d2, d3, d4, d5)
    x = [{"string": "x"}]
    await propose(
        client,
        values((by_entity, x), (by_aspect, x), (by_restli, x), (soft, x), (kept, x)),
        values((by_entity, x), (by_restli, x), urn=OTHER),
    )
    await propose(client, mcp("status", {"removed": True}, urn=soft, entity="structuredProperty"))
    before = {
        urn: (await stored(db, urn, "structuredProperties"))["systemMetadata"]["version"] for urn in (DATASET, OTHER)
    }
    assert before == {DATASET: "1", OTHER: "1"}

    assert (await client.delete(f"/openapi/v3/entity/structuredProperty/{by_entity}")).status_code == 200
    assert (
        await client.delete(f"/openapi/v3/entity/structuredProperty/{by_aspect}/propertyDefinition")
    ).status_code == 200
    response = await client.post(
        "/entities?action=delete", json={"urn": by_restli}, headers={"X-RestLi-Protocol-Version": "2.0.0"}
    )
    assert response.status_code == 200 and response.json()["value"]["rows"] > 0, response.text

    async def removed() -> bool:
        return (
            set(held(await stored(db, DATASET, "structuredProperties"))) == {soft, kept}
            and held(await stored(db, OTHER, "structuredProperties")) == {}
        )

    await eventually(removed, what="the deleted properties' values removed")
    rows = {urn: await stored(db, urn, "structuredProperties") for urn in (DATASET, OTHER)}
    assert held(rows[DATASET]) == {soft: x, kept: x}
    # one PATCH per entity and deleted property, each a version with its change log, naming its cause
    assert rows[DATASET]["systemMetadata"]["version"] == "4" and rows[OTHER]["systemMetadata"]["version"] == "3"
    cause = rows[DATASET]["systemMetadata"]["properties"]
    assert cause["metaledger.cause.processor"] == "PropertyDefinitionDeleteSideEffect"
    assert cause["metaledger.cause.urn"] in (by_entity, by_aspect, by_restli)
    logged = await db.fetch(
        "SELECT DISTINCT urn, version FROM change_log_outbox WHERE aspect = 'structuredProperties'"
        " AND change_type = 'UPSERT'"
    )  # one per version, whatever the topics
    assert sorted((r["urn"], r["version"]) for r in logged) == [
        (OTHER, 1),
        (OTHER, 2),
        (OTHER, 3),
        (DATASET, 1),
        (DATASET, 2),
        (DATASET, 3),
        (DATASET, 4),
    ]
    # the soft-deleted property's value is still stored, hidden on read
    aspect = await client.get(f"/openapi/v3/entity/dataset/{quote(DATASET, safe='')}/structuredProperties")
    assert [a["propertyUrn"] for a in aspect.json()["value"]["properties"]] == [kept]


async def test_a_write_committed_while_the_values_are_removed_is_kept(client, db, monkeypatch):
    """The removal is a PATCH applied to the row as it is locked: a value written between the moment the holders
    are read and the removal stays."""
    from app.write import structured_property_deletes

    (gone, d1), (kept, d2) = named("gone"), named("kept")
    await propose(client, d1, d2)
    await propose(client, values((gone, [{"string": "old"}]), (kept, [{"string": "before"}])))
    real_holders = structured_property_deletes.holders
    raced: list[str] = []

    async def holders_then_a_concurrent_write(repo, property_urn, after, limit):
        found = await real_holders(repo, property_urn, after, limit)
        if found and not raced:
            raced.append(property_urn)
            change = [
                {
                    "op": "add",
                    "path": f"/properties/{kept}",
                    "value": {"propertyUrn": kept, "values": [{"string": "after"}]},
                }
            ]
            await propose(client, mcp("structuredProperties", change, change_type="PATCH"))
        return found

    monkeypatch.setattr(structured_property_deletes, "holders", holders_then_a_concurrent_write)
    assert (await client.delete(f"/openapi/v3/entity/structuredProperty/{gone}")).status_code == 200

    async def removed() -> bool:
        return gone not in held(await stored(db, DATASET, "structuredProperties"))

    await eventually(removed, what="the deleted property's value removed")
    assert raced == [gone]
    row = await stored(db, DATASET, "structuredProperties")
    assert held(row) == {kept: [{"string": "after"}]} and row["systemMetadata"]["version"] == "3"


async def test_a_soft_delete_keeps_the_values_and_a_hard_delete_of_it_then_removes_them(client, db):
    (soft, d1), (other, d2) = named("soft"), named("other")
    await propose(client, d1, d2)
    await propose(client, values((soft, [{"string": "x"}])), values((other, [{"string": "y"}]), urn=OTHER))
    await propose(client, mcp("status", {"removed": True}, urn=soft, entity="structuredProperty"))
    # a later hard delete of another property is removed: the reader went past the soft delete
    assert (await client.delete(f"/openapi/v3/entity/structuredProperty/{other}")).status_code == 200

    async def other_removed() -> bool:
        return held(await stored(db, OTHER, "structuredProperties")) == {}

    await eventually(other_removed)
    assert held(await stored(db, DATASET, "structuredProperties")) == {soft: [{"string": "x"}]}

    assert (await client.delete(f"/openapi/v3/entity/structuredProperty/{soft}")).status_code == 200
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = ANY($1)", [soft, other]) == 0

    async def soft_removed() -> bool:
        return held(await stored(db, DATASET, "structuredProperties")) == {}

    await eventually(soft_removed)


async def test_holders_past_a_page_are_removed_page_by_page_and_the_delete_is_passed_with_the_last(
    client, db, monkeypatch
):
    """More holders than a page: the reader keeps its position before the DELETE until a page finds none left, then
    passes it (and a change of another property after it waits for the last page)."""
    from app.write import structured_property_deletes

    monkeypatch.setattr(structured_property_deletes, "REMOVAL_PAGE", 2)
    (paged, d1), (later, d2) = named("paged"), named("later")
    await propose(client, d1, d2)
    holders = [f"urn:li:dataset:(urn:li:dataPlatform:hive,db.paged_{i},PROD)" for i in range(5)]
    await propose(client, *(values((paged, [{"string": "x"}]), urn=urn) for urn in holders))
    await propose(client, values((later, [{"string": "y"}]), urn=OTHER))
    assert (await client.delete(f"/openapi/v3/entity/structuredProperty/{paged}")).status_code == 200
    assert (await client.delete(f"/openapi/v3/entity/structuredProperty/{later}")).status_code == 200

    async def removed() -> bool:
        rows = [await stored(db, urn, "structuredProperties") for urn in (*holders, OTHER)]
        return all(held(row) == {} for row in rows)

    await eventually(removed, what="every holder's values removed, three pages of two")
    assert {(await stored(db, urn, "structuredProperties"))["systemMetadata"]["version"] for urn in holders} == {"2"}
    assert await db.fetchval(
        "SELECT last_offset FROM feed_reader_state WHERE reader = 'structured-property-deletes'"
    ) >= await db.fetchval("SELECT max(feed_offset) FROM change_log_outbox WHERE urn = $1", later)
