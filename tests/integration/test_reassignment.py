"""Partition reassignment (KIP-455) against real brokers, a real ZooKeeper and real clients.

* *Two moves under an acks=all stream*: an RF=2 partition goes [1,2] -> [2,3] through
  AlterPartitionReassignments (kafka-python's admin client), then [2,3] -> [3,1] through the
  `/admin/reassign_partitions` znode; both moves take the leader out of the replica set, so the
  leader moves too. A confluent-kafka producer writes with acks=all throughout. After each move:
  the assignment znode says RS = TRS with no adding/removing replicas, the partition state's ISR
  is TRS with a TRS leader, every broker's Metadata shows the new replicas, the new replica's files
  hold the leader's batches byte for byte up to the HW, the removed broker's partition directory
  is gone, and the znode trigger's znode is deleted. At the end every acknowledged record is read
  back from the leader at its offset, exactly once but for the copies a non-idempotent producer
  re-sent after the old leader refused them (see `assert_read_once_but_for_retries`).
* *In progress, listed, cancelled*: the target broker is frozen with SIGSTOP so it cannot catch up;
  ListPartitionReassignments shows RS, adding and removing replicas (also in the assignment znode);
  cancelling (null replicas) reverts the partition to its original replicas; a second cancel is
  NO_REASSIGNMENT_IN_PROGRESS.
* *Controller failover mid-move*: with the target broker frozen, the controller (one of the
  original replicas) is killed; the new controller reads the move from the assignment znode and
  finishes it once the target broker runs again.
* *Errors*: per-partition codes of Kafka (UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT for
  empty/duplicate/unknown brokers, NO_REASSIGNMENT_IN_PROGRESS) and NOT_CONTROLLER from any broker
  but the controller.

Waits are deadlines (`wait_until`); clusters with faults are private (`make_cluster`).
"""

from __future__ import annotations

import collections
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode

from odradek.controller.reassignment_zk import encode_reassignment
from odradek.protocol.codec import ApiKey
from odradek.protocol.record_batch import Record
from odradek.testing import LocalCluster
from odradek.zk.client import ZkClient
from odradek.zk.errors import NoNodeError
from odradek.zk.znodes import (
    DeleteTopicsTopicZNode,
    ReassignPartitionsZNode,
    ReplicaAssignment,
)
from tests.fixtures.cluster import wait_until
from tests.integration._controller import zk_call, zk_topic
from tests.integration._replication import (
    StreamingProducer,
    assert_acknowledged_present,
    broker_metadata,
    create_topic,
    latest_offset,
    partition_dir,
    read_committed,
    replica_batches,
    request,
    unique_topic,
    wait_for_identical_replicas,
    zk_partition_state,
)

log = logging.getLogger(__name__)

TIMEOUT_S = 90.0
CLI_TIMEOUT_S = 120


def admin_client(cluster: LocalCluster) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=cluster.bootstrap_servers,
        client_id="reassignment-test",
        request_timeout_ms=30000,
    )


def alter(
    cluster: LocalCluster, reassignments: dict[tuple[str, int], Sequence[int] | None]
) -> dict[tuple[str, int], type | None]:
    """AlterPartitionReassignments through kafka-python: error class (or None) per partition."""
    admin = admin_client(cluster)
    try:
        results = admin.alter_partition_reassignments(
            {
                KafkaTopicPartition(t, p): (None if r is None else list(r))
                for (t, p), r in reassignments.items()
            }
        )
    finally:
        admin.close()
    return {(tp.topic, tp.partition): error for tp, error in results.items()}


def queue_deletion(cluster: LocalCluster, topic: str) -> None:
    async def create(zk: ZkClient) -> None:
        await zk.create(DeleteTopicsTopicZNode.path(topic), b"", makepath=True)

    zk_call(cluster, create)


def list_moving(cluster: LocalCluster) -> dict[tuple[str, int], dict[str, list[int]]]:
    admin = admin_client(cluster)
    try:
        listed = admin.list_partition_reassignments()
    finally:
        admin.close()
    return {(tp.topic, tp.partition): entry for tp, entry in listed.items()}


def write_reassign_znode(cluster: LocalCluster, entries: dict[tuple[str, int], list[int]]) -> None:
    async def write(zk: ZkClient) -> None:
        await zk.create(ReassignPartitionsZNode.path(), encode_reassignment(entries), makepath=True)

    zk_call(cluster, write)


def reassign_znode_exists(cluster: LocalCluster) -> bool:
    async def check(zk: ZkClient) -> bool:
        try:
            await zk.get(ReassignPartitionsZNode.path())
        except NoNodeError:
            return False
        return True

    return zk_call(cluster, check)


def wait_for_completed_move(
    cluster: LocalCluster,
    topic: str,
    partition: int,
    target: Sequence[int],
    brokers: Sequence[int] | None = None,
) -> None:
    """The assignment znode, the partition state and the Metadata of every live broker (or of
    `brokers`: a frozen broker answers nothing) all show the move to `target` as done."""
    expected = ReplicaAssignment(tuple(target))

    def assignment_done() -> bool:
        assignment = zk_topic(cluster, topic)
        return assignment is not None and assignment.partitions[partition] == expected

    wait_until(assignment_done, TIMEOUT_S, f"the assignment of {topic}-{partition} = {target}")
    state = zk_partition_state(cluster, topic, partition)
    assert sorted(state.isr) == sorted(target), state
    assert state.leader in target, state
    live = (
        brokers if brokers is not None else [b for b in cluster.broker_ids if cluster.is_alive(b)]
    )

    def metadata_agrees() -> bool:
        for broker_id in live:
            view = broker_metadata(cluster.broker(broker_id), topic).get(partition)
            if view is None or list(view.replicas) != list(target) or view.leader not in target:
                return False
        return True

    wait_until(metadata_agrees, TIMEOUT_S, f"every broker's metadata to show {target}")


def wait_for_directory_gone(cluster: LocalCluster, broker_id: int, topic: str) -> None:
    directory = partition_dir(cluster.broker(broker_id), topic, 0)
    wait_until(lambda: not directory.exists(), TIMEOUT_S, f"{directory} to be deleted")


def assert_new_replica_matches_leader(
    cluster: LocalCluster, topic: str, replicas: Sequence[int]
) -> None:
    """The replicas' files hold byte-identical batches up to the leader's HW."""
    state = zk_partition_state(cluster, topic, 0)
    error, high_watermark = latest_offset(cluster.broker(state.leader), topic, 0)
    assert error == ErrorCode.none, error
    assert high_watermark > 0
    wait_for_identical_replicas(
        cluster,
        list(replicas),
        topic,
        0,
        TIMEOUT_S,
        end_offset=high_watermark,
        min_end_offset=high_watermark,
    )


def assert_read_once_but_for_retries(
    cluster: LocalCluster,
    leader: int,
    topic: str,
    acknowledged: dict[int, bytes | None],
    records: Sequence[Record],
) -> None:
    """Each acknowledged value is read once, except for a copy its producer was told had failed.

    Without an idempotent producer (this broker has no InitProducerId yet) neither Kafka nor this
    broker can promise more: a batch the old leader appended and the new leader had already
    fetched is committed by the new leader, while the old leader answers NOT_LEADER_OR_FOLLOWER
    and the client sends it again. Such a copy is told apart from a real duplication (a replica
    copied twice, a retry inside one leader epoch) by where it lies: below the acknowledged copy,
    in a batch of an older leader epoch, at most one extra copy per value.
    """
    epoch_of: dict[int, int] = {}
    for batch in replica_batches(cluster.broker(leader), topic, 0):
        for offset in range(batch.base_offset, batch.last_offset + 1):
            epoch_of[offset] = batch.partition_leader_epoch
    offsets_of: dict[bytes | None, list[int]] = collections.defaultdict(list)
    for record in records:
        offsets_of[record.value].append(record.offset)
    for acked_offset, value in acknowledged.items():
        copies = offsets_of[value]
        assert acked_offset in copies, (value, acked_offset, copies)
        extra = [o for o in copies if o != acked_offset]
        assert len(extra) <= 1, f"{value!r} is at offsets {copies}"
        for offset in extra:
            assert offset < acked_offset and epoch_of[offset] < epoch_of[acked_offset], (
                f"{value!r}: the extra copy at {offset} (epoch {epoch_of.get(offset)}) is not an "
                f"older leader's write of the copy acknowledged at {acked_offset} "
                f"(epoch {epoch_of.get(acked_offset)})"
            )


def wait_for_more_acks(producer: StreamingProducer, more: int) -> None:
    start = producer.acknowledged_count()
    wait_until(
        lambda: producer.acknowledged_count() >= start + more,
        TIMEOUT_S,
        f"{more} more acknowledged records",
    )


def test_moves_under_acks_all_by_api_then_by_znode_move_the_leader_and_lose_nothing(
    cluster3: LocalCluster,
) -> None:
    topic = unique_topic("reassign")
    create_topic(cluster3, topic, [[1, 2]])
    producer = StreamingProducer(cluster3.bootstrap_servers, topic, "r", partition=0).start()
    try:
        wait_for_more_acks(producer, 200)
        # 1. the API: [1,2] -> [2,3]; leader 1 leaves
        assert alter(cluster3, {(topic, 0): [2, 3]}) == {(topic, 0): None}
        wait_for_completed_move(cluster3, topic, 0, [2, 3])
        wait_for_directory_gone(cluster3, 1, topic)
        assert_new_replica_matches_leader(cluster3, topic, [2, 3])
        wait_for_more_acks(producer, 200)
        # 2. the znode: [2,3] -> [3,1]; leader 2 leaves
        write_reassign_znode(cluster3, {(topic, 0): [3, 1]})
        wait_for_completed_move(cluster3, topic, 0, [3, 1])
        wait_for_directory_gone(cluster3, 2, topic)
        wait_until(
            lambda: not reassign_znode_exists(cluster3),
            TIMEOUT_S,
            "/admin/reassign_partitions to be deleted",
        )
        assert_new_replica_matches_leader(cluster3, topic, [3, 1])
        wait_for_more_acks(producer, 200)
    except BaseException:
        producer.abandon()
        raise
    deliveries = producer.stop()
    assert not deliveries.failed, deliveries.failed[:5]
    acknowledged = deliveries.acknowledged_by_partition()[0]
    state = zk_partition_state(cluster3, topic, 0)
    read = read_committed(cluster3.broker(state.leader), topic, 0)
    assert read.error == ErrorCode.none, read.error
    assert_acknowledged_present(acknowledged, read.records, f"the leader of {topic}-0")
    assert_read_once_but_for_retries(cluster3, state.leader, topic, acknowledged, read.records)
    assert list_moving(cluster3) == {}


def _pick_roles(cluster: LocalCluster) -> tuple[int, int, int]:
    """(controller, other, target): the controller and one other broker hold the partition; the
    target broker is neither, so freezing it never freezes the controller."""
    controller = wait_until(cluster.controller_id, TIMEOUT_S, "a controller")
    others = [b for b in cluster.broker_ids if b != controller]
    return controller, others[0], others[1]


def reassign_cli(
    cluster: LocalCluster,
    broker_id: int,
    *args: str,
    targets: dict[int, list[int]] | None = None,
    topic: str = "",
    tmp_path: Path | None = None,
) -> tuple[int, str, str]:
    """`odradek reassign-partitions` in a subprocess, bootstrapped from `broker_id` only."""
    argv = [sys.executable, "-m", "odradek.cli.main", "reassign-partitions"]
    argv += ["--bootstrap-server", cluster.broker(broker_id).bootstrap, *args]
    if targets is not None:
        assert tmp_path is not None
        path = tmp_path / f"reassign-{uuid.uuid4().hex[:6]}.json"
        entries = [{"topic": topic, "partition": p, "replicas": r} for p, r in targets.items()]
        path.write_text(json.dumps({"version": 1, "partitions": entries}))
        argv += ["--reassignment-json-file", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    return done.returncode, done.stdout, done.stderr


def list_on_wire(
    cluster: LocalCluster, broker_id: int
) -> dict[tuple[str, int], tuple[list[int], ...]]:
    answer = request(
        cluster.broker(broker_id), ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, {"topics": None}
    )
    assert answer.error_code == ErrorCode.none, answer
    return {
        (t.name, p.partition_index): (
            list(p.replicas),
            list(p.adding_replicas),
            list(p.removing_replicas),
        )
        for t in answer.topics
        for p in t.partitions
    }


def test_an_unfinished_move_is_listed_and_cancelling_it_restores_the_original_replicas(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(3, shared_zookeeper=True)
    controller, other, target = _pick_roles(cluster)
    running = [controller, other]
    topic = unique_topic("cancel")
    create_topic(cluster, topic, [[other, controller]])
    producer = StreamingProducer(cluster.bootstrap_servers, topic, "c", partition=0).start()
    move = {0: [controller, target]}
    try:
        wait_for_more_acks(producer, 100)
        cluster.stop(target)
        try:
            code, out, err = reassign_cli(
                cluster, controller, "--execute", targets=move, topic=topic, tmp_path=tmp_path
            )
            assert code == 0, err
            assert "Successfully started partition reassignments for " + f"{topic}-0" in out
            assert f'"replicas":[{other},{controller}]' in out  # the rollback JSON
            expected = ([controller, target, other], [target], [other])
            assert list_on_wire(cluster, controller) == {(topic, 0): expected}
            code, out, err = reassign_cli(cluster, controller, "--list")
            assert code == 0, err
            assert (
                f"{topic}-0: replicas: {controller},{target},{other}. adding: {target}."
                f" removing: {other}."
            ) in out
            assignment = zk_topic(cluster, topic)
            assert assignment is not None
            assert assignment.partitions[0] == ReplicaAssignment(
                (controller, target, other), (target,), (other,)
            )
            wait_for_more_acks(producer, 50)  # the frozen target holds nothing up
            code, out, err = reassign_cli(
                cluster, controller, "--verify", targets=move, topic=topic, tmp_path=tmp_path
            )
            assert (code, f"Reassignment of partition {topic}-0 is still in progress.") == (
                0,
                out.splitlines()[-1],
            ), err
            code, out, err = reassign_cli(
                cluster, controller, "--cancel", targets=move, topic=topic, tmp_path=tmp_path
            )
            assert code == 0, err
            # The original replicas, in the order RS keeps them: as in Kafka, the order before
            # the move cannot be recovered from RS, AR and RR (the target comes first in RS).
            wait_for_completed_move(cluster, topic, 0, [controller, other], brokers=running)
            assert list_on_wire(cluster, controller) == {}
            code, out, err = reassign_cli(
                cluster, controller, "--cancel", targets=move, topic=topic, tmp_path=tmp_path
            )
            assert code == 1 and err.startswith("odradek: error: NO_REASSIGNMENT_IN_PROGRESS"), err
            assert len(err.strip().splitlines()) == 1, err
            code, out, err = reassign_cli(
                cluster, controller, "--verify", targets=move, topic=topic, tmp_path=tmp_path
            )
            assert code == 1 and "rather than" in out, (out, err)
        finally:
            cluster.cont(target)
        wait_for_more_acks(producer, 50)
    except BaseException:
        producer.abandon()
        raise
    assert_leader_holds_acknowledged(cluster, producer, topic)


def assert_leader_holds_acknowledged(
    cluster: LocalCluster, producer: StreamingProducer, topic: str
) -> None:
    """Stop `producer`; every record it had acknowledged on partition 0 is on the current leader."""
    deliveries = producer.stop()
    assert not deliveries.failed, deliveries.failed[:5]
    state = zk_partition_state(cluster, topic, 0)
    read = read_committed(cluster.broker(state.leader), topic, 0)
    assert_acknowledged_present(
        deliveries.acknowledged_by_partition()[0], read.records, f"the leader of {topic}-0"
    )


def test_a_new_controller_finishes_a_move_the_killed_controller_started(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(3, shared_zookeeper=True)
    controller, other, target = _pick_roles(cluster)
    topic = unique_topic("failover")
    create_topic(cluster, topic, [[other, controller]])
    producer = StreamingProducer(cluster.bootstrap_servers, topic, "f", partition=0).start()
    try:
        wait_for_more_acks(producer, 100)
        cluster.stop(target)
        try:
            code, _out, err = reassign_cli(
                cluster,
                controller,
                "--execute",
                targets={0: [other, target]},
                topic=topic,
                tmp_path=tmp_path,
            )
            assert code == 0, err
            assignment = zk_topic(cluster, topic)
            assert assignment is not None
            assert assignment.partitions[0] == ReplicaAssignment(
                (other, target, controller), (target,), (controller,)
            )
            cluster.kill(controller)
            wait_until(
                lambda: cluster.controller_id() == other, TIMEOUT_S, f"broker {other} to lead"
            )
        finally:
            cluster.cont(target)
        wait_for_completed_move(cluster, topic, 0, [other, target])
        assert_new_replica_matches_leader(cluster, topic, [other, target])
        wait_for_more_acks(producer, 50)
    except BaseException:
        producer.abandon()
        raise
    assert_leader_holds_acknowledged(cluster, producer, topic)


def test_a_topic_deleted_mid_move_is_deleted_once_the_move_is_over(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """Kafka makes a topic with a move in progress ineligible for deletion; the deletion must go
    on (not wait forever) once the move completes."""
    cluster = make_cluster(3, shared_zookeeper=True)
    controller, other, target = _pick_roles(cluster)
    topic = unique_topic("delete")
    create_topic(cluster, topic, [[other, controller]])
    cluster.stop(target)
    try:
        code, _out, err = reassign_cli(
            cluster,
            controller,
            "--execute",
            targets={0: [other, target]},
            topic=topic,
            tmp_path=tmp_path,
        )
        assert code == 0, err
        queue_deletion(cluster, topic)  # what DeleteTopics does on any broker
        wait_until(
            lambda: any(
                "topics queued for deletion" in line and topic in line
                for line in cluster.broker(controller).log.read_text().splitlines()
            ),
            TIMEOUT_S,
            "the controller to queue the deletion",
        )
        assignment = zk_topic(cluster, topic)
        assert assignment is not None and assignment.partitions[0].adding_replicas == (target,)
    finally:
        cluster.cont(target)
    wait_until(lambda: zk_topic(cluster, topic) is None, TIMEOUT_S, f"{topic} to be deleted")
    assert list_on_wire(cluster, cluster.controller_id()) == {}


def test_refused_reassignments_get_kafkas_error_codes(cluster3: LocalCluster) -> None:
    topic = unique_topic("refused")
    create_topic(cluster3, topic, [[1, 2]])
    results = alter(
        cluster3,
        {
            (topic, 0): [1, 1],
            (topic, 5): [1, 2],
            (unique_topic("missing"), 0): [1, 2],
        },
    )
    codes = {tp: getattr(error, "errno", None) for tp, error in results.items()}
    assert codes[(topic, 0)] == ErrorCode.invalid_replica_assignment
    assert codes[(topic, 5)] == ErrorCode.unknown_topic_or_partition
    assert len([c for c in codes.values() if c == ErrorCode.unknown_topic_or_partition]) == 2
    unknown_broker = alter(cluster3, {(topic, 0): [1, 42]})
    assert (
        getattr(unknown_broker[(topic, 0)], "errno", None) == ErrorCode.invalid_replica_assignment
    )
    assert zk_topic(cluster3, topic).partitions[0] == ReplicaAssignment((1, 2))  # type: ignore[union-attr]
    controller = cluster3.controller_id()
    not_controller = next(b for b in cluster3.broker_ids if b != controller)
    empty = request(
        cluster3.broker(controller),
        ApiKey.ALTER_PARTITION_REASSIGNMENTS,
        0,
        {"topics": [{"name": topic, "partitions": [{"partition_index": 0, "replicas": []}]}]},
    )
    assert empty.responses[0].partitions[0].error_code == ErrorCode.invalid_replica_assignment
    for api_key, values in (
        (
            ApiKey.ALTER_PARTITION_REASSIGNMENTS,
            {"topics": [{"name": topic, "partitions": [{"partition_index": 0, "replicas": [2]}]}]},
        ),
        (ApiKey.LIST_PARTITION_REASSIGNMENTS, {"topics": None}),
    ):
        answer = request(cluster3.broker(not_controller), api_key, 0, values)
        assert answer.error_code == ErrorCode.not_controller, answer
    # the znode trigger: refused entries are dropped from it (and the emptied znode deleted)
    write_reassign_znode(cluster3, {(topic, 0): [2, 2], (topic, 7): [1, 2]})
    wait_until(
        lambda: not reassign_znode_exists(cluster3),
        TIMEOUT_S,
        "the refused /admin/reassign_partitions to be deleted",
    )
    assert zk_topic(cluster3, topic).partitions[0] == ReplicaAssignment((1, 2))  # type: ignore[union-attr]


@pytest.fixture(autouse=True)
def _quiet_kafka_python() -> None:
    logging.getLogger("kafka").setLevel(logging.WARNING)
