"""The local cluster launcher (`LocalCluster`), `odradek cluster ...` and `odradek topics ...`.

Argument errors and output formats are checked in-process; the status reader against a real
ZooKeeper with hand-written znodes; process handling and the fault-drill commands against real
broker processes (`make_cluster`, and the CLI in subprocesses).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from odradek.cli.cluster import format_status
from odradek.cli.main import main
from odradek.cli.topics import (
    describe_lines,
    parse_bootstrap,
    parse_replica_assignment,
    topic_id_text,
)
from odradek.errors import OperatorError
from odradek.protocol.build import build
from odradek.protocol.codec import response_class
from odradek.testing import CLUSTER_FILE, LocalCluster, ProcessState, read_status
from odradek.zk.client import ZkClient
from odradek.zk.ops import CreateOp
from odradek.zk.server import server_mode
from odradek.zk.znodes import (
    BrokerIdZNode,
    ControllerEpochZNode,
    ControllerZNode,
    EndPoint,
    TopicPartitionStateZNode,
    TopicZNode,
)
from tests.fixtures.cluster import wait_until
from tests.fixtures.zookeeper import ZooKeeperHandle, free_port

CLI_TIMEOUT_S = 120


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, fragment: str) -> None:
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("odradek: error: "), err
    assert fragment in lines[0], err


def processes_mentioning(text: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def zombie_children() -> list[int]:
    """Our own children that have exited and not been reaped."""
    zombies = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            zombies.append(int(entry.name))
    return zombies


def write_fake_cluster_file(directory: Path) -> None:
    """A cluster.json of one broker that is not running (no processes needed)."""
    broker_dir = directory / "broker-1"
    document = {
        "zookeeper": {"connect": "127.0.0.1:1", "port": 1, "pid": None, "dir": None, "log": None},
        "brokers": [
            {
                "id": 1,
                "host": "127.0.0.1",
                "port": 1,
                "pid": None,
                "dir": str(broker_dir),
                "data_dir": str(broker_dir / "data"),
                "log": str(broker_dir / "broker.log"),
                "config": str(broker_dir / "server.properties"),
            }
        ],
        "bootstrap": "127.0.0.1:1",
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CLUSTER_FILE).write_text(json.dumps(document))


# ---------------------------------------------------------------------------------------------
# Arguments and formats (no processes)


def test_cluster_up_rejects_zero_brokers(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code, _, err = run_main(capsys, "cluster", "up", "--brokers", "0", "--dir", str(tmp_path))
    assert_one_line_error(code, err, "--brokers must be at least 1")
    assert not (tmp_path / CLUSTER_FILE).exists()


@pytest.mark.parametrize("command", [["status"], ["down"], ["kill", "1"], ["restart", "1"]])
def test_cluster_commands_need_a_cluster_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
):
    code, _, err = run_main(capsys, "cluster", *command, "--dir", str(tmp_path))
    assert_one_line_error(code, err, "no cluster in")


def test_cluster_broker_commands_name_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    write_fake_cluster_file(tmp_path)
    code, _, err = run_main(capsys, "cluster", "kill", "9", "--dir", str(tmp_path))
    assert_one_line_error(code, err, "no broker 9")
    code, _, err = run_main(capsys, "cluster", "stop", "1", "--dir", str(tmp_path))
    assert_one_line_error(code, err, "broker 1 is not running")
    # Killing a broker that is already dead is not an error: fault drills repeat themselves.
    code, _, err = run_main(capsys, "cluster", "kill", "1", "--dir", str(tmp_path))
    assert code == 0
    assert "was not running" in err


def test_cluster_file_that_is_not_json_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    (tmp_path / CLUSTER_FILE).write_text("{not json")
    code, _, err = run_main(capsys, "cluster", "status", "--dir", str(tmp_path))
    assert_one_line_error(code, err, "not a valid cluster file")


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (["--create"], "--topic is required with --create"),
        (["--delete"], "--topic is required with --delete"),
        (
            ["--create", "--topic", "t", "--replica-assignment", "1:2", "--partitions", "2"],
            "cannot be combined",
        ),
        (["--create", "--topic", "t", "--partitions", "0"], "--partitions must be at least 1"),
        (["--list", "--partitions", "3"], "need --create"),
        (["--list", "--unavailable-partitions"], "need --describe"),
        (["--create", "--topic", "t", "--config", "novalue"], "invalid --config"),
        (["--create", "--topic", "t", "--replica-assignment", "1:2,3"], "replication factor"),
        (["--create", "--topic", "t", "--replica-assignment", "1:1"], "lists a broker twice"),
    ],
)
def test_topics_argument_errors(
    capsys: pytest.CaptureFixture[str], arguments: list[str], fragment: str
):
    # Nothing listens on the port: each mistake must be reported before connecting.
    port = free_port()
    code, out, err = run_main(
        capsys, "topics", "--bootstrap-server", f"127.0.0.1:{port}", *arguments
    )
    assert_one_line_error(code, err, fragment)
    assert out == ""


def test_topics_bad_bootstrap_and_unreachable_broker(capsys: pytest.CaptureFixture[str]):
    code, _, err = run_main(capsys, "topics", "--bootstrap-server", "no-port", "--list")
    assert_one_line_error(code, err, "invalid --bootstrap-server entry 'no-port'")
    port = free_port()
    code, _, err = run_main(
        capsys, "topics", "--bootstrap-server", f"127.0.0.1:{port}", "--list", "--timeout", "5"
    )
    assert_one_line_error(code, err, f"cannot connect to 127.0.0.1:{port}")


def test_parsers():
    assert parse_replica_assignment("1:2,2:3, 3:1") == {0: [1, 2], 1: [2, 3], 2: [3, 1]}
    assert parse_bootstrap("a:1,[::1]:9092") == [("a", 1), ("::1", 9092)]
    with pytest.raises(OperatorError):
        parse_bootstrap("a:70000")
    with pytest.raises(OperatorError):
        parse_replica_assignment("1:x")
    assert topic_id_text(uuid.UUID(int=0)) == "AAAAAAAAAAAAAAAAAAAAAA"
    assert topic_id_text(uuid.UUID(bytes=bytes(range(16)))) == "AAECAwQFBgcICQoLDA0ODw"


def _metadata(topics: list[dict[str, Any]], live: list[int]) -> Any:
    brokers = [{"node_id": i, "host": "h", "port": 9000 + i} for i in live]
    return build(
        response_class(3, 12),
        {"brokers": brokers, "controller_id": live[0], "topics": topics},
    )


def _partition(index: int, leader: int, replicas: list[int], isr: list[int], offline=()) -> dict:
    return {
        "partition_index": index,
        "leader_id": leader,
        "replica_nodes": replicas,
        "isr_nodes": isr,
        "offline_replicas": list(offline),
    }


def test_describe_lines_match_kafka_topics():
    metadata = _metadata(
        [
            {
                "name": "orders",
                "topic_id": uuid.UUID(int=0),
                "partitions": [
                    _partition(1, 3, [3, 1, 2], [3, 1], offline=[2]),
                    _partition(0, 1, [1, 2, 3], [1, 2, 3]),
                    _partition(2, -1, [2, 3, 1], [2]),
                ],
            }
        ],
        live=[1, 3],
    )
    configs = {"orders": [("retention.ms", "1000"), ("cleanup.policy", "delete")]}
    assert describe_lines(metadata, configs) == [
        "Topic: orders\tTopicId: AAAAAAAAAAAAAAAAAAAAAA\tPartitionCount: 3\tReplicationFactor: 3"
        "\tConfigs: retention.ms=1000,cleanup.policy=delete",
        "\tTopic: orders\tPartition: 0\tLeader: 1\tReplicas: 1,2,3\tIsr: 1,2,3",
        "\tTopic: orders\tPartition: 1\tLeader: 3\tReplicas: 3,1,2\tIsr: 3,1\tOffline: 2",
        "\tTopic: orders\tPartition: 2\tLeader: none\tReplicas: 2,3,1\tIsr: 2",
    ]
    under = describe_lines(metadata, configs, under_replicated_only=True)
    assert [line.split("\t")[2] for line in under] == ["Partition: 1", "Partition: 2"]
    unavailable = describe_lines(metadata, configs, unavailable_only=True)
    assert [line.split("\t")[2] for line in unavailable] == ["Partition: 2"]


def test_format_status_lists_brokers_and_bad_partitions():
    offline = {"topic": "t", "partition": 0, "leader": -1, "replicas": [1], "isr": [1]}
    under = {"topic": "t", "partition": 1, "leader": 2, "replicas": [1, 2], "isr": [2]}
    status = {
        "bootstrap": "127.0.0.1:1,127.0.0.1:2",
        "zookeeper": {"connect": "127.0.0.1:5", "pid": 7, "process_alive": True, "reachable": True},
        "controller": {"id": 2, "epoch": 4},
        "brokers": [
            {"id": 1, "registered": False, "process": "dead", "pid": None, "endpoint": "x:1"},
            {"id": 2, "registered": True, "process": "stopped", "pid": 42, "endpoint": "x:2"},
        ],
        "topics": {
            "t": {
                "partitions": 2,
                "online": 1,
                "offline": 1,
                "under_replicated": 1,
                "offline_partitions": [offline],
                "under_replicated_partitions": [under],
            }
        },
        "totals": {"partitions": 2, "online": 1, "offline": 1, "under_replicated": 1},
    }
    text = format_status(status)
    assert "Controller  broker 2 (epoch 4)" in text
    assert [line.split() for line in text.splitlines() if line.startswith(("1 ", "2 "))] == [
        ["1", "no", "dead", "-", "x:1"],
        ["2", "yes", "stopped", "42", "x:2"],
    ]
    assert "Offline partitions (1):\n  t-0  leader none  replicas 1  isr 1" in text
    assert "Under-replicated partitions (1):\n  t-1  leader 2  replicas 1,2  isr 2" in text


# ---------------------------------------------------------------------------------------------
# Status, read from a real ZooKeeper


async def _write_cluster_znodes(
    connect: str,
    registered: list[int],
    controller: int,
    topics: dict[str, dict[int, tuple[list[int], tuple[int, list[int]] | None]]],
) -> None:
    """Hand-written Kafka znodes: registrations, the controller, topics and partition states
    (`None` for a partition without a state znode)."""
    zk = ZkClient(connect)
    await zk.start()
    try:
        ops: list[CreateOp] = [
            CreateOp("/brokers"),
            CreateOp("/brokers/ids"),
            CreateOp("/brokers/topics"),
        ]
        for broker_id in registered:
            data = BrokerIdZNode.encode([EndPoint.plaintext("127.0.0.1", 9000 + broker_id)])
            ops.append(CreateOp(BrokerIdZNode.path(broker_id), data))
        ops.append(CreateOp(ControllerZNode.path(), ControllerZNode.encode(controller)))
        ops.append(CreateOp(ControllerEpochZNode.path(), ControllerEpochZNode.encode(5)))
        await zk.multi(ops)
        ops = []
        for topic, partitions in topics.items():
            assignment = {p: replicas for p, (replicas, _) in partitions.items()}
            ops.append(CreateOp(TopicZNode.path(topic), TopicZNode.encode(assignment)))
            ops.append(CreateOp(f"{TopicZNode.path(topic)}/partitions"))
            for p, (_, state) in partitions.items():
                if state is None:
                    continue
                leader, isr = state
                ops.append(CreateOp(f"{TopicZNode.path(topic)}/partitions/{p}"))
                data = TopicPartitionStateZNode.encode(
                    leader=leader, leader_epoch=0, isr=isr, controller_epoch=5
                )
                ops.append(CreateOp(TopicPartitionStateZNode.path(topic, p), data))
        results = await zk.chunked_multi(None, ops)
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            raise errors[0]
    finally:
        await zk.close()


def test_read_status_classifies_partitions(zk_chroot: str):
    topics = {
        "a": {
            0: ([1, 2], (1, [1, 2])),  # healthy
            1: ([3, 1], (3, [3])),  # leader 3 is not registered: offline, under-replicated
            2: ([2, 1], (-1, [2])),  # no leader: offline, under-replicated
        },
        "b": {0: ([2], None)},  # no state znode yet: offline; an empty ISR is under-replicated
        "c": {0: ([1, 2], (2, [2, 1]))},  # healthy
    }
    asyncio.run(_write_cluster_znodes(zk_chroot, [1, 2], controller=2, topics=topics))

    status = asyncio.run(read_status(zk_chroot))

    assert sorted(status["registered"]) == [1, 2]
    assert status["registered"][1]["endpoint"] == "127.0.0.1:9001"
    assert status["controller"] == {"id": 2, "epoch": 5}
    a = status["topics"]["a"]
    assert (a["partitions"], a["online"], a["offline"], a["under_replicated"]) == (3, 1, 2, 2)
    assert [p["partition"] for p in a["offline_partitions"]] == [1, 2]
    assert a["offline_partitions"][0] == {
        "topic": "a",
        "partition": 1,
        "leader": 3,
        "replicas": [3, 1],
        "isr": [3],
    }
    b = status["topics"]["b"]
    assert (b["online"], b["offline"], b["under_replicated"]) == (0, 1, 1)
    assert status["totals"] == {"partitions": 5, "online": 2, "offline": 3, "under_replicated": 3}


def test_read_status_of_ten_thousand_partitions_is_fast(zk_chroot: str):
    per_topic = 1000
    topics = {
        f"t{t}": {
            p: ([1, 2, 3], (1 + p % 3, [1, 2, 3] if p % 10 else [1 + p % 3]))
            for p in range(per_topic)
        }
        for t in range(10)
    }
    asyncio.run(_write_cluster_znodes(zk_chroot, [1, 2, 3], controller=1, topics=topics))

    started = time.monotonic()
    status = asyncio.run(read_status(zk_chroot))
    elapsed = time.monotonic() - started

    assert status["totals"] == {
        "partitions": 10_000,
        "online": 10_000,
        "offline": 0,
        "under_replicated": 1_000,
    }
    # Pipelined reads take about a second here; one round trip per read would take far longer.
    assert elapsed < 15, f"status of 10,000 partitions took {elapsed:.1f}s"


# ---------------------------------------------------------------------------------------------
# Processes


def test_up_fails_fast_with_the_brokers_error_and_leaves_nothing(tmp_path: Path):
    with pytest.raises(OperatorError) as failure:
        LocalCluster.up(tmp_path, 1, per_broker_overrides={1: {"num.partitions": "0"}})
    message = str(failure.value)
    assert "broker 1 exited during start-up" in message
    assert "num.partitions" in message
    assert processes_mentioning(str(tmp_path)) == []
    assert zombie_children() == []
    document = json.loads((tmp_path / CLUSTER_FILE).read_text())
    assert document["zookeeper"]["pid"] is None
    assert [b["pid"] for b in document["brokers"]] == [None]


def test_up_refuses_a_port_in_use(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OperatorError, match=f"port {port} \\(broker 1\\) is in use"):
            LocalCluster.up(tmp_path, 1, base_port=port - 1)
    assert processes_mentioning(str(tmp_path)) == []


def test_local_cluster_fault_drills(make_cluster: Any):
    cluster = make_cluster(3)
    directory = cluster.directory

    document = json.loads((directory / CLUSTER_FILE).read_text())
    assert set(document) == {"zookeeper", "brokers", "bootstrap", "client_config"}
    assert document["zookeeper"]["connect"] == cluster.zookeeper_connect
    assert {"connect", "port", "pid", "dir", "log"} <= set(document["zookeeper"])
    assert [b["id"] for b in document["brokers"]] == [1, 2, 3]
    assert {"id", "host", "port", "pid", "dir", "data_dir", "log", "config"} <= set(
        document["brokers"][0]
    )
    assert document["bootstrap"] == cluster.bootstrap_servers
    assert all(cluster.is_alive(i) for i in (1, 2, 3))
    status = cluster.status()
    assert [b["registered"] for b in status["brokers"]] == [True, True, True]
    assert status["controller"]["id"] in (1, 2, 3)
    assert cluster.controller_id() == status["controller"]["id"]

    cluster.stop(2)
    assert cluster.process_state(2) is ProcessState.STOPPED
    cluster.cont(2)
    assert cluster.process_state(2) is ProcessState.RUNNING

    old_pid = cluster.broker(1).pid
    old_epoch = cluster.status()["brokers"][0]["broker_epoch"]
    assert cluster.kill(1)
    assert not cluster.is_alive(1)
    assert zombie_children() == []
    assert json.loads((directory / CLUSTER_FILE).read_text())["brokers"][0]["pid"] is None
    wait_until(
        lambda: cluster.status()["brokers"][0]["registered"] is False,
        30,
        "broker 1's registration to expire",
    )

    cluster.restart(1)
    assert cluster.is_alive(1)
    assert cluster.broker(1).pid not in (None, old_pid)
    broker1 = cluster.status()["brokers"][0]
    assert broker1["registered"] and broker1["broker_epoch"] != old_epoch

    # A controlled shutdown exits by itself and closes the session: unregistered at once.
    assert cluster.terminate(3, timeout=60)
    assert not cluster.is_alive(3)
    assert 3 not in cluster.registered_brokers()

    pids = [b.pid for b in cluster.brokers if b.pid is not None]
    cluster.down()
    assert processes_mentioning(str(directory)) == []
    assert zombie_children() == []
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)
    assert (directory / "broker-1" / "broker.log").exists()


def test_make_cluster_on_the_shared_zookeeper(make_cluster: Any, zookeeper: ZooKeeperHandle):
    cluster = make_cluster(1, shared_zookeeper=True, num_partitions=2)
    assert cluster.zookeeper_connect.startswith(zookeeper.connect_string + "/")
    assert "num.partitions=2" in cluster.broker(1).config.read_text().splitlines()
    status = cluster.status()
    assert status["zookeeper"]["external"] is True
    assert status["controller"]["id"] == 1


def test_cluster3_fixture_serves_clients(cluster3: LocalCluster, capsys: pytest.CaptureFixture):
    assert len(cluster3.brokers) == 3
    topic = f"fixture-{uuid.uuid4().hex[:8]}"
    bootstrap = cluster3.bootstrap_servers
    code, out, err = run_main(
        capsys, "topics", "--bootstrap-server", bootstrap, "--create", "--topic", topic
    )
    assert (code, out.strip(), err) == (0, f"Created topic {topic}.", "")

    def listed() -> bool:
        # --list may reach a broker whose UpdateMetadata for the new topic is still on its way
        # (as with Kafka, only the broker that answered CreateTopics is sure to know it).
        code, out, _ = run_main(capsys, "topics", "--bootstrap-server", bootstrap, "--list")
        return code == 0 and topic in out.splitlines()

    wait_until(listed, timeout=30, message=f"{topic} in the topic list")
    code, _, _ = run_main(
        capsys, "topics", "--bootstrap-server", bootstrap, "--delete", "--topic", topic
    )
    assert code == 0


# ---------------------------------------------------------------------------------------------
# The command line, end to end


def odradek(*argv: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "odradek.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    print(
        f"odradek {' '.join(argv)}: exit {result.returncode} in {time.monotonic() - started:.1f}s"
    )
    return result


def cli_status(directory: Path) -> dict[str, Any]:
    result = odradek("cluster", "status", "--dir", str(directory), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_cluster_cli_up_status_kill_restart_down(tmp_path: Path):
    directory = tmp_path / "cluster"
    up = odradek("cluster", "up", "--brokers", "3", "--dir", str(directory))
    try:
        assert up.returncode == 0, up.stderr
        bootstrap = up.stdout.strip()
        assert bootstrap == json.loads((directory / CLUSTER_FILE).read_text())["bootstrap"]
        assert len(bootstrap.split(",")) == 3

        again = odradek("cluster", "up", "--brokers", "3", "--dir", str(directory))
        assert again.returncode == 1
        assert again.stderr.startswith("odradek: error: a cluster is already running")

        status = cli_status(directory)
        assert [(b["id"], b["registered"], b["process"]) for b in status["brokers"]] == [
            (1, True, "running"),
            (2, True, "running"),
            (3, True, "running"),
        ]
        assert status["controller"]["id"] in (1, 2, 3)

        topics = ("topics", "--bootstrap-server", bootstrap)
        created = odradek(*topics, "--create", "--topic", "solo", "--replica-assignment", "1")
        assert (created.returncode, created.stdout) == (0, "Created topic solo.\n"), created.stderr
        created = odradek(*topics, "--create", "--topic", "trio", "--replication-factor", "3")
        assert created.returncode == 0, created.stderr
        duplicate = odradek(*topics, "--create", "--topic", "trio")
        assert duplicate.returncode == 1
        assert duplicate.stderr.startswith("odradek: error: TOPIC_ALREADY_EXISTS")
        described = odradek(*topics, "--describe", "--topic", "trio")
        assert described.stdout.startswith("Topic: trio\tTopicId: ")
        assert "\tPartitionCount: 1\tReplicationFactor: 3\t" in described.stdout

        killed = odradek("cluster", "kill", "1", "--dir", str(directory))
        assert killed.returncode == 0, killed.stderr
        broker1 = cli_status(directory)["brokers"][0]
        assert (broker1["process"], broker1["process_alive"]) == ("dead", False)
        status = wait_until(
            lambda: (
                (s := cli_status(directory))["brokers"][0]["registered"] is False
                and s["topics"]["solo"]["offline"] == 1
                and s["topics"]["trio"]["under_replicated"] == 1
                and s
            ),
            60,
            "broker 1 to be gone from ZooKeeper and its partitions to be reported",
        )
        assert status["topics"]["solo"]["offline_partitions"][0]["partition"] == 0
        assert odradek(*topics, "--describe", "--unavailable-partitions").stdout.startswith(
            "\tTopic: solo\tPartition: 0\tLeader: none"
        )

        restarted = odradek("cluster", "restart", "1", "--dir", str(directory))
        assert restarted.returncode == 0, restarted.stderr
        broker1 = cli_status(directory)["brokers"][0]
        assert (broker1["registered"], broker1["process"]) == (True, "running")

        deleted = odradek(*topics, "--delete", "--topic", "solo")
        assert deleted.returncode == 0, deleted.stderr
        missing = odradek(*topics, "--describe", "--topic", "solo")
        assert missing.returncode == 1
        assert missing.stderr.startswith("odradek: error: UNKNOWN_TOPIC_OR_PARTITION")

        down = odradek("cluster", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr
        wait_until(
            lambda: processes_mentioning(str(directory)) == [],
            30,
            "every process of the cluster to be gone",
        )
        document = json.loads((directory / CLUSTER_FILE).read_text())
        assert document["zookeeper"]["pid"] is None
        assert [b["pid"] for b in document["brokers"]] == [None, None, None]
    finally:
        if (directory / CLUSTER_FILE).exists():
            LocalCluster.load(directory).kill_all()


def test_cluster_cli_with_a_zookeeper_ensemble(tmp_path: Path):
    """`cluster up --zookeepers 3`: three members in one quorum, all in the brokers'
    zookeeper.connect; the cluster keeps working with one member killed; `cluster down` stops
    every member."""
    directory = tmp_path / "cluster"
    up = odradek("cluster", "up", "--brokers", "1", "--zookeepers", "3", "--dir", str(directory))
    try:
        assert up.returncode == 0, up.stderr
        zookeeper = json.loads((directory / CLUSTER_FILE).read_text())["zookeeper"]
        members = zookeeper["servers"]
        assert [m["id"] for m in members] == [1, 2, 3]
        assert zookeeper["connect"] == ",".join(f"{m['host']}:{m['port']}" for m in members)
        config = (directory / "broker-1" / "server.properties").read_text()
        assert f"zookeeper.connect={zookeeper['connect']}" in config
        modes = sorted(server_mode(m["host"], m["port"]) or "none" for m in members)
        assert modes == ["follower", "follower", "leader"]
        for member in members:
            assert (Path(member["dir"]) / "myid").read_text().strip() == str(member["id"])

        leader = next(m for m in members if server_mode(m["host"], m["port"]) == "leader")
        os.killpg(leader["pid"], 9)
        bootstrap = up.stdout.strip()
        created = odradek("topics", "--bootstrap-server", bootstrap, "--create", "--topic", "t")
        assert created.returncode == 0, created.stderr
        assert cli_status(directory)["brokers"][0]["registered"] is True

        down = odradek("cluster", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr
        wait_until(
            lambda: processes_mentioning(str(directory)) == [],
            30,
            "every ZooKeeper member and the broker to be gone",
        )
        document = json.loads((directory / CLUSTER_FILE).read_text())
        assert [m["pid"] for m in document["zookeeper"]["servers"]] == [None, None, None]
    finally:
        if (directory / CLUSTER_FILE).exists():
            LocalCluster.load(directory).kill_all()
