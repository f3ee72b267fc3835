"""The znode classes: Kafka's exact paths and JSON, encode -> decode round trips, bad payloads."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from odradek.zk.errors import InvalidZNodeDataError
from odradek.zk.znodes import (
    PERSISTENT_PATHS,
    BrokerConfigZNode,
    BrokerIdsZNode,
    BrokerIdZNode,
    ClusterIdZNode,
    ConfigChangeNotificationSequenceZNode,
    ConfigChangeNotificationZNode,
    ControllerEpochZNode,
    ControllerZNode,
    DeleteTopicsTopicZNode,
    DeleteTopicsZNode,
    EndPoint,
    IsrChangeNotificationSequenceZNode,
    IsrChangeNotificationZNode,
    LeaderIsrAndControllerEpoch,
    PreferredReplicaElectionZNode,
    ReassignPartitionsZNode,
    ReplicaAssignment,
    TopicConfigZNode,
    TopicPartition,
    TopicPartitionStateZNode,
    TopicPartitionsZNode,
    TopicPartitionZNode,
    TopicsZNode,
    TopicZNode,
)


def fields(data: bytes) -> dict:
    return json.loads(data)


def test_paths_are_kafkas() -> None:
    assert BrokerIdsZNode.path() == "/brokers/ids"
    assert BrokerIdZNode.path(3) == "/brokers/ids/3"
    assert TopicsZNode.path() == "/brokers/topics"
    assert TopicZNode.path("t") == "/brokers/topics/t"
    assert TopicPartitionsZNode.path("t") == "/brokers/topics/t/partitions"
    assert TopicPartitionZNode.path("t", 2) == "/brokers/topics/t/partitions/2"
    assert TopicPartitionStateZNode.path("t", 2) == "/brokers/topics/t/partitions/2/state"
    assert ControllerZNode.path() == "/controller"
    assert ControllerEpochZNode.path() == "/controller_epoch"
    assert IsrChangeNotificationZNode.path() == "/isr_change_notification"
    assert IsrChangeNotificationSequenceZNode.path() == "/isr_change_notification/isr_change_"
    assert DeleteTopicsZNode.path() == "/admin/delete_topics"
    assert DeleteTopicsTopicZNode.path("t") == "/admin/delete_topics/t"
    assert ReassignPartitionsZNode.path() == "/admin/reassign_partitions"
    assert PreferredReplicaElectionZNode.path() == "/admin/preferred_replica_election"
    assert TopicConfigZNode.path("t") == "/config/topics/t"
    assert BrokerConfigZNode.path(1) == "/config/brokers/1"
    assert BrokerConfigZNode.path(BrokerConfigZNode.DEFAULT) == "/config/brokers/<default>"
    assert ConfigChangeNotificationZNode.path() == "/config/changes"
    assert ConfigChangeNotificationSequenceZNode.path() == "/config/changes/config_change_"
    assert ClusterIdZNode.path() == "/cluster/id"


def test_persistent_paths_cover_the_broker_start_up_set() -> None:
    for path in (
        "/brokers/ids",
        "/brokers/topics",
        "/config/topics",
        "/config/brokers",
        "/config/changes",
        "/admin/delete_topics",
        "/isr_change_notification",
        "/cluster",
    ):
        assert path in PERSISTENT_PATHS
    assert len(set(PERSISTENT_PATHS)) == len(PERSISTENT_PATHS)


def test_broker_registration_fields_and_round_trip() -> None:
    endpoints = [EndPoint.plaintext("h1", 9092)]
    data = BrokerIdZNode.encode(endpoints, rack="r1", timestamp_ms=1234)
    assert b" " not in data  # compact, as Kafka writes it
    assert fields(data) == {
        "version": 5,
        "host": "h1",
        "port": 9092,
        "endpoints": ["PLAINTEXT://h1:9092"],
        "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
        "rack": "r1",
        "jmx_port": -1,
        "features": {},
        "timestamp": "1234",
    }
    info = BrokerIdZNode.decode(7, data, czxid=4242)
    assert (info.id, info.host, info.port, info.rack, info.broker_epoch) == (
        7,
        "h1",
        9092,
        "r1",
        4242,
    )
    assert info.endpoints == tuple(endpoints)
    assert info.endpoint("PLAINTEXT") == endpoints[0]


def test_broker_registration_without_rack_omits_the_key_like_kafka() -> None:
    data = BrokerIdZNode.encode([EndPoint.plaintext("h", 1)])
    assert "rack" not in fields(data)
    assert int(fields(data)["timestamp"]) > 0
    assert BrokerIdZNode.decode(1, data, czxid=1).rack is None


def test_broker_registration_with_named_listeners_and_ipv6() -> None:
    endpoints = [EndPoint("INTERNAL", "::1", 9093, "PLAINTEXT"), EndPoint("EXT", "e", 9094, "SSL")]
    data = BrokerIdZNode.encode(endpoints)
    assert fields(data)["endpoints"] == ["INTERNAL://[::1]:9093", "EXT://e:9094"]
    assert (fields(data)["host"], fields(data)["port"]) == ("::1", 9093)
    assert BrokerIdZNode.decode(1, data, czxid=9).endpoints == tuple(endpoints)


def test_broker_registration_written_by_kafka_decodes() -> None:
    kafka = (
        b'{"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},"endpoints":'
        b'["PLAINTEXT://kafka-1:9092"],"jmx_port":-1,"features":{},"host":"kafka-1",'
        b'"timestamp":"1700000000000","port":9092,"version":5}'
    )
    info = BrokerIdZNode.decode(1, kafka, czxid=77)
    assert (info.host, info.port, info.rack, info.broker_epoch) == ("kafka-1", 9092, None, 77)
    legacy = b'{"version":1,"host":"old","port":9092,"jmx_port":-1,"timestamp":"1"}'
    assert BrokerIdZNode.decode(2, legacy, czxid=1).endpoints == (EndPoint.plaintext("old", 9092),)


def test_broker_endpoint_with_unmapped_listener_is_refused() -> None:
    data = b'{"version":5,"host":null,"port":-1,"endpoints":["X://h:1"],"listener_security_protocol_map":{}}'
    with pytest.raises(InvalidZNodeDataError, match="listener 'X'"):
        BrokerIdZNode.decode(1, data, czxid=1)


def test_topic_assignment_fields_and_round_trip() -> None:
    data = TopicZNode.encode({1: [2, 3, 1], 0: [1, 2, 3]})
    assert fields(data) == {
        "version": 2,
        "partitions": {"0": [1, 2, 3], "1": [2, 3, 1]},
        "adding_replicas": {},
        "removing_replicas": {},
    }
    decoded = TopicZNode.decode("t", data, stat_version=4)
    assert decoded.topic == "t" and decoded.zk_version == 4 and decoded.topic_id is None
    assert decoded.partitions == {0: ReplicaAssignment((1, 2, 3)), 1: ReplicaAssignment((2, 3, 1))}


def test_topic_assignment_with_reassignment_in_flight() -> None:
    moving = ReplicaAssignment((1, 2, 4), adding_replicas=(4,), removing_replicas=(3,))
    data = TopicZNode.encode({0: moving, 1: ReplicaAssignment((2, 3))}, topic_id="abc")
    assert fields(data)["adding_replicas"] == {"0": [4]}
    assert fields(data)["removing_replicas"] == {"0": [3]}
    assert fields(data)["topic_id"] == "abc"
    decoded = TopicZNode.decode("t", data, 0)
    assert decoded.partitions[0] == moving and decoded.topic_id == "abc"


def test_partition_state_fields_and_round_trip() -> None:
    data = TopicPartitionStateZNode.encode(leader=2, leader_epoch=48, isr=[2], controller_epoch=29)
    assert fields(data) == {
        "controller_epoch": 29,
        "leader": 2,
        "version": 1,
        "leader_epoch": 48,
        "isr": [2],
    }
    assert TopicPartitionStateZNode.decode(data, stat_version=6) == LeaderIsrAndControllerEpoch(
        leader=2, leader_epoch=48, isr=(2,), controller_epoch=29, zk_version=6
    )


@given(
    st.integers(-1, 2**31 - 1),
    st.integers(0, 2**31 - 1),
    st.lists(st.integers(0, 2**31 - 1), max_size=8),
    st.integers(0, 2**31 - 1),
)
def test_partition_state_bytes_are_the_compact_json_of_its_fields(
    leader: int, leader_epoch: int, isr: list[int], controller_epoch: int
) -> None:
    # encode formats the JSON itself; it must be byte for byte what the JSON writer gives
    data = TopicPartitionStateZNode.encode(
        leader=leader, leader_epoch=leader_epoch, isr=tuple(isr), controller_epoch=controller_epoch
    )
    assert (
        data
        == json.dumps(
            {
                "controller_epoch": controller_epoch,
                "leader": leader,
                "version": 1,
                "leader_epoch": leader_epoch,
                "isr": isr,
            },
            separators=(",", ":"),
        ).encode()
    )


def test_partition_state_rejects_bad_payloads() -> None:
    with pytest.raises(InvalidZNodeDataError, match="not valid JSON"):
        TopicPartitionStateZNode.decode(b"{", 0)
    with pytest.raises(InvalidZNodeDataError, match="'leader'"):
        TopicPartitionStateZNode.decode(b'{"leader_epoch":1,"isr":[],"controller_epoch":1}', 0)
    with pytest.raises(InvalidZNodeDataError, match="'isr'"):
        TopicPartitionStateZNode.decode(
            b'{"leader":1,"leader_epoch":1,"isr":"1","controller_epoch":1}', 0
        )
    with pytest.raises(InvalidZNodeDataError, match="not an integer"):
        TopicPartitionStateZNode.decode(
            b'{"leader":true,"leader_epoch":1,"isr":[],"controller_epoch":1}', 0
        )
    with pytest.raises(InvalidZNodeDataError, match="'isr' is not a list of integers"):
        TopicPartitionStateZNode.decode(
            b'{"leader":1,"leader_epoch":1,"isr":[1,true],"controller_epoch":1}', 0
        )


def test_controller_and_epoch() -> None:
    data = ControllerZNode.encode(8, timestamp_ms=99)
    assert fields(data) == {"version": 1, "brokerid": 8, "timestamp": "99"}
    info = ControllerZNode.decode(data, stat_version=0)
    assert (info.broker_id, info.timestamp_ms, info.zk_version) == (8, 99, 0)
    assert ControllerEpochZNode.encode(17) == b"17"
    epoch = ControllerEpochZNode.decode(b"17", stat_version=16)
    assert (epoch.epoch, epoch.zk_version) == (17, 16)
    with pytest.raises(InvalidZNodeDataError):
        ControllerEpochZNode.decode(b"seventeen", 0)


def test_isr_change_notification() -> None:
    partitions = {TopicPartition("a", 0), TopicPartition("b", 3)}
    data = IsrChangeNotificationSequenceZNode.encode(sorted(partitions))
    assert fields(data) == {
        "version": 1,
        "partitions": [{"topic": "a", "partition": 0}, {"topic": "b", "partition": 3}],
    }
    decoded = IsrChangeNotificationSequenceZNode.decode(data, stat_version=0)
    assert decoded.partitions == partitions
    assert (
        IsrChangeNotificationSequenceZNode.sequence_number("isr_change_0000000042") == "0000000042"
    )
    assert IsrChangeNotificationSequenceZNode.path("0000000042") == (
        "/isr_change_notification/isr_change_0000000042"
    )


def test_reassignment_and_preferred_election() -> None:
    reassignment = {TopicPartition("t", 0): [4, 5, 6], TopicPartition("u", 1): [1]}
    data = ReassignPartitionsZNode.encode(reassignment)
    assert fields(data) == {
        "version": 1,
        "partitions": [
            {"topic": "t", "partition": 0, "replicas": [4, 5, 6]},
            {"topic": "u", "partition": 1, "replicas": [1]},
        ],
    }
    decoded = ReassignPartitionsZNode.decode(data, stat_version=2)
    assert decoded.replicas == {TopicPartition("t", 0): (4, 5, 6), TopicPartition("u", 1): (1,)}
    assert decoded.zk_version == 2

    data = PreferredReplicaElectionZNode.encode([TopicPartition("t", 0)])
    assert fields(data) == {"version": 1, "partitions": [{"topic": "t", "partition": 0}]}
    assert PreferredReplicaElectionZNode.decode(data, 0).partitions == {TopicPartition("t", 0)}


def test_entity_configs() -> None:
    data = TopicConfigZNode.encode({"retention.ms": "1000", "cleanup.policy": "delete"})
    assert fields(data) == {
        "version": 1,
        "config": {"retention.ms": "1000", "cleanup.policy": "delete"},
    }
    decoded = TopicConfigZNode.decode(data, stat_version=3, topic="t")
    assert decoded.config == {"retention.ms": "1000", "cleanup.policy": "delete"}
    assert decoded.zk_version == 3
    assert BrokerConfigZNode.decode(BrokerConfigZNode.encode({}), 0).config == {}
    assert TopicConfigZNode.decode(b"", 0).config == {}
    with pytest.raises(InvalidZNodeDataError, match="not a string"):
        TopicConfigZNode.decode(b'{"version":1,"config":{"retention.ms":1000}}', 0)


def test_config_change_notification() -> None:
    data = ConfigChangeNotificationSequenceZNode.encode("topics", "t")
    assert fields(data) == {"version": 2, "entity_path": "topics/t"}
    decoded = ConfigChangeNotificationSequenceZNode.decode(data, 0)
    assert (decoded.entity_type, decoded.entity_name) == ("topics", "t")
    v1 = b'{"version":1,"entity_type":"brokers","entity_name":"1"}'
    assert ConfigChangeNotificationSequenceZNode.decode(v1, 0).entity_name == "1"
    assert ConfigChangeNotificationSequenceZNode.sequence_number("config_change_0000000007") == (
        "0000000007"
    )


def test_cluster_id_version_is_a_string() -> None:
    data = ClusterIdZNode.encode("abcDEF")
    assert fields(data) == {"version": "1", "id": "abcDEF"}
    assert ClusterIdZNode.decode(data, stat_version=0).id == "abcDEF"


def test_delete_topic_marker_is_empty() -> None:
    assert DeleteTopicsTopicZNode.encode() == b""


def test_non_object_json_is_refused() -> None:
    with pytest.raises(InvalidZNodeDataError, match="JSON object"):
        ClusterIdZNode.decode(b"[1]", 0)
    with pytest.raises(InvalidZNodeDataError):
        TopicZNode.decode("t", b'{"version":2,"partitions":{"x":[1]}}', 0)
