"""The fields below the root that answer a page of entities (DataHub's `relationships`, `lineage`, `assertions`,
`relatedDocuments`, `listQueries`, a domain's `entities`, …): each topic module declares its own here, beside the
resolver whose default it names, and the cost of an operation (app.graphql.limits.query_cost) pays what their results
select once per result of the page asked for, as it does for the searches. It imports nothing of app.graphql, so
every topic module can declare into it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PagedList:
    results: str  # the child field holding the page's results
    default_count: int  # the page size when the request gives none (the resolver's)
    in_input: bool = True  # `count` is a field of the `input` argument, else an argument of its own


# field name -> its page; a field name means the same page wherever DataHub's schema declares it
PAGED_LISTS: dict[str, PagedList] = {}


def declare_paged(field: str, results: str, default_count: int, *, in_input: bool = True) -> None:
    PAGED_LISTS[field] = PagedList(results, default_count, in_input)
