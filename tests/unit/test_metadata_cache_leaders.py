"""The metadata cache counts the partitions whose leader an UpdateMetadata changed (the broker logs
it: when clients asking this broker learn of new leaders)."""

from __future__ import annotations

from odradek.server.metadata_cache import MetadataCache, PartitionMetadata


def state(partition: int, leader: int, topic: str = "t") -> PartitionMetadata:
    return PartitionMetadata(topic, partition, leader, 0, (leader,), (1, 2, 3))


def test_leaders_changed_counts_moved_leaders_only() -> None:
    cache = MetadataCache(broker_id=1)
    cache.update(1, 1, [], [state(p, 1) for p in range(4)])
    assert cache.leaders_changed == 0  # new partitions are not moves
    cache.update(1, 1, [], [state(0, 1), state(1, 2), state(2, 3), state(0, 2, topic="u")])
    assert cache.leaders_changed == 2
    cache.update(1, 1, [], [state(1, 2)])
    assert cache.leaders_changed == 0  # the same leader again
    cache.update(1, 1, [], [state(3, -2)])  # deleted: not a move
    assert cache.leaders_changed == 0
    assert cache.get_partition("t", 3) is None
