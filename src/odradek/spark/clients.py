"""The Kafka clients of the data source (confluent-kafka, i.e. librdkafka) and their errors.

Three kinds of client, each built from the checked options:

* `consumer_config` -- executors read offset ranges with a Consumer that is *assigned* its
  partition at an explicit offset. It never subscribes and never commits: offsets live in Spark's
  checkpoint, so no consumer group is joined. confluent-kafka insists on a `group.id` anyway:
  `kafka.group.id` if given (as Spark allows, for quotas and ACLs), else a fixed one.
  `auto.offset.reset=error` makes an out-of-range start an event the reader sees (data loss)
  rather than a silent jump, and `enable.partition.eof` tells it when a fetch reached the HW.
* `producer_config` -- the sink produces with `acks=all`, idempotence off (as it always has; the
  brokers support idempotent producers now) and librdkafka's retries on, and partitions keys
  with murmur2 as Java clients do, so that a key lands in the same partition whichever client
  wrote it.
* `ClusterOffsets` -- the driver's view of the cluster: topics, partitions and their earliest /
  latest offsets, through an AdminClient (ListOffsets batched per leader, not one request per
  partition). "Latest" is the high watermark (reads never go past replicated records), or under
  `kafka.isolation.level=read_committed` the last stable offset (never into an open transaction).

librdkafka's own log lines go to the `odradek.spark.librdkafka` logger instead of stderr.
Third-party exceptions (`confluent_kafka.KafkaException`) are translated into the project's at this
boundary by `translate`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import IsolationLevel, KafkaException
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from odradek.errors import (
    BrokerNotAvailableError,
    DataSourceOptionError,
    KafkaError,
    LeaderNotAvailableError,
    NotLeaderOrFollowerError,
    OdradekError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from odradek.spark.offsets import TopicPartition

__all__ = [
    "ClusterOffsets",
    "OffsetsResult",
    "admin_config",
    "consumer_config",
    "producer_config",
    "translate",
]

log = logging.getLogger(__name__)
librdkafka_log = logging.getLogger("odradek.spark.librdkafka")
# librdkafka reports every refused connection during a broker restart at error level; they reach
# the application's handlers when it configures logging, but are not printed to stderr otherwise.
librdkafka_log.addHandler(logging.NullHandler())

CONSUMER_GROUP_ID = "odradek-spark"  # required by confluent-kafka; no group is ever joined


def _base(bootstrap_servers: str, params: Mapping[str, str], client_id: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": client_id,
        "logger": librdkafka_log,
        **params,
    }


def consumer_config(
    bootstrap_servers: str, params: Mapping[str, str], isolation_level: str = "read_uncommitted"
) -> dict[str, Any]:
    """A reader's Consumer: explicit assignment, no commits, end-of-partition events on, the
    source's isolation level (librdkafka's own default, read_committed, is never left in
    place: Spark's default is read_uncommitted)."""
    config = _base(
        bootstrap_servers, {"group.id": CONSUMER_GROUP_ID, **params}, "odradek-spark-reader"
    )
    config.update(
        {
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "allow.auto.create.topics": False,
            "isolation.level": isolation_level,
        }
    )
    return config


def producer_config(
    bootstrap_servers: str, params: Mapping[str, str], transactional_id: str | None = None
) -> dict[str, Any]:
    """The sink's Producer: acks=all, retries on, Java's key partitioning; idempotence off, or
    on and transactional with `transactional_id` (the exactly-once sink)."""
    config: dict[str, Any] = {
        "linger.ms": 5,
        "partitioner": "murmur2_random",
        "compression.type": "none",
    }
    config.update(_base(bootstrap_servers, params, "odradek-spark-writer"))
    config.update({"acks": "all", "enable.idempotence": transactional_id is not None})
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    config.setdefault("message.send.max.retries", 2_147_483_647)
    return config


def admin_config(bootstrap_servers: str, params: Mapping[str, str]) -> dict[str, Any]:
    return _base(bootstrap_servers, params, "odradek-spark-driver")


_CODES: dict[int, type[KafkaError]] = {
    RdKafkaError.UNKNOWN_TOPIC_OR_PART: UnknownTopicOrPartitionError,
    RdKafkaError._UNKNOWN_PARTITION: UnknownTopicOrPartitionError,
    RdKafkaError._UNKNOWN_TOPIC: UnknownTopicOrPartitionError,
    RdKafkaError.NOT_LEADER_FOR_PARTITION: NotLeaderOrFollowerError,
    RdKafkaError.LEADER_NOT_AVAILABLE: LeaderNotAvailableError,
    RdKafkaError._TIMED_OUT: RequestTimedOutError,
    RdKafkaError.REQUEST_TIMED_OUT: RequestTimedOutError,
    RdKafkaError._TRANSPORT: BrokerNotAvailableError,
    RdKafkaError._ALL_BROKERS_DOWN: BrokerNotAvailableError,
}


def translate(error: KafkaException | RdKafkaError, context: str) -> OdradekError:
    """A confluent-kafka error as the project's exception, its message prefixed by `context`."""
    rd = error.args[0] if isinstance(error, KafkaException) and error.args else error
    if isinstance(rd, RdKafkaError):
        if rd.code() == RdKafkaError._INVALID_ARG and "configuration" in rd.str().lower():
            return DataSourceOptionError(f"{context}: {rd.str()}")
        return _CODES.get(rd.code(), KafkaError)(f"{context}: {rd.str()} ({rd.name()})")
    return KafkaError(f"{context}: {error}")


def is_retriable(error: Any) -> bool:
    """Whether a failed offset or metadata request may succeed if asked again (no leader yet,
    a broker down, a timeout), as opposed to a partition that does not exist."""
    rd = error.args[0] if isinstance(error, KafkaException) and error.args else error
    if not isinstance(rd, RdKafkaError):
        return False
    if rd.code() in (RdKafkaError.UNKNOWN_TOPIC_OR_PART, RdKafkaError._UNKNOWN_PARTITION):
        return False
    return bool(rd.retriable()) or rd.code() in (
        RdKafkaError._TRANSPORT,
        RdKafkaError._TIMED_OUT,
        RdKafkaError._ALL_BROKERS_DOWN,
        RdKafkaError.LEADER_NOT_AVAILABLE,
        RdKafkaError.NOT_LEADER_FOR_PARTITION,
        RdKafkaError.REQUEST_TIMED_OUT,
        # The client's cached leader epoch is behind or ahead of the leader's (an ISR change or
        # an election since its last metadata): Kafka's clients refresh metadata and ask again.
        RdKafkaError.FENCED_LEADER_EPOCH,
        RdKafkaError.UNKNOWN_LEADER_EPOCH,
    )


@dataclass
class OffsetsResult:
    """Offsets that were found, and the partitions whose offset could not be had (with why)."""

    offsets: dict[TopicPartition, int]
    failed: dict[TopicPartition, OdradekError]

    def require(self) -> dict[TopicPartition, int]:
        """All offsets, or the first failure raised."""
        if self.failed:
            raise self.failed[min(self.failed)]
        return self.offsets


class ClusterOffsets:
    """The driver's read-only view of the cluster: topics, partitions, earliest and latest offsets.

    Concurrency: one thread (the Spark driver's planning worker runs one call at a time). Holds an
    AdminClient created on first use and dropped when pickled, so the object can travel inside a
    reader. Request errors are retried `retries` times, `retry_interval_s` apart, when retriable.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        params: Mapping[str, str],
        timeout_s: float = 10.0,
        retries: int = 3,
        retry_interval_s: float = 1.0,
        read_committed: bool = False,
        answer_timeout_s: float | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.read_committed = read_committed
        self.params = dict(params)
        self.timeout_s = timeout_s
        # How long to wait for a request's answers: librdkafka times the request out itself
        # (`timeout_s`), plus its lookup of the leader; this only bounds an answer that never
        # comes, so that a query never stalls on one partition.
        self.answer_timeout_s = 2 * timeout_s + 5 if answer_timeout_s is None else answer_timeout_s
        self.retries = retries
        self.retry_interval_s = retry_interval_s
        self._admin: AdminClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_admin"] = None
        return state

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            try:
                self._admin = AdminClient(admin_config(self.bootstrap_servers, self.params))
            except KafkaException as e:
                raise translate(e, "creating the Kafka admin client") from None
        return self._admin

    def close(self) -> None:
        self._admin = None  # AdminClient has no close(); dropping it stops its threads

    def topics(self, expect: Iterable[TopicPartition] = ()) -> dict[str, list[int]]:
        """Every topic with its partition numbers (no topic is auto-created by asking).

        If partitions in `expect` are missing, metadata is fetched again up to `retries` times
        before the answer is believed: a broker that just started may not know every topic yet,
        and a partition wrongly reported gone would fail a query for data loss.
        """
        expected = set(expect)
        attempt = 0
        while True:
            try:
                metadata = self.admin.list_topics(timeout=self.timeout_s)
            except KafkaException as e:
                self._admin = None
                if attempt < self.retries and is_retriable(e):
                    attempt += 1
                    time.sleep(self.retry_interval_s)
                    continue
                raise translate(e, f"reading metadata from {self.bootstrap_servers}") from None
            topics = {
                name: sorted(topic.partitions)
                for name, topic in metadata.topics.items()
                if topic.error is None or topic.partitions
            }
            missing = [tp for tp in expected if tp.partition not in set(topics.get(tp.topic, ()))]
            if not missing or attempt >= self.retries:
                return topics
            attempt += 1
            log.info("partitions %s missing from metadata; asking again", sorted(missing))
            time.sleep(self.retry_interval_s)

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> OffsetsResult:
        """For each partition, the first offset whose record timestamp is at or after the given
        one (ListOffsets by timestamp), or -1 where no record is (below the high watermark, or
        the last stable offset with `read_committed`). Retried as `list_offsets` is."""
        return self.list_offsets(timestamps, "timestamp")

    def list_offsets(
        self,
        partitions: Iterable[TopicPartition] | Mapping[TopicPartition, int],
        which: Literal["earliest", "latest", "timestamp"],
        retries: int | None = None,
    ) -> OffsetsResult:
        """The earliest (log start) or latest offset of each partition: the high watermark, or
        with `read_committed` the last stable offset (ListOffsets under read_committed).

        Partitions whose request failed with a retriable error are asked again, up to `retries`
        times (default: the configured number); what still fails is returned in `failed` rather
        than raised, so that a caller can carry on without one partition whose leader is moving.

        After any failure the AdminClient is replaced: librdkafka's admin client keeps using its
        cached leaders and leader epochs after a leader change (and is answered
        FENCED_LEADER_EPOCH, or waits for a dead broker until the request times out, then reports
        offset -1001), where a new client starts from fresh metadata.
        """
        retries = self.retries if retries is None else retries
        timestamps = dict(partitions) if isinstance(partitions, Mapping) else {}
        pending = sorted(set(partitions))
        found: dict[TopicPartition, int] = {}
        failed: dict[TopicPartition, OdradekError] = {}
        attempt = 0
        while pending:
            request = {
                RdTopicPartition(tp.topic, tp.partition): (
                    OffsetSpec.for_timestamp(timestamps[tp])
                    if which == "timestamp"
                    else OffsetSpec.earliest()
                    if which == "earliest"
                    else OffsetSpec.latest()
                )
                for tp in pending
            }
            retry: list[TopicPartition] = []
            try:
                isolation = (
                    IsolationLevel.READ_COMMITTED
                    if self.read_committed
                    else IsolationLevel.READ_UNCOMMITTED
                )
                futures = self.admin.list_offsets(
                    request, isolation_level=isolation, request_timeout=self.timeout_s
                )
            except KafkaException as e:
                self._admin = None
                raise translate(e, f"listing {which} offsets") from None
            answers_by = time.monotonic() + self.answer_timeout_s
            for rd_tp, future in futures.items():
                tp = TopicPartition(rd_tp.topic, rd_tp.partition)
                try:
                    wait_s = max(0.0, answers_by - time.monotonic())
                    offset = int(future.result(timeout=wait_s).offset)
                except TimeoutError:
                    failed[tp] = RequestTimedOutError(
                        f"listing the {which} offset of {tp}: no answer within "
                        f"{self.answer_timeout_s:.0f} s"
                    )
                    retry.append(tp)
                    continue
                except KafkaException as e:
                    failed[tp] = translate(e, f"listing the {which} offset of {tp}")
                    if is_retriable(e):
                        retry.append(tp)
                    continue
                if offset == -1 and which == "timestamp":
                    found[tp] = -1  # no record at or after the timestamp
                    failed.pop(tp, None)
                    continue
                if offset < 0:  # librdkafka's answer when the leader did not reply in time
                    failed[tp] = RequestTimedOutError(
                        f"listing the {which} offset of {tp}: no answer from its leader"
                    )
                    retry.append(tp)
                    continue
                found[tp] = offset
                failed.pop(tp, None)
            if failed:
                self._admin = None
            if not retry or attempt >= retries:
                break
            attempt += 1
            pending = retry
            time.sleep(self.retry_interval_s)
        return OffsetsResult(found, failed)
