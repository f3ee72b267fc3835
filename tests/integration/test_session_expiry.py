"""ZooKeeper session expiry of a broker, for real: the broker is frozen with SIGSTOP for longer than
zookeeper.session.timeout.ms, so ZooKeeper expires its session and deletes its ephemeral znodes,
exactly as after a long GC pause or a stalled VM. (`expire_session` from the fixtures would need
the session's password, which only the broker process holds.)

* *A follower-and-leader broker.* The controller treats the expiry as a broker failure: the
  partitions it led move to other ISR members, it leaves every ISR. After SIGCONT it learns that
  its session expired, registers again with a new broker epoch (the czxid of
  `/brokers/ids/<id>` grows), and rejoins as a follower: every ISR is full again, it leads nothing,
  its Metadata agrees with the others', and a producer writing with acks=all throughout got
  every record acknowledged and readable.
* *The controller.* Another broker wins the election (controller epoch + 1); the frozen one, once
  resumed, resigns (its log says so), re-registers with a new epoch and stays an ordinary broker:
  `/controller` and the epoch do not move again, and it learns the new controller.
* *The GC-pause zombie.* A leader of three partitions is frozen past its session; the controller
  elects new leaders. While it is still frozen, acks=all Produce requests for each partition are
  written into raw connections to it alone, so they are the first thing it reads when SIGCONT
  wakes it, before it has heard of its expiry: each is answered with an error (or never), none is
  acknowledged. Whatever it tries to write to ZooKeeper (an ISR shrink) fails on the znode
  version, so the partition states keep the controller's leaders and leader epochs; it follows the
  new leaders, truncates what only it accepted, and ends byte-identical to them; nothing a client
  got acknowledged is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from odradek.testing import LocalCluster
from odradek.zk.znodes import LeaderIsrAndControllerEpoch
from tests.fixtures.cluster import wait_until
from tests.integration import _wire
from tests.integration._replication import (
    METADATA_VERSION,
    Deliveries,
    StreamingProducer,
    assert_acknowledged_present,
    create_topic,
    encode_values,
    read_committed,
    records_of,
    request,
    unique_topic,
    wait_for_identical_replicas,
    zk_partition_state,
)

SESSION_TIMEOUT_MS = 6000
LAG_TIME_MS = 3000
TIMEOUT_S = 60.0
# From SIGSTOP until ZooKeeper expires the session and the controller has acted on it.
EXPIRY_TIMEOUT_S = SESSION_TIMEOUT_MS / 1000 + 25
STREAM_SETTINGS = {
    # A frozen leader never answers: give up on a request after 5 s and look for the new leader.
    "request_timeout_ms": 5000,
    "socket_timeout_ms": 5000,
}
ZOMBIE_ANSWER_TIMEOUT_S = 30.0


def _cluster(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    return make_cluster(
        brokers=3,
        min_insync_replicas=2,
        replica_lag_time_max_ms=LAG_TIME_MS,
        zookeeper_session_timeout_ms=SESSION_TIMEOUT_MS,
    )


def _registration(cluster: LocalCluster, broker_id: int) -> dict[str, Any]:
    return next(b for b in cluster.status()["brokers"] if b["id"] == broker_id)


def _controller(cluster: LocalCluster) -> dict[str, Any] | None:
    controller: dict[str, Any] | None = cluster.status()["controller"]
    return controller


def _controller_other_than(cluster: LocalCluster, broker_id: int) -> dict[str, Any] | None:
    controller = _controller(cluster)
    return controller if controller is not None and controller["id"] != broker_id else None


def _registered_again(cluster: LocalCluster, broker_id: int) -> dict[str, Any] | None:
    registration = _registration(cluster, broker_id)
    return registration if registration["registered"] else None


def _metadata_controller(cluster: LocalCluster, broker_id: int) -> int:
    response = request(
        cluster.broker(broker_id),
        ApiKey.METADATA,
        METADATA_VERSION,
        {"topics": [], "allow_auto_topic_creation": False},
    )
    return int(response.controller_id)


def _full_isr(cluster: LocalCluster, topic: str) -> bool:
    entry = cluster.status()["topics"].get(topic)
    return entry is not None and entry["under_replicated"] == 0 and entry["offline"] == 0


def _assert_acknowledged_everywhere(
    cluster: LocalCluster, topic: str, deliveries: Deliveries
) -> None:
    for partition, acked in deliveries.acknowledged_by_partition().items():
        state = zk_partition_state(cluster, topic, partition)
        read = read_committed(cluster.broker(state.leader), topic, partition)
        assert read.error == ErrorCode.none, read.error
        assert_acknowledged_present(acked, read.records, f"the leader of {topic}-{partition}")
        common = wait_for_identical_replicas(
            cluster, list(state.isr), topic, partition, TIMEOUT_S, min_end_offset=max(acked) + 1
        )
        assert_acknowledged_present(acked, records_of(common), f"{topic}-{partition} replicas")


def _wait_expired_and_moved(
    cluster: LocalCluster, broker_id: int, topic: str, partitions: int
) -> list[LeaderIsrAndControllerEpoch]:
    """Wait until ZooKeeper lost the broker's registration and the controller moved it out of
    every leadership and ISR of `topic`; returns the partition states then."""
    wait_until(
        lambda: not _registration(cluster, broker_id)["registered"],
        EXPIRY_TIMEOUT_S,
        f"the session of broker {broker_id} to expire",
    )

    def moved() -> list[LeaderIsrAndControllerEpoch] | None:
        states = [zk_partition_state(cluster, topic, p) for p in range(partitions)]
        if all(s.leader not in (broker_id, -1) and broker_id not in s.isr for s in states):
            return states
        return None

    found = wait_until(
        moved,
        EXPIRY_TIMEOUT_S,
        f"the controller to move broker {broker_id} out of every leadership and ISR",
    )
    assert found is not None
    return found


def test_a_broker_frozen_past_its_session_is_failed_and_rejoins_with_a_new_broker_epoch(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = _cluster(make_cluster)
    controller = cluster.controller_id()
    victim = next(b for b in cluster.broker_ids if b != controller)
    first, second = (b for b in cluster.broker_ids if b != victim)
    assignment = [
        [victim, first, second],
        [first, victim, second],
        [victim, second, first],
        [second, first, victim],
    ]
    topic = unique_topic("expired")
    create_topic(cluster, topic, assignment)
    epoch_before = _registration(cluster, victim)["broker_epoch"]
    log_size = cluster.broker(victim).log.stat().st_size

    stream = StreamingProducer(
        cluster.bootstrap_servers, topic, "exp", acks="all", **STREAM_SETTINGS
    ).start()
    try:
        wait_until(lambda: stream.acknowledged_count() >= 300, TIMEOUT_S, "300 acknowledged")
        cluster.stop(victim)
        moved = _wait_expired_and_moved(cluster, victim, topic, len(assignment))
        cluster.cont(victim)
        registration = wait_until(
            lambda: _registered_again(cluster, victim),
            TIMEOUT_S,
            f"broker {victim} to register again",
        )
        assert registration is not None
        wait_until(lambda: _full_isr(cluster, topic), TIMEOUT_S, f"broker {victim} in every ISR")
        acknowledged = stream.acknowledged_count()
        wait_until(
            lambda: stream.acknowledged_count() >= acknowledged + 300,
            TIMEOUT_S,
            "300 more acknowledged after the broker's return",
        )
    except BaseException:
        stream.abandon()
        raise
    deliveries = stream.stop()

    # A new broker epoch: the registration is a new znode, created after the old one.
    assert registration["broker_epoch"] > epoch_before
    log_text = cluster.broker(victim).log.read_bytes()[log_size:].decode(errors="replace")
    assert "ZooKeeper session expired" in log_text
    assert f"with broker epoch {registration['broker_epoch']}" in log_text
    # It came back as a follower: the leaders chosen during its absence still lead.
    for partition, state in enumerate(moved):
        now = zk_partition_state(cluster, topic, partition)
        assert now.leader == state.leader and now.leader != victim, (partition, state, now)
        assert victim in now.isr
    views = request(
        cluster.broker(victim),
        ApiKey.METADATA,
        METADATA_VERSION,
        {"topics": [{"name": topic, "topic_id": None}], "allow_auto_topic_creation": False},
    )
    leaders = {p.partition_index: p.leader_id for p in views.topics[0].partitions}
    assert leaders == {p: s.leader for p, s in enumerate(moved)}
    assert not deliveries.failed, deliveries.failed[:5]
    _assert_acknowledged_everywhere(cluster, topic, deliveries)


def test_a_controller_frozen_past_its_session_resigns_and_stays_an_ordinary_broker(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = _cluster(make_cluster)
    before = _controller(cluster)
    assert before is not None
    old = before["id"]
    others = [b for b in cluster.broker_ids if b != old]
    assignment = [[old, *others], [others[0], old, others[1]]]
    topic = unique_topic("controller-expired")
    create_topic(cluster, topic, assignment)
    epoch_before = _registration(cluster, old)["broker_epoch"]
    log_size = cluster.broker(old).log.stat().st_size

    cluster.stop(old)
    elected = wait_until(
        lambda: _controller_other_than(cluster, old),
        EXPIRY_TIMEOUT_S,
        "another broker to become controller",
    )
    assert elected is not None
    assert elected["epoch"] == before["epoch"] + 1
    _wait_expired_and_moved(cluster, old, topic, len(assignment))
    cluster.cont(old)

    registration = wait_until(
        lambda: _registered_again(cluster, old),
        TIMEOUT_S,
        f"broker {old} to register again",
    )
    assert registration is not None
    assert registration["broker_epoch"] > epoch_before
    wait_until(
        lambda: "resigns as controller" in cluster.broker(old).log.read_text(errors="replace"),
        TIMEOUT_S,
        f"broker {old} to resign",
    )
    wait_until(
        lambda: _metadata_controller(cluster, old) == elected["id"],
        TIMEOUT_S,
        f"broker {old} to learn the new controller",
    )
    wait_until(lambda: _full_isr(cluster, topic), TIMEOUT_S, f"broker {old} in every ISR")
    # Nobody took the controller back: the election happened exactly once.
    assert _controller(cluster) == elected
    log_text = cluster.broker(old).log.read_bytes()[log_size:].decode(errors="replace")
    assert f"broker {old} is the controller now" not in log_text
    for broker_id in others:
        assert _metadata_controller(cluster, broker_id) == elected["id"]


def test_a_leader_paused_past_its_session_acknowledges_nothing_after_it_wakes(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = _cluster(make_cluster)
    controller = cluster.controller_id()
    zombie = next(b for b in cluster.broker_ids if b != controller)
    first, second = (b for b in cluster.broker_ids if b != zombie)
    assignment = [[zombie, first, second], [zombie, second, first], [zombie, first, second]]
    topic = unique_topic("gc-pause")
    create_topic(cluster, topic, assignment)
    before = [zk_partition_state(cluster, topic, p) for p in range(len(assignment))]

    stream = StreamingProducer(
        cluster.bootstrap_servers, topic, "acked", acks="all", **STREAM_SETTINGS
    ).start()
    connections: list[tuple[_wire.WireConnection, int]] = []
    try:
        wait_until(lambda: stream.acknowledged_count() >= 300, TIMEOUT_S, "300 acknowledged")
        cluster.stop(zombie)
        deposed = _wait_expired_and_moved(cluster, zombie, topic, len(assignment))
        for old, new in zip(before, deposed, strict=True):
            assert new.leader_epoch > old.leader_epoch
        # Still frozen: its kernel accepts the connections and buffers the requests.
        for partition in range(len(assignment)):
            connection = _wire.WireConnection.to(
                cluster.broker(zombie).bootstrap, timeout=ZOMBIE_ANSWER_TIMEOUT_S
            )
            correlation_id, frame = connection.encode(
                ApiKey.PRODUCE,
                _wire.PRODUCE_VERSION,
                _wire.produce_values(
                    topic, partition, encode_values([b"zombie-%d" % partition]), acks=-1
                ),
            )
            assert connection.send_bytes(frame)
            connections.append((connection, correlation_id))
        cluster.cont(zombie)
        answers: list[ErrorCode | str] = []
        for connection, correlation_id in connections:
            try:
                response = connection.read_response(
                    ApiKey.PRODUCE, _wire.PRODUCE_VERSION, correlation_id, ZOMBIE_ANSWER_TIMEOUT_S
                )
                answers.append(ErrorCode(response.responses[0].partition_responses[0].error_code))
            except (_wire.ConnectionClosed, _wire.NoAnswer) as e:
                answers.append(type(e).__name__)
        acknowledged = stream.acknowledged_count()
        wait_until(
            lambda: stream.acknowledged_count() >= acknowledged + 300,
            TIMEOUT_S,
            "300 more acknowledged through the new leaders",
        )
    except BaseException:
        stream.abandon()
        raise
    finally:
        for connection, _ in connections:
            connection.close()
    deliveries = stream.stop()

    # Not one of the requests the zombie read first was acknowledged.
    assert len(answers) == len(assignment)
    assert ErrorCode.none not in answers, answers
    # Nothing the zombie wrote landed: ZooKeeper holds the controller's leaders and leader
    # epochs (ISR changes by the new leaders keep both).
    for partition, state in enumerate(deposed):
        now = zk_partition_state(cluster, topic, partition)
        assert now.leader == state.leader and now.leader_epoch == state.leader_epoch, now
    wait_until(lambda: _full_isr(cluster, topic), TIMEOUT_S, f"broker {zombie} in every ISR")
    assert not deliveries.failed, deliveries.failed[:5]
    _assert_acknowledged_everywhere(cluster, topic, deliveries)
    # What only the zombie accepted was truncated when it began to follow.
    for partition, replicas in enumerate(assignment):
        common = wait_for_identical_replicas(cluster, replicas, topic, partition, TIMEOUT_S)
        zombie_values = [
            r.value for r in records_of(common) if r.value and r.value.startswith(b"zombie-")
        ]
        assert zombie_values == [], (partition, zombie_values)
