"""DeleteRecords, DescribeCluster, DescribeLogDirs and ListOffsets' max timestamp (KIP-734) through
the admin clients users have (confluent-kafka, kafka-python), on the shared cluster; raw Fetch
requests where the exact error code matters.
"""

from __future__ import annotations

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from kio.schema.errors import ErrorCode

from odradek.testing import LocalCluster
from tests.integration import _wire
from tests.integration._clients import create_topic, unique_topic
from tests.integration._groups import CLIENT_TIMEOUT_S


def test_max_timestamp_delete_records_and_cluster_descriptions(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("admin")
    create_topic(bootstrap, topic, partitions=1, replication_factor=3)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    timestamps = [1_000 + (i * 7) % 10 for i in range(10)]  # the largest, 1009, at offset 7
    for timestamp in timestamps:
        producer.produce(topic, value=b"v", partition=0, timestamp=timestamp)
        producer.flush(CLIENT_TIMEOUT_S)  # one batch per record: the search crosses batches
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(topic, 0)

    def listed(spec: OffsetSpec) -> tuple[int, int]:
        (future,) = admin.list_offsets({tp: spec}).values()
        result = future.result(CLIENT_TIMEOUT_S)
        return result.offset, result.timestamp

    assert listed(OffsetSpec.max_timestamp()) == (7, 1009)
    assert listed(OffsetSpec.for_timestamp(1005)) == (1, 1007)
    # DeleteRecords: the log start moves; below it a fetch is out of range.
    (deleted,) = admin.delete_records([TopicPartition(topic, 0, 4)]).values()
    assert deleted.result(CLIENT_TIMEOUT_S).low_watermark == 4
    assert listed(OffsetSpec.earliest())[0] == 4
    (beyond,) = admin.delete_records([TopicPartition(topic, 0, 11)]).values()
    try:
        beyond.result(CLIENT_TIMEOUT_S)
        raise AssertionError("deleting beyond the high watermark was accepted")
    except Exception as e:
        assert "OFFSET_OUT_OF_RANGE" in str(e)
    leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    with _wire.WireConnection.to(cluster3.broker(leader).bootstrap) as connection:
        below = _wire.fetch(connection, topic, 0, 2)
        assert below.error_code == ErrorCode.offset_out_of_range
        at = _wire.fetch(connection, topic, 0, 4)
        assert at.error_code == ErrorCode.none and at.log_start_offset == 4
    # DescribeCluster: the brokers, the controller, the cluster id (as Metadata says).
    described = admin.describe_cluster().result(CLIENT_TIMEOUT_S)
    controller, brokers = _wire.cluster_view(bootstrap.split(",")[0])
    assert sorted(n.id for n in described.nodes) == sorted(brokers)
    assert described.controller.id == controller
    assert described.cluster_id == admin.list_topics(timeout=10).cluster_id
    # DescribeLogDirs through kafka-python: every replica's directory lists the partition.
    from kafka import KafkaAdminClient

    client = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        dirs = client.describe_log_dirs(topic_partitions=[topic])
    finally:
        client.close()
    holders = {
        entry["broker"]
        for entry in dirs
        for log_dir in entry["log_dirs"]
        for listed_topic in log_dir["topics"]
        if listed_topic["name"] == topic
    }
    assert holders == set(cluster3.broker_ids)
