"""The state machines' transition tables and the state-change log (odradek.controller.states)."""

from __future__ import annotations

import itertools
import logging
import re

import pytest

from odradek.controller.states import (
    STATE_CHANGE_LOG_FILE_NAME,
    STATE_CHANGE_LOGGER_NAME,
    PartitionState,
    ReplicaState,
    StateChangeLogger,
    attach_state_change_log_file,
    format_partition,
    format_replica,
    format_transition,
    is_valid_transition,
    split_valid_transitions,
)

R = ReplicaState
P = PartitionState

# Kafka 2.8's tables, written out pair by pair (from -> to), independently of the module's own data.
REPLICA_TRANSITIONS = {
    (R.NonExistentReplica, R.NewReplica),
    (R.NewReplica, R.OnlineReplica),
    (R.OnlineReplica, R.OnlineReplica),
    (R.OfflineReplica, R.OnlineReplica),
    (R.ReplicaDeletionIneligible, R.OnlineReplica),
    (R.NewReplica, R.OfflineReplica),
    (R.OnlineReplica, R.OfflineReplica),
    (R.OfflineReplica, R.OfflineReplica),
    (R.ReplicaDeletionIneligible, R.OfflineReplica),
    (R.OfflineReplica, R.ReplicaDeletionStarted),
    (R.ReplicaDeletionStarted, R.ReplicaDeletionSuccessful),
    (R.ReplicaDeletionStarted, R.ReplicaDeletionIneligible),
    (R.OfflineReplica, R.ReplicaDeletionIneligible),
    (R.ReplicaDeletionSuccessful, R.NonExistentReplica),
}

PARTITION_TRANSITIONS = {
    (P.NonExistentPartition, P.NewPartition),
    (P.NewPartition, P.OnlinePartition),
    (P.OnlinePartition, P.OnlinePartition),
    (P.OfflinePartition, P.OnlinePartition),
    (P.NewPartition, P.OfflinePartition),
    (P.OnlinePartition, P.OfflinePartition),
    (P.OfflinePartition, P.OfflinePartition),
    (P.OfflinePartition, P.NonExistentPartition),
}


def test_state_counts_and_kafka_state_bytes():
    assert len(ReplicaState) == 7
    assert len(PartitionState) == 4
    assert [state.value for state in ReplicaState] == [1, 2, 3, 4, 5, 6, 7]
    assert P.NewPartition.value == 0 and P.NonExistentPartition.value == 3
    assert str(R.ReplicaDeletionIneligible) == "ReplicaDeletionIneligible"


@pytest.mark.parametrize(
    ("current", "target"), list(itertools.product(ReplicaState, ReplicaState)), ids=str
)
def test_every_replica_pair(current, target):
    expected = (current, target) in REPLICA_TRANSITIONS
    assert is_valid_transition(current, target) is expected
    assert (current in target.valid_previous_states) is expected
    valid, invalid = split_valid_transitions(["r"], lambda _: current, target)
    assert (valid, invalid) == ((["r"], []) if expected else ([], ["r"]))


@pytest.mark.parametrize(
    ("current", "target"), list(itertools.product(PartitionState, PartitionState)), ids=str
)
def test_every_partition_pair(current, target):
    expected = (current, target) in PARTITION_TRANSITIONS
    assert is_valid_transition(current, target) is expected
    valid, invalid = split_valid_transitions(["p"], lambda _: current, target)
    assert (valid, invalid) == ((["p"], []) if expected else ([], ["p"]))


def test_valid_previous_states_are_frozensets():
    for state in [*ReplicaState, *PartitionState]:
        assert isinstance(state.valid_previous_states, frozenset)
        assert state.valid_previous_states  # every state is reachable from somewhere


def test_split_keeps_input_order_in_both_halves():
    current = {
        ("t", 0, 1): R.OnlineReplica,
        ("t", 0, 2): R.ReplicaDeletionStarted,
        ("t", 1, 1): R.NewReplica,
        ("t", 1, 2): R.NonExistentReplica,
        ("t", 2, 3): R.OfflineReplica,
    }
    valid, invalid = split_valid_transitions(current, current.__getitem__, R.OfflineReplica)
    assert valid == [("t", 0, 1), ("t", 1, 1), ("t", 2, 3)]
    assert invalid == [("t", 0, 2), ("t", 1, 2)]


def test_split_of_nothing():
    assert split_valid_transitions([], lambda _: P.NewPartition, P.OnlinePartition) == ([], [])


# --- state-change log -----------------------------------------------------------------------------


def test_subject_formats_match_kafka():
    assert format_partition("orders", 3) == "orders-3"
    assert format_replica("orders", 3, 7) == "[Topic=orders,Partition=3,Replica=7]"


def test_transition_line_with_and_without_leader():
    line = format_transition(
        1, 7, "t-0", P.NewPartition, P.OnlinePartition, leader=1, isr=[1, 2], leader_epoch=0
    )
    assert line == (
        "[Controller id=1 epoch=7] Changed state of t-0 from NewPartition to OnlinePartition"
        " with leader=1, leader_epoch=0, isr=[1, 2]"
    )
    line = format_transition(1, 7, "t-0", P.OnlinePartition, P.OfflinePartition)
    assert (
        line
        == "[Controller id=1 epoch=7] Changed state of t-0 from OnlinePartition to OfflinePartition"
    )


def test_logger_writes_transitions_and_refusals(caplog):
    """Partition transitions at INFO, replica transitions at DEBUG (Kafka: TRACE), refusals at
    ERROR; a refusal comes after the transitions logged before it."""
    logger = StateChangeLogger(controller_id=3)
    with caplog.at_level(logging.DEBUG, logger=STATE_CHANGE_LOGGER_NAME):
        logger.partition_transition(
            5, "t", 0, P.OfflinePartition, P.OnlinePartition, leader=2, isr=[2, 3]
        )
        logger.replica_transition(5, "t", 0, 1, R.OnlineReplica, R.OfflineReplica)
        logger.invalid_transition(
            5, format_replica("t", 0, 1), R.ReplicaDeletionStarted, R.OnlineReplica
        )
    records = [r for r in caplog.records if r.name == STATE_CHANGE_LOGGER_NAME]
    assert [r.levelno for r in records] == [logging.INFO, logging.DEBUG, logging.ERROR]
    assert records[0].getMessage() == (
        "[Controller id=3 epoch=5] Changed state of t-0 from OfflinePartition to OnlinePartition"
        " with leader=2, isr=[2, 3]"
    )
    assert records[1].getMessage() == (
        "[Controller id=3 epoch=5] Changed state of [Topic=t,Partition=0,Replica=1]"
        " from OnlineReplica to OfflineReplica"
    )
    refusal = records[2].getMessage()
    assert "[Topic=t,Partition=0,Replica=1] from ReplicaDeletionStarted to OnlineReplica" in refusal
    assert "NewReplica,OfflineReplica,OnlineReplica,ReplicaDeletionIneligible" in refusal


def test_state_change_log_file(tmp_path):
    state_logger = logging.getLogger(STATE_CHANGE_LOGGER_NAME)
    saved = (state_logger.level, state_logger.propagate)
    handler = attach_state_change_log_file(tmp_path / "logs")
    try:
        state_changes = StateChangeLogger(1)
        state_changes.partition_transition(2, "t", 4, P.NewPartition, P.OnlinePartition, leader=9)
        state_changes.replica_transition(2, "t", 4, 9, R.NonExistentReplica, R.NewReplica)
        assert (tmp_path / "logs" / STATE_CHANGE_LOG_FILE_NAME).read_text() == ""  # pending
        state_changes.flush()
        state_logger.setLevel(logging.DEBUG)  # as a user may set it, to see replica transitions
        state_changes.replica_transition(2, "t", 4, 9, R.NewReplica, R.OnlineReplica)
        state_changes.flush()
        assert state_logger.propagate is False
    finally:
        state_logger.removeHandler(handler)
        handler.close()
        state_logger.setLevel(saved[0])
        state_logger.propagate = saved[1]
    lines = (tmp_path / "logs" / STATE_CHANGE_LOG_FILE_NAME).read_text().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(
        "INFO [Controller id=1 epoch=2] Changed state of t-4"
        " from NewPartition to OnlinePartition with leader=9"
    )
    assert lines[1].endswith(
        "DEBUG [Controller id=1 epoch=2] Changed state of [Topic=t,Partition=4,Replica=9]"
        " from NewReplica to OnlineReplica"
    )


def test_batched_lines_read_as_records_would(tmp_path):
    """`StateChangeLogHandler.write_lines` writes each line exactly as the handler's formatter
    writes a record logged at the same time; the logger falls back to records whenever anything
    else listens (here a second, plain handler), and either way the lines keep their order."""
    state_logger = logging.getLogger(STATE_CHANGE_LOGGER_NAME)
    saved = (state_logger.level, state_logger.propagate)
    handler = attach_state_change_log_file(tmp_path / "batched")
    try:
        created = 1_790_000_000.0421
        record = logging.makeLogRecord(
            {"levelno": logging.INFO, "levelname": "INFO", "msg": "one", "created": created}
        )
        record.msecs = 42.0
        expected = handler.format(record) + "\n"
        handler.write_lines([(created, logging.INFO, "one")])
        handler.flush()
        assert (tmp_path / "batched" / STATE_CHANGE_LOG_FILE_NAME).read_text() == expected

        plain = logging.FileHandler(tmp_path / "plain.log", encoding="utf-8")
        plain.setFormatter(logging.Formatter("%(message)s"))
        state_logger.addHandler(plain)
        try:
            changes = StateChangeLogger(1)
            changes.partition_transition(2, "t", 0, P.NewPartition, P.OnlinePartition, leader=1)
            changes.partition_transition(2, "t", 1, P.NewPartition, P.OnlinePartition, leader=2)
            changes.flush()
        finally:
            state_logger.removeHandler(plain)
            plain.close()
        changes.partition_transition(2, "t", 2, P.NewPartition, P.OnlinePartition, leader=3)
        changes.flush()
    finally:
        state_logger.removeHandler(handler)
        handler.close()
        state_logger.setLevel(saved[0])
        state_logger.propagate = saved[1]
    plain_lines = (tmp_path / "plain.log").read_text().splitlines()
    assert [line.split(" ")[6] for line in plain_lines] == ["t-0", "t-1"]
    lines = (tmp_path / "batched" / STATE_CHANGE_LOG_FILE_NAME).read_text().splitlines()
    assert [line.split(" ")[9] for line in lines[1:]] == ["t-0", "t-1", "t-2"]
    assert all(
        re.match(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] INFO \[Controller", line)
        for line in lines[1:]
    )
