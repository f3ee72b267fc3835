"""Leader epoch cache: assignment rules, OffsetForLeaderEpoch answers, truncation, the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from odradek.errors import KafkaStorageError
from odradek.log.leader_epoch import EpochEntry, LeaderEpochCache


@pytest.fixture
def cache(tmp_path: Path) -> LeaderEpochCache:
    return LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")


def test_empty_cache(cache: LeaderEpochCache) -> None:
    assert cache.latest_epoch == -1
    assert cache.latest_entry is None and cache.earliest_entry is None
    assert cache.end_offset_for(0, 100) == (-1, -1)
    assert not cache.path.exists()


def test_assign_and_file_format(cache: LeaderEpochCache) -> None:
    assert cache.assign(0, 0)
    assert cache.assign(3, 150)
    assert not cache.assign(3, 200)  # same epoch, later offset: nothing new
    assert not cache.assign(2, 300)  # stale epoch: ignored
    assert cache.epoch_entries() == [EpochEntry(0, 0), EpochEntry(3, 150)]
    assert not cache.path.exists()  # written lazily, by sync()
    cache.sync()
    assert cache.path.read_text() == "0\n2\n0 0\n3 150\n"
    reloaded = LeaderEpochCache(cache.path)
    assert reloaded.epoch_entries() == cache.epoch_entries()
    assert not (cache.path.parent / "leader-epoch-checkpoint.tmp").exists()


def test_assign_keeps_both_columns_increasing(cache: LeaderEpochCache) -> None:
    cache.assign(1, 10)
    cache.assign(2, 20)
    assert cache.assign(2, 15)  # the latest epoch moves its start back
    assert cache.epoch_entries() == [EpochEntry(1, 10), EpochEntry(2, 15)]
    assert cache.assign(5, 12)  # newer epoch starting before the latest entry: it wins
    assert cache.epoch_entries() == [EpochEntry(1, 10), EpochEntry(5, 12)]
    with pytest.raises(KafkaStorageError):
        cache.assign(-1, 0)


def test_end_offset_for(cache: LeaderEpochCache) -> None:
    for epoch, start in [(1, 0), (3, 100), (4, 250), (7, 400)]:
        cache.assign(epoch, start)
    leo = 555
    table = {
        -1: (-1, -1),  # undefined epoch
        0: (0, 0),  # below the first entry: Kafka answers the first entry's start offset
        1: (1, 100),
        2: (1, 100),  # unknown epoch between entries: the largest epoch below it
        3: (3, 250),
        4: (4, 400),
        5: (4, 400),
        6: (4, 400),
        7: (7, leo),  # the latest epoch is still open: it ends at the LEO
        8: (-1, -1),  # newer than anything known
    }
    for requested, expected in table.items():
        assert cache.end_offset_for(requested, leo) == expected, requested


def test_epoch_for_offset(cache: LeaderEpochCache) -> None:
    cache.assign(2, 10)
    cache.assign(5, 20)
    assert [cache.epoch_for_offset(o) for o in (0, 10, 19, 20, 99)] == [-1, 2, 2, 5, 5]


def test_truncate_from_end(cache: LeaderEpochCache) -> None:
    for epoch, start in [(1, 0), (2, 100), (3, 200)]:
        cache.assign(epoch, start)
    cache.truncate_from_end(300)
    assert len(cache.epoch_entries()) == 3
    cache.truncate_from_end(200)
    assert cache.epoch_entries() == [EpochEntry(1, 0), EpochEntry(2, 100)]
    cache.truncate_from_end(50)
    assert cache.epoch_entries() == [EpochEntry(1, 0)]
    cache.sync()
    assert LeaderEpochCache(cache.path).epoch_entries() == [EpochEntry(1, 0)]


def test_truncate_from_start(cache: LeaderEpochCache) -> None:
    for epoch, start in [(1, 0), (2, 100), (3, 200)]:
        cache.assign(epoch, start)
    cache.truncate_from_start(0)
    assert len(cache.epoch_entries()) == 3
    cache.truncate_from_start(150)  # epoch 2 is in force at 150: kept, starting there
    assert cache.epoch_entries() == [EpochEntry(2, 150), EpochEntry(3, 200)]
    cache.truncate_from_start(200)
    assert cache.epoch_entries() == [EpochEntry(3, 200)]
    cache.truncate_from_start(250)
    assert cache.epoch_entries() == [EpochEntry(3, 250)]
    cache.sync()
    assert LeaderEpochCache(cache.path).epoch_entries() == [EpochEntry(3, 250)]


def test_clear_and_flush(cache: LeaderEpochCache) -> None:
    cache.assign(1, 0)
    cache.clear_and_flush()
    assert cache.epoch_entries() == []
    cache.sync()
    assert cache.path.read_text() == "0\n0\n"


def test_malformed_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text("0\n1\n5\n")
    with pytest.raises(KafkaStorageError, match="line 3"):
        LeaderEpochCache(path)
