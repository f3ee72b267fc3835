"""The records of `__transaction_state` and the transaction markers
(`odradek.coordinator.transaction.log_records`) against Kafka 3.9:

* every vector Kafka's own classes wrote (`kafka_schemas/transaction_record_vectors.json`, made by
  `TransactionRecordVectors.java`) decodes to the values written there, and encodes back to the
  same bytes;
* the fields of TransactionLogValue are the JSON schema's, in order;
* a marker batch is a valid control batch the log's producer state reads as COMMIT/ABORT;
* a partition's replay keeps the last record of each id and drops tombstoned ids;
* bad bytes raise CorruptRecordError, never anything else.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from odradek.coordinator.transaction import log_records
from odradek.coordinator.transaction.log_records import (
    TransactionLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from odradek.coordinator.transaction.metadata import TransactionState, TxnTransitMetadata
from odradek.errors import CorruptRecordError
from odradek.log.producer_state import read_end_txn_marker
from odradek.protocol.record_batch import iter_batches, read_header, validate_replicated_batches

SCHEMAS = Path(__file__).parent / "kafka_schemas"
VECTORS = json.loads((SCHEMAS / "transaction_record_vectors.json").read_text())


def _vectors(name: str) -> list[dict[str, object]]:
    return [v for v in VECTORS if v["name"] == name]


def test_key_vector_round_trips() -> None:
    (vector,) = _vectors("TransactionLogKey")
    data = bytes.fromhex(str(vector["hex"]))
    assert decode_key(data) == "txn-€-𝄞"
    assert encode_key("txn-€-𝄞") == data


@pytest.mark.parametrize("index", range(4))
def test_value_vectors_round_trip(index: int) -> None:
    vector = _vectors("TransactionLogValue")[index]
    data = bytes.fromhex(str(vector["hex"]))
    value = decode_value(data)
    if value.transaction_status == 1:
        assert value == TransactionLogValue(
            123456789012,
            7,
            60000,
            1,
            (("orders", (0, 3, 2147483647)), ("__consumer_offsets", (17,))),
            1700000000123,
            1700000000001,
        )
    else:
        assert value == TransactionLogValue(5, 0, 900000, 0, None, 1700000000999, -1)
    assert encode_value(value, int(str(vector["version"]))) == data


def test_value_fields_follow_the_schema() -> None:
    text = (SCHEMAS / "TransactionLogValue.json").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))
    schema = json.loads(body)
    names = [f["name"] for f in schema["fields"]]
    snake = [re.sub(r"(?<!^)(?=[A-Z])", "_", n).lower() for n in names]
    assert snake == [
        "producer_id",
        "producer_epoch",
        "transaction_timeout_ms",
        "transaction_status",
        "transaction_partitions",
        "transaction_last_update_timestamp_ms",
        "transaction_start_timestamp_ms",
    ]
    assert list(TransactionLogValue.__dataclass_fields__) == snake
    assert schema["validVersions"] == "0-1" and schema["flexibleVersions"] == "1+"


@pytest.mark.parametrize(
    ("commit", "name", "epoch"), [(True, "MarkerValueCommit", 42), (False, "MarkerValueAbort", 7)]
)
def test_marker_batch_is_a_control_batch_kafka_would_write(
    commit: bool, name: str, epoch: int
) -> None:
    batch = log_records.build_marker_batch(77, 3, commit, epoch, 1700000000000)
    (header,) = validate_replicated_batches(batch)
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, -1)
    assert log_records.marker_type(batch) == (1 if commit else 0)
    marker, timestamp = read_end_txn_marker(batch, read_header(batch))  # type: ignore[misc]
    assert (marker.control_type, marker.coordinator_epoch, timestamp) == (
        1 if commit else 0,
        epoch,
        1700000000000,
    )
    from odradek.protocol.record_batch import decode_records

    (record,) = decode_records(batch)
    assert record.value == bytes.fromhex(str(_vectors(name)[0]["hex"]))


def test_replay_keeps_the_last_record_and_honours_tombstones() -> None:
    def transit(
        state: TransactionState, epoch: int, partitions: frozenset[tuple[str, int]]
    ) -> TxnTransitMetadata:
        start = -1 if state is TransactionState.EMPTY else 10
        return TxnTransitMetadata(5, -1, epoch, -1, 60000, state, partitions, start, 20)

    records = [
        log_records.transaction_record("a", transit(TransactionState.EMPTY, 0, frozenset()), 1),
        log_records.transaction_record(
            "a", transit(TransactionState.ONGOING, 0, frozenset({("t", 1)})), 2
        ),
        log_records.transaction_record("b", transit(TransactionState.EMPTY, 0, frozenset()), 3),
        log_records.transaction_record("b", None, 4),
    ]
    data = b"".join(records)
    loaded: dict[str, TxnTransitMetadata] = {}
    batches = [(h, data[h.position : h.position + h.size]) for h in iter_batches(data)]
    assert log_records.replay(batches, loaded) == 4
    assert set(loaded) == {"a"}
    assert loaded["a"].state is TransactionState.ONGOING
    assert loaded["a"].partitions == frozenset({("t", 1)})


@given(st.binary(max_size=80))
def test_garbage_values_raise_corrupt_record_only(data: bytes) -> None:
    try:
        decode_value(data)
    except CorruptRecordError:
        pass


@given(
    st.text(max_size=30),
    st.integers(0, 2**63 - 1),
    st.integers(0, 32767),
    st.sampled_from(list(TransactionState)),
    st.lists(st.tuples(st.text(min_size=1, max_size=10), st.integers(0, 2**31 - 1)), max_size=5),
)
def test_values_round_trip(
    transactional_id: str,
    producer_id: int,
    epoch: int,
    state: TransactionState,
    partitions: list[tuple[str, int]],
) -> None:
    parts = frozenset(partitions) if state is not TransactionState.EMPTY else frozenset()
    target = TxnTransitMetadata(producer_id, -1, epoch, -1, 1000, state, parts, 5, 6)
    assert decode_key(encode_key(transactional_id)) == transactional_id
    back = log_records.transit_from_value(decode_value(log_records.value_for(target)))
    assert back == target


def test_offsets_replay_applies_transactional_commits_at_their_marker() -> None:
    """`__consumer_offsets`: a TxnOffsetCommit batch counts only once its producer's COMMIT
    marker follows; an aborted one never; one without a marker yet stays pending."""
    from odradek.coordinator.group import log_records as group_records
    from odradek.coordinator.group.offsets import OffsetAndMetadata

    def commit(producer: int, offset: int) -> bytes:
        entry = group_records.offset_commit_entry("g", ("t", 0), OffsetAndMetadata(offset))
        return group_records.build_records([entry], 1, producer=(producer, 0))

    def marker(producer: int, commit_: bool) -> bytes:
        return log_records.build_marker_batch(producer, 0, commit_, 0, 1)

    plain = group_records.build_records(
        [group_records.offset_commit_entry("g", ("t", 0), OffsetAndMetadata(1))], 1
    )
    pieces = [plain, commit(7, 5), commit(8, 9), marker(8, False), marker(7, True), commit(9, 11)]
    data = bytearray()
    for offset, piece in enumerate(pieces):
        patched = bytearray(piece)
        patched[0:8] = offset.to_bytes(8, "big")
        data += patched
    replay = group_records.PartitionReplay()
    replay.feed(bytes(data))
    assert replay.groups["g"].offsets[("t", 0)][0].offset == 5
    assert replay.pending_offsets() == {9: {"g": {("t", 0): OffsetAndMetadata(11)}}}
