"""The relay's retry waits (app.kafka.relay.Backoff): database reconnects and Kafka producer restarts."""

from app.kafka.relay import Backoff


def test_waits_double_from_the_first_failure_up_to_the_cap():
    database = Backoff(base=0.2, cap=5.0)
    assert [round(database.failed(), 6) for _ in range(6)] == [0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    kafka = Backoff(base=0.25, cap=2.0)
    assert [kafka.failed() for _ in range(4)] == [0.5, 1.0, 2.0, 2.0]
    assert kafka.failures == 4  # what the relay logs as attempts


def test_a_success_starts_the_count_again():
    backoff = Backoff(base=0.25, cap=2.0)
    for _ in range(3):
        backoff.failed()
    backoff.succeeded()
    assert backoff.failures == 0
    assert backoff.failed() == 0.5


def test_a_long_outage_keeps_the_cap():
    backoff = Backoff(base=0.25, cap=2.0)
    for _ in range(5000):  # 2**5000 as a float would overflow
        wait = backoff.failed()
    assert wait == 2.0 and backoff.failures == 5000
