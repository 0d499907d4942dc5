import pytest

from app.urns import InvalidUrnError, make_urn, parse_urn, validate_urn


def test_tuple_urn_splits_at_depth_one_and_keeps_nested_urns_whole():
    urn = parse_urn("urn:li:dataset:(urn:li:dataPlatform:hive,db.table,PROD)")
    assert urn.entity_type == "dataset"
    assert urn.parts == ("urn:li:dataPlatform:hive", "db.table", "PROD")


def test_nested_tuple_keeps_its_commas():
    urn = parse_urn("urn:li:dataJob:(urn:li:dataFlow:(airflow,dag,prod),task_1)")
    assert urn.parts == ("urn:li:dataFlow:(airflow,dag,prod)", "task_1")


def test_simple_urn_is_one_part():
    assert parse_urn("urn:li:corpuser:jdoe@example.com").parts == ("jdoe@example.com",)


@pytest.mark.parametrize(
    "bad, reason",
    [
        ("urn:li:dataset:(a,,b)", "empty part"),
        ("urn:li:dataset:(a,b", "mismatched paren"),
        ("urn:li:dataset:(a,b))", "mismatched paren"),
        ("urn:li:tag:foo)", "mismatched paren"),
        ("urn:li:dataset:(a,b)x", "mismatched paren"),
        ("urn:li:tag:", "empty id"),
        ("urn:li::x", "no entity type"),
        ("li:tag:x", "must start with"),
        ("urn:li:tag", "no entity type"),
    ],
)
def test_malformed_urns_are_rejected_with_a_reason(bad, reason):
    with pytest.raises(InvalidUrnError, match=reason):
        parse_urn(bad)


def test_validation_rules():
    with pytest.raises(InvalidUrnError, match="whitespace"):
        validate_urn(" urn:li:tag:x")
    with pytest.raises(InvalidUrnError, match="reserved character"):
        validate_urn("urn:li:tag:a\u241fb")
    with pytest.raises(InvalidUrnError, match="limit is 512"):
        validate_urn("urn:li:tag:" + "x" * 520)
    # schemaField URNs nest whole dataset URNs and are exempt from the length limit
    validate_urn("urn:li:schemaField:(urn:li:dataset:(urn:li:dataPlatform:hive," + "x" * 600 + ",PROD),f)")
    with pytest.raises(InvalidUrnError, match="comma"):
        validate_urn("urn:li:tag:a,b")
    with pytest.raises(InvalidUrnError, match="reserved characters"):
        validate_urn("urn:li:dataset:(urn:li:dataPlatform:hive,db(1).t,PROD)")
    # percent-encoded parentheses are fine, and non-strict mode lets reserved characters through
    validate_urn("urn:li:dataset:(urn:li:dataPlatform:hive,db%281%29.t,PROD)")
    validate_urn("urn:li:tag:a,b", strict=False)


def test_length_is_measured_url_encoded():
    # 100 x '@' is 300 bytes URL-encoded: fine; 170 is 510 + prefix: over
    validate_urn("urn:li:corpuser:" + "@" * 100)
    with pytest.raises(InvalidUrnError, match="URL-encoded"):
        validate_urn("urn:li:corpuser:" + "@" * 170)


def test_make_urn_round_trips():
    urn = make_urn("dataset", ["urn:li:dataPlatform:hive", "db.t", "PROD"])
    assert urn == "urn:li:dataset:(urn:li:dataPlatform:hive,db.t,PROD)"
    assert parse_urn(urn).parts == ("urn:li:dataPlatform:hive", "db.t", "PROD")
    assert make_urn("tag", ["pii"]) == "urn:li:tag:pii"
