"""Preferred-replica leader election and automatic leader rebalancing on real brokers, a real
ZooKeeper and real clients.

Every test starts from the situation elections exist for: a six-partition RF=3 topic whose
partitions prefer each broker twice (`ASSIGNMENT`), some records written with acks=all, then one
broker that is not the controller restarted with a controlled shutdown, so that the partitions it
preferred are led by others; the test waits until it is back in every ISR. Then leadership must
move back:

* through confluent-kafka's `AdminClient.elect_leaders` (ElectLeaders, routed by librdkafka to the
  controller): the displaced partitions answer success, the others ELECTION_NOT_NEEDED, an unknown
  partition UNKNOWN_TOPIC_OR_PARTITION; a second call answers ELECTION_NOT_NEEDED everywhere, and
  "all partitions" (null) answers nothing at all;
* an UNCLEAN election gives an offline partition (its only ISR member down, unclean election off
  for the topic) the live replica outside the ISR, and it serves the records it had replicated;
* on the wire, ElectLeaders answers as Kafka does: NOT_CONTROLLER from any other broker, v0 (no
  election type) is PREFERRED, timeout 0 still elects, an unknown election type is INVALID_REQUEST, a preferred replica
  that is down is PREFERRED_LEADER_NOT_AVAILABLE, and UNCLEAN on led partitions is not needed;
* through `/admin/preferred_replica_election`, which the controller deletes once done;
* through `odradek leader-election` (the three ways of naming partitions, and its errors);
* by itself, on a cluster started with `leader.imbalance.check.interval.seconds=2`.

After every move ZooKeeper's partition state has the preferred leader one leader epoch later with
the ISR unchanged, the partitions that did not move are untouched, every broker's Metadata agrees
with ZooKeeper, and the acknowledged records are read back from the new leaders. The first four
run on one cluster with `auto.leader.rebalance.enable=false`, so that nothing but the trigger under
test can move a leader.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ElectionType, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from odradek.testing import LocalCluster
from odradek.zk.client import ZkClient
from odradek.zk.znodes import LeaderIsrAndControllerEpoch, PreferredReplicaElectionZNode
from odradek.zk.znodes import TopicPartition as ZkTopicPartition
from tests.fixtures.cluster import START_TIMEOUT_S, _bring_down, _used_clusters, wait_until
from tests.integration._controller import (
    MetadataView,
    request,
    wait_for_agreement,
    zk_call,
    zk_controller,
    zk_exists,
    zk_partition_states,
)
from tests.integration._replication import (
    AckedProducer,
    Deliveries,
    assert_acknowledged_present,
    create_topic,
    read_committed,
    unique_topic,
)

TIMEOUT_S = 60.0
CLI_TIMEOUT_S = 90.0
ASSIGNMENT = [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 3, 2], [2, 1, 3], [3, 2, 1]]
PARTITIONS = range(len(ASSIGNMENT))
ELECT_LEADERS_VERSION = 2
RECORDS = 60

States = dict[int, LeaderIsrAndControllerEpoch]


@pytest.fixture(scope="module")
def manual_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three brokers that never rebalance leaders by themselves, shared by this module's tests
    (each uses its own topic and leaves all three brokers running)."""
    cluster = LocalCluster.up(
        tmp_path_factory.mktemp("preferred-election"),
        3,
        overrides={"auto.leader.rebalance.enable": "false"},
        timeout=START_TIMEOUT_S,
    )
    try:
        yield cluster
    finally:
        _bring_down(cluster)


@pytest.fixture
def cluster(manual_cluster: LocalCluster, request: pytest.FixtureRequest) -> LocalCluster:
    """The module's cluster, named in this test's failure report (broker log tails)."""
    _used_clusters(request.node).append(manual_cluster)
    return manual_cluster


# ---------------------------------------------------------------------------------------------
# Helpers


def _preferred(partition: int) -> int:
    return ASSIGNMENT[partition][0]


def _states(cluster: LocalCluster, topic: str) -> States:
    states = zk_partition_states(cluster, topic, PARTITIONS)
    assert sorted(states) == list(PARTITIONS), states
    return states


def _not_controller(cluster: LocalCluster) -> int:
    controller = zk_controller(cluster).broker_id
    return next(b for b in cluster.broker_ids if b != controller)


def _displaced_topic(cluster: LocalCluster, prefix: str) -> tuple[str, int, States, Deliveries]:
    """Create the topic, write records, restart a broker that is not the controller (controlled
    shutdown) and wait until it is back in every ISR. Returns the topic, the restarted broker,
    the partition states then (its preferred partitions led by others), and the deliveries."""
    topic = unique_topic(prefix)
    create_topic(cluster, topic, ASSIGNMENT)
    deliveries = AckedProducer(cluster.bootstrap_servers, acks="all").send(
        topic, [b"record-%d" % i for i in range(RECORDS)], keyed=True
    )
    assert not deliveries.failed, deliveries.failed
    victim = _not_controller(cluster)
    cluster.restart(victim, timeout=TIMEOUT_S)
    wait_until(
        lambda: all(sorted(s.isr) == [1, 2, 3] for s in _states(cluster, topic).values()),
        TIMEOUT_S,
        f"broker {victim} to rejoin every ISR of {topic}",
    )
    states = _states(cluster, topic)
    for partition, state in states.items():
        if _preferred(partition) == victim:
            assert state.leader != victim, f"{topic}-{partition} still led by {victim}: {state}"
        else:
            assert state.leader == _preferred(partition), f"{topic}-{partition}: {state}"
    return topic, victim, states, deliveries


def _moved(victim: int) -> list[int]:
    return [p for p in PARTITIONS if _preferred(p) == victim]


def _assert_elected(
    cluster: LocalCluster, topic: str, before: States, moved: Sequence[int]
) -> None:
    """ZooKeeper: moved partitions led by their preferred replica one epoch later, same ISR;
    the others untouched. Every broker's Metadata says the same; the records are all there."""
    after = _states(cluster, topic)
    for partition in PARTITIONS:
        old, new = before[partition], after[partition]
        if partition in moved:
            assert new.leader == _preferred(partition), (partition, old, new)
            assert new.leader_epoch == old.leader_epoch + 1, (partition, old, new)
            assert new.isr == old.isr, (partition, old, new)
        else:
            assert new == old, (partition, old, new)

    def agrees_with_zookeeper(view: MetadataView) -> bool:
        info = view.topic(topic)
        return info is not None and all(
            (p.leader, p.leader_epoch, sorted(p.isr))
            == (after[i].leader, after[i].leader_epoch, sorted(after[i].isr))
            for i, p in info.partitions.items()
        )

    wait_for_agreement(
        cluster, [topic], agrees_with_zookeeper, timeout=TIMEOUT_S, what="the new leaders"
    )


def _assert_records_readable(cluster: LocalCluster, topic: str, deliveries: Deliveries) -> None:
    for partition, acked in deliveries.acknowledged_by_partition().items():
        leader = cluster.broker(_preferred(partition))
        answer = read_committed(leader, topic, partition)
        assert answer.error == ErrorCode.none, answer.error
        assert_acknowledged_present(acked, answer.records, f"the new leader of {topic}-{partition}")


def _admin(cluster: LocalCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap_servers})


def _codes(results: Mapping[TopicPartition, Any]) -> dict[tuple[str, int], str | None]:
    """confluent-kafka's per-partition results as {(topic, partition): error name or None}."""
    names: dict[tuple[str, int], str | None] = {}
    for tp, error in results.items():
        if isinstance(error, KafkaException):
            error = error.args[0]
        names[(tp.topic, tp.partition)] = None if error is None else error.name()
    return names


def _elect_leaders_wire(
    cluster: LocalCluster,
    broker_id: int,
    partitions: Mapping[str, Sequence[int]] | None,
    version: int = ELECT_LEADERS_VERSION,
    election_type: int = 0,
    timeout_ms: int = 30_000,
) -> tuple[int, dict[tuple[str, int], int]]:
    """One ElectLeaders request to one broker: (top-level error, {partition: error code})."""
    response = request(
        cluster.broker(broker_id),
        ApiKey.ELECT_LEADERS,
        version,
        {
            "election_type": election_type,
            "topic_partitions": None
            if partitions is None
            else [{"topic": t, "partitions": list(p)} for t, p in partitions.items()],
            "timeout": timeout_ms,
        },
        timeout=45.0,
    )
    codes = {
        (str(r.topic), int(p.partition_id)): int(p.error_code)
        for r in response.replica_election_results
        for p in r.partition_result
    }
    return int(getattr(response, "error_code", 0)), codes


def _odradek(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "odradek.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


# ---------------------------------------------------------------------------------------------
# The ElectLeaders API


def test_elect_leaders_moves_preferred_leaders_back_and_a_second_call_is_not_needed(
    cluster: LocalCluster,
) -> None:
    topic, victim, before, deliveries = _displaced_topic(cluster, "elect-api")
    moved = _moved(victim)
    admin = _admin(cluster)
    asked = [TopicPartition(topic, p) for p in PARTITIONS] + [TopicPartition("no-such-topic", 0)]

    first = admin.elect_leaders(ElectionType.PREFERRED, asked).result(TIMEOUT_S)
    assert _codes(first) == {
        **{(topic, p): None if p in moved else "ELECTION_NOT_NEEDED" for p in PARTITIONS},
        ("no-such-topic", 0): "UNKNOWN_TOPIC_OR_PART",
    }
    _assert_elected(cluster, topic, before, moved)
    _assert_records_readable(cluster, topic, deliveries)

    after = _states(cluster, topic)
    second = admin.elect_leaders(ElectionType.PREFERRED, asked[:-1]).result(TIMEOUT_S)
    assert _codes(second) == {(topic, p): "ELECTION_NOT_NEEDED" for p in PARTITIONS}
    # Null partitions: every partition of the cluster, and those not needing an election are
    # left out of the answer.
    assert admin.elect_leaders(ElectionType.PREFERRED, None).result(TIMEOUT_S) == {}
    assert _states(cluster, topic) == after, "an election that was not needed wrote anyway"


def test_elect_leaders_on_the_wire_answers_each_partition_as_kafka_does(
    cluster: LocalCluster,
) -> None:
    topic, victim, before, _ = _displaced_topic(cluster, "elect-wire")
    moved = _moved(victim)
    controller = zk_controller(cluster).broker_id
    assert controller is not None
    others = [b for b in cluster.broker_ids if b != controller]
    everything = {topic: list(PARTITIONS)}

    # Only the controller elects.
    for broker_id in others:
        top, codes = _elect_leaders_wire(cluster, broker_id, everything)
        assert (top, set(codes.values())) == (ErrorCode.none, {ErrorCode.not_controller})
        assert sorted(codes) == [(topic, p) for p in PARTITIONS]
    # An election type that does not exist.
    top, codes = _elect_leaders_wire(cluster, controller, everything, election_type=7)
    assert (top, set(codes.values())) == (ErrorCode.invalid_request, {ErrorCode.invalid_request})
    assert _states(cluster, topic) == before

    # UNCLEAN: every partition has a live leader.
    top, codes = _elect_leaders_wire(cluster, controller, everything, election_type=1)
    assert codes == {(topic, p): ErrorCode.election_not_needed for p in PARTITIONS}

    # v0 has no election type: preferred. Timeout 0 still elects (as in Kafka): it only gives
    # up waiting for the new leaders to reach the metadata.
    top, codes = _elect_leaders_wire(cluster, controller, everything, version=0, timeout_ms=0)
    for p in PARTITIONS:
        if p in moved:
            assert codes[(topic, p)] in (ErrorCode.none, ErrorCode.request_timed_out), codes
        else:
            assert codes[(topic, p)] == ErrorCode.election_not_needed, codes
    _assert_elected(cluster, topic, before, moved)

    # A preferred replica that is down (clean shutdown: it left every ISR first).
    down = others[0]
    cluster.terminate(down, timeout=TIMEOUT_S)
    try:
        wait_until(
            lambda: all(s.leader != down for s in _states(cluster, topic).values()),
            TIMEOUT_S,
            f"the partitions of {topic} to be led by brokers other than {down}",
        )
        top, codes = _elect_leaders_wire(cluster, controller, {topic: _moved(down)})
        assert codes == {(topic, p): ErrorCode.preferred_leader_not_available for p in _moved(down)}
    finally:
        cluster.start_broker(down, timeout=TIMEOUT_S)


def test_unclean_election_gives_an_offline_partition_a_leader_outside_the_isr(
    cluster: LocalCluster,
) -> None:
    """AR [a, b], unclean election off: b stops (leaves the ISR), then a (the last ISR member:
    the partition goes offline). b returns but stays out of the ISR, so the partition stays
    offline; a PREFERRED election cannot help (a is down); UNCLEAN makes b leader with ISR [b],
    and b serves what it had replicated."""
    controller = zk_controller(cluster).broker_id
    a, b = (broker for broker in cluster.broker_ids if broker != controller)
    topic = unique_topic("elect-unclean")
    create_topic(cluster, topic, [[a, b]])
    deliveries = AckedProducer(cluster.bootstrap_servers, acks="all").send(
        topic, [b"record-%d" % i for i in range(RECORDS)], partition=0
    )
    assert not deliveries.failed, deliveries.failed
    cluster.terminate(b, timeout=TIMEOUT_S)
    cluster.terminate(a, timeout=TIMEOUT_S)
    try:
        offline = wait_until(
            lambda: (s := zk_partition_states(cluster, topic, [0])[0]).leader == -1 and s,
            TIMEOUT_S,
            f"{topic}-0 to go offline",
        )
        assert offline.isr == (a,)
        cluster.start_broker(b, timeout=TIMEOUT_S)

        def b_live_and_partition_offline(view: MetadataView) -> bool:
            info = view.topic(topic)
            return b in view.broker_ids and info is not None and info.partitions[0].leader == -1

        wait_for_agreement(
            cluster,
            [topic],
            b_live_and_partition_offline,
            broker_ids=[controller, b],
            timeout=TIMEOUT_S,
            what=f"broker {b} back and {topic}-0 still offline",
        )
        admin = _admin(cluster)
        tp = TopicPartition(topic, 0)
        preferred = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(TIMEOUT_S)
        assert _codes(preferred) == {(topic, 0): "PREFERRED_LEADER_NOT_AVAILABLE"}
        unclean = admin.elect_leaders(ElectionType.UNCLEAN, [tp]).result(TIMEOUT_S)
        assert _codes(unclean) == {(topic, 0): None}

        elected = zk_partition_states(cluster, topic, [0])[0]
        assert (elected.leader, elected.isr) == (b, (b,))
        assert elected.leader_epoch == offline.leader_epoch + 1
        wait_for_agreement(
            cluster,
            [topic],
            lambda view: (
                (p := view.topic(topic)) is not None
                and (p.partitions[0].leader, p.partitions[0].leader_epoch)
                == (b, elected.leader_epoch)
            ),
            broker_ids=[controller, b],
            timeout=TIMEOUT_S,
            what=f"{b} leading {topic}-0",
        )
        answer = read_committed(cluster.broker(b), topic, 0)
        assert answer.error == ErrorCode.none, answer.error
        acked = deliveries.acknowledged_by_partition()[0]
        assert_acknowledged_present(acked, answer.records, f"the unclean leader {b}")
    finally:
        for broker_id in (b, a):
            cluster.start_broker(broker_id, timeout=TIMEOUT_S)


# ---------------------------------------------------------------------------------------------
# /admin/preferred_replica_election


def test_preferred_replica_election_znode_moves_leaders_back_and_is_deleted(
    cluster: LocalCluster,
) -> None:
    topic, victim, before, deliveries = _displaced_topic(cluster, "elect-znode")
    moved = _moved(victim)
    path = PreferredReplicaElectionZNode.path()
    # Kafka's JSON, as its old preferred-replica election tool writes it; every partition of the
    # topic and one that does not exist (skipped).
    requested = [ZkTopicPartition(topic, p) for p in PARTITIONS]
    requested.append(ZkTopicPartition("no-such-topic", 3))
    payload = PreferredReplicaElectionZNode.encode(requested)
    assert json.loads(payload)["version"] == 1

    async def write(zk: ZkClient) -> None:
        await zk.create(path, payload, makepath=True)

    zk_call(cluster, write)
    wait_until(
        lambda: not zk_exists(cluster, [path])[path],
        TIMEOUT_S,
        f"the controller to delete {path}",
    )
    _assert_elected(cluster, topic, before, moved)
    _assert_records_readable(cluster, topic, deliveries)


# ---------------------------------------------------------------------------------------------
# odradek leader-election


def test_cli_leader_election(cluster: LocalCluster, tmp_path: Path) -> None:
    topic, victim, before, _ = _displaced_topic(cluster, "elect-cli")
    moved = _moved(victim)
    bootstrap = cluster.broker(_not_controller(cluster)).bootstrap  # found the controller itself
    election_file = tmp_path / "election.json"
    election_file.write_text(
        json.dumps({"partitions": [{"topic": topic, "partition": p} for p in PARTITIONS]})
    )
    base = ("leader-election", "--bootstrap-server", bootstrap, "--election-type")

    result = _odradek(*base, "preferred", "--path-to-json-file", str(election_file))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "Successfully completed leader election (PREFERRED) for partitions "
        + ", ".join(f"{topic}-{p}" for p in moved),
        "Valid replica already elected for partitions "
        + ", ".join(f"{topic}-{p}" for p in PARTITIONS if p not in moved),
    ]
    _assert_elected(cluster, topic, before, moved)

    one = _odradek(*base, "PREFERRED", "--topic", topic, "--partition", "0")
    assert (one.returncode, one.stdout) == (
        0,
        f"Valid replica already elected for partitions {topic}-0\n",
    ), one.stderr
    everything = _odradek(*base, "unclean", "--all-topic-partitions")
    assert (everything.returncode, everything.stdout) == (0, ""), everything.stderr

    missing = _odradek(*base, "preferred", "--topic", "no-such-topic", "--partition", "0")
    assert missing.returncode == 1
    assert missing.stdout.startswith(
        "Error completing leader election (PREFERRED) for partition: no-such-topic-0: "
        "UNKNOWN_TOPIC_OR_PARTITION"
    ), missing.stdout
    assert missing.stderr == "odradek: error: 1 replica(s) could not be elected\n"

    election_file.write_text('{"partitions": [{"topic": "t"}]}')
    bad = _odradek(*base, "preferred", "--path-to-json-file", str(election_file))
    assert bad.returncode == 1
    assert bad.stderr.startswith("odradek: error: ") and bad.stderr.count("\n") == 1, bad.stderr


# ---------------------------------------------------------------------------------------------
# auto.leader.rebalance.enable


def test_leaders_move_back_by_themselves_with_auto_rebalance(make_cluster: Any) -> None:
    cluster = make_cluster(3, leader_imbalance_check_interval_seconds=2)
    topic = unique_topic("auto-rebalance")
    create_topic(cluster, topic, ASSIGNMENT)
    deliveries = AckedProducer(cluster.bootstrap_servers, acks="all").send(
        topic, [b"record-%d" % i for i in range(RECORDS)], keyed=True
    )
    created = _states(cluster, topic)
    victim = _not_controller(cluster)
    cluster.terminate(victim, timeout=TIMEOUT_S)
    # While it is down nothing can move back to it: these are the displaced leaders.

    def moved_away() -> States | None:
        states = _states(cluster, topic)
        return states if all(s.leader != victim for s in states.values()) else None

    displaced = wait_until(moved_away, TIMEOUT_S, f"the leaderships of {victim} to move away")
    cluster.start_broker(victim, timeout=TIMEOUT_S)

    def rebalanced() -> States | None:
        states = _states(cluster, topic)
        if all(s.leader == _preferred(p) and sorted(s.isr) == [1, 2, 3] for p, s in states.items()):
            return states
        return None

    after = wait_until(rebalanced, TIMEOUT_S, f"the leaders of {topic} to return by themselves")
    for partition in _moved(victim):
        assert after[partition].leader_epoch > displaced[partition].leader_epoch, partition
    for partition in PARTITIONS:
        if partition not in _moved(victim):
            assert after[partition].leader == created[partition].leader, partition

    def agrees_with_zookeeper(view: MetadataView) -> bool:
        info = view.topic(topic)
        return info is not None and all(
            (p.leader, p.leader_epoch) == (after[i].leader, after[i].leader_epoch)
            for i, p in info.partitions.items()
        )

    wait_for_agreement(cluster, [topic], agrees_with_zookeeper, timeout=TIMEOUT_S)
    _assert_records_readable(cluster, topic, deliveries)
    controller = zk_controller(cluster).broker_id
    assert controller is not None
    log_text = cluster.broker(controller).log.read_text(errors="replace")
    assert "leader imbalance above the threshold" in log_text
