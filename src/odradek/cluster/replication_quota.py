"""Replication throttles (KIP-73; Kafka's `ReplicationQuotaManager`): bound the bytes a leader
serves to, and a follower fetches for, the replicas a reassignment is moving, so that moving a
partition does not starve producers and consumers.

Two managers per broker:
* `leader`: bounded by `leader.replication.throttled.rate` (a dynamic broker config); applies to
  the partitions that the topic config `leader.replication.throttled.replicas` lists for this
  broker (`partition:broker` pairs, or `*` for every partition of the topic);
* `follower`: `follower.replication.throttled.rate` and `follower.replication.throttled.replicas`.

A replica is throttled only while it is out of the ISR (a caught-up replica is never held back).
On the leader, a follower fetch gets no records for a throttled partition while the leader's
throttled rate is over its bound, and the bytes sent for throttled partitions are recorded; on
the follower, a throttled partition is left out of the fetch while the follower's rate is over
its bound, and the bytes received for throttled partitions are recorded. The rate is Kafka's
`SimpleRate` over `replication.quota.window.num` (11) windows of
`replication.quota.window.size.seconds` (1 s) (`odradek.server.quota.rate` defines it; this
module takes any object with `record` and `measure`).

`throttled_replicas` parses a topic config value (Kafka's `ThrottledReplicaListValidator` and
`TopicConfigHandler.parseThrottledPartitions`).

Concurrency: the broker's event loop thread only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sized
from typing import Any, Protocol, TypeVar

ALL_PARTITIONS: frozenset[int] = frozenset({-1})
"""Every partition of the topic (`*`)."""

LEADER_THROTTLED_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_THROTTLED_REPLICAS = "follower.replication.throttled.replicas"
LEADER_THROTTLED_RATE = "leader.replication.throttled.rate"
FOLLOWER_THROTTLED_RATE = "follower.replication.throttled.rate"

_REPLICA = re.compile(r"([0-9]+:[0-9]+)?")


class InvalidThrottledReplicasError(ValueError):
    pass


def validate_throttled_replicas(name: str, value: str) -> None:
    """Kafka's check: `*`, or a comma-separated list of `partition:broker` (empty items allowed)."""
    items = [item.strip() for item in value.split(",")]
    if "".join(items) == "*":
        return
    if not all(_REPLICA.fullmatch(item) for item in items):
        raise InvalidThrottledReplicasError(
            f"{name} must be the literal '*' or a list of replicas in the following format: "
            "[partitionId]:[brokerId],[partitionId]:[brokerId],..."
        )


def throttled_replicas(value: str, broker_id: int) -> frozenset[int]:
    """The partitions a topic's throttled-replicas config names for `broker_id`
    (`ALL_PARTITIONS` for `*`). Raises InvalidThrottledReplicasError for a malformed value."""
    value = value.strip()
    validate_throttled_replicas("throttled replicas", value)
    if value == "":
        return frozenset()
    if "".join(item.strip() for item in value.split(",")) == "*":
        return ALL_PARTITIONS
    partitions = set()
    for item in value.split(","):
        item = item.strip()
        if item:
            partition, broker = item.split(":")
            if int(broker) == broker_id:
                partitions.add(int(partition))
    return frozenset(partitions)


class Measured(Protocol):
    def record(self, value: float, now_ms: int) -> None: ...

    def measure(self, now_ms: int) -> float: ...


class ReplicationQuotaManager:
    """One direction's throttle (leader or follower). Event-loop thread only."""

    def __init__(
        self,
        config_key: str,
        new_rate: Callable[[], Measured],
        broker_id: int = -1,
        topic_config: Callable[[str], dict[str, str]] | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.config_key = config_key
        self.broker_id = broker_id
        self.bound: float | None = None
        """Bytes per second; None: unbounded (Kafka's Long.MaxValue default)."""
        self._rate = new_rate()
        self._topic_config = topic_config or (lambda _topic: {})
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._parsed: dict[str, tuple[str, frozenset[int]]] = {}

    @property
    def enabled(self) -> bool:
        """A bound is set: the quick check before anything else is asked."""
        return self.bound is not None

    def update_quota(self, bound: float | None) -> None:
        self.bound = bound

    def is_throttled(self, topic: str, partition: int) -> bool:
        value = self._topic_config(topic).get(self.config_key, "")
        if not value:
            return False
        cached = self._parsed.get(topic)
        if cached is None or cached[0] != value:
            try:
                partitions = throttled_replicas(value, self.broker_id)
            except InvalidThrottledReplicasError:
                partitions = frozenset()
            cached = self._parsed[topic] = (value, partitions)
        partitions = cached[1]
        return partitions is ALL_PARTITIONS or partition in partitions

    def record(self, value: int) -> None:
        self._rate.record(float(value), self._clock_ms())

    def record_fetched(self, topic: str, partition: int, records: Sized) -> None:
        """A follower received `records` for a partition: counted if it is throttled."""
        if self.bound is not None and self.is_throttled(topic, partition):
            self.record(len(records))

    def is_quota_exceeded(self) -> bool:
        if self.bound is None:
            return False
        return self._rate.measure(self._clock_ms()) > self.bound

    def rate(self) -> float:
        return self._rate.measure(self._clock_ms())


class FollowerFetchState(Protocol):
    """What `hold_throttled` needs of a replica fetcher's partition state."""

    partition: Any  # .topic, .partition
    caught_up: bool
    delayed_until: float


S = TypeVar("S", bound=FollowerFetchState)


def hold_throttled(throttle: ReplicationQuotaManager, states: list[S], until: float) -> list[S]:
    """The follower's partitions to fetch now: a throttled one (listed for this broker, not
    caught up) waits, its state delayed `until` then, while the follower throttle is over its
    rate."""
    exceeded: bool | None = None
    kept = []
    for state in states:
        partition = state.partition
        if not state.caught_up and throttle.is_throttled(partition.topic, partition.partition):
            if exceeded is None:
                exceeded = throttle.is_quota_exceeded()
            if exceeded:
                state.delayed_until = until
                continue
        kept.append(state)
    return kept


class ReplicationQuotas:
    """The leader and follower throttles of a broker."""

    def __init__(self, config: Any, new_rate: Callable[[Any], Measured] | None = None) -> None:
        self.config = config
        self._new_rate = new_rate
        self.leader = ReplicationQuotaManager(LEADER_THROTTLED_REPLICAS, self._rate_factory)
        self.follower = ReplicationQuotaManager(FOLLOWER_THROTTLED_REPLICAS, self._rate_factory)

    def _rate_factory(self) -> Measured:
        if self._new_rate is None:
            raise RuntimeError("ReplicationQuotas needs a rate factory")
        return self._new_rate(self.config)

    def bind(self, broker_id: int, topic_config: Callable[[str], dict[str, str]]) -> None:
        """Say which broker this is and where topic configs come from (once both exist)."""
        for manager in (self.leader, self.follower):
            manager.broker_id = broker_id
            manager._topic_config = topic_config
            manager._parsed.clear()
