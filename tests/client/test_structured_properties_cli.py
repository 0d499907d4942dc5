"""Structured properties with the real client: `datahub properties upsert -f` defines them, the SDK's patch helpers
set a dataset's values (stored and read back), bad values are refused naming the property, narrowing a
definition that stored values rely on is refused, and `datahub delete --hard` of the property removes its values."""

from __future__ import annotations

import json
import textwrap

DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,cli_props.orders,PROD)"
CHART = "urn:li:chart:(looker,cli_props.revenue)"
TIER = "urn:li:structuredProperty:io.acryl.cli.tier"

DEFINITIONS = """
- id: io.acryl.cli.tier
  type: string
  cardinality: SINGLE
  display_name: Tier
  entity_types: [dataset]
  allowed_values:
    - value: gold
    - value: silver
  version: "{version}"
"""

SET_VALUES = """
    import json
    from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
    from datahub.emitter.mcp import MetadataChangeProposalWrapper
    from datahub.metadata.schema_classes import StructuredPropertiesClass, StructuredPropertyValueAssignmentClass
    from datahub.specific.dataset import DatasetPatchBuilder

    graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))

    def refusal(emitting):
        try:
            emitting()
            return None
        except Exception as error:
            return str(error)

    def emit(builder, *values):  # the patch helper DataHub's docs show
        value = list(values) if len(values) > 1 else values[0]
        return refusal(lambda: graph.emit_mcps(builder.set_structured_property(TIER, value).build()))

    def emit_aspect(urn, value):  # the whole aspect, for an entity without a patch helper
        aspect = StructuredPropertiesClass(properties=[StructuredPropertyValueAssignmentClass(propertyUrn=TIER, values=[value])])
        return refusal(lambda: graph.emit_mcp(MetadataChangeProposalWrapper(entityUrn=urn, aspect=aspect)))

    refusals = {
        "outside allowedValues": emit(DatasetPatchBuilder(DATASET), "bronze"),
        "wrong type": emit(DatasetPatchBuilder(DATASET), 5),
        "two values for SINGLE": emit(DatasetPatchBuilder(DATASET), "gold", "silver"),
        "entity type not allowed": emit_aspect(CHART, "gold"),
    }
    assert emit(DatasetPatchBuilder(DATASET), "gold") is None
    stored = graph.get_aspect(DATASET, StructuredPropertiesClass)
    print(json.dumps({"refusals": refusals, "stored": [[p.propertyUrn, p.values] for p in stored.properties]}))
"""

READ_DEFINITION = """
    from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
    from datahub.metadata.schema_classes import StructuredPropertyDefinitionClass

    graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
    print(graph.get_aspect(TIER, StructuredPropertyDefinitionClass).version)
"""

VALUES_GONE = """
    import time
    from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
    from datahub.metadata.schema_classes import StructuredPropertiesClass

    graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
    deadline = time.monotonic() + 20
    while True:  # the removal follows the delete asynchronously
        held = [p.propertyUrn for p in graph.get_aspect(DATASET, StructuredPropertiesClass).properties]
        if TIER not in held or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    print(held)
"""


def test_properties_upsert_then_sdk_values_checked_against_the_definition(datahub, tmp_path):
    definitions = tmp_path / "properties.yaml"
    definitions.write_text(textwrap.dedent(DEFINITIONS.format(version="20240101000000")))
    datahub.cli("properties", "upsert", "-f", str(definitions))

    out = json.loads(
        datahub.script(SET_VALUES, DATASET=DATASET, CHART=CHART, TIER=TIER).stdout.strip().splitlines()[-1]
    )
    assert out["stored"] == [[TIER, ["gold"]]]
    for case, message in out["refusals"].items():
        assert message is not None and TIER in message, (case, message)
    assert "should be one of" in out["refusals"]["outside allowedValues"]
    assert "should be a string" in out["refusals"]["wrong type"]
    assert "has cardinality 1" in out["refusals"]["two values for SINGLE"]
    assert "cannot be applied to entity type chart" in out["refusals"]["entity type not allowed"]

    # a breaking change (a version bump) that the stored "gold" does not survive is refused
    narrowed = DEFINITIONS.format(version="20250101000000").replace("    - value: gold\n", "")
    definitions.write_text(textwrap.dedent(narrowed))
    refused = datahub.cli("properties", "upsert", "-f", str(definitions), check=False)
    shown = refused.stdout + refused.stderr
    assert "would invalidate stored values" in shown and DATASET in shown, shown[-3000:]
    kept = datahub.script(READ_DEFINITION, TIER=TIER).stdout.strip().splitlines()[-1]
    assert kept == "20240101000000"

    # a hard delete of the property removes its values (a new version of the dataset's aspect, read back)
    datahub.cli("delete", "--urn", TIER, "--hard", "--force")
    assert datahub.script(VALUES_GONE, DATASET=DATASET, TIER=TIER).stdout.strip().splitlines()[-1] == "[]"
