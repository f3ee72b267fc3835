"""Topic creation, partition expansion and topic deletion, every path, on real clusters.

Creation:
* CreateTopics sent to each broker in turn (not only the controller) creates the topic: every
  broker's Metadata shows it led, with the topic id the answer gave, and ZooKeeper holds its
  assignment and config.
* A topic written straight to ZooKeeper (`/brokers/topics/<t>` JSON, as an old admin tool writes
  it, with no topic id) is picked up by the controller: partition state znodes appear with the
  first replica leading, the topic gets a topic id, and every broker's Metadata shows it.
* Auto-creation: Metadata for an unknown topic creates it when the broker and the request allow
  it (`auto.create.topics.enable`, default true), and answers UNKNOWN_TOPIC_OR_PARTITION, creating
  nothing, when either does not.
* Refusals, per topic of one request: a replication factor above the broker count
  (INVALID_REPLICATION_FACTOR), a partition count below one (INVALID_PARTITIONS), an unknown topic
  config or a bad value (INVALID_CONFIG), an existing topic, a bad explicit assignment; none of
  them leaves a znode behind.
* An explicit replica assignment is honoured exactly (order included: the first replica leads).
* validate_only answers as a creation would and writes nothing.
* Partition expansion by editing `/brokers/topics/<t>`: the new partitions get leaders on every
  broker, the old ones are untouched.

Deletion:
* `odradek topics --delete` removes the topic from every broker's Metadata, from ZooKeeper
  (`/brokers/topics/<t>`, `/config/topics/<t>`, `/admin/delete_topics/<t>`) and its partition
  directories from every broker's data directory; the same name created again is an empty topic.
* Deleting while a replica's broker is down: the live brokers delete at once, the deletion stays
  pending in ZooKeeper, and completes (the returned broker's directories too) once it is back;
  only the returned broker's replicas are retried, so the controller refuses no state transition.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
from kio.schema.errors import ErrorCode

from odradek.testing import LocalCluster
from odradek.zk.znodes import (
    DeleteTopicsTopicZNode,
    LeaderIsrAndControllerEpoch,
    TopicAssignment,
    TopicConfigZNode,
    TopicZNode,
)
from tests.fixtures.cluster import wait_until
from tests.integration._controller import (
    MetadataView,
    assignment_json,
    create_topics,
    delete_topics,
    metadata,
    metadata_by_broker,
    partition_dirs,
    state_change_lines,
    topic_spec,
    topic_uuid,
    wait_for_agreement,
    zk_controller,
    zk_exists,
    zk_partition_states,
    zk_topic,
    zk_topic_config,
    zk_write_topic,
)
from tests.integration._replication import (
    AckedProducer,
    fetch_records,
    latest_offset,
    records_of,
    replicas_identical,
    unique_topic,
)

AGREEMENT_TIMEOUT_S = 30.0
DELETION_TIMEOUT_S = 60.0
CLI_TIMEOUT_S = 120.0


def _led(topic: str, partitions: int) -> Callable[[MetadataView], bool]:
    return lambda view: view.all_led([topic], {topic: partitions})


def _gone(topic: str) -> Callable[[MetadataView], bool]:
    return lambda view: view.topics[topic].error == ErrorCode.unknown_topic_or_partition


def _topic_paths(topic: str) -> list[str]:
    return [
        TopicZNode.path(topic),
        TopicConfigZNode.path(topic),
        DeleteTopicsTopicZNode.path(topic),
    ]


# ---------------------------------------------------------------------------------------------
# Creation


def test_create_topics_is_accepted_by_every_broker(cluster3: LocalCluster):
    for broker in cluster3.brokers:
        topic = unique_topic(f"created-on-{broker.id}")
        answers = create_topics(
            broker, [topic_spec(topic, 6, 2, configs={"retention.ms": "3600000"})]
        )
        answer = answers[topic]
        assert answer.error == ErrorCode.none, (broker.id, answer)
        assert (answer.num_partitions, answer.replication_factor) == (6, 2)
        view = wait_for_agreement(
            cluster3, [topic], _led(topic, 6), what=f"leaders of {topic} (created on {broker.id})"
        )
        info = view.topic(topic)
        assert info is not None
        assert all(len(p.replicas) == 2 for p in info.partitions.values())
        assignment = zk_topic(cluster3, topic)
        assert assignment is not None
        assert answer.topic_id is not None
        assert topic_uuid(assignment) == info.topic_id == answer.topic_id
        assert zk_topic_config(cluster3, topic) == {"retention.ms": "3600000"}


def test_a_topic_written_straight_to_zookeeper_is_created_by_the_controller(
    cluster3: LocalCluster,
):
    topic = unique_topic("zk-written")
    assignment = {0: [1, 2], 1: [2, 3], 2: [3, 1], 3: [1, 3]}
    zk_write_topic(cluster3, topic, assignment_json(assignment))
    controller = zk_controller(cluster3)

    def all_states() -> dict[int, LeaderIsrAndControllerEpoch] | None:
        found = zk_partition_states(cluster3, topic, assignment)
        return found if found.keys() == assignment.keys() else None

    def with_topic_id() -> TopicAssignment | None:
        found = zk_topic(cluster3, topic)
        return found if found is not None and found.topic_id is not None else None

    states = wait_until(all_states, AGREEMENT_TIMEOUT_S, f"partition state znodes of {topic}")
    assert states is not None
    for partition, replicas in assignment.items():
        state = states[partition]
        assert (state.leader, sorted(state.isr), state.leader_epoch) == (
            replicas[0],
            sorted(replicas),
            0,
        ), (partition, state)
        assert state.controller_epoch == controller.epoch
    written = wait_until(with_topic_id, AGREEMENT_TIMEOUT_S, f"a topic id for {topic}")
    assert written is not None
    assert {p: list(a.replicas) for p, a in written.partitions.items()} == assignment
    view = wait_for_agreement(cluster3, [topic], _led(topic, len(assignment)), what="the topic")
    info = view.topic(topic)
    assert info is not None
    assert info.topic_id == topic_uuid(written)
    assert {p: list(i.replicas) for p, i in info.partitions.items()} == assignment
    assert {p: i.leader for p, i in info.partitions.items()} == {
        p: r[0] for p, r in assignment.items()
    }
    # It is a working topic: records go in and come out.
    producer = AckedProducer(cluster3.broker(2).bootstrap, acks="all")
    deliveries = producer.send(topic, [b"zk-%d" % p for p in assignment], partition=3)
    assert not deliveries.failed, deliveries.failed


def test_metadata_auto_creates_unknown_topics_only_when_the_request_allows_it(
    cluster3: LocalCluster,
):
    broker = cluster3.broker(2)
    refused = unique_topic("not-auto-created")
    view = metadata(broker, [refused], allow_auto_topic_creation=False)
    assert view.topics[refused].error == ErrorCode.unknown_topic_or_partition, view

    created = unique_topic("auto-created")
    first = metadata(broker, [created], allow_auto_topic_creation=True)
    assert first.topics[created].error in (ErrorCode.leader_not_available, ErrorCode.none), first
    # The broker defaults: num.partitions=1, default.replication.factor=3 (development defaults).
    view = wait_for_agreement(cluster3, [created], _led(created, 1), what="the auto-created topic")
    info = view.topic(created)
    assert info is not None and len(info.partitions[0].replicas) == 3
    assignment = zk_topic(cluster3, created)
    assert assignment is not None and topic_uuid(assignment) == info.topic_id
    # The refused name was asked for first, on the same broker: had it been created, it would be
    # by now.
    assert not any(zk_exists(cluster3, _topic_paths(refused)).values())
    assert metadata(broker, [refused]).topics[refused].error == (
        ErrorCode.unknown_topic_or_partition
    )


def test_auto_creation_disabled_on_the_broker_refuses_unknown_topics(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(brokers=1, auto_create_topics_enable=False, shared_zookeeper=True)
    broker = cluster.broker(1)
    refused = unique_topic("auto-disabled")
    view = metadata(broker, [refused], allow_auto_topic_creation=True)
    assert view.topics[refused].error == ErrorCode.unknown_topic_or_partition, view
    # Explicit creation still works; once it is done, the refused topic is still nowhere.
    explicit = unique_topic("explicit")
    assert create_topics(broker, [topic_spec(explicit, 1, 1)])[explicit].error == ErrorCode.none
    wait_for_agreement(cluster, [explicit], _led(explicit, 1), what="the explicit topic")
    assert not any(zk_exists(cluster, _topic_paths(refused)).values())
    again = metadata(broker, [refused], allow_auto_topic_creation=True)
    assert again.topics[refused].error == ErrorCode.unknown_topic_or_partition


def test_create_topics_refuses_bad_topics_one_by_one_and_writes_nothing(cluster3: LocalCluster):
    existing = unique_topic("exists")
    assert create_topics(cluster3.broker(1), [topic_spec(existing, 1, 1)])[existing].error == (
        ErrorCode.none
    )
    good = unique_topic("good-neighbour")
    cases = {
        unique_topic("rf-above-brokers"): (topic_spec("", 3, 4), "invalid_replication_factor"),
        unique_topic("rf-zero"): (topic_spec("", 3, 0), "invalid_replication_factor"),
        unique_topic("no-partitions"): (topic_spec("", 0, 1), "invalid_partitions"),
        unique_topic("negative-partitions"): (topic_spec("", -5, 1), "invalid_partitions"),
        unique_topic("unknown-config"): (
            topic_spec("", 1, 1, configs={"no.such.config": "1"}),
            "invalid_config",
        ),
        unique_topic("bad-config-value"): (
            topic_spec("", 1, 1, configs={"min.insync.replicas": "zero"}),
            "invalid_config",
        ),
        unique_topic("unknown-broker"): (
            topic_spec("", assignment={0: [1, 99]}),
            "invalid_replica_assignment",
        ),
        unique_topic("broker-twice"): (
            topic_spec("", assignment={0: [2, 2]}),
            "invalid_replica_assignment",
        ),
        existing: (topic_spec("", 1, 1), "topic_already_exists"),
        good: (topic_spec("", 2, 2), "none"),
    }
    specs = [{**spec, "name": name} for name, (spec, _) in cases.items()]
    answers = create_topics(cluster3.broker(3), specs)
    assert {name: answers[name].error.name for name in cases} == {
        name: code for name, (_, code) in cases.items()
    }, {name: answers[name].message for name in cases}
    for name, (_, code) in cases.items():
        if code == "none":
            continue
        assert answers[name].message, name  # every refusal says why
        if name != existing:
            assert not any(zk_exists(cluster3, _topic_paths(name)).values()), name
    # The good topic of the same request was created all the same.
    wait_for_agreement(cluster3, [good], _led(good, 2), what="the good neighbour")
    refused = [name for name, (_, code) in cases.items() if name != existing and code != "none"]
    for view in metadata_by_broker(cluster3, refused).values():
        assert all(view.topics[n].error == ErrorCode.unknown_topic_or_partition for n in refused)


def test_an_explicit_replica_assignment_is_honoured(cluster3: LocalCluster):
    topic = unique_topic("explicit")
    assignment = {0: [3, 1], 1: [2, 3], 2: [1, 2], 3: [3, 2], 4: [1, 3]}
    answers = create_topics(cluster3.broker(2), [topic_spec(topic, assignment=assignment)])
    assert answers[topic].error == ErrorCode.none, answers
    assert (answers[topic].num_partitions, answers[topic].replication_factor) == (5, 2)
    view = wait_for_agreement(cluster3, [topic], _led(topic, 5), what="the explicit topic")
    info = view.topic(topic)
    assert info is not None
    assert {p: list(i.replicas) for p, i in info.partitions.items()} == assignment
    assert {p: i.leader for p, i in info.partitions.items()} == {
        p: r[0] for p, r in assignment.items()
    }
    written = zk_topic(cluster3, topic)
    assert written is not None
    assert {p: list(a.replicas) for p, a in written.partitions.items()} == assignment


def test_validate_only_answers_like_a_creation_and_creates_nothing(cluster3: LocalCluster):
    topic = unique_topic("validate-only")
    bad = unique_topic("validate-only-bad")
    answers = create_topics(
        cluster3.broker(1),
        [
            topic_spec(topic, 4, 2, configs={"retention.ms": "60000"}),
            topic_spec(bad, 4, 7),
        ],
        validate_only=True,
    )
    assert answers[topic].error == ErrorCode.none, answers
    assert (answers[topic].num_partitions, answers[topic].replication_factor) == (4, 2)
    assert answers[bad].error == ErrorCode.invalid_replication_factor, answers
    for name in (topic, bad):
        assert not any(zk_exists(cluster3, _topic_paths(name)).values()), name
    assert all(not dirs for dirs in partition_dirs(cluster3, topic).values())
    # Nothing was left behind: the same name can be created for real now.
    created = create_topics(cluster3.broker(1), [topic_spec(topic, 4, 2)])[topic]
    assert created.error == ErrorCode.none, created
    wait_for_agreement(cluster3, [topic], _led(topic, 4), what="the real creation")


def test_partition_expansion_by_editing_the_assignment_znode(cluster3: LocalCluster):
    topic = unique_topic("expanded")
    assignment = {0: [1, 2], 1: [2, 3]}
    answers = create_topics(cluster3.broker(1), [topic_spec(topic, assignment=assignment)])
    assert answers[topic].error == ErrorCode.none, answers
    before = wait_for_agreement(cluster3, [topic], _led(topic, 2), what="the first partitions")
    current = zk_topic(cluster3, topic)
    assert current is not None and current.topic_id is not None

    expanded = {**assignment, 2: [3, 1], 3: [1, 3]}
    data = TopicZNode.encode(expanded, current.topic_id)
    zk_write_topic(cluster3, topic, data, expected_version=current.zk_version)

    after = wait_for_agreement(
        cluster3, [topic], _led(topic, 4), timeout=AGREEMENT_TIMEOUT_S, what="the new partitions"
    )
    info, old = after.topic(topic), before.topic(topic)
    assert info is not None and old is not None
    assert info.topic_id == old.topic_id
    assert {p: list(i.replicas) for p, i in info.partitions.items()} == expanded
    for partition in (2, 3):
        assert info.partitions[partition].leader == expanded[partition][0]
    for partition in (0, 1):  # untouched: same leader, same leader epoch
        assert info.partitions[partition] == old.partitions[partition]
    states = zk_partition_states(cluster3, topic, expanded)
    assert {p: s.leader for p, s in states.items()} == {p: r[0] for p, r in expanded.items()}


# ---------------------------------------------------------------------------------------------
# Deletion


def _odradek(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "odradek.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def _assert_empty_topic(cluster: LocalCluster, topic: str, partitions: int) -> None:
    """Every partition of `topic` is led and holds nothing: latest offset 0 at its leader."""
    view = wait_for_agreement(cluster, [topic], _led(topic, partitions), what="the new topic")
    info = view.topic(topic)
    assert info is not None
    for index, partition in info.partitions.items():
        leader = cluster.broker(partition.leader)
        assert latest_offset(leader, topic, index) == (ErrorCode.none, 0), index
        answer = fetch_records(leader, topic, index, 0)
        assert (answer.error, answer.records) == (ErrorCode.none, []), index


def test_cli_delete_removes_the_topic_everywhere_and_the_name_can_be_reused(
    cluster3: LocalCluster,
):
    topic = unique_topic("deleted")
    partitions = 3
    answers = create_topics(
        cluster3.broker(1), [topic_spec(topic, partitions, 3, configs={"retention.ms": "600000"})]
    )
    assert answers[topic].error == ErrorCode.none, answers
    old = wait_for_agreement(cluster3, [topic], _led(topic, partitions), what="the topic")
    AckedProducer(cluster3.bootstrap_servers, acks="all").send(
        topic, [b"doomed-%d" % i for i in range(30)], keyed=True
    )
    assert all(len(dirs) == partitions for dirs in partition_dirs(cluster3, topic).values())

    result = _odradek(
        "topics", "--bootstrap-server", cluster3.broker(2).bootstrap, "--delete", "--topic", topic
    )
    assert result.returncode == 0, result.stderr

    wait_for_agreement(
        cluster3, [topic], _gone(topic), timeout=DELETION_TIMEOUT_S, what="the topic gone"
    )
    wait_until(
        lambda: not any(zk_exists(cluster3, _topic_paths(topic)).values()),
        DELETION_TIMEOUT_S,
        f"the znodes of {topic} to be deleted",
    )
    wait_until(
        lambda: not any(partition_dirs(cluster3, topic).values()),
        DELETION_TIMEOUT_S,
        f"the partition directories of {topic} to be deleted",
    )

    # The same name again: a new topic (new id), with nothing of the old one's records.
    assert create_topics(cluster3.broker(3), [topic_spec(topic, partitions, 3)])[topic].error == (
        ErrorCode.none
    )
    _assert_empty_topic(cluster3, topic, partitions)
    new_info, old_info = metadata(cluster3.broker(1), [topic]).topic(topic), old.topic(topic)
    assert new_info is not None and old_info is not None
    assert new_info.topic_id != old_info.topic_id
    assert zk_topic_config(cluster3, topic) == {}
    # And it replicates: the followers' fetchers sent the old topic's id under this name, and
    # start their fetch sessions over with the new one.
    wait_for_agreement(cluster3, [topic], _led(topic, partitions), what="the new topic")
    AckedProducer(cluster3.bootstrap_servers, acks="all").send(
        topic, [b"reborn-%d" % i for i in range(30)], keyed=True
    )

    def replicated() -> bool:
        values: list[bytes] = []
        for partition in range(partitions):
            common = replicas_identical(cluster3, [1, 2, 3], topic, partition)
            if common is None:
                return False
            values.extend(r.value or b"" for r in records_of(common))
        return sorted(values) == sorted(b"reborn-%d" % i for i in range(30))

    wait_until(replicated, AGREEMENT_TIMEOUT_S, "the new topic's records on every replica")


def _delete_while_down(cluster: LocalCluster, timing: str) -> tuple[str, int, int]:
    """Create a 3-partition RF=3 topic with records, kill a broker that is not the controller,
    delete the topic, check that only the live brokers finish, restart the broker, and wait for
    the deletion to complete everywhere. Returns (topic, controller id, the restarted broker).

    `timing` "noticed": the deletion starts once the controller has seen the broker go (its
    session expired), so the broker's replicas are ineligible for deletion from the start;
    "unnoticed": the deletion starts at once, while the controller still counts the broker live.
    """
    controller = zk_controller(cluster).broker_id
    assert controller is not None
    down = next(b for b in cluster.broker_ids if b != controller)
    survivors = [b for b in cluster.broker_ids if b != down]
    topic = unique_topic("deleted-while-down")
    partitions = 3
    answers = create_topics(cluster.broker(controller), [topic_spec(topic, partitions, 3)])
    assert answers[topic].error == ErrorCode.none, answers
    wait_for_agreement(cluster, [topic], _led(topic, partitions), what="the topic")
    AckedProducer(cluster.bootstrap_servers, acks="all").send(
        topic, [b"doomed-%d" % i for i in range(30)], keyed=True
    )

    cluster.kill(down)
    if timing == "noticed":
        wait_for_agreement(
            cluster,
            [topic],
            lambda v: v.broker_ids == survivors and v.all_led([topic]),
            broker_ids=survivors,
            timeout=DELETION_TIMEOUT_S,
            what=f"broker {down} gone",
        )
    assert delete_topics(cluster.broker(controller), [topic]) == {topic: ErrorCode.none}

    # The live brokers are done; the deletion waits, recorded in ZooKeeper, for the other one.
    wait_for_agreement(
        cluster, [topic], _gone(topic), broker_ids=survivors, what="the topic gone on survivors"
    )
    wait_until(
        lambda: all(not partition_dirs(cluster, topic)[b] for b in survivors),
        DELETION_TIMEOUT_S,
        "the survivors' partition directories to be deleted",
    )
    assert len(partition_dirs(cluster, topic)[down]) == partitions
    pending = zk_exists(cluster, [TopicZNode.path(topic), DeleteTopicsTopicZNode.path(topic)])
    assert all(pending.values()), pending

    cluster.start_broker(down)
    wait_until(
        lambda: not any(zk_exists(cluster, _topic_paths(topic)).values()),
        DELETION_TIMEOUT_S,
        "the deletion to complete in ZooKeeper",
    )
    wait_until(
        lambda: not any(partition_dirs(cluster, topic).values()),
        DELETION_TIMEOUT_S,
        f"broker {down}'s partition directories to be deleted",
    )
    wait_for_agreement(cluster, [topic], _gone(topic), what="the topic gone everywhere")
    return topic, controller, down


@pytest.mark.parametrize("timing", ["noticed", "unnoticed"])
def test_deletion_while_a_replica_broker_is_down_completes_when_it_returns(
    make_cluster: Callable[..., LocalCluster], timing: str
):
    cluster = make_cluster(brokers=3, shared_zookeeper=True)
    topic, _, down = _delete_while_down(cluster, timing)
    # Created again, the topic is empty on every replica, the returned broker's included.
    assert create_topics(cluster.broker(down), [topic_spec(topic, 3, 3)])[topic].error == (
        ErrorCode.none
    )
    _assert_empty_topic(cluster, topic, 3)


def test_deletion_resumed_for_a_returned_broker_makes_no_invalid_transition(
    make_cluster: Callable[..., LocalCluster],
):
    """The deletion of the returned broker's replicas is retried alone: the controller's
    state-change log refuses no transition (a refusal means its cache and its callbacks
    disagree)."""
    cluster = make_cluster(brokers=3, shared_zookeeper=True)
    topic, controller, _ = _delete_while_down(cluster, "noticed")
    refused = [
        line
        for line in state_change_lines(cluster.broker(controller))
        if "Refused" in line and topic in line
    ]
    assert not refused, "\n".join(refused[:10])
