"""Kafka's BrokerTopicStats and the replica manager's ISR meters: counters the request path bumps.

Kafka keeps a meter per topic and one for all topics (`kafka.server:type=BrokerTopicMetrics,
name=MessagesInPerSec[,topic=...]`), bumped where the leader appends records (ReplicaManager's
appendToLocalLog) and where a fetch response is built. Here a meter is a plain monotonically
increasing count: Prometheus computes the rate, so no exponentially weighted average is kept.

Concurrency: owned by the event loop thread; every method is O(1) and never blocks. Readers (the
metrics scrape) take a snapshot on the loop thread too.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class TopicMeters:
    """The counts behind one topic's BrokerTopicMetrics (or the all-topics total)."""

    messages_in: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    failed_produce_requests: int = 0
    failed_fetch_requests: int = 0
    total_produce_requests: int = 0
    total_fetch_requests: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class BrokerTopicStats:
    """Per-topic and all-topics meters, plus the ISR shrink/expand meters of ReplicaManager."""

    def __init__(self) -> None:
        self.all_topics = TopicMeters()
        self.topics: dict[str, TopicMeters] = {}
        self.isr_shrinks = 0
        self.isr_expands = 0

    def topic(self, topic: str) -> TopicMeters:
        meters = self.topics.get(topic)
        if meters is None:
            meters = self.topics[topic] = TopicMeters()
        return meters

    def record_append(self, topic: str, record_count: int, size: int) -> None:
        """A leader appended `record_count` records of `size` bytes from a producer."""
        meters = self.topic(topic)
        meters.total_produce_requests += 1
        meters.messages_in += record_count
        meters.bytes_in += size
        total = self.all_topics
        total.total_produce_requests += 1
        total.messages_in += record_count
        total.bytes_in += size

    def record_failed_produce(self, topic: str) -> None:
        meters = self.topic(topic)
        meters.total_produce_requests += 1
        meters.failed_produce_requests += 1
        self.all_topics.total_produce_requests += 1
        self.all_topics.failed_produce_requests += 1

    def record_fetch(self, topic: str, size: int, failed: bool) -> None:
        """A consumer fetch read `size` bytes of `topic` (or failed for it)."""
        meters = self.topic(topic)
        total = self.all_topics
        meters.total_fetch_requests += 1
        total.total_fetch_requests += 1
        if failed:
            meters.failed_fetch_requests += 1
            total.failed_fetch_requests += 1
        meters.bytes_out += size
        total.bytes_out += size

    def remove_topic(self, topic: str) -> None:
        """A deleted topic's meters go (Kafka's removeMetrics); the totals keep their counts."""
        self.topics.pop(topic, None)
