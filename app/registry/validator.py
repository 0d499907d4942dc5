"""Compiled validators for aspect payloads in Pegasus JSON form.

:func:`compile_validator` turns a parsed schema (``app.registry.schema``) into Python source, one function per
record / union / array / map, and ``exec``s it once. Validating a payload then runs straight-line code: no schema
walking, no per-call allocation beyond the output and the small path tuples passed to nested functions.

Every generated function has the signature ``f(value, path, issues) -> normalized value``. ``path`` is a chain of
``(parent, key)`` tuples (``None`` is the root), rendered to ``$.a[3].b`` only when an issue is recorded.
Issues are collected in one pass, up to :data:`MAX_ISSUES`.

Normalization (the returned value is always a new object; the input is never mutated):

* record fields come out in schema order; absent fields with a default get the default (required fields, and
  optional fields whose Avro default is not null); optional fields that are absent or JSON null are left out;
* map entries come out sorted by key (Pegasus maps are unordered, so equal values serialize equally);
* ``float``/``double`` values come out as Python floats (``1`` → ``1.0``), like Pegasus' NORMAL coercion;
* unknown record fields are issues, or are dropped silently when compiled with ``trim_unknown=True``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from app.registry.errors import AspectValidationError, FieldIssue
from app.registry.schema import (
    MISSING,
    AliasedUnion,
    Array,
    Enum,
    Field,
    Fixed,
    Map,
    Primitive,
    Record,
    Type,
    Union,
)

MAX_ISSUES = 50
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
FLOAT_MAX = 3.4028234663852886e38
URN_CACHE_MAX = 200_000
URN_CACHE_MAX_CHARS = 16_000_000  # the cached URNs' characters: the cache is bounded in bytes, not only in entries
URN_CACHED_LENGTH = 512  # longer URNs (schemaField, exempt from the 512-byte limit) are validated every time

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Abort(Exception):
    """Raised when MAX_ISSUES issues have been collected."""


# --------------------------------------------------------------------------------------------------------------
# Runtime helpers (error paths only, except the URN cache lookups).
# --------------------------------------------------------------------------------------------------------------
def render_path(p: Any) -> str:
    keys = []
    while p is not None:
        p, k = p
        keys.append(k)
    out = ["$"]
    for k in reversed(keys):
        if k.__class__ is int:
            out.append(f"[{k}]")
        elif isinstance(k, str) and _IDENT.match(k):
            out.append("." + k)
        else:
            out.append("[" + json.dumps(k if isinstance(k, str) else str(k), ensure_ascii=False) + "]")
    return "".join(out)


def describe_value(v: Any) -> str:
    if v is None:
        return "null"
    if v is True or v is False:
        return f"boolean {'true' if v else 'false'}"
    if isinstance(v, int):
        return f"integer {v}" if abs(v) < 10**30 else "integer (huge)"
    if isinstance(v, float):
        return f"number {v!r}"
    if isinstance(v, str):
        s = json.dumps(v if len(v) <= 60 else v[:57] + "...", ensure_ascii=False)
        return f"string {s}"
    if isinstance(v, dict):
        return "object" if v else "empty object"
    if isinstance(v, (list, tuple)):
        return "array"
    return type(v).__name__


def _add(issues: list[FieldIssue], p: Any, message: str, expected: str | None, found: str | None) -> None:
    issues.append(FieldIssue(render_path(p), message, expected, found))
    if len(issues) >= MAX_ISSUES:
        raise _Abort


def _bad(issues, p, expected, v):
    found = describe_value(v)
    _add(issues, p, f"expected {expected}, found {found}", expected, found)
    return None


def _miss(issues, p, name, expected):
    _add(issues, (p, name), f'missing required field "{name}"', expected, None)


def _unknown(issues, p, d, known, rname):
    for k in d:
        if k not in known:
            if isinstance(k, str):
                _add(issues, (p, k), f'unknown field "{k}" (not in {rname})', None, None)
            else:
                _add(issues, p, f"object key {k!r} is not a string (in {rname})", None, None)


def _bad_int(issues, p, v, kind):
    if isinstance(v, int) and not isinstance(v, bool):
        lo, hi = (INT_MIN, INT_MAX) if kind == "int" else (LONG_MIN, LONG_MAX)
        if lo <= v <= hi:
            return int(v)  # an int subclass
        bits = 32 if kind == "int" else 64
        found = describe_value(v)
        _add(issues, p, f"expected {kind}, found {found} (out of {bits}-bit range)", kind, found)
        return None
    return _bad(issues, p, kind, v)


def _bad_float(issues, p, v, kind):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return _bad(issues, p, kind, v)
    try:
        f = float(v)
    except OverflowError:
        f = float("inf")
    limit = FLOAT_MAX if kind == "float" else 1.7976931348623157e308
    if f - f == 0.0 and -limit <= f <= limit:
        return f
    found = describe_value(v)
    reason = "not finite" if isinstance(v, float) and not (f - f == 0.0) else "out of range"
    _add(issues, p, f"expected {kind}, found {found} ({reason})", kind, found)
    return None


def _bad_str(issues, p, v, expected="string"):
    if isinstance(v, str):  # a str subclass
        return str(v)
    return _bad(issues, p, expected, v)


def _bad_bytes(issues, p, v):
    if isinstance(v, str):
        if all(ord(c) < 256 for c in v):
            return str(v)
        found = describe_value(v)
        _add(issues, p, f"expected bytes (a string of characters \\u0000-\\u00ff), found {found}", "bytes", found)
        return None
    return _bad(issues, p, "bytes", v)


def _bad_fixed(issues, p, v, name, size):
    expected = f"fixed {name} ({size} bytes)"
    if isinstance(v, str):
        found = describe_value(v)
        _add(issues, p, f"expected {expected}, found {found} of length {len(v)}", expected, found)
        return None
    return _bad(issues, p, expected, v)


def _bad_enum(issues, p, v, name, symbols):
    expected = f"enum {name}"
    if isinstance(v, str):
        if v in symbols:  # a str subclass
            return str(v)
        allowed = ", ".join(symbols) if len(symbols) <= 40 else ", ".join(symbols[:40]) + ", …"
        shown = json.dumps(v if len(v) <= 60 else v[:57] + "...", ensure_ascii=False)
        _add(issues, p, f"{shown} is not a symbol of enum {name} (allowed: {allowed})", expected, describe_value(v))
        return None
    return _bad(issues, p, expected, v)


def _bad_union(issues, p, v, keys, what="union"):
    members = ", ".join(keys)
    found = describe_value(v)
    if isinstance(v, dict) and len(v) == 1:
        (k,) = v
        _add(issues, p, f'"{k}" is not a member of the {what} (members: {members})', what, f'member "{k}"')
        return None
    if isinstance(v, dict):
        found = f"object with {len(v)} keys" if v else "empty object"
    _add(issues, p, f"{what} value must be an object with exactly one member key, one of: {members}", what, found)
    return None


def _bad_map_key(issues, p, k):
    _add(issues, p, f"map key {k!r} is not a string", "string", describe_value(k))


class UrnChecker:
    """Validates URN-typed fields with ``app.urns`` and caches the valid ones (string → lower-case entity type)."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.cache: dict[str, str] = {}
        self.cached_chars = 0

    def check(self, issues, p, v, entity):
        """Slow path: v is a str not (yet) in the cache, or its entity type did not match."""
        etype = self.cache.get(v)
        if etype is None:
            from app.urns import InvalidUrnError, validate_urn

            try:
                urn = validate_urn(v, strict=self.strict)
            except InvalidUrnError as e:
                found = describe_value(v)
                _add(issues, p, f"invalid urn {json.dumps(v, ensure_ascii=False)}: {e}", "urn", found)
                return
            except Exception as e:  # noqa: BLE001 - a URN that breaks the parser is still just an invalid URN
                found = describe_value(v)
                _add(issues, p, f"invalid urn {json.dumps(v, ensure_ascii=False)}: {e}", "urn", found)
                return
            etype = urn.entity_type.lower()
            if len(v) <= URN_CACHED_LENGTH:
                if len(self.cache) >= URN_CACHE_MAX or self.cached_chars >= URN_CACHE_MAX_CHARS:
                    self.cache.clear()
                    self.cached_chars = 0
                self.cache[v] = etype
                self.cached_chars += len(v)
        if entity and etype != entity.lower():
            expected = f"{entity} urn"
            _add(
                issues,
                p,
                f"expected a urn of entity type {entity}, found {json.dumps(v, ensure_ascii=False)}",
                expected,
                describe_value(v),
            )


_URN_CHECKERS = {True: UrnChecker(True), False: UrnChecker(False)}


def forget_checked_urns() -> None:
    """Empty the URN checkers' caches (app.ops.backpressure, once a flood of new URNs is over). The validators
    generated for the aspects hold the dicts themselves: they are emptied, not replaced."""
    for checker in _URN_CHECKERS.values():
        checker.cache.clear()
        checker.cached_chars = 0


# --------------------------------------------------------------------------------------------------------------
# Code generation.
# --------------------------------------------------------------------------------------------------------------
class _Gen:
    def __init__(self, *, trim_unknown: bool, strict_urns: bool) -> None:
        self.trim = trim_unknown
        self.urns = _URN_CHECKERS[strict_urns]
        self.ns: dict[str, Any] = {
            "_M": MISSING,
            "_bad": _bad,
            "_miss": _miss,
            "_unknown": _unknown,
            "_bad_int": _bad_int,
            "_bad_float": _bad_float,
            "_bad_str": _bad_str,
            "_bad_bytes": _bad_bytes,
            "_bad_fixed": _bad_fixed,
            "_bad_enum": _bad_enum,
            "_bad_union": _bad_union,
            "_bad_map_key": _bad_map_key,
            "_UC": self.urns.cache,
            "_urn": self.urns.check,
            "_sorted": sorted,
            "_enumerate": enumerate,
        }
        self.chunks: list[str] = []
        self.fns: dict[tuple[int, str | None], str] = {}
        self.n = 0

    def _name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def const(self, prefix: str, value: Any) -> str:
        name = self._name(prefix)
        self.ns[name] = value
        return name

    # -- functions ----------------------------------------------------------------------------------------
    def fn(self, t: Type, urn: str | None = None) -> str:
        """Name of a generated function ``f(v, p, I)`` validating ``t``."""
        key = (id(t), urn)
        if key in self.fns:
            return self.fns[key]
        if isinstance(t, Record):
            name = self._name("r_")
            self.fns[key] = name
            self._record(name, t)
        elif isinstance(t, Union):
            name = self._name("u_")
            self.fns[key] = name
            self._union(name, t.members, t.has_null, "union")
        elif isinstance(t, AliasedUnion):
            name = self._name("au_")
            self.fns[key] = name
            self._union(name, t.members, False, f"union {t.name}")
        elif isinstance(t, Array):
            name = self._name("a_")
            self.fns[key] = name
            self._array(name, t, urn)
        elif isinstance(t, Map):
            name = self._name("m_")
            self.fns[key] = name
            self._map(name, t)
        else:
            name = self._name("p_")
            self.fns[key] = name
            body = self.value(t, "v", "p", "return {}", 1, urn)
            self.chunks.append(f"def {name}(v, p, I):\n" + "\n".join(body) + "\n")
        return name

    def _record(self, name: str, t: Record) -> None:
        L = [f"def {name}(d, p, I):"]
        rname = t.name
        L.append("    if d.__class__ is not dict and not isinstance(d, dict):")
        L.append(f"        return _bad(I, p, {t.describe()!r}, d)")
        if not t.fields:
            L.append("    if d:")
            if self.trim:
                L.append("        return {}")
            else:
                known = self.const("K_", frozenset())
                L.append(f"        _unknown(I, p, d, {known}, {rname!r})")
            L.append("    return {}")
            self.chunks.append("\n".join(L) + "\n")
            return
        L.append("    o = {}")
        L.append("    g = d.get")
        count = not self.trim
        if count:
            L.append("    n = 0")
        for f in t.fields:
            L.extend(self._field(f))
        if count:
            known = self.const("K_", frozenset(f.name for f in t.fields))
            L.append("    if n != len(d):")
            L.append(f"        _unknown(I, p, d, {known}, {rname!r})")
        L.append("    return o")
        self.chunks.append("\n".join(L) + "\n")

    def _field(self, f: Field) -> list[str]:
        fname = repr(f.name)
        pexpr = f"(p, {fname})"
        assign = f"o[{fname}] = {{}}"
        urn = f.urn_entity
        count = not self.trim
        L: list[str] = []
        if f.default is not MISSING:
            absent = [f"o[{fname}] = {_literal(f.default)}"]
        elif f.optional:
            absent = []
        else:
            absent = [f"_miss(I, p, {fname}, {f.type.describe()!r})"]
        body = self.value(f.type, "v", pexpr, assign, 0, urn)
        if count:
            L.append(f"v = g({fname}, _M)")
            L.append("if v is _M:")
            L.extend("    " + x for x in (absent or ["pass"]))
            if f.optional:
                L.append("elif v is None:")
                L.extend("    " + x for x in (["n += 1"] + absent))
            L.append("else:")
            L.append("    n += 1")
            L.extend("    " + x for x in body)
        elif f.optional or f.default is not MISSING:
            # trim mode: absent and (for optional fields) null are the same
            if f.optional:
                L.append(f"v = g({fname})")
                L.append("if v is None:")
            else:
                L.append(f"v = g({fname}, _M)")
                L.append("if v is _M:")
            L.extend("    " + x for x in (absent or ["pass"]))
            L.append("else:")
            L.extend("    " + x for x in body)
        else:
            L.append(f"v = g({fname}, _M)")
            L.append("if v is _M:")
            L.extend("    " + x for x in absent)
            L.append("else:")
            L.extend("    " + x for x in body)
        return ["    " + x for x in L]

    def _array(self, name: str, t: Array, urn: str | None) -> None:
        items = t.items
        assert items is not None
        L = [f"def {name}(v, p, I):"]
        L.append("    if v.__class__ is not list and not isinstance(v, (list, tuple)):")
        L.append("        return _bad(I, p, 'array', v)")
        if isinstance(items, (Record, Union, AliasedUnion, Array, Map)):
            f = self.fn(items)
            L.append(f"    return [{f}(x, (p, i), I) for i, x in _enumerate(v)]")
        else:
            L.append("    o = []")
            L.append("    A = o.append")
            L.append("    i = 0")
            L.append("    for x in v:")
            L.extend("    " + x for x in self.value(items, "x", "(p, i)", "A({})", 1, urn))
            L.append("        i += 1")
            L.append("    return o")
        self.chunks.append("\n".join(L) + "\n")

    def _map(self, name: str, t: Map) -> None:
        values = t.values
        assert values is not None
        L = [f"def {name}(v, p, I):"]
        L.append("    if v.__class__ is not dict and not isinstance(v, dict):")
        L.append("        return _bad(I, p, 'object (map)', v)")
        if isinstance(values, Primitive) and values.kind == "string":
            L.append("    for k, x in v.items():")
            L.append("        if k.__class__ is not str or x.__class__ is not str:")
            L.append("            break")
            L.append("    else:")
            L.append("        return dict(_sorted(v.items())) if len(v) > 1 else dict(v)")
        L.append("    o = {}")
        L.append("    for k, x in v.items():")
        L.append("        if k.__class__ is not str:")
        L.append("            _bad_map_key(I, p, k)")
        L.append("            continue")
        L.extend("    " + x for x in self.value(values, "x", "(p, k)", "o[k] = {}", 1, None))
        L.append("    if len(o) > 1:")
        L.append("        return dict(_sorted(o.items()))")
        L.append("    return o")
        self.chunks.append("\n".join(L) + "\n")

    def _union(self, name: str, members: list[tuple[str, Type]], has_null: bool, what: str) -> None:
        table = self.const("U_", {})
        keys = self.const("UK_", tuple(k for k, _ in members))
        L = [f"def {name}(v, p, I):"]
        if has_null:
            L.append("    if v is None:")
            L.append("        return None")
        L.append("    if v.__class__ is dict and len(v) == 1:")
        L.append("        (k,) = v")
        L.append(f"        f = {table}.get(k)")
        L.append("        if f is not None:")
        L.append("            return {k: f(v[k], (p, k), I)}")
        L.append(f"    return _bad_union(I, p, v, {keys}, {what!r})")
        self.chunks.append("\n".join(L) + "\n")
        # Fill the dispatch table after generating the member functions (they may be recursive).
        pending = [(k, self.fn(m)) for k, m in members]
        self._fixups.append((table, pending))

    # -- inline value checks ------------------------------------------------------------------------------
    def value(self, t: Type, v: str, pexpr: str, assign: str, indent: int, urn: str | None) -> list[str]:
        """Lines validating the value in variable ``v`` and storing the normalized value with ``assign``."""
        A = assign.format
        pad = "    " * indent
        k = t.kind
        out: list[str]
        if isinstance(t, (Record, Union, AliasedUnion, Map)):
            out = [A(f"{self.fn(t)}({v}, {pexpr}, I)")]
        elif isinstance(t, Array):
            items_urn = (
                urn if (urn is not None and isinstance(t.items, Primitive) and t.items.kind == "string") else None
            )
            out = [A(f"{self.fn(t, items_urn)}({v}, {pexpr}, I)")]
        elif isinstance(t, Enum):
            syms = self.const("E_", frozenset(t.symbols))
            symlist = self.const("EL_", t.symbols)
            out = [
                f"if {v}.__class__ is str and {v} in {syms}:",
                "    " + A(v),
                "else:",
                "    " + A(f"_bad_enum(I, {pexpr}, {v}, {t.name!r}, {symlist})"),
            ]
        elif isinstance(t, Fixed):
            out = [
                f"if {v}.__class__ is str and len({v}) == {t.size}:",
                "    " + A(v),
                "else:",
                "    " + A(f"_bad_fixed(I, {pexpr}, {v}, {t.name!r}, {t.size})"),
            ]
        elif k == "string":
            out = [f"if {v}.__class__ is str:", "    " + A(v)]
            if urn is not None:
                if urn:
                    want = repr(urn.lower())
                    out.append(f"    if _UC.get({v}) != {want}:")
                else:
                    out.append(f"    if {v} not in _UC:")
                out.append(f"        _urn(I, {pexpr}, {v}, {urn!r})")
            out += ["else:", "    " + A(f"_bad_str(I, {pexpr}, {v})")]
        elif k == "boolean":
            out = [
                f"if {v} is True or {v} is False:",
                "    " + A(v),
                "else:",
                "    " + A(f"_bad(I, {pexpr}, 'boolean', {v})"),
            ]
        elif k in ("int", "long"):
            lo, hi = (INT_MIN, INT_MAX) if k == "int" else (LONG_MIN, LONG_MAX)
            out = [
                f"if {v}.__class__ is int and {lo} <= {v} <= {hi}:",
                "    " + A(v),
                "else:",
                "    " + A(f"_bad_int(I, {pexpr}, {v}, {k!r})"),
            ]
        elif k in ("float", "double"):
            cond = (
                f"{v}.__class__ is float and {-FLOAT_MAX!r} <= {v} <= {FLOAT_MAX!r}"
                if k == "float"
                else f"{v}.__class__ is float and {v} - {v} == 0.0"
            )
            out = [f"if {cond}:", "    " + A(v), "else:", "    " + A(f"_bad_float(I, {pexpr}, {v}, {k!r})")]
        elif k == "bytes":
            out = [
                f"if {v}.__class__ is str and {v}.isascii():",
                "    " + A(v),
                "else:",
                "    " + A(f"_bad_bytes(I, {pexpr}, {v})"),
            ]
        elif k == "null":
            out = [f"if {v} is None:", "    " + A("None"), "else:", "    " + A(f"_bad(I, {pexpr}, 'null', {v})")]
        else:  # pragma: no cover - the parser only produces the kinds above
            raise ValueError(f"cannot compile type {k!r}")
        return [pad + x for x in out]

    # -- driver -------------------------------------------------------------------------------------------
    def build(self, root: Type, label: str) -> tuple[Callable[[Any, Any, list], Any], str]:
        self._fixups: list[tuple[str, list[tuple[str, str]]]] = []
        root_fn = self.fn(root)
        source = "\n".join(self.chunks)
        code = compile(source, f"<validator {label}>", "exec")
        exec(code, self.ns)  # noqa: S102 - source generated from parsed schemas; names go through repr()
        for table, pending in self._fixups:
            self.ns[table].update({k: self.ns[f] for k, f in pending})
        return self.ns[root_fn], source


def _literal(value: Any) -> str:
    """A Python expression that evaluates to a fresh copy of a JSON-like default."""
    if isinstance(value, float) and not (value - value == 0.0):
        return f"float({str(value)!r})"
    return repr(value)


class CompiledValidator:
    """A compiled validator for one schema. Call it with a JSON-like value; it returns the normalized value or
    raises :class:`AspectValidationError`."""

    __slots__ = ("label", "source", "_fn", "trim_unknown", "strict_urns")

    def __init__(self, root: Type, *, label: str, trim_unknown: bool = False, strict_urns: bool = True) -> None:
        gen = _Gen(trim_unknown=trim_unknown, strict_urns=strict_urns)
        self._fn, self.source = gen.build(root, label)
        self.label = label
        self.trim_unknown = trim_unknown
        self.strict_urns = strict_urns

    def __call__(self, value: Any) -> Any:
        issues: list[FieldIssue] = []
        try:
            out = self._fn(value, None, issues)
        except _Abort:
            raise AspectValidationError(self.label, issues, truncated=True) from None
        except RecursionError:
            issues.append(FieldIssue("$", "value is nested too deeply", None, None))
            raise AspectValidationError(self.label, issues) from None
        if issues:
            raise AspectValidationError(self.label, issues)
        return out

    def issues(self, value: Any) -> list[FieldIssue]:
        """All issues of ``value`` (empty when valid), without raising."""
        try:
            self(value)
        except AspectValidationError as e:
            return e.issues
        return []


def compile_validator(
    root: Type, *, label: str, trim_unknown: bool = False, strict_urns: bool = True
) -> CompiledValidator:
    return CompiledValidator(root, label=label, trim_unknown=trim_unknown, strict_urns=strict_urns)
