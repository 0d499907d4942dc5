"""DataHub's filters as the backends' criteria (`app.search.model.Criterion`), for every protocol that takes one: the
OpenAPI v3 scroll bodies, GraphQL's orFilters and the filters of DataHub Views.

A DataHub criterion is `{"field", "values" (or the deprecated single "value"), "condition"?, "negated"?}`:
`condition` one of `app.search.model.CONDITIONS` (EQUAL when absent or null; IN is EQUAL; DataHub's OpenAPI v3
spelling STARTS_WITH/ENDS_WITH is START_WITH/END_WITH), and a field's `.keyword` suffix (DataHub's exact sub-field)
is dropped: every filter here is exact already. A filter is an OR of AND groups in one of DataHub's forms (see
`filter_groups`). What cannot be answered is an `InvalidFilter` naming its place in the filter given; the protocol
layers answer it with a 400 at that place in their request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.errors import Issue, ValidationFailed
from app.limits import clip
from app.search.model import CONDITIONS, MAX_FILTER_VALUES, Criterion, criterion_problem

# DataHub's OpenAPI v3 spells two conditions its own way (its Criterion.Condition enum); both spellings are taken.
CONDITION_ALIASES = {"STARTS_WITH": "START_WITH", "ENDS_WITH": "END_WITH"}
# Every condition name a criterion may carry (the hierarchy conditions are refused by `criterion_problem`).
CONDITION_NAMES = tuple(sorted(CONDITIONS | CONDITION_ALIASES.keys()))
# A field a search filters or sorts on: a filter name or a document field, dotted for nested ones.
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.@]{0,199}")
KEYWORD_SUFFIX = ".keyword"
FILTER_FORMS = '{"and": [{"criteria": [...]}, ...]}, {"or": [{"and": [...]}, ...]} or {"criteria": [...]}'

Loc = tuple[str | int, ...]  # a place inside the filter given: keys and array positions


def json_path(base: str, loc: Loc) -> str:
    """`loc` below `base` as a JSON path: `$.filter` and ("and", 1, "criteria") give `$.filter.and[1].criteria`."""
    return base + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


class InvalidFilter(ValueError):
    """A filter the backends cannot answer; `loc`: where, inside the filter given."""

    def __init__(self, message: str, loc: Loc = (), *, expected: str | None = None, found: Any = None) -> None:
        super().__init__(message)
        self.loc = loc
        self.expected = expected
        self.found = None if found is None else clip(str(found), 100)

    def at(self, base: str) -> ValidationFailed:
        """The 400 answering it, the filter being at `base` in the caller's request (`$.filter`, `$input.orFilters`)."""
        return ValidationFailed(
            str(self), [Issue(str(self), path=json_path(base, self.loc), expected=self.expected, found=self.found)]
        )


@dataclass(frozen=True, slots=True)
class Placed:
    """A criterion and its place in the filter given (for the callers that accept only some criteria)."""

    loc: Loc
    criterion: Criterion


Groups = tuple[tuple[Criterion, ...], ...]  # an OR of AND groups, as `SearchBackend.search`'s `any_of`


def criterion(raw: Any, loc: Loc = ()) -> Criterion:
    """One DataHub criterion (module docstring)."""
    if not isinstance(raw, Mapping):
        raise InvalidFilter('a criterion is {"field", "values", "condition"?, "negated"?}', loc, found=raw)
    field = raw.get("field")
    if not isinstance(field, str) or not FIELD_NAME.fullmatch(field):
        raise InvalidFilter("not a field name", (*loc, "field"), expected=FIELD_NAME.pattern, found=field)
    condition = raw.get("condition") or "EQUAL"
    if not isinstance(condition, str):
        raise InvalidFilter(
            "a condition is a string", (*loc, "condition"), expected=", ".join(CONDITION_NAMES), found=condition
        )
    condition = CONDITION_ALIASES.get(condition, condition)
    negated = raw.get("negated")
    if not isinstance(negated, bool | None):
        raise InvalidFilter("negated must be true or false", (*loc, "negated"), found=negated)
    values = raw.get("values")
    if values is None:
        values = [raw["value"]] if raw.get("value") is not None else []
    if not isinstance(values, Sequence) or isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise InvalidFilter("values must be an array of strings", (*loc, "values"), found=values)
    for position, value in enumerate(values):
        if "\x00" in value:
            raise InvalidFilter("a NUL character (\\u0000)", (*loc, "values", position))
    problem = criterion_problem(condition, values)
    if problem is not None:
        message = f"filter on field {clip(field, 100)!r}: {problem.message}"
        if problem.value is None:
            raise InvalidFilter(message, (*loc, "condition"), expected=problem.expected, found=condition)
        raise InvalidFilter(
            message, (*loc, "values", problem.value), expected=problem.expected, found=values[problem.value]
        )
    name = field.removesuffix(KEYWORD_SUFFIX)
    return Criterion(name, tuple(values), bool(negated), "EQUAL" if condition == "IN" else condition)


def _clause(items: Any, loc: Loc) -> list[Placed]:
    if not isinstance(items, list):
        raise InvalidFilter("an AND clause is an array of criteria", loc, found=items)
    return [Placed((*loc, position), criterion(raw, (*loc, position))) for position, raw in enumerate(items)]


def _disjunction(clauses: Any, inner: str, loc: Loc) -> list[list[Placed]]:
    """An OR of `{inner: [criterion, ...]}` clauses."""
    if not isinstance(clauses, list):
        raise InvalidFilter("an OR of clauses is an array", loc, found=clauses)
    groups = []
    for position, clause in enumerate(clauses):
        if not isinstance(clause, Mapping) or not isinstance(clause.get(inner), list):
            raise InvalidFilter(f'a clause is {{"{inner}": [...]}}', (*loc, position), found=clause)
        groups.append(_clause(clause[inner], (*loc, position, inner)))
    return groups


def _limited(values: int) -> None:
    """Every value is a query clause or a few SQL parameters: a search carries at most MAX_FILTER_VALUES."""
    if values > MAX_FILTER_VALUES:
        raise InvalidFilter(
            f"the filter carries {values} values; the limit is {MAX_FILTER_VALUES}",
            expected=f"at most {MAX_FILTER_VALUES} values",
            found=values,
        )


def _within_limit(groups: list[list[Placed]]) -> list[list[Placed]]:
    _limited(sum(len(placed.criterion.values) for group in groups for placed in group))
    return groups


def placed_filter_groups(filter_: Any) -> list[list[Placed]]:
    """`filter_groups`, each criterion with its place."""
    if filter_ is None:
        return []
    given = (
        {key: value for key, value in filter_.items() if value is not None} if isinstance(filter_, Mapping) else None
    )
    if given is None or len(given) > 1 or set(given) - {"and", "or", "criteria"}:
        raise InvalidFilter(f"a filter is one of {FILTER_FORMS}", expected=FILTER_FORMS, found=filter_)
    if not given:
        return []
    form, items = next(iter(given.items()))
    if form == "criteria":
        return _within_limit([_clause(items, ("criteria",))])
    return _within_limit(_disjunction(items, "criteria" if form == "and" else "and", (form,)))


def filter_groups(filter_: Any) -> Groups:
    """A DataHub filter as an OR of AND groups. DataHub's OpenAPI v3 filter (what its SDK sends) is
    `{"and": [{"criteria": [...]}, ...]}`: despite the name, an OR of its clauses, each an AND of its criteria. Its
    Rest.li `Filter` (a View's filter too) is `{"or": [{"and": [...]}, ...]}`, or the deprecated `{"criteria": [...]}`
    (one AND). No groups (`{}`, a null form, an empty one, no filter): no condition."""
    return criteria_groups(placed_filter_groups(filter_))


def stored_filter_groups(filter_: Mapping[str, Any] | None) -> Groups:
    """A stored Rest.li Filter (a View's) as DataHub reads one: its `or` when it has clauses, else its deprecated
    `criteria`."""
    if not filter_:
        return ()
    return filter_groups({"or": filter_["or"]} if filter_.get("or") else {"criteria": filter_.get("criteria")})


def placed_or_filters(or_filters: Sequence[Any]) -> list[list[Placed]]:
    """GraphQL's orFilters (`[{"and": [FacetFilterInput, ...]}, ...]`; `and` may be null, an empty group), each
    criterion with its place."""
    clauses = [{"and": clause.get("and") or []} if isinstance(clause, Mapping) else clause for clause in or_filters]
    return _within_limit(_disjunction(clauses, "and", ()))


def single_clause(filter_: Any) -> list[Placed]:
    """A filter that must be one AND clause (or none: no condition): its criteria, placed."""
    groups = placed_filter_groups(filter_)
    if len(groups) > 1:
        form = next(key for key, value in filter_.items() if value is not None)
        raise InvalidFilter("an OR of several clauses is not supported here: send one clause", (form, 1))
    return groups[0] if groups else []


def both(one: Groups, other: Groups) -> Groups:
    """Both hold: each group of one ANDed with each group of the other (either empty: the other alone)."""
    if not other:
        return one
    if not one:
        return other
    combined = tuple((*mine, *theirs) for mine in one for theirs in other)
    _limited(sum(len(c.values) for group in combined for c in group))
    return combined


def criteria_groups(groups: list[list[Placed]]) -> Groups:
    """Placed groups without their places."""
    return tuple(tuple(placed.criterion for placed in group) for group in groups)
