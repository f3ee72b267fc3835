"""Each broker's view of the cluster, fed only by the controller's UpdateMetadata requests.

The cache answers Metadata requests on any broker, so clients can route to partition leaders through
whichever broker they bootstrap from, and it tells request handlers which partitions exist (unknown
ones get UNKNOWN_TOPIC_OR_PARTITION). A partition whose leader is `LEADER_DURING_DELETE` (-2) in an
UpdateMetadata request is being deleted and leaves the cache.

Every live broker is known with the endpoint of each of its listeners (UpdateMetadata carries them
all): a client is answered with the addresses of the listener it connected to, other brokers reach
each other on the inter-broker listener (`default_listener`).

Building a Metadata response for thousands of partitions is expensive in Python, so responses are
memoised per (API version, requested topics, listener, ...) and the memo is dropped on every update.

Concurrency: touched only by the broker's event loop thread.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

NO_LEADER = -1
LEADER_DURING_DELETE = -2


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    """A broker as one listener reaches it."""

    id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class LiveBroker:
    """A live broker with every listener's (host, port)."""

    id: int
    endpoints: dict[str, tuple[str, int]]
    rack: str | None = None

    def endpoint(self, listener: str) -> BrokerEndpoint | None:
        address = self.endpoints.get(listener)
        if address is None:
            return None
        return BrokerEndpoint(self.id, address[0], address[1], self.rack)


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    zk_version: int = 0
    controller_epoch: int = 0


@dataclass(slots=True)
class MetadataCache:
    broker_id: int
    default_listener: str = "PLAINTEXT"
    controller_id: int = -1
    controller_epoch: int = -1
    brokers: dict[int, LiveBroker] = field(default_factory=dict)
    topics: dict[str, dict[int, PartitionMetadata]] = field(default_factory=dict)
    topic_ids: dict[str, uuid.UUID] = field(default_factory=dict)
    version: int = 0
    leaders_changed: int = 0
    """Partitions whose leader the last `update` changed (not counting new ones)."""
    _memo: dict[Any, Any] = field(default_factory=dict)
    _names_by_id: dict[uuid.UUID, str] | None = None

    def update(
        self,
        controller_id: int,
        controller_epoch: int,
        brokers: Iterable[LiveBroker],
        partitions: Iterable[PartitionMetadata],
        topic_ids: dict[str, uuid.UUID] | None = None,
    ) -> list[tuple[str, int]]:
        """Apply one UpdateMetadata request; returns the partitions it deleted."""
        self.controller_id = controller_id
        self.controller_epoch = controller_epoch
        self.brokers = {broker.id: broker for broker in brokers}
        deleted: list[tuple[str, int]] = []
        changed = 0
        for state in partitions:
            if state.leader == LEADER_DURING_DELETE:
                topic_partitions = self.topics.get(state.topic)
                if topic_partitions is not None and topic_partitions.pop(state.partition, None):
                    deleted.append((state.topic, state.partition))
                    if not topic_partitions:
                        del self.topics[state.topic]
                        self.topic_ids.pop(state.topic, None)
                continue
            topic_partitions = self.topics.setdefault(state.topic, {})
            previous = topic_partitions.get(state.partition)
            if previous is not None and previous.leader != state.leader:
                changed += 1
            topic_partitions[state.partition] = state
        self.leaders_changed = changed
        if topic_ids:
            for topic, topic_id in topic_ids.items():
                if topic in self.topics:
                    self.topic_ids[topic] = topic_id
        self.version += 1
        self._memo.clear()
        self._names_by_id = None
        return deleted

    # queries

    def get_partition(self, topic: str, partition: int) -> PartitionMetadata | None:
        partitions = self.topics.get(topic)
        return partitions.get(partition) if partitions is not None else None

    def contains_topic(self, topic: str) -> bool:
        return topic in self.topics

    def partition_count(self, topic: str) -> int:
        return len(self.topics.get(topic, ()))

    def alive_broker_ids(self) -> list[int]:
        return sorted(self.brokers)

    def get_broker(self, broker_id: int, listener: str | None = None) -> BrokerEndpoint | None:
        """The broker's address on `listener` (the inter-broker listener by default); None if it
        is not live or has no such listener."""
        broker = self.brokers.get(broker_id)
        if broker is None:
            return None
        return broker.endpoint(listener or self.default_listener)

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        """The topic of an id (Fetch v13+ names topics by id)."""
        names = self._names_by_id
        if names is None:
            names = self._names_by_id = {v: k for k, v in self.topic_ids.items()}
        return names.get(topic_id)

    def memo(self, key: Any) -> Any:
        return self._memo.get(key)

    def remember(self, key: Any, value: Any) -> None:
        self._memo[key] = value
