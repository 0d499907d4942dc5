"""Benchmark of the aspect validator (a script, not a test).

    /work/main/.venv/bin/python bench/validation.py [--registry entity_registry.yml] [--seconds 1.0]

Prints the registry load time, the time to compile every aspect validator, and validations per second (µs per
validation) for a small aspect (status), a medium one (datasetProperties with 20 custom properties) and a large
one (schemaMetadata with 500 fields), each compared with a naive baseline: a recursive interpreter that walks the
raw .avsc schema on every call (same rules: optional fields, wrapped unions, defaults, unknown fields).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.registry import load_registry  # noqa: E402
from app.registry.registry import AspectSpec  # noqa: E402

PRIMS = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


# ---------------------------------------------------------------------------------------------------------------
# Naive baseline: interpret the raw Avro schema per call.
# ---------------------------------------------------------------------------------------------------------------
class NaiveValidator:
    def __init__(self, schema: dict[str, Any]) -> None:
        self.root = schema
        self.names: dict[str, Any] = {}
        self._index(schema, None)

    def _index(self, s: Any, ns: str | None) -> None:
        if isinstance(s, list):
            for b in s:
                self._index(b, ns)
        elif isinstance(s, dict):
            t = s.get("type")
            if t in ("record", "enum", "fixed"):
                full = s["name"] if "." in s["name"] else f"{s.get('namespace', ns)}.{s['name']}"
                self.names.setdefault(full, s)
                for f in s.get("fields", []):
                    self._index(f["type"], full.rpartition(".")[0])
            elif t == "array":
                self._index(s["items"], ns)
            elif t == "map":
                self._index(s["values"], ns)

    def _resolve(self, s: Any) -> Any:
        if isinstance(s, str) and s not in PRIMS:
            return self.names[s]
        return s

    @staticmethod
    def _key(s: Any) -> str:
        if isinstance(s, str):
            return s.replace("pegasus2avro.", "") if "." in s else s
        if s["type"] in ("record", "enum", "fixed"):
            full = s["name"] if "." in s["name"] else f"{s.get('namespace')}.{s['name']}"
            return full.replace("pegasus2avro.", "")
        return s["type"]

    def __call__(self, value: Any) -> Any:
        issues: list[str] = []
        out = self.check(self.root, value, "$", issues)
        if issues:
            raise ValueError(issues)
        return out

    def check(self, s: Any, v: Any, path: str, issues: list[str]) -> Any:
        s = self._resolve(s)
        if isinstance(s, list):
            members = {self._key(b): b for b in s if b != "null"}
            if "null" in s and v is None:
                return None
            if not isinstance(v, dict) or len(v) != 1:
                issues.append(f"{path}: bad union")
                return None
            (k,) = v
            if k not in members:
                issues.append(f"{path}: not a member {k}")
                return None
            return {k: self.check(members[k], v[k], f"{path}[{k!r}]", issues)}
        t = s if isinstance(s, str) else s["type"]
        if t == "record":
            if not isinstance(v, dict):
                issues.append(f"{path}: expected record")
                return None
            out = {}
            known = set()
            for f in s["fields"]:
                name = f["name"]
                known.add(name)
                ft = f["type"]
                optional = isinstance(ft, list) and "null" in ft
                x = v.get(name)
                if x is None:
                    if "default" in f and f["default"] is not None:
                        out[name] = f["default"]
                    elif not optional:
                        issues.append(f"{path}.{name}: missing")
                    continue
                if optional:
                    nn = [b for b in ft if b != "null"]
                    ft = nn[0] if len(nn) == 1 else nn
                out[name] = self.check(ft, x, f"{path}.{name}", issues)
            for k in v:
                if k not in known:
                    issues.append(f"{path}.{k}: unknown field")
            return out
        if t == "array":
            if not isinstance(v, list):
                issues.append(f"{path}: expected array")
                return None
            return [self.check(s["items"], x, f"{path}[{i}]", issues) for i, x in enumerate(v)]
        if t == "map":
            if not isinstance(v, dict):
                issues.append(f"{path}: expected map")
                return None
            return {k: self.check(s["values"], x, f"{path}[{k!r}]", issues) for k, x in sorted(v.items())}
        if t == "enum":
            if v not in s["symbols"]:
                issues.append(f"{path}: bad enum")
            return v
        if t in ("string", "bytes", "fixed"):
            if not isinstance(v, str):
                issues.append(f"{path}: expected string")
            return v
        if t == "boolean":
            if not isinstance(v, bool):
                issues.append(f"{path}: expected boolean")
            return v
        if t in ("int", "long"):
            if not isinstance(v, int) or isinstance(v, bool):
                issues.append(f"{path}: expected {t}")
            return v
        if t in ("float", "double"):
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                issues.append(f"{path}: expected {t}")
                return v
            return float(v)
        if t == "null":
            return None
        return self.check(t, v, path, issues)


# ---------------------------------------------------------------------------------------------------------------
# Payloads
# ---------------------------------------------------------------------------------------------------------------
STAMP = {"time": 1700000000000, "actor": "urn:li:corpuser:ingestion"}
TYPES = [
    ("com.linkedin.schema.StringType", "varchar(255)"),
    ("com.linkedin.schema.NumberType", "bigint"),
    ("com.linkedin.schema.BooleanType", "boolean"),
    ("com.linkedin.schema.DateType", "date"),
    ("com.linkedin.schema.TimeType", "timestamp"),
    ("com.linkedin.schema.BytesType", "binary"),
]


def status() -> dict:
    return {"removed": False}


def dataset_properties() -> dict:
    return {
        "customProperties": {f"property_{i:02d}": f"value number {i}" for i in range(20)},
        "externalUrl": "https://example.com/datasets/db.table",
        "name": "table",
        "qualifiedName": "warehouse.db.table",
        "description": "A table with twenty custom properties",
        "created": {"time": 1700000000000, "actor": "urn:li:corpuser:jdoe"},
        "tags": [],
    }


def schema_metadata(n: int = 500) -> dict:
    fields = []
    for i in range(n):
        type_name, native = TYPES[i % len(TYPES)]
        f: dict[str, Any] = {
            "fieldPath": f"[version=2.0].[type=struct].col_{i}",
            "nullable": i % 3 == 0,
            "type": {"type": {type_name: {}}},
            "nativeDataType": native,
            "recursive": False,
            "isPartOfKey": i == 0,
        }
        if i % 2 == 0:
            f["description"] = f"column number {i}"
        if i % 10 == 0:
            f["globalTags"] = {"tags": [{"tag": "urn:li:tag:pii"}]}
        if i % 25 == 0:
            f["glossaryTerms"] = {
                "terms": [{"urn": "urn:li:glossaryTerm:Classification.Sensitive"}],
                "auditStamp": STAMP,
            }
        if i % 50 == 0:
            f["type"] = {"type": {"com.linkedin.schema.ArrayType": {"nestedType": ["string"]}}}
        fields.append(f)
    return {
        "schemaName": "warehouse.db.table",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "created": STAMP,
        "lastModified": STAMP,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.MySqlDDL": {"tableSchema": "CREATE TABLE t (...)"}},
        "fields": fields,
        "primaryKeys": ["[version=2.0].[type=struct].col_0"],
    }


def rate(fn, value, seconds: float) -> tuple[float, int]:
    """(µs per call, calls): best of 3 timed rounds of about seconds/3 each."""
    fn(value)  # warm up (compiles, fills the URN cache)
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn(value)
        dt = time.perf_counter() - t0
        if dt > 0.05:
            break
        n *= 4
    per_round = max(1, int(n * (seconds / 3) / dt))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(per_round):
            fn(value)
        best = min(best, (time.perf_counter() - t0) / per_round)
    return best * 1e6, per_round


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--registry", default=str(ROOT / "entity_registry.yml"))
    ap.add_argument("--seconds", type=float, default=1.5, help="time budget per measurement")
    args = ap.parse_args()

    t0 = time.perf_counter()
    reg = load_registry(args.registry)
    load_s = time.perf_counter() - t0
    c = reg.counts()
    print(f"registry: {c['entities']} entities, {c['aspects']} aspects ({c['timeseries']} timeseries)")
    print(f"registry load:                     {load_s * 1000:8.1f} ms")
    t0 = time.perf_counter()
    reg.aspect("dataset", "schemaMetadata").validator()
    one_s = time.perf_counter() - t0
    print(f"compile schemaMetadata validator:  {one_s * 1000:8.1f} ms")
    compile_s = reg.compile_all()
    print(f"compile all {c['aspects']} validators:     {compile_s * 1000:8.1f} ms (lazy: only on first use)")
    print()

    cases: list[tuple[str, AspectSpec, dict]] = [
        ("status", reg.aspect("dataset", "status"), status()),
        ("datasetProperties (20 props)", reg.aspect("dataset", "datasetProperties"), dataset_properties()),
        ("schemaMetadata (500 fields)", reg.aspect("dataset", "schemaMetadata"), schema_metadata(500)),
    ]
    header = f"{'aspect':30} {'compiled':>22} {'naive interpreter':>22} {'speedup':>8}"
    print(header)
    print("-" * len(header))
    for label, spec, value in cases:
        spec.validate(value)
        naive = NaiveValidator(spec.schema)
        naive(value)
        us, _ = rate(spec.validate, value, args.seconds)
        nus, _ = rate(naive, value, args.seconds)
        print(f"{label:30} {us:9.2f} µs {1e6 / us:8.0f}/s {nus:9.2f} µs {1e6 / nus:8.0f}/s {nus / us:7.1f}x")


if __name__ == "__main__":
    main()
