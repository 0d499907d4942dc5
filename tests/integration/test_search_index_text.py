"""The text the embedded search backend indexes (app.search.postgres `index_text`): as written and split on the
characters that are not letters or digits. It splits in Python on the ASCII ones; these tests hold it to the vectors
the regular expression it replaced in the statements (`[^[:alnum:]]+`, any character) gave, non-ASCII text included,
so that documents indexed before and after the change are found alike."""

from __future__ import annotations

import random

from app.search.postgres import aspect_text, index_text

REGEXP_TEXT = "coalesce(t || ' ' || regexp_replace(t, '[^[:alnum:]]+', ' ', 'g'), '')"
NAMED = [
    "db.orders",
    "user@example.com",
    "https://example.com/a/b?q=1&r=2",
    "snake_case_name",
    "a-b-c",
    "café au lait",
    "naïve–test",
    "Ωmega’s “quoted” text…",
    "x\u00a0y",
    "中文.表_名",
    "tab\tand\nnewline",
    "emoji😀inside",
    "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)",
    "",
]


def corpus(size: int) -> list[str]:
    rng = random.Random(7)
    alphabet = list("abcXYZ019 ._-/:@,;()[]{}=+*&^%$#!?'\"\\|~`<>\t\n") + list("éßü中文’–…\u00a0😀Ωñ")
    return NAMED + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(size)]


async def test_split_text_gives_the_vectors_of_the_regular_expression(db):
    texts = corpus(5000)
    differing = await db.fetch(
        f"SELECT t, to_tsvector('simple', {REGEXP_TEXT})::text AS expected, to_tsvector('simple', s)::text AS got "
        "FROM unnest($1::text[], $2::text[]) AS x(t, s) "
        f"WHERE to_tsvector('simple', {REGEXP_TEXT}) IS DISTINCT FROM to_tsvector('simple', s)",
        texts,
        [index_text(t) for t in texts],
    )
    assert [dict(r) for r in differing] == []


def test_split_text_keeps_the_whole_and_its_parts():
    assert index_text("db.orders_v2") == "db.orders_v2 db orders v2"
    assert index_text("café–au") == "café–au café–au"  # non-ASCII: left to the parser


def test_aspect_text_is_split_and_counts_the_characters_as_written():
    texts, exact, kept = aspect_text({"name": "db.orders"}, {"name": ("A", True)}, 100)
    assert texts == ["db.orders db orders", None, None, None]
    assert exact == ["db.orders"] and kept == len("db.orders")
