"""The fault suite's own parts, without a cluster: every checker (`checker`, and the
transaction checks of `transaction_checks`) must be able to fail on the smallest history that
shows its violation, a seed must give the same schedule every time, and a torn write must cut
only what was never flushed."""

from __future__ import annotations

import json

from odradek.log.checkpoints import write_offset_checkpoint
from odradek.log.naming import RECOVERY_POINT_CHECKPOINT, log_dir_name
from odradek.protocol.record_batch import Record, build_batch
from tests.faults.checker import (
    ControllerEpochHistory,
    FinalPartition,
    LeaderEpochHistory,
    acknowledged_records_readable,
    brokers_never_crash,
    controller_epoch_monotonic,
    every_partition_led,
    idempotent_writes_once,
    one_leader_per_epoch,
    producer_epochs_of,
    producer_order,
    read_state_change_log,
    replicas_agree_below_high_watermark,
)
from tests.faults.history import Event, History, check_history
from tests.faults.schedule import FaultKind, make_schedule, tear_segment
from tests.faults.test_fault_injection import CI
from tests.faults.transaction_checks import (
    aborted_transactions_invisible,
    check_transactions,
    committed_transactions_visible_once,
    lso_monotonic,
    read_committed_reads_stable,
)
from tests.faults.workload import ProducerStats, client_stall, unfinished_report
from tests.integration._replication import StoredBatch


def _batch(base_offset: int, data: bytes, epoch: int = 0) -> StoredBatch:
    return StoredBatch(base_offset, base_offset, epoch, data)


def test_each_checker_detects_the_violation_it_exists_for():
    acked = {0: {0: b"p0-0", 1: b"p0-1"}}
    assert acknowledged_records_readable(acked, {0: [Record(0, 0, None, b"p0-0", [])]}).details
    assert acknowledged_records_readable(
        acked, {0: [Record(0, 0, None, b"p0-0", []), Record(1, 0, None, b"p0-1", [])]}
    ).passed
    assert not producer_order(acked, {0: {0: -1, 1: 1}}).passed  # sent after 1 was acked
    assert producer_order(acked, {0: {0: -1, 1: 0}}).passed
    same = [_batch(0, b"a"), _batch(1, b"b")]
    assert replicas_agree_below_high_watermark({0: {1: same, 2: same}}, {0: 2}).passed
    diverged = {0: {1: same, 2: [_batch(0, b"a"), _batch(1, b"c", 1)]}}
    assert not replicas_agree_below_high_watermark(diverged, {0: 2}).passed
    short = {0: {1: same, 2: same[:1]}}
    assert not replicas_agree_below_high_watermark(short, {0: 2}).passed
    # Beyond the HW replicas may differ.
    assert replicas_agree_below_high_watermark(diverged, {0: 1}).passed

    leaders = LeaderEpochHistory()
    leaders.observe(0, 3, 1, "ZooKeeper")
    leaders.observe(0, 3, -1, "broker 2 Metadata")  # no leader is not a second leader
    assert one_leader_per_epoch(leaders).passed
    leaders.observe(0, 3, 2, "broker 2 Metadata")
    assert not one_leader_per_epoch(leaders).passed

    controllers = ControllerEpochHistory()
    for epoch in (1, 2, 2, 3):
        controllers.observe_epoch(epoch)
    assert controller_epoch_monotonic(controllers).passed
    controllers.observe_epoch(2)
    assert not controller_epoch_monotonic(controllers).passed
    split = ControllerEpochHistory()
    log_text = (
        "[Controller id=1 epoch=4] Changed state of t-0 from OfflinePartition to "
        "OnlinePartition with leader=2, leader_epoch=5, isr=[2, 3]\n"
        "[Controller id=3 epoch=4] Changed state of t-0 from OfflinePartition to "
        "OnlinePartition with leader=3, leader_epoch=5, isr=[3]\n"
    )
    from_log = LeaderEpochHistory()
    assert read_state_change_log(log_text, "t", "broker 1", from_log, split) == 2
    assert not controller_epoch_monotonic(split).passed
    assert not one_leader_per_epoch(from_log).passed

    assert brokers_never_crash([], 30).passed
    assert not brokers_never_crash(["#3 kill_leader: broker 2 exited during start-up"], 30).passed

    led = [FinalPartition(0, 1, (1, 2, 3), (1, 2, 3))]
    assert every_partition_led(led, [1, 2, 3], 1).passed
    assert not every_partition_led(led, [2, 3], 1).passed
    assert not every_partition_led([FinalPartition(0, 1, (1,), (1, 2, 3))], [1, 2, 3], 1).passed

    def records(*values: bytes) -> dict[int, list[Record]]:
        return {0: [Record(i, 0, None, v, []) for i, v in enumerate(values)]}

    assert idempotent_writes_once(records(b"i0-0", b"p0-0", b"i0-2", b"p0-0"), ["i0"]).passed
    assert not idempotent_writes_once(records(b"i0-0", b"i0-1", b"i0-1"), ["i0"]).passed
    assert not idempotent_writes_once(records(b"i0-3", b"i0-2"), ["i0"]).passed
    assert idempotent_writes_once(records(b"i0-0", b"i0-1"), ["i0"], {0: [b"i0-1"]}).passed
    assert not idempotent_writes_once(records(b"i0-0"), ["i0"], {0: [b"i0-1"]}).passed


def test_a_seed_gives_the_same_schedule_and_every_kind_early():
    first, again = make_schedule(7, CI), make_schedule(7, CI)
    assert first == again
    assert make_schedule(8, CI) != first
    assert len(first.faults) == CI.faults
    assert CI.min_brokers <= first.brokers <= CI.max_brokers
    assert {f.kind for f in first.faults[: len(FaultKind)]} == set(FaultKind)


def test_a_torn_write_cuts_only_unflushed_batches(tmp_path):
    directory = tmp_path / log_dir_name("t", 0)
    directory.mkdir()
    batches = [build_batch([(None, b"v%d" % i, [], 0)], base_offset=i) for i in range(5)]
    segment = directory / "00000000000000000000.log"
    segment.write_bytes(b"".join(batches))
    write_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT, {("t", 0): 3})
    torn = tear_segment(tmp_path, "t", 0, append=False, fraction=0.0, seed=1)
    assert torn is not None
    kept = segment.stat().st_size
    # The cut falls inside the batches at or after the recovery point (offsets 3 and 4).
    assert len(b"".join(batches[:3])) < kept < len(b"".join(batches))
    appended = tear_segment(tmp_path, "t", 0, append=True, fraction=0.0, seed=1)
    assert appended is not None and segment.stat().st_size > kept


def test_each_transaction_checker_detects_the_violation_it_exists_for():
    def history(*events: tuple[str, str, int, str | None, int | None, str | None]) -> list[Event]:
        return [
            Event(float(t), kind, process, partition, value, offset, error=error)
            for t, (kind, process, partition, value, offset, error) in enumerate(events)
        ]

    def txn(name: str, outcome: str, *records: tuple[int, str]) -> list[tuple]:
        sends = [("txn_send", name, p, v, None, None) for p, v in records]
        return [*sends, ("txn_outcome", name, -1, None, None, outcome)]

    def final(*records: tuple[int, int, str]) -> list[tuple]:
        return [("txn_final", "final-reader", p, v, o, None) for p, o, v in records]

    sent = [
        *txn("t.1", "committed", (0, "t.1-0"), (1, "t.1-1")),
        *txn("t.2", "aborted", (0, "t.2-0"), (1, "t.2-1")),
    ]
    good = final((0, 0, "t.1-0"), (1, 0, "t.1-1"))
    assert committed_transactions_visible_once(history(*sent, *good)).passed
    assert aborted_transactions_invisible(history(*sent, *good)).passed
    # A committed record missing, read twice, or in the wrong partition.
    assert not committed_transactions_visible_once(history(*sent, *good[:1])).passed
    twice = final((0, 0, "t.1-0"), (0, 1, "t.1-0"), (1, 0, "t.1-1"))
    assert not committed_transactions_visible_once(history(*sent, *twice)).passed
    moved = final((0, 0, "t.1-0"), (0, 1, "t.1-1"))
    assert not committed_transactions_visible_once(history(*sent, *moved)).passed
    # Unknown outcome: all or nothing.
    unknown = txn("t.3", "unknown", (0, "t.3-0"), (1, "t.3-1"))
    assert committed_transactions_visible_once(history(*sent, *unknown, *good)).passed
    all_of_it = final((0, 0, "t.1-0"), (1, 0, "t.1-1"), (0, 1, "t.3-0"), (1, 1, "t.3-1"))
    assert committed_transactions_visible_once(history(*sent, *unknown, *all_of_it)).passed
    half = final((0, 0, "t.1-0"), (1, 0, "t.1-1"), (0, 1, "t.3-0"))
    assert not committed_transactions_visible_once(history(*sent, *unknown, *half)).passed
    # An aborted, fenced or failed transaction's record, read at the end or during the run.
    leaked = final((0, 0, "t.1-0"), (1, 0, "t.1-1"), (0, 1, "t.2-0"))
    assert not aborted_transactions_invisible(history(*sent, *leaked)).passed
    during = ("txn_read", "txn-reader", 1, "t.2-1", 2, None)
    assert not aborted_transactions_invisible(history(*sent, during, *good)).passed
    for outcome in ("fenced", "failed"):
        other = txn("t.4", outcome, (1, "t.4-0"))
        seen = final((0, 0, "t.1-0"), (1, 0, "t.1-1"), (1, 1, "t.4-0"))
        assert not aborted_transactions_invisible(history(*sent, *other, *seen)).passed
    zombie = [*sent, ("txn_outcome", "t.5", -1, "zombie commit accepted", None, "fenced")]
    assert not aborted_transactions_invisible(history(*zombie, *good)).passed
    stranger = final((0, 0, "t.1-0"), (1, 0, "t.1-1"), (1, 1, "p0-7"))
    assert not aborted_transactions_invisible(history(*sent, *stranger)).passed
    # Nothing committed or nothing aborted: the checks would prove nothing.
    assert not committed_transactions_visible_once(history(*sent[3:])).passed
    assert not aborted_transactions_invisible(history(*sent[:3], *good)).passed
    # Reads during the run: in the final read at the same offset, each once.
    read = ("txn_read", "txn-reader", 0, "t.1-0", 0, None)
    assert read_committed_reads_stable(history(*sent, read, *good)).passed
    assert not read_committed_reads_stable(history(*sent, read, read, *good)).passed
    elsewhere = ("txn_read", "txn-reader", 0, "t.1-0", 5, None)
    assert not read_committed_reads_stable(history(*sent, elsewhere, *good)).passed

    def lso(*observations: tuple[str, int, int, int]) -> list[Event]:
        return [
            Event(float(t), "lso", broker, partition, offset=offset, leader_epoch=epoch)
            for t, (broker, partition, epoch, offset) in enumerate(observations)
        ]

    assert lso_monotonic(lso(("b1", 0, 3, 10), ("b1", 0, 3, 12), ("b2", 0, 4, 11))).passed
    assert lso_monotonic(lso(("b1", 0, 3, 10), ("b1", 1, 3, 5))).passed
    assert not lso_monotonic(lso(("b1", 0, 3, 10), ("b1", 0, 3, 9))).passed
    assert not lso_monotonic([]).passed
    skipped = check_transactions([], transactional=False)
    assert all(r.passed and r.details[0].startswith("skipped") for r in skipped)


def test_a_transactional_history_runs_the_transaction_checks():
    history = History(transactional=True)
    history.record("txn_send", "t.1", 0, value="t.1-0")
    history.record("txn_outcome", "t.1", -1, error="committed")
    history.record("txn_send", "t.2", 0, value="t.2-0")
    history.record("txn_outcome", "t.2", -1, error="aborted")
    history.record("lso", "broker1", 0, offset=3, leader_epoch=0)
    history.record("txn_final", "final-reader", 0, value="t.1-0", offset=0)
    results = {r.name: r for r in check_history(history)}
    assert results["committed_transactions_visible_once"].checked == 1
    assert results["aborted_transactions_invisible"].passed
    assert results["lso_monotonic"].checked == 1
    history.record("txn_final", "final-reader", 0, value="t.2-0", offset=2)
    results = {r.name: r for r in check_history(history)}
    assert not results["aborted_transactions_invisible"].passed


def _stats_with(partition: dict, handles: dict) -> ProducerStats:
    stats = ProducerStats("p0", unreported={0: 61})
    stats.statistics = json.dumps(
        {
            "age": 400_000_000,
            "brokers": handles,
            "topics": {"t": {"partitions": {"0": {"leader": 1, **partition}}}},
        }
    )
    return stats


def test_client_stall_needs_every_message_unsent_and_no_connected_handle() -> None:
    idle = {"127.0.0.1:9092/1": {"nodeid": 1, "state": "INIT"}}
    up = {"127.0.0.1:9092/1": {"nodeid": 1, "state": "UP"}}
    queued = {"broker": 1, "msgq_cnt": 61, "xmit_msgq_cnt": 0, "msgs_inflight": 0}
    stall = client_stall(_stats_with(queued, idle), "t", [0])
    assert stall.startswith("client stall: p0: 61 queued, delegated to 1, leader 1")
    assert "127.0.0.1:9092/1 INIT" in stall
    orphan = {**queued, "broker": -1}
    assert client_stall(_stats_with(orphan, up), "t", [0]).startswith("client stall: p0")
    # Sent, or delegated to a connected broker: the brokers had their chance, not a stall.
    assert client_stall(_stats_with({**queued, "msgs_inflight": 3}, idle), "t", [0]) == ""
    assert client_stall(_stats_with({**queued, "xmit_msgq_cnt": 5}, idle), "t", [0]) == ""
    assert client_stall(_stats_with(queued, up), "t", [0]) == ""
    # No statistics, or none for a waiting partition: no evidence, no stall.
    assert client_stall(ProducerStats("p0", unreported={0: 1}), "t", [0]) == ""
    assert client_stall(_stats_with(queued, idle), "t", [0, 1]) == ""


def test_unfinished_report_names_every_handle_of_the_leader() -> None:
    handles = {
        "127.0.0.1:9092/1": {"nodeid": 1, "state": "INIT"},
        "127.0.0.1:9093/1": {"nodeid": 1, "state": "DOWN"},
    }
    queued = {"broker": -1, "msgq_cnt": 61, "xmit_msgq_cnt": 0, "msgs_inflight": 0}
    report = unfinished_report(_stats_with(queued, handles), "t")
    assert "p0: leader 1 delegated to -1 msgq 61" in report
    assert "handles of 1: 127.0.0.1:9092/1 INIT, 127.0.0.1:9093/1 DOWN" in report


def test_a_record_stored_again_under_a_new_producer_epoch_is_reported_not_failed():
    """librdkafka's renumbering after an epoch bump (the fault suite's seed 120060345 stored
    i0-8468 as epoch 0, sequence 1411, and again as epoch 1, sequence 0): any broker stores it
    twice, so it is reported; a second copy under the same epoch is still a violation."""
    values = [b"i0-0", b"i0-1", b"p0-0", b"i0-1", b"i0-2"]
    records = {0: [Record(i, 0, None, v, []) for i, v in enumerate(values)]}
    batches = [
        _batch(i, build_batch([(None, v, [], 0)], base_offset=i, producer_id=5, producer_epoch=e))
        for i, (v, e) in enumerate(zip(values, [0, 0, 0, 1, 1], strict=True))
    ]
    epochs = {0: producer_epochs_of(batches)}
    assert epochs[0] == {0: 0, 1: 0, 2: 0, 3: 1, 4: 1}
    result = idempotent_writes_once(records, ["i0"], None, epochs)
    assert result.passed
    assert any("renumbering" in d and "i0-1 at offset 3" in d for d in result.details)
    same_epoch = {0: {offset: 0 for offset in range(5)}}
    assert not idempotent_writes_once(records, ["i0"], None, same_epoch).passed
    assert not idempotent_writes_once(records, ["i0"]).passed  # without epochs: as before
