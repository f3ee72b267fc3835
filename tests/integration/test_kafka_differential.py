"""Odradek and a real Kafka 3.9 broker answer the same hand-made record batches.

Every case of tests/fuzz/record_batches.py (valid batches, each kind of malformation with a
correct CRC, decompression bombs, timestamps out of KIP-937 bounds) is produced, byte for byte the
same, to a one-broker Odradek cluster and to Apache Kafka 3.9.1 in ZooKeeper mode (`./dev kafka`
fetches it), each with the same three topics: CreateTime with default bounds, CreateTime with
message.timestamp.before/after.max.ms of one hour, and LogAppendTime. For each case:

* Odradek answers the case's expected code, and Kafka answers Kafka's (the same, except for the
  documented cases where Kafka stores what its consumers cannot read or answers
  UNKNOWN_SERVER_ERROR; `Case.why` says which and why);
* a refused batch leaves the partition's log end offset where it was, on both brokers;
* INVALID_TIMESTAMP names the same records in `record_errors` on both;
* a batch both accept reads back the same from both: same records (keys, values, headers,
  timestamps, offsets relative to the batch) and the same header corrections (maxTimestamp, the
  timestamp-type bit), with a valid CRC.

Without Kafka's jars the test is skipped, except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from odradek.protocol.record_batch import (
    TimestampType,
    build_batch,
    compute_crc,
    decode_records,
    iter_batches,
)
from odradek.testing.local_cluster import LocalCluster
from tests.fixtures.zookeeper import ZooKeeperHandle
from tests.fuzz.record_batches import BOMB_NAMES, Case, bomb_cases, cases
from tests.integration import _wire
from tests.integration._kafka import KafkaBroker, require_kafka

HOUR_MS = 3600 * 1000
NOW_MS = int(time.time() * 1000)
SMALL = cases(NOW_MS)
TOPIC_CONFIGS = {
    "create": {},
    "bounded": {
        "message.timestamp.before.max.ms": str(HOUR_MS),
        "message.timestamp.after.max.ms": str(HOUR_MS),
    },
    "append": {"message.timestamp.type": "LogAppendTime"},
}


@pytest.fixture(scope="module")
def brokers(
    zookeeper: ZooKeeperHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    require_kafka()
    zookeeper.ensure_running()
    base = tmp_path_factory.mktemp("differential")
    odradek = LocalCluster.up(
        base / "odradek",
        1,
        overrides={"auto.create.topics.enable": "false"},
        zookeeper=f"{zookeeper.connect_string}/odradek-{uuid.uuid4().hex}",
    )
    kafka = KafkaBroker(base / "kafka", f"{zookeeper.connect_string}/kafka-{uuid.uuid4().hex}")
    try:
        kafka.start()
        bootstraps = {"odradek": odradek.bootstrap_servers, "kafka": kafka.bootstrap}
        for bootstrap in bootstraps.values():
            admin = AdminClient({"bootstrap.servers": bootstrap})
            futures = admin.create_topics(
                [NewTopic(name, 1, 1, config=config) for name, config in TOPIC_CONFIGS.items()]
            )
            for future in futures.values():
                future.result(30)
        for bootstrap in bootstraps.values():
            for name in TOPIC_CONFIGS:
                _wait_for_leader(bootstrap, name)
        yield bootstraps
    finally:
        kafka.stop()
        odradek.down()


def _wait_for_leader(bootstrap: str, topic: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            _wire.log_end_offset(bootstrap, topic)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass(frozen=True)
class Answer:
    code: str
    message: str | None
    record_errors: tuple[int, ...]
    base_offset: int
    end_before: int
    end_after: int


def send(bootstrap: str, case: Case) -> Answer:
    before = _wire.log_end_offset(bootstrap, case.topic)
    with _wire.WireConnection.to(bootstrap, timeout=60) as connection:
        response = connection.request(
            ApiKey.PRODUCE,
            8,
            _wire.produce_values(case.topic, 0, case.records),
            timeout=60,
        )
    (answer,) = response.responses[0].partition_responses
    after = _wire.log_end_offset(bootstrap, case.topic)
    return Answer(
        ErrorCode(answer.error_code).name,
        answer.error_message,
        tuple(e.batch_index for e in answer.record_errors),
        int(answer.base_offset),
        before,
        after,
    )


def stored_batch(bootstrap: str, topic: str, offset: int) -> bytes:
    with _wire.WireConnection.to(bootstrap, timeout=60) as connection:
        fetched = _wire.fetch(connection, topic, 0, offset, max_bytes=64 << 20)
    for header in iter_batches(fetched.records):
        if header.base_offset == offset:
            return fetched.records[header.position : header.position + header.size]
    raise AssertionError(f"no batch at offset {offset} of {topic} on {bootstrap}")


def describe(batch: bytes) -> dict[str, Any]:
    """What must be the same whoever stored the batch."""
    (header,) = list(iter_batches(batch))
    assert compute_crc(batch, header) == header.crc
    append_time = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    return {
        "attributes": header.attributes,
        # Each broker stamps its own clock.
        "max_timestamp": "append time" if append_time else header.max_timestamp,
        "last_offset_delta": header.last_offset_delta,
        "records_count": header.records_count,
        "records": [
            (
                r.offset - header.base_offset,
                "append time" if append_time else r.timestamp,
                r.key,
                r.value,
                r.headers,
            )
            for r in decode_records(batch)
        ],
    }


def check(brokers: dict[str, str], case: Case) -> None:
    odradek, kafka = send(brokers["odradek"], case), send(brokers["kafka"], case)
    assert (odradek.code, kafka.code) == (case.expected, case.kafka_expected), (odradek, kafka)
    for answer, code in ((odradek, case.expected), (kafka, case.kafka_expected)):
        if code != "none":
            assert answer.end_after == answer.end_before, f"a refused batch was stored: {answer}"
    if case.expected != "none":
        assert odradek.message, "Odradek explains every refusal"
    if case.expected == case.kafka_expected == "invalid_timestamp":
        assert odradek.record_errors == kafka.record_errors
        assert odradek.message == kafka.message
    if case.expected == case.kafka_expected == "none":
        assert describe(stored_batch(brokers["odradek"], case.topic, odradek.base_offset)) == (
            describe(stored_batch(brokers["kafka"], case.topic, kafka.base_offset))
        )


@pytest.mark.parametrize("case", SMALL, ids=[c.name for c in SMALL])
def test_same_answers_as_kafka(brokers: dict[str, str], case: Case) -> None:
    check(brokers, case)


@cache
def _bombs() -> list[Case]:
    return bomb_cases()


@pytest.mark.parametrize("name", BOMB_NAMES)
def test_same_answers_as_kafka_for_bombs(brokers: dict[str, str], name: str) -> None:
    check(brokers, _bombs()[BOMB_NAMES.index(name)])


def test_the_differences_are_documented() -> None:
    for case in SMALL:
        assert (case.kafka is None) == (not case.why), case.name


# -- an idempotent producer's sequences --------------------------------------------------------

IDEMPOTENT_STEPS: list[tuple[str, int, int, int, int, str]] = [
    # (what, epoch above the one InitProducerId gave, first sequence, records, acks, topic)
    ("first batch", 0, 0, 2, 1, "idem"),
    ("retry of the last batch", 0, 0, 2, 1, "idem"),
    ("next batch", 0, 2, 2, 1, "idem"),
    ("a gap", 0, 6, 2, 1, "idem"),
    ("lower, overlapping, not a retry", 0, 1, 2, 1, "idem"),
    ("next batch after the refusals", 0, 4, 2, 1, "idem"),
    *[("five more", 0, sequence, 2, 1, "idem") for sequence in (6, 8, 10, 12, 14)],
    ("retry of the fifth batch back", 0, 6, 2, 1, "idem"),
    ("retry of the sixth batch back", 0, 4, 2, 1, "idem"),
    ("retry of the last with fewer records", 0, 14, 1, 1, "idem"),
    ("new epoch not from sequence 0", 1, 5, 2, 1, "idem"),
    ("new epoch from sequence 0", 1, 0, 2, 1, "idem"),
    ("the old epoch", 0, 16, 2, 1, "idem"),
    ("retry of the new epoch's batch", 1, 0, 2, 1, "idem"),
    ("epoch skipped ahead, from 0", 3, 0, 2, 1, "idem"),
]
"""Hand-made batches of one idempotent producer, as clients send them around retries, epoch bumps
(KIP-360) and refused writes; the refusals are what a client meets around a leader change
(librdkafka issue #4953 bumps the epoch after an OUT_OF_ORDER_SEQUENCE_NUMBER). A refusal for too
few in-sync replicas is not among them: on one broker, Kafka 3.9.1 accepted acks=all to a topic of
one replica with min.insync.replicas=2, where Odradek (as Kafka 2.x) answers NOT_ENOUGH_REPLICAS."""


def _idempotent_answers(bootstrap: str, suffix: str) -> list[tuple[str, str, int]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics: dict[str, dict[str, str]] = {"idem": {}}
    futures = admin.create_topics(
        [NewTopic(f"{name}-{suffix}", 1, 1, config=config) for name, config in topics.items()]
    )
    for future in futures.values():
        future.result(30)
    for name in topics:
        _wait_for_leader(bootstrap, f"{name}-{suffix}")
    answers = []
    with _wire.WireConnection.to(bootstrap, timeout=60) as connection:
        deadline = time.monotonic() + 30
        while True:  # a broker that just started may still be getting its block of ids
            initialized = connection.request(
                ApiKey.INIT_PRODUCER_ID,
                4,
                {"transactional_id": None, "transaction_timeout": 60_000},
            )
            if initialized.error_code != ErrorCode.coordinator_load_in_progress:
                break
            assert time.monotonic() < deadline, initialized
            time.sleep(0.2)
        assert initialized.error_code == ErrorCode.none, initialized
        producer_id, epoch = int(initialized.producer_id), int(initialized.producer_epoch)
        first: dict[str, int] = {}
        for what, bump, sequence, count, acks, topic in IDEMPOTENT_STEPS:
            records = build_batch(
                [(None, f"{what}-{i}".encode(), [], NOW_MS) for i in range(count)],
                producer_id=producer_id,
                producer_epoch=epoch + bump,
                base_sequence=sequence,
            )
            answer = _wire.produce(connection, f"{topic}-{suffix}", 0, records, acks=acks)
            offset = int(answer.base_offset)
            if offset >= 0:
                first.setdefault(topic, offset)
                offset -= first[topic]
            answers.append((what, answer.error_code.name, offset))
    for name in topics:
        end = _wire.log_end_offset(bootstrap, f"{name}-{suffix}") - first.get(name, 0)
        answers.append((f"log end offset of {name}", "", end))
    return answers


def test_an_idempotent_producer_gets_the_same_answers_as_from_kafka(
    brokers: dict[str, str],
) -> None:
    suffix = uuid.uuid4().hex[:6]
    odradek = _idempotent_answers(brokers["odradek"], suffix)
    kafka = _idempotent_answers(brokers["kafka"], suffix)
    assert odradek == kafka
    # And what they agree on is what idempotence promises: a retry is answered, never stored.
    answered = {what: (code, offset) for what, code, offset in odradek}
    assert answered["retry of the last batch"] == ("none", 0)
    assert answered["log end offset of idem"][1] == 2 + 2 + 2 + 10 + 2 + 2
