"""What the change-processor pipeline costs per change, in process (no database, no HTTP): the three example before
processors of examples/change_processors (installed by `make venv`), two in scope of a datasetProperties change.

    .venv/bin/python bench/change_processors.py [--changes 20000]

Prints µs per change for: an empty pipeline's check, the three examples, and each alone (the rest of a write's cost
is in bench/ingest.py --pipeline none|examples).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.write.processors import Phase, Pipeline, PipelineStep, ProposedChange  # noqa: E402

EXAMPLES = [
    PipelineStep("ignore-disallowed-words", config={"words": "confidential,secret"}),
    PipelineStep("lowercase-tags", scope={"aspects": ["globalTags", "datasetProperties"]}),
    PipelineStep("prod-datasets-need-an-owner"),
]


def change(i: int) -> ProposedChange:
    value = {
        "name": f"table_{i}",
        "description": f"Table {i}, revision 3: orders placed through the web shop",
        "customProperties": {"owner_team": "core", "revision": "3", "rows": str(i)},
        "tags": [],
    }
    previous = dict(value, description=f"Table {i}, revision 2: orders placed through the web shop")
    return ProposedChange(
        f"urn:li:dataset:(urn:li:dataPlatform:hive,bench.t{i},PROD)",
        "dataset",
        "datasetProperties",
        "UPSERT",
        value,
        previous,
    )


def per_change_us(pipeline: Pipeline, changes: list[ProposedChange]) -> float:
    started = time.perf_counter()
    for c in changes:
        if pipeline.governs(Phase.BEFORE, c.entity_type, c.aspect, c.change_type):
            pipeline.run(Phase.BEFORE, c)
    elapsed = time.perf_counter() - started
    pipeline.publish_metrics()
    return elapsed / len(changes) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=20_000)
    args = parser.parse_args()
    changes = [change(i) for i in range(1000)] * (args.changes // 1000)
    rows = [("empty pipeline", Pipeline([])), ("the three examples", Pipeline(EXAMPLES))]
    rows += [(f"  {step.name} alone", Pipeline([step])) for step in EXAMPLES]
    for label, pipeline in rows:
        per_change_us(pipeline, changes[:1000])  # warm: plans, imports
        print(f"{label:<40} {min(per_change_us(pipeline, changes) for _ in range(3)):6.2f} µs per change")


if __name__ == "__main__":
    main()
