"""A broker SIGKILLed and started again at once reclaims its registration without waiting for its
old ZooKeeper session to expire (issue 19, item 4; `odradek.server.session_reclaim`).

The clusters run with `zookeeper.session.timeout.ms=30000`, so the difference is unambiguous: the
killed process's session cannot expire before two thirds of that timeout have passed since the
kill (kazoo pings every third of it, so ZooKeeper heard from the session at most 10 s before the
kill), so a registration back within 20 s of the kill can only come from the session being closed.

* *A broker that is not the controller* (it leads some partitions and follows others, a producer
  writing acks=all throughout): registered again with a new broker epoch (the znode's czxid) well
  before the session could have expired; its log says it closed its previous process's session;
  the controller handled it as a broker that went and came back (dead then new, or bounced: new
  leaders for what it led, then it follows), it is back in every ISR, a consumer reads through it
  and the producer's records are all acknowledged and on every replica.
* *A corrupt session record* (garbage where the record was): a warning, nothing closed, and the
  broker registers once its old session has expired, as before (session timeout 20 s here).
* *The controller*: `/controller` went with its old session, so another broker (or the restarted
  one) is controller with a higher epoch well before the session timeout, the restarted broker is
  registered with a new epoch, every ISR is whole again and acks=all writes are acknowledged.

What the restarted process must never do (close a session of a process that still runs) is ruled
out by the log directory lock, tested in test_operator_errors.py
(`test_log_dir_in_use_by_a_running_broker`); the unit cases are in
tests/unit/test_broker_registration.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from odradek.server.session_reclaim import SESSION_FILE
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._clients import consume
from tests.integration._replication import (
    METADATA_VERSION,
    Deliveries,
    StreamingProducer,
    assert_acknowledged_present,
    create_topic,
    read_committed,
    records_of,
    request,
    unique_topic,
    wait_for_identical_replicas,
    wait_for_metadata,
    zk_partition_state,
)

SESSION_TIMEOUT_MS = 30_000
# The earliest the killed process's session could expire, counted from the kill.
EARLIEST_EXPIRY_S = SESSION_TIMEOUT_MS / 1000 * 2 / 3
TIMEOUT_S = 90.0
STREAM_SETTINGS = {"request_timeout_ms": 5000, "socket_timeout_ms": 5000}
CLOSED_LINE = re.compile(r"closed session 0x[0-9a-f]+ of our previous process")


def _cluster(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    return make_cluster(
        brokers=3,
        min_insync_replicas=2,
        replica_lag_time_max_ms=3000,
        zookeeper_session_timeout_ms=SESSION_TIMEOUT_MS,
        # Opt-in (see odradek.server.session_reclaim).
        overrides={"zookeeper.session.reclaim.enable": "true"},
    )


def _log_since(cluster: LocalCluster, broker_id: int, offset: int) -> str:
    return cluster.broker(broker_id).log.read_bytes()[offset:].decode(errors="replace")


def _log_size(cluster: LocalCluster, broker_id: int) -> int:
    return cluster.broker(broker_id).log.stat().st_size


def _registered_anew(cluster: LocalCluster, broker_id: int, before: int) -> int | None:
    epoch = cluster.registered_epochs().get(broker_id)
    return epoch if epoch is not None and epoch != before else None


def _kill_and_restart(cluster: LocalCluster, broker_id: int) -> tuple[int, float]:
    """SIGKILL the broker, start it again at once; its new broker epoch and the seconds from the
    kill until it was registered again."""
    before = cluster.registered_epochs()[broker_id]
    killed_at = time.monotonic()
    assert cluster.kill(broker_id)
    cluster.start_broker(broker_id, wait=False)
    epoch = wait_until(
        lambda: _registered_anew(cluster, broker_id, before),
        TIMEOUT_S,
        f"broker {broker_id} to register again",
    )
    return epoch, time.monotonic() - killed_at


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
    assert not deliveries.failed, deliveries.failed[:5]
    for partition, acked in deliveries.acknowledged_by_partition().items():
        state = zk_partition_state(cluster, topic, partition)
        read = read_committed(cluster.broker(state.leader), topic, partition)
        assert read.error == ErrorCode.none, read.error
        assert_acknowledged_present(acked, read.records, f"the leader of {topic}-{partition}")
        common = wait_for_identical_replicas(
            cluster, list(state.isr), topic, partition, TIMEOUT_S, min_end_offset=max(acked) + 1
        )
        assert_acknowledged_present(acked, records_of(common), f"{topic}-{partition} replicas")


def _stream_until(stream: StreamingProducer, count: int, what: str) -> None:
    wait_until(lambda: stream.acknowledged_count() >= count, TIMEOUT_S, what)


def test_a_killed_broker_restarted_at_once_is_back_before_its_session_could_expire(
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
    topic = unique_topic("restarted")
    create_topic(cluster, topic, assignment)
    epoch_before = cluster.registered_epochs()[victim]
    states_before = [zk_partition_state(cluster, topic, p) for p in range(len(assignment))]
    assert controller is not None
    controller_log = _log_size(cluster, controller)
    victim_log = _log_size(cluster, victim)

    stream = StreamingProducer(
        cluster.bootstrap_servers, topic, "restart", acks="all", **STREAM_SETTINGS
    ).start()
    try:
        _stream_until(stream, 300, "300 acknowledged")
        epoch, elapsed = _kill_and_restart(cluster, victim)
        assert elapsed < EARLIEST_EXPIRY_S, f"registered again {elapsed:.1f}s after the kill"
        wait_until(lambda: _full_isr(cluster, topic), TIMEOUT_S, f"broker {victim} in every ISR")
        acknowledged = stream.acknowledged_count()
        _stream_until(stream, acknowledged + 300, "300 more acknowledged after the restart")
    except BaseException:
        stream.abandon()
        raise
    deliveries = stream.stop()

    assert epoch > epoch_before
    restarted = _log_since(cluster, victim, victim_log)
    assert CLOSED_LINE.search(restarted), "the restarted broker did not close its old session"
    assert f"with broker epoch {epoch}" in restarted
    # The controller saw it go and come back: its leaderships moved to ISR members at new leader
    # epochs, then it rejoined as follower (every ISR is whole again above).
    changes = re.findall(
        r"brokers changed: new \[(.*?)\], dead \[(.*?)\], bounced \[(.*?)\]",
        _log_since(cluster, controller, controller_log),
    )
    went = any(
        str(victim) in dead.split(", ") or str(victim) in bounced.split(", ")
        for _new, dead, bounced in changes
    )
    assert went, changes
    for partition, old_state in enumerate(states_before):
        state = zk_partition_state(cluster, topic, partition)
        assert state.leader != -1 and victim in state.isr, (partition, state)
        if old_state.leader == victim:
            assert state.leader_epoch > old_state.leader_epoch, (old_state, state)
    # It serves again: its own Metadata knows every leader, and a consumer bootstrapped from it
    # alone reads a partition it hosts from the start.
    for partition in range(len(assignment)):
        wait_for_metadata(
            cluster,
            topic,
            partition,
            [victim],
            lambda view: view.leader >= 0,
            TIMEOUT_S,
            f"{topic}-{partition} led in broker {victim}'s metadata",
        )
    partition_zero = deliveries.acknowledged_by_partition().get(0, {})
    if partition_zero:
        consumed = consume(
            "confluent", cluster.broker(victim).bootstrap, topic, 0, 0, max(partition_zero) + 1
        )
        values = {c.offset: c.value for c in consumed}
        assert all(values.get(o) == v for o, v in partition_zero.items())
    _assert_acknowledged_everywhere(cluster, topic, deliveries)


def test_a_killed_controller_restarted_at_once_gives_way_to_a_new_controller_at_once(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = _cluster(make_cluster)
    before = cluster.status()["controller"]
    assert before is not None
    old = before["id"]
    others = [b for b in cluster.broker_ids if b != old]
    assignment = [[old, *others], [others[0], old, others[1]], [others[1], others[0], old]]
    topic = unique_topic("controller-restarted")
    create_topic(cluster, topic, assignment)
    epoch_before = cluster.registered_epochs()[old]
    old_log = _log_size(cluster, old)

    stream = StreamingProducer(
        cluster.bootstrap_servers, topic, "controller", acks="all", **STREAM_SETTINGS
    ).start()
    try:
        _stream_until(stream, 300, "300 acknowledged")
        killed_at = time.monotonic()
        epoch, elapsed = _kill_and_restart(cluster, old)
        assert elapsed < EARLIEST_EXPIRY_S, f"registered again {elapsed:.1f}s after the kill"

        def new_controller() -> dict[str, Any] | None:
            current: dict[str, Any] | None = cluster.status()["controller"]
            return current if current is not None and current["epoch"] > before["epoch"] else None

        elected = wait_until(new_controller, TIMEOUT_S, "a controller with a new epoch")
        assert elected is not None
        assert time.monotonic() - killed_at < EARLIEST_EXPIRY_S, "controller elected late"
        wait_until(lambda: _full_isr(cluster, topic), TIMEOUT_S, f"broker {old} in every ISR")
        acknowledged = stream.acknowledged_count()
        _stream_until(stream, acknowledged + 300, "300 more acknowledged after the restart")
    except BaseException:
        stream.abandon()
        raise
    deliveries = stream.stop()

    assert epoch > epoch_before
    assert CLOSED_LINE.search(_log_since(cluster, old, old_log))
    # Every broker, the restarted one too, names the controller ZooKeeper names.
    final = cluster.status()["controller"]
    assert final is not None and final["epoch"] >= elected["epoch"]
    for broker_id in cluster.broker_ids:
        wait_until(
            lambda broker_id=broker_id: _metadata_controller(cluster, broker_id) == final["id"],
            TIMEOUT_S,
            f"broker {broker_id} to name controller {final['id']}",
        )
    _assert_acknowledged_everywhere(cluster, topic, deliveries)


def test_a_corrupt_session_record_is_ignored_and_the_restart_waits_for_the_expiry(
    make_cluster: Callable[..., LocalCluster],
):
    """A record torn or overwritten with garbage while the broker was down: the new process warns,
    does not close anything, and registers once the old session has expired, as before."""
    # Long enough that the old registration is still there when the new process looks (the
    # record is read only then), even on a loaded machine.
    cluster = make_cluster(
        brokers=1,
        zookeeper_session_timeout_ms=20_000,
        overrides={"zookeeper.session.reclaim.enable": "true"},
    )
    epoch_before = cluster.registered_epochs()[1]
    log_size = _log_size(cluster, 1)
    assert cluster.kill(1)
    record = cluster.broker(1).data_dir / SESSION_FILE
    record.write_bytes(record.read_bytes()[:25] + b"\x00\xffgarbage")
    cluster.start_broker(1, wait=False)
    epoch = wait_until(
        lambda: _registered_anew(cluster, 1, epoch_before), TIMEOUT_S, "broker 1 to register"
    )
    assert epoch > epoch_before
    log_text = _log_since(cluster, 1, log_size)
    assert f"ignoring {record}" in log_text
    assert not CLOSED_LINE.search(log_text)
    assert cluster.is_alive(1)
