"""A client generated from the committed OpenAPI document with `openapi-python-client` (in its own virtualenv):
it generates without a warning, has every operation of the document, and writes and reads through metaledger —
an MCP through /openapi/v1/proposals, a v3 entity — with a bearer token."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.client.conftest import GENERATOR_VENV, GENERATOR_VERSION

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "openapi" / "openapi.json"
METHODS = {"get", "head", "post", "put", "patch", "delete"}
# Without the generator's post-hooks (`ruff check --fix-only` and `ruff format` over the ~3,600 generated files: 6-9 s
# of the 20-30 s of CPU a generation takes). They only restyle the generated code, whose import and use below is the
# proof; what the generator itself reports (no warning, nothing skipped) is unchanged.
GENERATOR_CONFIG = "post_hooks: []\n"


@pytest.fixture(scope="module")
def generated(generator_python: Path) -> Path:
    """The generated package's parent directory. Generating takes half a minute of CPU: the result is kept under the
    generator's virtualenv, keyed by the document's content, the generator's version and its configuration, and made
    again only when one changes (an earlier key's result is then removed)."""
    spec = SPEC.read_bytes()
    cache = GENERATOR_VENV / "generated"
    out = cache / hashlib.sha256(spec + GENERATOR_VERSION.encode() + GENERATOR_CONFIG.encode()).hexdigest()[:16]
    if (out / "metaledger_client").is_dir():
        return out
    cache.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cache, prefix="staging-"))
    (staging / "config.yml").write_text(GENERATOR_CONFIG)
    done = subprocess.run(
        [
            str(generator_python.parent / "openapi-python-client"),
            "generate",
            "--path",
            str(SPEC),
            "--meta",
            "none",
            "--config",
            str(staging / "config.yml"),
            "--output-path",
            str(staging / "metaledger_client"),
        ],
        cwd=staging,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Warning" not in output and "Skipping" not in output, output
    for earlier in cache.iterdir():
        if earlier != staging:
            shutil.rmtree(earlier, ignore_errors=True)
    staging.rename(out)  # only a clean generation is kept
    return out


def test_every_operation_is_generated(generated: Path):
    spec = json.loads(SPEC.read_text())
    operations = sum(1 for item in spec["paths"].values() for method in item if method in METHODS)
    modules = [p for p in (generated / "metaledger_client" / "api").rglob("*.py") if p.name != "__init__.py"]
    assert len(modules) == operations


def test_the_generated_client_writes_and_reads(generated: Path, generator_python: Path, metaledger):
    script = textwrap.dedent(
        """
        import json, sys
        from metaledger_client import AuthenticatedClient
        from metaledger_client.api.proposals import ingest_proposals
        from metaledger_client.api.dataset import create_dataset, get_dataset, get_dataset_aspect
        from metaledger_client.models import DatasetEntityRequest, MetadataChangeProposal

        base, token = sys.argv[1], sys.argv[2]
        urn = "urn:li:dataset:(urn:li:dataPlatform:hive,generated.orders,PROD)"
        client = AuthenticatedClient(base_url=base, token=token)
        written = ingest_proposals.sync_detailed(client=client, body=[MetadataChangeProposal.from_dict({
            "entityType": "dataset", "entityUrn": urn, "aspectName": "datasetProperties",
            "aspect": {"value": {"name": "orders", "description": "via the generated client"}}})])
        created = create_dataset.sync_detailed(client=client, async_=False, body=[DatasetEntityRequest.from_dict({
            "urn": urn, "globalTags": {"value": {"tags": [{"tag": "urn:li:tag:generated"}]}}})])
        entity = get_dataset.sync(client=client, urn=urn)
        aspect = get_dataset_aspect.sync_detailed(client=client, urn=urn, aspect_name="datasetProperties")
        anonymous = get_dataset.sync_detailed(client=AuthenticatedClient(base_url=base, token="not-a-token"), urn=urn)
        print(json.dumps({
            "written": [written.status_code, written.parsed.to_dict()["results"][0]["status"]],
            "created": [created.status_code, [e.to_dict()["urn"] for e in created.parsed]],
            "entity": entity.to_dict(),
            # the single-aspect value is a union of the entity's aspects: read as sent
            "aspect": [aspect.status_code, json.loads(aspect.content)["value"]],
            "anonymous": [anonymous.status_code, anonymous.parsed.to_dict()["error"]],
        }))
        """
    )
    done = subprocess.run(
        [str(generator_python), "-c", script, metaledger.url, metaledger.token],
        cwd=generated,
        env={**os.environ, "PYTHONPATH": str(generated)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["written"] == [200, "CREATED"]
    assert result["created"] == [200, ["urn:li:dataset:(urn:li:dataPlatform:hive,generated.orders,PROD)"]]
    assert result["entity"]["datasetProperties"]["value"]["description"] == "via the generated client"
    assert result["entity"]["globalTags"]["value"]["tags"] == [{"tag": "urn:li:tag:generated"}]
    assert result["aspect"] == [
        200,
        {"name": "orders", "description": "via the generated client", "customProperties": {}, "tags": []},
    ]
    assert result["anonymous"] == [401, "Unauthorized"]
