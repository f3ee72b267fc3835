"""A fetch with nothing to read answers without reading the log (the idle path: most partitions
of a follower's or consumer's session are caught up), and answers what the log's read would:
no records, the partition's offsets, and for read_committed an empty list of aborted
transactions. A closed log still refuses the read."""

from __future__ import annotations

from pathlib import Path

import pytest

from odradek.errors import KafkaStorageError
from odradek.log.config import LogConfig
from tests.unit.compacted_log import Harness, Producer
from tests.unit.test_read_committed_zero_copy import _leader


def _log_with_an_open_transaction(tmp_path: Path) -> Harness:
    h = Harness(tmp_path, LogConfig(segment_bytes=4096, cleanup_policy=("delete",)))
    h.append([(b"k", b"plain")] * 5)
    h.append([(b"k", b"in a transaction")] * 3, producer=Producer(7, transactional=True))
    h.append([(b"k", b"after")] * 2)
    return h


@pytest.mark.parametrize("zero_copy", [False, True])
def test_reads_at_the_end_answer_nothing_with_the_partitions_offsets(
    tmp_path: Path, zero_copy: bool
) -> None:
    h = _log_with_an_open_transaction(tmp_path)
    partition = _leader(h)
    partition._maybe_increment_high_watermark()
    leo = h.log.log_end_offset
    hw = partition.high_watermark
    lso = h.log.last_stable_offset(hw)
    assert (lso, hw, leo) == (5, 10, 10)
    cases = [
        # (fetch offset, from a follower, read_committed, aborted transactions expected)
        (leo, True, False, None),
        (hw, False, False, None),
        (lso, False, True, []),
    ]
    for offset, follower, committed, aborted in cases:
        read = partition.read_records(
            offset, 1 << 20, from_follower=follower, read_committed=committed, zero_copy=zero_copy
        )
        assert bytes(read.records) == b""
        assert read.high_watermark == hw
        assert read.log_end_offset == leo
        assert read.log_start_offset == h.log.log_start_offset
        assert read.last_stable_offset == lso
        assert read.aborted_transactions == aborted
    # One offset before each end there is something to read.
    assert partition.read_records(leo - 1, 1 << 20, from_follower=True).records
    committed = partition.read_records(
        lso - 1, 1 << 20, from_follower=False, read_committed=True, zero_copy=zero_copy
    )
    assert committed.records


def test_a_closed_log_refuses_a_read_at_its_end(tmp_path: Path) -> None:
    h = _log_with_an_open_transaction(tmp_path)
    partition = _leader(h)
    leo = h.log.log_end_offset
    h.log.close()
    with pytest.raises(KafkaStorageError):
        partition.read_records(leo, 1 << 20, from_follower=True, zero_copy=True)
