"""Checked GraphQL documents are kept by query text: a query sent again is not parsed or validated again, a refused
one is refused every time, and the cache holds the most recently used documents only."""

from __future__ import annotations

from graphql import parse

from app.graphql import service
from app.graphql.service import BASE, ValidatedDocuments, _checked
from app.settings import Settings

QUERY = 'query { tag(urn: "urn:li:tag:a") { urn name } }'


def test_a_query_sent_again_is_checked_once(monkeypatch):
    settings = Settings()
    monkeypatch.setattr(service, "VALIDATED", ValidatedDocuments(8))
    validations = []
    real_validate = service.validate
    monkeypatch.setattr(service, "validate", lambda schema, doc: validations.append(doc) or real_validate(schema, doc))
    first = _checked(QUERY, settings, BASE.schema)
    assert not isinstance(first, dict)
    assert _checked(QUERY, settings, BASE.schema) is first and len(validations) == 1

    unknown = 'query { tag(urn: "urn:li:tag:a") { nosuchfield } }'
    for _ in range(2):  # refused each time, never kept
        refused = _checked(unknown, settings, BASE.schema)
        assert isinstance(refused, dict) and "nosuchfield" in refused["errors"][0]["message"]
    assert len(validations) == 3

    # other limits: checked again under them
    tight = Settings(graphql_max_depth=1)
    assert isinstance(_checked(QUERY, tight, BASE.schema), dict)


def test_the_cache_keeps_the_most_recently_used():
    documents = ValidatedDocuments(2)
    keys = [(f"query {{ q{i} }}", None, 0) for i in range(3)]
    parsed = [parse(key[0]) for key in keys]
    for key, document in zip(keys[:2], parsed):
        documents.put(key, document)
    assert documents.get(keys[0]) is parsed[0]  # used: kept over keys[1]
    documents.put(keys[2], parsed[2])
    assert (
        documents.get(keys[1]) is None and documents.get(keys[0]) is parsed[0] and documents.get(keys[2]) is parsed[2]
    )
