"""Schemathesis over the committed OpenAPI document, against a real metaledger process: shared by the test suite
(tests/integration/test_fuzz.py, a fixed seed and a budget that fits CI) and bench/fuzz.py (every operation, a longer
run for humans). The checks are what the spec promises: no server error, no status the operation does not declare,
no response that violates its declared schema or content type."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "openapi" / "openapi.json"
CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance,content_type_conformance"
# The typed v3 paths repeat one handler per entity type: CI fuzzes every other operation and these entity types'.
CI_ENTITIES = ("dataset", "chart", "corpuser", "schemaField", "dataProcessInstance", "glossaryTerm")


def ci_path_filter(entities: tuple[str, ...] = CI_ENTITIES) -> str:
    return rf"^(?!/openapi/v3/entity/)|^/openapi/v3/entity/({'|'.join(entities)})(/|$)"


@dataclass
class FuzzRun:
    returncode: int
    output: str

    @property
    def generated(self) -> int:
        match = re.search(r"(\d+) generated", self.output)
        return int(match.group(1)) if match else 0

    @property
    def operations(self) -> tuple[int, int]:
        """(operations selected, operations tested): a run cut short by its time budget tests fewer."""
        selected = re.search(r"Selected: (\d+)/", self.output)
        tested = re.search(r"Tested: (\d+)", self.output)
        return (int(selected.group(1)) if selected else 0), (int(tested.group(1)) if tested else 0)

    @property
    def failures(self) -> str:
        """The FAILURES section: each failing operation, the check, the response and a curl line to replay it."""
        start = self.output.find("= FAILURES =")
        if start < 0:
            return ""
        end = min(
            (i for i in (self.output.find("= WARNINGS =", start), self.output.find("= SUMMARY =", start)) if i > 0),
            default=len(self.output),
        )
        return self.output[self.output.rfind("\n", 0, start) + 1 : end]

    @property
    def summary(self) -> str:
        start = self.output.rfind("SUMMARY")
        # from the beginning of the "=== SUMMARY ===" line (not 40 characters before it, mid-line)
        return self.output[self.output.rfind("\n", 0, start) + 1 :] if start >= 0 else self.output[-3000:]


def fuzz(
    base_url: str,
    token: str,
    *,
    seed: int,
    max_examples: int,
    max_time_s: int | None,
    workers: int = 1,
    path_regex: str | None = None,
    report_dir: Path | None = None,
) -> FuzzRun:
    """One worker by default: with two threads, hypothesis's lambda descriptions (`ast.parse`) hit CPython 3.11.7's
    "AST constructor recursion depth mismatch" SystemError (gh-106905, fixed in 3.11.8), which schemathesis reports
    as a runtime error of the run.

    `max_time_s`: schemathesis's `--max-time`, a budget the fuzzing phase repeats over every operation until it is
    spent (new random cases each round, as many as the machine's speed allows). None: one round, `max_examples` cases
    of each operation after its examples, the same cases on every machine."""
    argv = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        str(SPEC),
        "--url",
        base_url,
        "-H",
        f"Authorization: Bearer {token}",
        "--checks",
        CHECKS,
        "--phases",
        "examples,fuzzing",
        "--max-examples",
        str(max_examples),
        "--seed",
        str(seed),
        "--workers",
        str(workers),
        "--no-shrink",
        "--request-timeout",
        "30",
        "--output-truncate",
        "true",
        "--generation-database",
        "none",  # each run starts from its seed alone
    ]
    if max_time_s is not None:
        argv += ["--max-time", str(max_time_s)]
    if path_regex:
        argv += ["--include-path-regex", path_regex]
    if report_dir is not None:
        argv += ["--report", "junit", "--report-dir", str(report_dir)]
    # one round of the CI's 110 operations takes 20-40 s on 2 busy cores
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=(max_time_s or 180) + 120)
    return FuzzRun(done.returncode, done.stdout + done.stderr)
