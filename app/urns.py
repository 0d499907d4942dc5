"""URN syntax: DataHub's ``urn:li:<entityType>:<id>`` with its tuple rules.

Parsing follows DataHub's ``TupleKey``: an id that starts with ``(`` is a tuple split on commas at paren depth 1
(so nested URNs keep their commas); any other id is one part whose parentheses must balance. Empty parts are
errors. ``validate_urn`` adds the server-side checks of ``UrnValidationUtil`` (whitespace, the ``␟`` separator,
512 bytes URL-encoded, reserved characters inside parts), which DataHub only warns about unless strict.

Hostile input: a string longer than ``URN_MAX_CHARS`` (or with a NUL, which Postgres cannot store) is refused before
it is parsed, and only URNs of at most ``URN_CACHE_MAX_CHARS`` are cached (``URN_CACHE_ENTRIES`` of them: a few
tens of MB at worst), so rejected or one-off long strings never stay in memory. Messages quote a URN's first
characters only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote_plus

from app.errors import clip

URN_PREFIX = "urn:li:"
URN_MAX_ENCODED_BYTES = 512
# Any URN, of any entity type (schemaField URNs are exempt from the 512-byte limit, not unbounded): longer strings
# are refused before they are parsed or cached.
URN_MAX_CHARS = 8192
# The entity URN of a write: metadata_aspect_v2.urn is varchar(500), as DataHub's.
URN_MAX_STORED_CHARS = 500
URN_CACHE_MAX_CHARS = 512  # longer URNs are parsed and validated every time, never cached
URN_CACHE_ENTRIES = 16_384
DELIMITER_SEPARATOR = "\u241f"  # ␟, DataHub's browse-path / nested-key separator
# Entities exempt from the length limit (schemaField URNs nest a whole dataset URN).
LENGTH_EXEMPT_ENTITY_TYPES = frozenset({"schemaField"})


class InvalidUrnError(ValueError):
    """A string that is not a valid URN; the message says why."""


def shown(urn: str) -> str:
    """A URN quoted in a message: its first characters only."""
    return repr(clip(urn))


@dataclass(frozen=True, slots=True)
class Urn:
    entity_type: str
    entity_id: str
    parts: tuple[str, ...]

    def __str__(self) -> str:
        return f"{URN_PREFIX}{self.entity_type}:{self.entity_id}"


def _split_tuple(entity_id: str, urn: str) -> tuple[str, ...]:
    if not entity_id.startswith("("):
        depth = 0
        for ch in entity_id:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth < 0:
                    break
        if depth != 0:
            raise InvalidUrnError(f"mismatched paren nesting in URN {shown(urn)}")
        return (entity_id,)
    if not entity_id.endswith(")"):
        raise InvalidUrnError(f"mismatched paren nesting in URN {shown(urn)}: a tuple id must end with ')'")
    parts: list[str] = []
    depth = 0
    start = 1
    for i, ch in enumerate(entity_id):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and i != len(entity_id) - 1:
                raise InvalidUrnError(f"mismatched paren nesting in URN {shown(urn)}: text after the closing ')'")
            if depth < 0:
                raise InvalidUrnError(f"mismatched paren nesting in URN {shown(urn)}")
        elif ch == "," and depth == 1:
            parts.append(entity_id[start:i])
            start = i + 1
    if depth != 0:
        raise InvalidUrnError(f"mismatched paren nesting in URN {shown(urn)}")
    parts.append(entity_id[start:-1])
    if any(part == "" for part in parts):
        raise InvalidUrnError(f"empty part disallowed in URN {shown(urn)}")
    return tuple(parts)


def entity_type_of(urn: str) -> str:
    """The entity type of ``urn:li:<entityType>:<id>`` without parsing the id; InvalidUrnError as `parse_urn`."""
    if not isinstance(urn, str):
        raise InvalidUrnError(f"a URN must be a string, found {type(urn).__name__}")
    if len(urn) > URN_MAX_CHARS:
        raise InvalidUrnError(f"URN is {len(urn)} characters; the limit is {URN_MAX_CHARS}: {shown(urn)}")
    if "\x00" in urn:
        raise InvalidUrnError(f"URN {shown(urn)} contains a NUL character (\\u0000)")
    if not urn.startswith(URN_PREFIX):
        raise InvalidUrnError(f"URN {shown(urn)} must start with '{URN_PREFIX}'")
    entity_type, sep, entity_id = urn[len(URN_PREFIX) :].partition(":")
    if not sep or not entity_type:
        raise InvalidUrnError(f"URN {shown(urn)} has no entity type: expected 'urn:li:<entityType>:<id>'")
    if not entity_id:
        raise InvalidUrnError(f"URN {shown(urn)} has an empty id")
    return entity_type


def type_of(urn: str) -> str:
    """The entity type of `urn`, "" when it is no URN (an edge's destination, a resource named in a request)."""
    try:
        return entity_type_of(urn)
    except InvalidUrnError:
        return ""


def is_urn_of(value: object, entity_types: Sequence[str]) -> bool:
    """Whether `value` is an URN of one of `entity_types` (an actor, a group, a role named in a request)."""
    return isinstance(value, str) and len(value) <= URN_MAX_CHARS and type_of(value) in entity_types


def parse_urn(urn: str) -> Urn:
    """Parse ``urn:li:<entityType>:<id>``; raises InvalidUrnError naming the problem. Short URNs are cached."""
    if isinstance(urn, str) and len(urn) <= URN_CACHE_MAX_CHARS:
        return _parse_cached(urn)
    return _parse(urn)


def _parse(urn: str) -> Urn:
    entity_type = entity_type_of(urn)  # the length and NUL checks, before anything is split or cached
    entity_id = urn[len(URN_PREFIX) + len(entity_type) + 1 :]
    return Urn(entity_type, entity_id, _split_tuple(entity_id, urn))


_parse_cached = lru_cache(maxsize=URN_CACHE_ENTRIES)(_parse)


def _java_url_encoded_length(text: str) -> int:
    # java.net.URLEncoder leaves "*" unencoded where quote_plus encodes it, and encodes "~" which quote_plus keeps.
    return len(quote_plus(text, safe="*").replace("~", "%7E"))


def _illegal_components(parts: Sequence[str]) -> list[str]:
    illegal = []
    for part in parts:
        if part.startswith(URN_PREFIX) or "%28" in part or "%29" in part:
            continue
        if "(" in part or ")" in part or (len(parts) > 1 and "," in part):
            illegal.append(part)
    return illegal


def validate_urn(urn: str, strict: bool = True) -> Urn:
    """Parse and apply DataHub's server-side URN rules. Non-strict mode skips the reserved-character checks.
    Short URNs are cached (valid ones only: an error is raised anew each time)."""
    if isinstance(urn, str) and len(urn) <= URN_CACHE_MAX_CHARS:
        return _validate_cached(urn, strict)
    return _validate(urn, strict)


def _validate(urn: str, strict: bool) -> Urn:
    if (
        isinstance(urn, str)
        and len(urn) > URN_MAX_ENCODED_BYTES
        and entity_type_of(urn) not in LENGTH_EXEMPT_ENTITY_TYPES
    ):
        # URL-encoding never shortens a string: too long before it is parsed
        raise InvalidUrnError(
            f"URN is {len(urn)} characters; the limit is {URN_MAX_ENCODED_BYTES} bytes URL-encoded: {shown(urn)}"
        )
    if isinstance(urn, str) and urn.strip() != urn:
        raise InvalidUrnError(f"URN {shown(urn)} has leading or trailing whitespace")
    parsed = parse_urn(urn)
    if DELIMITER_SEPARATOR in urn:
        raise InvalidUrnError(f"URN {shown(urn)} contains the reserved character '{DELIMITER_SEPARATOR}'")
    if parsed.entity_type not in LENGTH_EXEMPT_ENTITY_TYPES:
        encoded = _java_url_encoded_length(urn)
        if encoded > URN_MAX_ENCODED_BYTES:
            raise InvalidUrnError(
                f"URN is {encoded} bytes URL-encoded; the limit is {URN_MAX_ENCODED_BYTES}: {shown(urn)}"
            )
    if strict:
        if len(parsed.parts) == 1 and "," in parsed.parts[0]:
            raise InvalidUrnError(f"simple (non-tuple) URN {shown(urn)} contains a comma")
        illegal = _illegal_components(parsed.parts)
        if illegal:
            raise InvalidUrnError(
                f"URN {shown(urn)} has reserved characters '(' ')' ',' inside component(s) {illegal}; "
                "percent-encode them (%28 %29 %2C)"
            )
    return parsed


_validate_cached = lru_cache(maxsize=URN_CACHE_ENTRIES)(_validate)


def forget_cached_urns() -> None:
    """Empty the parse and validation caches (app.ops.backpressure, once a flood of new URNs is over)."""
    _parse_cached.cache_clear()
    _validate_cached.cache_clear()


def make_urn(entity_type: str, parts: Sequence[str]) -> str:
    """Build a URN from its parts: one part gives ``urn:li:t:part``, several a tuple ``urn:li:t:(a,b)``."""
    if not parts:
        raise InvalidUrnError(f"a {entity_type} URN needs at least one part")
    if len(parts) == 1:
        return f"{URN_PREFIX}{entity_type}:{parts[0]}"
    return f"{URN_PREFIX}{entity_type}:({','.join(parts)})"
