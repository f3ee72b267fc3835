"""Kafka's ZooKeeper data model: one small class per znode.

Every path and payload here is byte-compatible with Apache Kafka in ZooKeeper mode (2.x/3.x,
`kafka.zk.ZkData`), so Kafka-aware tools (zookeeper-shell, kafka-topics --zookeeper, Burrow, ...)
read an Odradek cluster and vice versa. Each class is a namespace of static methods:

* `path(...)` builds the znode path;
* `encode(...)` returns the payload bytes: compact JSON in UTF-8 (no spaces, as Jackson writes it),
  except `/controller_epoch`, whose payload is the epoch as decimal text;
* `decode(data, stat_version, ...)` parses a payload into a frozen dataclass that carries the
  znode's version (`zk_version`), because every conditional write in Kafka names the version it
  read. A payload that is not what the class expects raises `InvalidZNodeDataError`.

One module per znode family: `brokers` (registration, cluster id), `controller` (`/controller`,
`/controller_epoch`), `topics` (assignments, partition states, ISR change notifications), `admin`
(deletions, reassignments, preferred elections) and `configs` (overrides and change
notifications). This package re-exports every class, so `from odradek.zk.znodes import X` works
whichever family X belongs to.

Nothing here does I/O; the classes are safe to use from any thread.
"""

from __future__ import annotations

from odradek.zk.znodes._common import TopicPartition
from odradek.zk.znodes.admin import (
    AdminZNode,
    DeleteTopicsTopicZNode,
    DeleteTopicsZNode,
    PartitionReassignment,
    PreferredReplicaElection,
    PreferredReplicaElectionZNode,
    ReassignPartitionsZNode,
)
from odradek.zk.znodes.brokers import (
    BrokerIdsZNode,
    BrokerIdZNode,
    BrokerInfo,
    BrokersZNode,
    ClusterId,
    ClusterIdZNode,
    ClusterZNode,
    EndPoint,
)
from odradek.zk.znodes.configs import (
    BrokerConfigZNode,
    ConfigChangeNotification,
    ConfigChangeNotificationSequenceZNode,
    ConfigChangeNotificationZNode,
    ConfigZNode,
    EntityConfig,
    TopicConfigZNode,
)
from odradek.zk.znodes.controller import (
    ControllerEpoch,
    ControllerEpochZNode,
    ControllerInfo,
    ControllerZNode,
)
from odradek.zk.znodes.log_dirs import (
    LOG_DIR_FAILURE_EVENT,
    LogDirEventNotification,
    LogDirEventNotificationSequenceZNode,
    LogDirEventNotificationZNode,
)
from odradek.zk.znodes.topics import (
    IsrChangeNotification,
    IsrChangeNotificationSequenceZNode,
    IsrChangeNotificationZNode,
    LeaderIsrAndControllerEpoch,
    ReplicaAssignment,
    TopicAssignment,
    TopicPartitionStateZNode,
    TopicPartitionsZNode,
    TopicPartitionZNode,
    TopicsZNode,
    TopicZNode,
)

# Persistent paths every broker creates at start-up if missing (Kafka's ZkData.PersistentZkPaths,
# plus /cluster, the parent of /cluster/id). The consumer, seqid, producer-id and log-dir paths
# are not used by Odradek but are created so that Kafka's own tools find the layout they expect.
PERSISTENT_PATHS: tuple[str, ...] = (
    "/consumers",
    BrokerIdsZNode.path(),
    TopicsZNode.path(),
    ConfigChangeNotificationZNode.path(),
    DeleteTopicsZNode.path(),
    f"{BrokersZNode.path()}/seqid",
    IsrChangeNotificationZNode.path(),
    "/latest_producer_id_block",
    LogDirEventNotificationZNode.path(),
    f"{ConfigZNode.path()}/topics",
    f"{ConfigZNode.path()}/clients",
    f"{ConfigZNode.path()}/users",
    f"{ConfigZNode.path()}/brokers",
    ClusterZNode.path(),
)

__all__ = [
    "LOG_DIR_FAILURE_EVENT",
    "PERSISTENT_PATHS",
    "AdminZNode",
    "BrokerConfigZNode",
    "BrokerIdZNode",
    "BrokerIdsZNode",
    "BrokerInfo",
    "BrokersZNode",
    "ClusterId",
    "ClusterIdZNode",
    "ClusterZNode",
    "ConfigChangeNotification",
    "ConfigChangeNotificationSequenceZNode",
    "ConfigChangeNotificationZNode",
    "ConfigZNode",
    "ControllerEpoch",
    "ControllerEpochZNode",
    "ControllerInfo",
    "ControllerZNode",
    "DeleteTopicsTopicZNode",
    "DeleteTopicsZNode",
    "EndPoint",
    "EntityConfig",
    "IsrChangeNotification",
    "IsrChangeNotificationSequenceZNode",
    "IsrChangeNotificationZNode",
    "LeaderIsrAndControllerEpoch",
    "LogDirEventNotification",
    "LogDirEventNotificationSequenceZNode",
    "LogDirEventNotificationZNode",
    "PartitionReassignment",
    "PreferredReplicaElection",
    "PreferredReplicaElectionZNode",
    "ReassignPartitionsZNode",
    "ReplicaAssignment",
    "TopicAssignment",
    "TopicConfigZNode",
    "TopicPartition",
    "TopicPartitionStateZNode",
    "TopicPartitionZNode",
    "TopicPartitionsZNode",
    "TopicZNode",
    "TopicsZNode",
]
