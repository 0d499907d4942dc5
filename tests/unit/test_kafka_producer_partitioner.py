"""The producers' partitioner agrees with aiokafka's (and so the Java client's) murmur2 placement of a key."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner

from app.kafka.producer import KeyPartitioner


def test_keys_go_where_the_default_partitioner_puts_them():
    ours, theirs = KeyPartitioner(), DefaultPartitioner()
    for partitions in ([0], [0, 1, 2], list(range(12))):
        for i in range(300):
            key = f"urn:li:dataset:(urn:li:dataPlatform:hive,db.t{i},PROD)".encode()
            assert ours(key, partitions, partitions) == theirs(key, partitions, partitions)
            assert ours(key, partitions, partitions) == theirs(key, partitions, partitions)  # from its cache
    assert ours(None, [0, 1], [1]) == 1  # no key: any available partition
