"""The aborted-transaction index and the last stable offset of a log
(`odradek.log.transaction_index`, `Log.last_stable_offset`, `Log.collect_aborted_transactions`):

* entries are Kafka's 34-byte layout in `<base>.txnindex` beside the segment;
* a transaction aborted by a marker is indexed with its first offset, the marker's offset and the
  LSO at that moment; a committed one is not;
* the LSO stays at the first offset of an open transaction, and at the HW otherwise;
* the index survives a reopen after a clean shutdown and is rebuilt by the replay after an unclean
  one (the file deleted); truncation below a marker drops its entry;
* followers (append_as_follower) build the same index.
"""

from __future__ import annotations

import struct
from pathlib import Path

from odradek.coordinator.transaction.log_records import build_marker_batch
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.log.producer_state import AppendOrigin
from odradek.log.transaction_index import AbortedTxn, TransactionIndexes, txn_index_file_name
from odradek.protocol.record_batch import build_batch

NOW = 1_700_000_000_000


def _open(path: Path, clean: bool = True) -> Log:
    return Log.open(
        path / "t-0",
        LogConfig(),
        recovery_point=0,
        log_start_offset=0,
        clean_shutdown=clean,
        now_ms=NOW,
    )


def _txn_batch(producer_id: int, sequence: int, count: int = 2) -> bytes:
    return build_batch(
        [(None, b"v%d" % i, (), NOW) for i in range(count)],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=sequence,
        is_transactional=True,
    )


def _marker(log: Log, producer_id: int, commit: bool) -> int:
    info = log.append_as_leader(
        build_marker_batch(producer_id, 0, commit, 0, NOW), 0, NOW, origin=AppendOrigin.COORDINATOR
    )
    return int(info.first_offset)


def test_file_format_is_kafkas(tmp_path: Path) -> None:
    index = TransactionIndexes(tmp_path)
    index.append(0, AbortedTxn(7, 10, 20, 10))
    data = (tmp_path / txn_index_file_name(0)).read_bytes()
    assert data == struct.pack(">hqqqq", 0, 7, 10, 20, 10) and len(data) == 34
    index.append(0, AbortedTxn(7, 10, 20, 10))  # a replay re-adding it changes nothing
    assert TransactionIndexes(tmp_path).entries() == [AbortedTxn(7, 10, 20, 10)]


def test_lso_and_aborted_transactions(tmp_path: Path) -> None:
    log = _open(tmp_path)
    log.append_as_leader(_txn_batch(1, 0), 0, NOW)  # offsets 0-1, producer 1
    log.append_as_leader(_txn_batch(2, 0), 0, NOW)  # offsets 2-3, producer 2
    assert log.last_stable_offset(4) == 0
    assert _marker(log, 1, commit=False) == 4
    assert log.last_stable_offset(5) == 2  # producer 2 still open
    assert _marker(log, 2, commit=True) == 5
    assert log.last_stable_offset(6) == 6
    assert log.last_stable_offset(5) == 5  # never beyond the HW
    assert log.collect_aborted_transactions(0, 6) == [AbortedTxn(1, 0, 4, 2)]
    assert log.collect_aborted_transactions(5, 6) == []
    log.close()
    reopened = _open(tmp_path)
    assert reopened.collect_aborted_transactions(0, 6) == [AbortedTxn(1, 0, 4, 2)]
    reopened.close()
    # After a crash that lost the index file, the replay rebuilds it.
    (tmp_path / "t-0" / txn_index_file_name(0)).unlink()
    for snapshot in (tmp_path / "t-0").glob("*.snapshot"):
        snapshot.unlink()
    crashed = _open(tmp_path, clean=False)
    assert crashed.collect_aborted_transactions(0, 6) == [AbortedTxn(1, 0, 4, 2)]
    assert crashed.truncate_to(4)
    assert crashed.collect_aborted_transactions(0, 6) == []
    assert crashed.last_stable_offset(4) == 0  # both transactions are open again


def test_follower_builds_the_same_index(tmp_path: Path) -> None:
    leader = _open(tmp_path / "leader")
    leader.append_as_leader(_txn_batch(9, 0, 3), 0, NOW)
    _marker(leader, 9, commit=False)
    follower = _open(tmp_path / "follower")
    follower.append_as_follower(leader.read(0, 1 << 20))
    assert follower.collect_aborted_transactions(0, 10) == [AbortedTxn(9, 0, 3, 4)]
    assert follower.last_stable_offset(4) == 4
