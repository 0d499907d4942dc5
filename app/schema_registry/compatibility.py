"""Compatibility between schema versions, by Avro's schema-resolution rules: can a reader schema read data written
with a writer schema? Confluent's levels are built on that one question:

- BACKWARD: the new schema reads data written with the latest one (consumers upgrade first). Adding a field needs a
  default; removing a field is fine; renaming one needs an alias naming the old field (or a default).
- FORWARD: the latest schema reads data written with the new one. FULL: both. `*_TRANSITIVE`: against every
  earlier version, not only the latest. NONE: no check.

The rules checked (Avro specification, "Schema Resolution"): primitive promotions (int → long, float, double;
long → float, double; float → double; string ↔ bytes); records matched by unqualified name or a reader alias, each
reader field found in the writer by name or by one of its aliases, else it needs a default; enums: every writer
symbol known to the reader unless the reader has a default; fixed: same name and size; arrays and maps by their
items and values; unions: every writer branch readable by the reader (by some branch when the reader is a union).
"""

from __future__ import annotations

from typing import Any

from app.schema_registry.errors import InvalidCompatibilityLevel
from app.schema_registry.normal_form import NormalSchema, display, resolve, type_of

LEVELS = (
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
    "NONE",
)
DEFAULT_LEVEL = "BACKWARD"

_PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "double": {"double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}
_PRIMITIVE_KINDS = frozenset({*_PROMOTIONS, "null", "boolean"})
_MAX_REASONS = 20


def check_level(level: Any) -> str:
    if not isinstance(level, str) or level.upper() not in LEVELS:
        raise InvalidCompatibilityLevel(
            f"Invalid compatibility level {str(level)[:100]!r}. Valid values are {', '.join(LEVELS)}"
        )
    return level.upper()


def incompatibilities(new: NormalSchema, previous: list[NormalSchema], level: str) -> list[str]:
    """Why `new` cannot follow `previous` (oldest first) under `level`; empty when it can."""
    if level == "NONE" or not previous:
        return []
    against = previous if level.endswith("_TRANSITIVE") else previous[-1:]
    base = level.removesuffix("_TRANSITIVE")
    reasons: list[str] = []
    for old in reversed(against):
        if base in ("BACKWARD", "FULL"):
            reasons += [
                f"the new schema cannot read data written with the old one: {r}" for r in reading_problems(new, old)
            ]
        if base in ("FORWARD", "FULL"):
            reasons += [
                f"the old schema cannot read data written with the new one: {r}" for r in reading_problems(old, new)
            ]
        if reasons:
            break
    return reasons[:_MAX_REASONS]


def reading_problems(reader: NormalSchema, writer: NormalSchema) -> list[str]:
    """Why data written with `writer` cannot be read with `reader` (empty: it can)."""
    return _Resolver(reader, writer).check(reader.schema, writer.schema, "")


class _Resolver:
    def __init__(self, reader: NormalSchema, writer: NormalSchema) -> None:
        self.reader_names = reader.names
        self.writer_names = writer.names
        self.in_progress: set[tuple[str, str]] = set()

    def check(self, reader: Any, writer: Any, path: str) -> list[str]:
        r = resolve(reader, self.reader_names)
        w = resolve(writer, self.writer_names)
        r_kind, w_kind = type_of(r), type_of(w)
        where = path or "/"
        if w_kind == "union":
            problems: list[str] = []
            for branch in w:  # every branch the writer may have written must be readable: one reason per branch
                problems += self.check(r, branch, path)[:1]
                if len(problems) >= _MAX_REASONS:
                    break
            return problems
        if r_kind == "union":
            for branch in r:
                if not self.check(branch, w, path):
                    return []
            return [
                f"at {where}: the reader's union {display(r, self.reader_names)} has no branch that reads the writer's "
                f"{display(w, self.writer_names)}"
            ]
        if w_kind in _PRIMITIVE_KINDS or r_kind in _PRIMITIVE_KINDS:
            if r_kind == w_kind or r_kind in _PROMOTIONS.get(w_kind, ()):
                return []
            return [
                f"at {where}: the type changed from {display(w, self.writer_names)} to {display(r, self.reader_names)}, which is not a promotion"
            ]
        if r_kind != w_kind:
            return [
                f"at {where}: the type changed from {display(w, self.writer_names)} to {display(r, self.reader_names)}"
            ]
        if r_kind == "array":
            return self.check(r["items"], w["items"], f"{path}/items")
        if r_kind == "map":
            return self.check(r["values"], w["values"], f"{path}/values")
        if not _same_name(r, w):
            return [f"at {where}: the {r_kind} {w['name']} is now named {r['name']} (add the old name to its aliases)"]
        if r_kind == "fixed":
            if r["size"] != w["size"]:
                return [f"at {where}: the size of fixed {r['name']} changed from {w['size']} to {r['size']}"]
            return []
        if r_kind == "enum":
            missing = [symbol for symbol in w["symbols"] if symbol not in r["symbols"]]
            if missing and "default" not in r:
                return [f"at {where}: the enum {r['name']} lost the symbols {missing} and has no default"]
            return []
        return self.record(r, w, path)

    def record(self, r: dict[str, Any], w: dict[str, Any], path: str) -> list[str]:
        key = (r["name"], w["name"])
        if key in self.in_progress:  # a recursive type: assumed compatible while it is being checked
            return []
        self.in_progress.add(key)
        try:
            writer_fields = {field["name"]: field for field in w["fields"]}
            problems: list[str] = []
            for field in r["fields"]:
                name = field["name"]
                written = writer_fields.get(name)
                if written is None:
                    written = next((writer_fields[a] for a in field.get("aliases", []) if a in writer_fields), None)
                if written is None:
                    if "default" not in field:
                        problems.append(
                            f"at {path}/{name}: the field {name!r} of {r['name']} is missing in the writer's schema and has "
                            f"no default (a new field needs a default; a renamed one needs an alias naming the old field)"
                        )
                    continue
                problems += self.check(field["type"], written["type"], f"{path}/{name}")
                if len(problems) >= _MAX_REASONS:
                    break
            return problems
        finally:
            self.in_progress.discard(key)


def _same_name(reader: dict[str, Any], writer: dict[str, Any]) -> bool:
    """Avro's rule: the same unqualified name, or the writer's full name among the reader's aliases."""
    if reader["name"].rsplit(".", 1)[-1] == writer["name"].rsplit(".", 1)[-1]:
        return True
    return writer["name"] in reader.get("aliases", [])
