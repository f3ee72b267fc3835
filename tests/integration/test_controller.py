"""The controller against real brokers and a real ZooKeeper: election, fencing, failover, ISR
change propagation and the state-change log.

* Exactly one controller: `/controller` names one registered broker, and every broker's Metadata
  names the same one.
* Fencing, broker side: LeaderAndIsr, UpdateMetadata and StopReplica carrying an older controller
  epoch than the cluster's are refused whole with STALE_CONTROLLER_EPOCH and change nothing -- the
  leader goes on leading, the follower goes on refusing writes, the metadata and the log stay.
  After a real failover the deposed controller's epoch is refused the same way.
* Fencing, ZooKeeper side: a partition state write made with the `/controller_epoch` znode
  version of an older epoch (a deposed controller's) fails with ControllerMovedError, and the
  partition state znode is unchanged.
* Fencing of an earlier incarnation (KIP-380): a broker restarted while its old session still
  lives refuses a request carrying its old broker epoch with STALE_BROKER_EPOCH (controller
  requests wait until the broker has registered and knows its epoch).
* Failover: SIGKILL the controller broker; once its session expires another broker wins
  `/controller` with the epoch one higher, every partition is led by a survivor, and the
  survivors' Metadata agrees. The killed broker restarts, gets its replicas back (in the ISR
  again, byte-identical to the leaders), and there is still exactly one controller.
* ISR changes: a follower frozen with SIGSTOP past replica.lag.time.max.ms leaves the ISR and
  rejoins after SIGCONT; the leader's `/isr_change_notification` entries are consumed (deleted)
  by the controller, and every broker's Metadata shows each new ISR.
* The state-change log: the controller broker's `state-change.log` has a NewPartition ->
  OnlinePartition line (with the elected leader) for every partition of a new topic; replica
  transitions are DEBUG lines (Kafka logs them at TRACE), so at the default level they are not
  in the file, but the controller's `/state-changes` history has a NewReplica -> OnlineReplica
  entry for each replica.

Tests that kill or freeze brokers run on their own clusters (`make_cluster`); the others share
`cluster3` and only touch their own topics.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.request
from collections.abc import Callable

import pytest
from kio.schema.errors import ErrorCode

from odradek.controller.controller_zk import ControllerZk
from odradek.errors import NetworkError
from odradek.server.session_reclaim import SESSION_FILE
from odradek.testing import LocalCluster
from odradek.zk.client import ZkClient
from odradek.zk.errors import ControllerMovedError
from odradek.zk.ops import CheckOp, CreateOp, SetDataOp
from odradek.zk.znodes import (
    IsrChangeNotificationSequenceZNode,
    IsrChangeNotificationZNode,
    TopicPartition,
    TopicPartitionStateZNode,
)
from tests.fixtures.cluster import wait_until
from tests.integration._controller import (
    ControllerState,
    MetadataView,
    TopicInfo,
    create_topics,
    metadata,
    metadata_by_broker,
    send_leader_and_isr,
    send_stop_replica,
    send_update_metadata,
    state_change_lines,
    topic_spec,
    wait_for_agreement,
    zk_broker_epoch,
    zk_call,
    zk_children,
    zk_controller,
    zk_partition_states,
    zk_stat,
)
from tests.integration._replication import (
    AckedProducer,
    partition_dir,
    produce_raw,
    read_committed,
    unique_topic,
    wait_for_identical_replicas,
    wait_for_isr,
)

FAILOVER_TIMEOUT_S = 60.0
AGREEMENT_TIMEOUT_S = 30.0
ISR_TIMEOUT_S = 30.0


def _create(cluster: LocalCluster, topic: str, assignment: dict[int, list[int]]) -> TopicInfo:
    """Create `topic` with an explicit assignment and wait until every broker shows it led."""
    answers = create_topics(cluster.broker(1), [topic_spec(topic, assignment=assignment)])
    assert answers[topic].error == ErrorCode.none, answers
    view = wait_for_agreement(
        cluster,
        [topic],
        lambda v: v.all_led([topic], {topic: len(assignment)}),
        what=f"leaders of {topic}",
    )
    info = view.topic(topic)
    assert info is not None
    return info


# ---------------------------------------------------------------------------------------------
# One controller


def test_exactly_one_controller_named_by_zookeeper_and_every_broker(cluster3: LocalCluster):
    state = zk_controller(cluster3)
    assert state.broker_id in cluster3.broker_ids, state
    assert cluster3.registered_brokers() == cluster3.broker_ids
    assert state.epoch >= 1, state
    expected_brokers = [(b.id, b.host, b.port) for b in cluster3.brokers]
    views = metadata_by_broker(cluster3, [])
    for broker_id, view in views.items():
        assert view.controller_id == state.broker_id, (broker_id, view)
        assert [(b.id, b.host, b.port) for b in view.brokers] == expected_brokers, broker_id
    assert len({view.cluster_id for view in views.values()}) == 1, views


# ---------------------------------------------------------------------------------------------
# Fencing


def test_requests_with_an_older_controller_epoch_are_refused_and_change_nothing(
    cluster3: LocalCluster,
):
    controller = zk_controller(cluster3)
    assert controller.broker_id is not None
    stale_epoch = controller.epoch - 1
    leader_id, follower_id, other_id = (
        [b for b in cluster3.broker_ids if b != controller.broker_id] + [controller.broker_id]
    )[:3]
    replicas = [leader_id, follower_id, other_id]
    topic = unique_topic("stale-epoch")
    info = _create(cluster3, topic, {0: replicas})
    leader, follower = cluster3.broker(leader_id), cluster3.broker(follower_id)
    assert produce_raw(leader, topic, 0, [b"before"], acks=1).error == ErrorCode.none
    zk_before = zk_partition_states(cluster3, topic, [0])[0]
    views_before = metadata_by_broker(cluster3, [topic])

    # What a deposed controller might still send: the follower leads now, alone in the ISR.
    coup = dataclasses.replace(
        zk_before,
        leader=follower_id,
        leader_epoch=zk_before.leader_epoch + 10,
        isr=(follower_id,),
        controller_epoch=stale_epoch,
        zk_version=zk_before.zk_version + 10,
    )
    for target in (leader, follower):
        answer = send_leader_and_isr(
            target,
            controller_id=controller.broker_id,
            controller_epoch=stale_epoch,
            broker_epoch=zk_broker_epoch(cluster3, target.id),
            topic=topic,
            topic_id=info.topic_id,
            partition=0,
            state=coup,
            replicas=replicas,
            live_leaders=[follower],
        )
        assert answer.error_code == ErrorCode.stale_controller_epoch, (target.id, answer)
        errors = [p.error_code for t in answer.topics for p in t.partition_errors]
        assert all(e == ErrorCode.stale_controller_epoch for e in errors), answer
    answer = send_update_metadata(
        leader,
        controller_id=controller.broker_id,
        controller_epoch=stale_epoch,
        broker_epoch=zk_broker_epoch(cluster3, leader_id),
        live_brokers=cluster3.brokers,  # so that a wrongly applied request breaks only the topic
        topic=topic,
        topic_id=info.topic_id,
        partition=0,
        state=coup,
        replicas=replicas,
    )
    assert answer.error_code == ErrorCode.stale_controller_epoch, answer
    answer = send_stop_replica(
        leader,
        controller_id=controller.broker_id,
        controller_epoch=stale_epoch,
        broker_epoch=zk_broker_epoch(cluster3, leader_id),
        topic=topic,
        partition=0,
        leader_epoch=coup.leader_epoch,
        delete=True,
    )
    assert answer.error_code == ErrorCode.stale_controller_epoch, answer

    # Nothing changed: the leader leads and still has its log, the follower still follows, the
    # brokers' metadata and ZooKeeper's partition state are as before.
    assert partition_dir(leader, topic, 0).is_dir()
    after = produce_raw(leader, topic, 0, [b"after"], acks=1)
    assert (after.error, after.base_offset) == (ErrorCode.none, 1), after
    refused = produce_raw(follower, topic, 0, [b"to-the-follower"], acks=1)
    assert refused.error == ErrorCode.not_leader_or_follower, refused
    wait_until(
        lambda: (
            [r.value for r in read_committed(leader, topic, 0).records] == [b"before", b"after"]
        ),
        ISR_TIMEOUT_S,
        "both records committed on the leader",
    )
    assert metadata_by_broker(cluster3, [topic]) == views_before
    assert zk_partition_states(cluster3, topic, [0])[0] == zk_before


def test_a_deposed_controllers_zookeeper_writes_are_fenced(cluster3: LocalCluster):
    topic = unique_topic("zk-fenced")
    broker_ids = cluster3.broker_ids
    _create(cluster3, topic, {0: broker_ids})
    controller = zk_controller(cluster3)
    # Each election sets /controller_epoch once: the previous controller held version - 1.
    assert controller.epoch_zk_version >= 1, controller
    deposed_version = controller.epoch_zk_version - 1
    path = TopicPartitionStateZNode.path(topic, 0)

    async def attempt(zk: ZkClient) -> tuple[bytes, int]:
        before, stat = await zk.get(path)
        current = TopicPartitionStateZNode.decode(before, stat.version)
        takeover = dataclasses.replace(
            current, leader=broker_ids[-1], leader_epoch=current.leader_epoch + 1
        )
        with pytest.raises(ControllerMovedError):
            await ControllerZk(zk).update_leader_and_isr(deposed_version, {(topic, 0): takeover})
        encoded = TopicPartitionStateZNode.encode(
            leader=takeover.leader,
            leader_epoch=takeover.leader_epoch,
            isr=takeover.isr,
            controller_epoch=controller.epoch - 1,
        )
        with pytest.raises(ControllerMovedError):
            await zk.checked_multi(deposed_version, [SetDataOp(path, encoded, stat.version)])
        # The same transaction shape passes the epoch check at the current version (a check
        # of the state's version writes nothing): the refusals above were the epoch's doing.
        await zk.checked_multi(controller.epoch_zk_version, [CheckOp(path, stat.version)])
        after, stat_after = await zk.get(path)
        assert (after, stat_after.version) == (before, stat.version)
        return after, stat_after.version

    zk_call(cluster3, attempt)
    view = metadata(cluster3.broker(broker_ids[0]), [topic]).topic(topic)
    assert view is not None and view.partitions[0].leader == broker_ids[0]


# The killed broker's old session must outlive its restart by a wide margin, so that the new
# process is certainly listening, and not yet registered, while the old registration stands.
BOUNCE_SESSION_TIMEOUT_MS = 10000


def _answers(cluster: LocalCluster, broker_id: int) -> bool:
    try:
        metadata(cluster.broker(broker_id), [])
    except NetworkError:
        return False
    return True


def test_a_restarted_broker_refuses_requests_addressed_to_its_previous_incarnation(
    make_cluster: Callable[..., LocalCluster],
):
    """KIP-380: a broker bounced within its session timeout gets requests the controller meant
    for the process that died (the controller has not noticed yet). They carry the old broker
    epoch (the czxid of the old registration) and must be refused with STALE_BROKER_EPOCH."""
    cluster = make_cluster(
        brokers=3, zookeeper_session_timeout_ms=BOUNCE_SESSION_TIMEOUT_MS, shared_zookeeper=True
    )
    controller = zk_controller(cluster)
    assert controller.broker_id is not None
    bounced = next(b for b in cluster.broker_ids if b != controller.broker_id)
    topic = unique_topic("bounced")
    _create(cluster, topic, {0: [bounced, controller.broker_id]})
    old_epoch = zk_broker_epoch(cluster, bounced)

    cluster.kill(bounced)
    # Without its predecessor's session record the new process cannot close that session
    # (session_reclaim), so the old registration stays until the session expires: the window
    # in which the controller may still address the dead process (a record is missing when the
    # process died before writing it, or its disk lost it).
    (cluster.broker(bounced).data_dir / SESSION_FILE).unlink()
    cluster.start_broker(bounced, wait=False)
    try:
        wait_until(lambda: _answers(cluster, bounced), 30, f"broker {bounced}'s new process")
        assert zk_broker_epoch(cluster, bounced) == old_epoch, "the old registration is gone"
        answer = send_stop_replica(
            cluster.broker(bounced),
            controller_id=controller.broker_id,
            controller_epoch=controller.epoch,
            broker_epoch=old_epoch,
            topic=topic,
            partition=0,
            leader_epoch=zk_partition_states(cluster, topic, [0])[0].leader_epoch,
            delete=True,
            # A broker may hold the request until it has registered (as Kafka does): the old
            # session must expire first.
            timeout=BOUNCE_SESSION_TIMEOUT_MS / 1000 + 20,
        )
        assert partition_dir(cluster.broker(bounced), topic, 0).is_dir(), "the log was deleted"
        assert answer.error_code == ErrorCode.stale_broker_epoch, answer
    finally:
        # A process still waiting to register would hold up the cluster's teardown.
        cluster.kill(bounced)


# ---------------------------------------------------------------------------------------------
# Failover


def test_killed_controller_is_replaced_and_gets_its_replicas_back_on_restart(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(brokers=3, shared_zookeeper=True)
    everyone = cluster.broker_ids
    topics = {unique_topic("failover-rf3"): 3, unique_topic("failover-rf2"): 2}
    partitions = 6
    answers = create_topics(
        cluster.broker(1), [topic_spec(name, partitions, rf) for name, rf in topics.items()]
    )
    assert all(a.error == ErrorCode.none for a in answers.values()), answers
    names = list(topics)
    counts = dict.fromkeys(names, partitions)
    before = wait_for_agreement(
        cluster, names, lambda v: v.all_led(names, counts), what="leaders of the new topics"
    )
    producer = AckedProducer(cluster.bootstrap_servers, acks="all")
    for name in names:
        producer.send(name, [b"%s-before-%d" % (name.encode(), i) for i in range(60)], keyed=True)

    old = zk_controller(cluster)
    dead = old.broker_id
    assert dead is not None
    survivors = [b for b in everyone if b != dead]
    cluster.kill(dead)

    # 1. Another broker wins /controller once the dead one's session expires; the epoch grows
    #    by exactly one (a single election).
    def elected() -> ControllerState | None:
        state = zk_controller(cluster)
        return state if state.broker_id in survivors else None

    new = wait_until(elected, FAILOVER_TIMEOUT_S, "a surviving broker to become controller")
    assert new is not None
    assert new.epoch == old.epoch + 1, (old, new)

    # 2. Every partition is led by a survivor, the dead broker left every ISR, and the
    #    survivors agree, naming the new controller and only live brokers.
    def failed_over(view: MetadataView) -> bool:
        return (
            view.all_led(names, counts)
            and view.controller_id == new.broker_id
            and view.broker_ids == survivors
            and all(
                p.leader != dead and dead not in p.isr
                for name in names
                for p in view.topics[name].partitions.values()
            )
        )

    after = wait_for_agreement(
        cluster,
        names,
        failed_over,
        broker_ids=survivors,
        timeout=FAILOVER_TIMEOUT_S,
        what="leaders among the survivors",
    )
    for name in names:
        states = zk_partition_states(cluster, name, range(partitions))
        for index, state in states.items():
            shown = after.topics[name].partitions[index]
            assert (state.leader, state.isr) == (shown.leader, shown.isr), (name, index)
            was = before.topics[name].partitions[index]
            if was.leader == dead:  # moved: a new leader epoch
                assert state.leader_epoch > was.leader_epoch, (name, index, was, state)
            if dead in was.replicas:
                assert dead in shown.offline_replicas, (name, index, shown)

    # 3. The deposed controller's epoch is refused by every survivor.
    name = names[0]
    stale_state = zk_partition_states(cluster, name, [0])[0]
    for broker_id in survivors:
        answer = send_leader_and_isr(
            cluster.broker(broker_id),
            controller_id=dead,
            controller_epoch=old.epoch,
            broker_epoch=zk_broker_epoch(cluster, broker_id),
            topic=name,
            topic_id=after.topics[name].topic_id,
            partition=0,
            state=dataclasses.replace(
                stale_state, leader=dead, leader_epoch=stale_state.leader_epoch + 5
            ),
            replicas=before.topics[name].partitions[0].replicas,
            live_leaders=[],
        )
        assert answer.error_code == ErrorCode.stale_controller_epoch, (broker_id, answer)
    assert zk_partition_states(cluster, name, [0])[0] == stale_state

    # Writes go on while the broker is away, so that it has something to catch up on.
    for name in names:
        producer.send(name, [b"%s-during-%d" % (name.encode(), i) for i in range(60)], keyed=True)
    assert not producer.deliveries.failed, producer.deliveries.failed[:3]

    # 4. The killed broker returns: its replicas rejoin every ISR, the controller stays put.
    cluster.start_broker(dead)
    final = wait_for_agreement(
        cluster,
        names,
        lambda v: (
            v.all_led(names, counts)
            and v.broker_ids == everyone
            and v.controller_id == new.broker_id
            and all(
                sorted(p.isr) == sorted(p.replicas)
                for name in names
                for p in v.topics[name].partitions.values()
            )
        ),
        timeout=FAILOVER_TIMEOUT_S,
        what="the restarted broker back in every ISR",
    )
    assert zk_controller(cluster) == new
    for name in names:
        for index, shown in final.topics[name].partitions.items():
            if dead in shown.replicas:
                wait_for_identical_replicas(
                    cluster, list(shown.replicas), name, index, AGREEMENT_TIMEOUT_S
                )


# ---------------------------------------------------------------------------------------------
# ISR change notifications

LAG_TIME_MS = 2000
# The frozen follower must look slow, not dead: its session outlives the pause.
SESSION_TIMEOUT_MS = 30000


def _notifications_consumed(cluster: LocalCluster, cversion_at_least: int) -> int | None:
    """The children version of `/isr_change_notification` once it has no children left and
    has changed at least to `cversion_at_least`: every notification created meanwhile (each
    creation and each deletion bumps the children version) has been deleted."""
    stat = zk_stat(cluster, IsrChangeNotificationZNode.path())
    if stat is None or stat.numChildren != 0 or stat.cversion < cversion_at_least:
        return None
    return int(stat.cversion)


def test_isr_changes_are_propagated_through_consumed_notifications(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(
        brokers=3,
        replica_lag_time_max_ms=LAG_TIME_MS,
        zookeeper_session_timeout_ms=SESSION_TIMEOUT_MS,
        shared_zookeeper=True,
    )
    controller = zk_controller(cluster).broker_id
    assert controller is not None
    # The controller leads: the frozen follower must take neither the leader nor the
    # controller down with it.
    paused, other = (b for b in cluster.broker_ids if b != controller)
    everyone = [controller, paused, other]
    topic = unique_topic("isr-notify")
    _create(cluster, topic, {0: everyone})
    AckedProducer(cluster.bootstrap_servers, acks="all").send(
        topic, [b"in-sync-%d" % i for i in range(10)], partition=0
    )
    start = zk_stat(cluster, IsrChangeNotificationZNode.path())
    assert start is not None

    # 1. Shrink: the leader drops the frozen follower, the controller consumes the
    #    notification and tells every running broker.
    cluster.stop(paused)
    try:
        wait_for_isr(cluster, topic, 0, [controller, other], ISR_TIMEOUT_S)
        wait_for_agreement(
            cluster,
            [topic],
            lambda v: sorted(v.topics[topic].partitions[0].isr) == sorted([controller, other]),
            broker_ids=[controller, other],
            timeout=ISR_TIMEOUT_S,
            what="the shrunk ISR",
        )
        shrunk = wait_until(
            lambda: _notifications_consumed(cluster, start.cversion + 2),
            ISR_TIMEOUT_S,
            "the shrink notification to be consumed",
        )
    finally:
        cluster.cont(paused)

    # 2. Expand: the follower catches up and rejoins; every broker, itself included, sees it.
    wait_for_isr(cluster, topic, 0, everyone, ISR_TIMEOUT_S)
    wait_for_agreement(
        cluster,
        [topic],
        lambda v: sorted(v.topics[topic].partitions[0].isr) == sorted(everyone),
        timeout=ISR_TIMEOUT_S,
        what="the expanded ISR",
    )
    assert shrunk is not None
    expanded = wait_until(
        lambda: _notifications_consumed(cluster, shrunk + 2),
        ISR_TIMEOUT_S,
        "the expand notification to be consumed",
    )

    # 3. A notification written by hand (as any leader writes one) is consumed too.
    async def notify(zk: ZkClient) -> str:
        data = IsrChangeNotificationSequenceZNode.encode([TopicPartition(topic, 0)])
        (created,) = await zk.multi(
            [CreateOp(IsrChangeNotificationSequenceZNode.path(), data, sequence=True)]
        )
        return str(created)

    created = zk_call(cluster, notify)
    wait_until(
        lambda: (
            created.rsplit("/", 1)[-1]
            not in zk_children(cluster, IsrChangeNotificationZNode.path())
        ),
        ISR_TIMEOUT_S,
        f"the controller to delete {created}",
    )
    assert expanded is not None
    assert _notifications_consumed(cluster, expanded + 2) is not None


# ---------------------------------------------------------------------------------------------
# The state-change log


def test_state_change_log_records_new_partitions_going_online(cluster3: LocalCluster):
    for broker in cluster3.brokers:
        assert (broker.dir / "state-change.log").is_file(), broker.dir
    controller = zk_controller(cluster3)
    assert controller.broker_id is not None
    topic = unique_topic("state-change")
    partitions = 6
    answers = create_topics(cluster3.broker(1), [topic_spec(topic, partitions, 2)])
    assert answers[topic].error == ErrorCode.none, answers
    view = wait_for_agreement(
        cluster3, [topic], lambda v: v.all_led([topic], {topic: partitions}), what="leaders"
    )
    info = view.topic(topic)
    assert info is not None
    log = cluster3.broker(controller.broker_id)
    assert log.metrics is not None
    metrics_base = log.metrics.removesuffix("/metrics")
    prefix = rf"\[Controller id={controller.broker_id} epoch={controller.epoch}\] Changed state of "

    def logged() -> list[str] | None:
        lines = state_change_lines(log)
        missing = []
        for index, shown in info.partitions.items():
            partition_line = re.compile(
                prefix
                + re.escape(f"{topic}-{index} from NewPartition to OnlinePartition")
                + rf" with leader={shown.leader}\b.*isr=\[{', '.join(map(str, shown.isr))}\]"
            )
            if not any(partition_line.search(line) for line in lines):
                missing.append(f"{topic}-{index} NewPartition -> OnlinePartition")
            history = json.loads(
                urllib.request.urlopen(
                    f"{metrics_base}/state-changes?topic={topic}&partition={index}", timeout=10
                ).read()
            )["entries"]
            online = {
                e["replica"]
                for e in history
                if e["replica"] is not None
                and (e["from_state"], e["to_state"]) == ("NewReplica", "OnlineReplica")
                and e["controller_epoch"] == controller.epoch
            }
            for replica in set(shown.replicas) - online:
                missing.append(f"replica {replica} of {topic}-{index} NewReplica -> Online")
        return None if missing else lines

    try:
        wait_until(logged, AGREEMENT_TIMEOUT_S, "the state changes in the controller's log")
    except AssertionError:
        tail = [line for line in state_change_lines(log) if topic in line][-20:]
        raise AssertionError(
            "missing state-change lines; the topic's lines:\n" + "\n".join(tail)
        ) from None
    # At the default INFO level, as in Kafka, replica transitions stay out of the file.
    assert [line for line in state_change_lines(log) if f"[Topic={topic}," in line] == []
