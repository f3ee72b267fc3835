"""Which librdkafka errors `spark.clients` asks again for (offsets and metadata requests)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from odradek.spark.clients import is_retriable


@pytest.mark.parametrize(
    "code",
    [
        # A leader epoch cached before an ISR change or an election (the demo met this after a
        # broker kill: ListOffsets of a partition whose leader had not moved).
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError._TRANSPORT,
    ],
)
def test_errors_of_a_moving_leader_are_asked_again(code: int) -> None:
    assert is_retriable(KafkaException(KafkaError(code)))


@pytest.mark.parametrize(
    "code", [KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED]
)
def test_errors_that_asking_again_cannot_mend_are_not(code: int) -> None:
    assert not is_retriable(KafkaException(KafkaError(code)))
