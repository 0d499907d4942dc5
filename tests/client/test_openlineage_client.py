"""OpenLineage's own Python client (`openlineage-python`, HTTP transport, its own virtualenv) writes a run to a running
metaledger; DataHub's SDK (acryl-datahub, pinned) reads the DataFlow, DataJob, run and datasets back, and
`datahub lineage` walks the lineage the events wrote."""

from __future__ import annotations

import json
import subprocess
import textwrap
import uuid

import pytest

pytestmark = pytest.mark.client

EMIT = """
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import column_lineage_dataset, processing_engine_run, schema_dataset
from openlineage.client.transport.http import ApiKeyTokenProvider, HttpConfig, HttpTransport

config = HttpConfig(url=GMS, endpoint=ENDPOINT, auth=ApiKeyTokenProvider({"apiKey": TOKEN}))
client = OpenLineageClient(transport=HttpTransport(config))
field = schema_dataset.SchemaDatasetFacetFields
source = InputDataset(namespace="postgres://db:5432", name="shop.public.orders", facets={
    "schema": schema_dataset.SchemaDatasetFacet(fields=[field(name="id", type="integer"), field(name="amount", type="numeric")])})
target = OutputDataset(namespace="s3://lake", name="marts/revenue", facets={
    "schema": schema_dataset.SchemaDatasetFacet(fields=[field(name="total", type="decimal(12,2)")]),
    "columnLineage": column_lineage_dataset.ColumnLineageDatasetFacet(fields={"total": column_lineage_dataset.Fields(
        inputFields=[column_lineage_dataset.InputField(namespace="postgres://db:5432", name="shop.public.orders", field="amount")],
        transformationDescription="", transformationType="")}),
})
run = Run(runId=RUN_ID, facets={"processing_engine": processing_engine_run.ProcessingEngineRunFacet(
    version="1.0", name="Python", openlineageAdapterVersion="1.54.0")})
job = Job(namespace="client-test", name="revenue.build")
for state, time in ((RunState.START, "2024-06-01T08:00:00+00:00"), (RunState.COMPLETE, "2024-06-01T08:02:00+00:00")):
    client.emit(RunEvent(eventType=state, eventTime=time, run=run, job=job, producer="https://example.com/client-test",
                         inputs=[source], outputs=[target]))
"""

READ = """
import json
from datahub.ingestion.graph.client import DatahubClientConfig, DataHubGraph
from datahub.metadata.schema_classes import (
    DataFlowInfoClass, DataJobInfoClass, DataJobInputOutputClass, DataProcessInstancePropertiesClass,
    DataProcessInstanceRelationshipsClass, DataProcessInstanceRunEventClass, SchemaMetadataClass,
)

graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
io = graph.get_aspect(JOB, DataJobInputOutputClass)
runs = graph.get_timeseries_values(RUN, DataProcessInstanceRunEventClass, filter={"or": [{"and": []}]}, limit=10)
print(json.dumps({
    "flow": graph.get_aspect(FLOW, DataFlowInfoClass).name,
    "job": graph.get_aspect(JOB, DataJobInfoClass).name,
    "inputs": [e.destinationUrn for e in io.inputDatasetEdges],
    "outputs": [e.destinationUrn for e in io.outputDatasetEdges],
    "columns": [(f.upstreams, f.downstreams) for f in io.fineGrainedLineages],
    "run": graph.get_aspect(RUN, DataProcessInstancePropertiesClass).name,
    "template": graph.get_aspect(RUN, DataProcessInstanceRelationshipsClass).parentTemplate,
    "states": sorted((p.status, p.result.type if p.result else None) for p in runs),
    "schemas": {urn: [f.fieldPath for f in graph.get_aspect(urn, SchemaMetadataClass).fields] for urn in (SOURCE, TARGET)},
}))
"""

SOURCE = "urn:li:dataset:(urn:li:dataPlatform:postgres,shop.public.orders,PROD)"
TARGET = "urn:li:dataset:(urn:li:dataPlatform:s3,lake/marts/revenue,PROD)"
FLOW = "urn:li:dataFlow:(python,revenue,client-test)"
JOB = f"urn:li:dataJob:({FLOW},revenue.build)"


@pytest.mark.parametrize("endpoint", ["openapi/openlineage/api/v1/lineage", "api/v1/lineage"])
def test_openlineage_client_run_is_read_back_by_datahub_sdk(openlineage_python, datahub, metaledger, endpoint):
    run_id = str(uuid.uuid4())
    prelude = f"GMS = {metaledger.url!r}\nTOKEN = {metaledger.token!r}\nENDPOINT = {endpoint!r}\nRUN_ID = {run_id!r}\n"
    emitted = subprocess.run(
        [str(openlineage_python), "-c", prelude + textwrap.dedent(EMIT)], capture_output=True, text=True, timeout=120
    )
    assert emitted.returncode == 0, emitted.stderr
    assert "Failed" not in emitted.stderr and "error" not in emitted.stderr.lower(), emitted.stderr

    run = f"urn:li:dataProcessInstance:{run_id}"
    out = datahub.script(READ, FLOW=FLOW, JOB=JOB, RUN=run, SOURCE=SOURCE, TARGET=TARGET)
    read = json.loads(out.stdout.strip().splitlines()[-1])
    assert read == {
        "flow": "revenue",
        "job": "revenue.build",
        "inputs": [SOURCE],
        "outputs": [TARGET],
        "columns": [[[f"urn:li:schemaField:({SOURCE},amount)"], [f"urn:li:schemaField:({TARGET},total)"]]],
        "run": run_id,
        "template": JOB,
        "states": [["COMPLETE", "SUCCESS"], ["STARTED", None]],
        "schemas": {SOURCE: ["id", "amount"], TARGET: ["total"]},
    }, read

    # `datahub lineage` (the CLI, over GraphQL searchAcrossLineage): the target's upstream is the job, then the source
    upstream = json.loads(datahub.cli("lineage", "--urn", TARGET, "--direction", "upstream", "--format", "json").stdout)
    assert [(r["urn"], r["hops"]) for r in upstream["results"] if r["urn"] != run] == [(JOB, 1), (SOURCE, 2)], upstream
    downstream = json.loads(
        datahub.cli("lineage", "--urn", SOURCE, "--direction", "downstream", "--hops", "2", "--format", "json").stdout
    )
    assert TARGET in {r["urn"] for r in downstream["results"]}, downstream
