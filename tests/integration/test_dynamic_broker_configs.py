"""Dynamic broker configs (KIP-226) and broker loggers (KIP-412) on a running 3-broker cluster of
its own (module scope: the tests change broker configs and restart a broker, which the shared
`cluster3` must not see).

A topic `sized` has one partition led by each broker (replicas [1], [2], [3]), so a produce to
partition i asks broker i+1 whether a record fits its `message.max.bytes`: the cluster default
set with `odradek configs --entity-default` reaches all three without a restart and survives one;
a per-broker value reaches that broker only; a static config is refused; describe output is what
Kafka 3.9.1's own kafka-configs tool prints; confluent-kafka's incremental_alter_configs works on
BROKER; a logger's level set at run time shows in that broker's log; turning the unclean
election default on makes the controller elect a leader for an offline partition.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from cryptography import x509
from kazoo.client import KazooClient

from odradek.protocol.codec import ApiKey
from odradek.security.certificates import LocalPki, create_local_pki
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration import _wire
from tests.integration._kafka import KafkaBroker, kafka_available, kafka_libs, require_kafka
from tests.integration._tools import assert_one_line_error, odradek_in_process

TOPIC = "sized"
BIG, SMALL, LIMIT = 3000, 1000, 2000


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    return create_local_pki(tmp_path_factory.mktemp("pki"), [1, 2, 3])


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: Any, pki: LocalPki
) -> Iterator[LocalCluster]:
    """Three brokers with a PLAINTEXT listener (clients, brokers) and an SSL one."""
    zookeeper.ensure_running()
    cluster = LocalCluster.up(
        tmp_path_factory.mktemp("dynconfig"),
        3,
        zookeeper=f"{zookeeper.connect_string}/dynconfig-{uuid.uuid4().hex}",
        timeout=120,
        listeners={"PLAINTEXT": "PLAINTEXT", "SSL": "SSL"},
        inter_broker_listener="PLAINTEXT",
        overrides={"ssl.keystore.type": "PEM"},
        per_broker_overrides={
            i: {"ssl.keystore.location": str(pki.brokers[i].keystore)} for i in (1, 2, 3)
        },
    )
    try:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        futures = admin.create_topics(
            [NewTopic(TOPIC, num_partitions=3, replica_assignment=[[1], [2], [3]])],
            operation_timeout=30,
        )
        futures[TOPIC].result(timeout=60)
        yield cluster
    finally:
        cluster.down(timeout=30)
        cluster.kill_all()


def produce(bootstrap: str, partition: int, size: int) -> int | None:
    """One record of `size` bytes to `sized`-`partition`; the error code, None if written."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "message.max.bytes": 10_000_000,
            "delivery.timeout.ms": 20_000,
            "linger.ms": 0,
        }
    )
    outcome: list[KafkaError | None] = []
    producer.produce(
        TOPIC, b"x" * size, partition=partition, on_delivery=lambda e, m: outcome.append(e)
    )
    producer.flush(30)
    assert outcome, "no delivery report"
    return None if outcome[0] is None else outcome[0].code()


def accepts(cluster: LocalCluster, sizes: dict[int, bool]) -> bool:
    """Does each partition take (True) or refuse as too large (False) a BIG record?"""
    for partition, fits in sizes.items():
        code = produce(cluster.bootstrap_servers, partition, BIG)
        if fits and code is not None:
            return False
        if not fits and code != KafkaError.MSG_SIZE_TOO_LARGE:
            return False
    return True


def tool(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    return odradek_in_process(capsys, *args)


def configs(cluster: LocalCluster) -> tuple[str, ...]:
    return ("configs", "--bootstrap-server", cluster.bootstrap_servers)


def test_the_cluster_default_reaches_every_broker_and_survives_a_restart(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    assert accepts(cluster, {0: True, 1: True, 2: True})
    result = tool(
        capsys, *configs(cluster), "--entity-type", "brokers", "--entity-default", "--alter",
        "--add-config", f"message.max.bytes={LIMIT}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Completed updating default config for brokers in the cluster.\n"
    # Every broker applies it on the notification, without a restart.
    wait_until(lambda: accepts(cluster, {0: False, 1: False, 2: False}), 30, "all three to refuse")
    assert all(produce(cluster.bootstrap_servers, p, SMALL) is None for p in range(3))
    result = tool(
        capsys, *configs(cluster), "--entity-type", "brokers", "--entity-default", "--describe"
    )
    assert result.stdout.splitlines() == [
        "Default configs for brokers in the cluster are:",
        f"  message.max.bytes={LIMIT} sensitive=false "
        f"synonyms={{DYNAMIC_DEFAULT_BROKER_CONFIG:message.max.bytes={LIMIT}}}",
    ]
    # Stored in ZooKeeper: a restarted broker starts with it.
    cluster.restart(2, timeout=60)
    wait_until(
        lambda: produce(cluster.bootstrap_servers, 1, SMALL) is None, 60, "broker 2 to lead again"
    )
    assert produce(cluster.bootstrap_servers, 1, BIG) == KafkaError.MSG_SIZE_TOO_LARGE
    result = tool(
        capsys, *configs(cluster), "--broker-defaults", "--alter", "--delete-config", "message.max.bytes"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    wait_until(lambda: accepts(cluster, {0: True, 1: True, 2: True}), 30, "the limit to go")


def test_a_per_broker_value_reaches_that_broker_only(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    result = tool(
        capsys, *configs(cluster), "--broker", "1", "--alter", "--add-config", f"message.max.bytes={LIMIT}"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Completed updating config for broker 1.\n"
    try:
        wait_until(lambda: accepts(cluster, {0: False, 1: True, 2: True}), 30, "broker 1 only")
        result = tool(capsys, *configs(cluster), "--broker", "1", "--describe")
        assert result.stdout.splitlines() == [
            "Dynamic configs for broker 1 are:",
            f"  message.max.bytes={LIMIT} sensitive=false synonyms={{DYNAMIC_BROKER_CONFIG:"
            f"message.max.bytes={LIMIT}, DEFAULT_CONFIG:message.max.bytes=1048588}}",
        ]
        assert tool(capsys, *configs(cluster), "--broker", "2", "--describe").stdout == (
            "Dynamic configs for broker 2 are:\n"
        )
        # A per-broker change goes to that broker: another refuses it, as Kafka does.
        assert _alter_on_the_wrong_broker(cluster) == (
            42,  # INVALID_REQUEST
            "Unexpected broker id, expected 1, but received 3",
        )
    finally:
        result = tool(
            capsys, *configs(cluster), "--broker", "1", "--alter", "--delete-config", "message.max.bytes"
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    wait_until(lambda: accepts(cluster, {0: True}), 30, "broker 1's limit to go")


def _alter_on_the_wrong_broker(cluster: LocalCluster) -> tuple[int, str]:
    from odradek.cli.topics import AdminClient as OdradekAdmin

    async def send() -> tuple[int, str]:
        host, port = cluster.broker(1).host, cluster.broker(1).port
        client = await OdradekAdmin.connect([(host, port)], 30.0)
        try:
            response = await client._send(
                client.bootstrap,
                ApiKey.INCREMENTAL_ALTER_CONFIGS,
                1,
                {
                    "resources": [
                        {
                            "resource_type": 4,
                            "resource_name": "3",
                            "configs": [
                                {"name": "message.max.bytes", "config_operation": 0, "value": "9"}
                            ],
                        }
                    ],
                    "validate_only": False,
                },
            )
        finally:
            client.close()
        result = response.responses[0]
        return int(result.error_code), result.error_message

    return asyncio.run(send())


def test_static_configs_and_bad_values_are_refused(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    result = tool(
        capsys, *configs(cluster), "--broker", "1", "--alter", "--add-config", "broker.id=7"
    )
    assert_one_line_error(result, "Cannot update these configs dynamically: Set(broker.id)")
    result = tool(
        capsys, *configs(cluster), "--broker-defaults", "--alter", "--add-config", "log.cleaner.threads=5"
    )  # fmt: skip
    assert_one_line_error(result, "more than double the current value 1")
    result = tool(
        capsys, *configs(cluster), "--broker-defaults", "--alter", "--add-config", "message.max.bytes=lots"
    )  # fmt: skip
    assert_one_line_error(result, "INVALID_REQUEST")
    assert tool(capsys, *configs(cluster), "--broker-defaults", "--describe").stdout == (
        "Default configs for brokers in the cluster are:\n"
    )


def test_confluent_incremental_alter_configs_on_a_broker(cluster: LocalCluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})

    def alter(operation: AlterConfigOpType, value: str | None, validate_only: bool = False) -> None:
        entry = ConfigEntry("log.cleaner.backoff.ms", value, incremental_operation=operation)
        resource = ConfigResource(ResourceType.BROKER, "2", incremental_configs=[entry])
        futures = admin.incremental_alter_configs([resource], validate_only=validate_only)
        futures[resource].result(timeout=30)

    def described() -> Any:
        resource = ConfigResource(ResourceType.BROKER, "2")
        return admin.describe_configs([resource])[resource].result(timeout=30)[
            "log.cleaner.backoff.ms"
        ]

    alter(AlterConfigOpType.SET, "5000", validate_only=True)
    assert described().value == "15000"
    alter(AlterConfigOpType.SET, "5000")
    entry = wait_until(lambda: (e := described()).value == "5000" and e, 30, "the new value")
    assert entry.source == 2  # DYNAMIC_BROKER_CONFIG
    assert not entry.is_read_only
    alter(AlterConfigOpType.DELETE, None)
    wait_until(lambda: described().value == "15000", 30, "the default again")


def test_kafka_configs_tool_prints_the_same(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    if not kafka_available():
        pytest.skip("Kafka's jars are not installed (./dev kafka)")
    args = ("--entity-type", "brokers", "--entity-name", "3")
    result = tool(
        capsys,
        *configs(cluster),
        "--broker",
        "3",
        "--alter",
        "--add-config",
        "num.replica.fetchers=2",
    )
    assert result.returncode == 0, result.stderr
    try:
        ours = tool(capsys, *configs(cluster), *args, "--describe", "--all").stdout
        kafka = subprocess.run(
            [
                "java", "-Xmx256m", "-cp", f"{kafka_libs()}/*", "kafka.admin.ConfigCommand",
                "--bootstrap-server", cluster.bootstrap_servers, *args, "--describe", "--all",
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert kafka.returncode == 0, kafka.stderr
        assert kafka.stdout.splitlines() == ours.splitlines()
        assert (
            "  num.replica.fetchers=2 sensitive=false synonyms={DYNAMIC_BROKER_CONFIG:"
            "num.replica.fetchers=2, DEFAULT_CONFIG:num.replica.fetchers=1}"
        ) in kafka.stdout.splitlines()
        assert any(line.startswith("  broker.id=3 sensitive=false synonyms={STATIC_BROKER_CONFIG:broker.id=3")
                   for line in kafka.stdout.splitlines())  # fmt: skip
    finally:
        tool(
            capsys,
            *configs(cluster),
            "--broker",
            "3",
            "--alter",
            "--delete-config",
            "num.replica.fetchers",
        )


def test_num_replica_fetchers_moves_followed_partitions_to_new_fetchers(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Broker 2 follows four partitions led by broker 1; with num.replica.fetchers=2 they are
    spread over two fetchers, and every record written afterwards still reaches broker 2."""
    topic = "fetched"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=4, replica_assignment=[[1, 2]] * 4)]
    )
    futures[topic].result(timeout=60)
    result = tool(
        capsys, *configs(cluster), "--broker", "2", "--alter", "--add-config", "num.replica.fetchers=2"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    try:
        wait_until(
            lambda: "2 replica fetchers per leader now" in cluster.broker(2).log.read_text(),
            30,
            "broker 2 to resize its fetchers",
        )
        producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
        for partition in range(4):
            producer.produce(topic, b"after the resize", partition=partition)
        assert producer.flush(30) == 0

        def replicated() -> bool:
            sizes = [
                [
                    (cluster.broker(b).data_dir / f"{topic}-{p}" / f"{0:020d}.log").stat().st_size
                    for b in (1, 2)
                ]
                for p in range(4)
            ]
            return all(leader == follower > 0 for leader, follower in sizes)

        wait_until(replicated, 30, "broker 2 to copy every partition")
    finally:
        tool(
            capsys, *configs(cluster), "--broker", "2", "--alter",
            "--delete-config", "num.replica.fetchers",
        )  # fmt: skip


def test_a_logger_level_set_at_run_time_shows_in_the_broker_log(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    logger = "odradek.server.dynamic_config_manager"
    result = tool(capsys, *configs(cluster), "--broker-logger", "1", "--describe")
    assert f"  {logger}=INFO sensitive=false synonyms={{}}" in result.stdout.splitlines()
    result = tool(
        capsys, *configs(cluster), "--broker-logger", "1", "--alter", "--add-config", f"{logger}=DEBUG"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Completed updating config for broker-logger 1.\n"
    result = tool(capsys, *configs(cluster), "--broker-logger", "1", "--describe")
    assert f"  {logger}=DEBUG sensitive=false synonyms={{}}" in result.stdout.splitlines()
    # Any config change now makes broker 1 (only) log its notification at DEBUG.
    tool(
        capsys,
        *configs(cluster),
        "--topic",
        TOPIC,
        "--alter",
        "--add-config",
        "retention.ms=86400000",
    )
    line = f"DEBUG {logger}: config change notification"
    wait_until(lambda: line in cluster.broker(1).log.read_text(), 30, "the DEBUG line")
    assert line not in cluster.broker(2).log.read_text()
    result = tool(
        capsys, *configs(cluster), "--broker-logger", "1", "--alter", "--delete-config", logger
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    result = tool(
        capsys, *configs(cluster), "--broker-logger", "1", "--alter", "--add-config", "no.such.logger=DEBUG"
    )  # fmt: skip
    assert_one_line_error(result, "Invalid broker logger(s): no.such.logger")


def test_the_unclean_election_default_turned_on_elects_an_offline_partition(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Broker 3 leads `unclean`-0 alone in the ISR, with broker 2 a follower outside it; broker 3
    dies, so the partition has no eligible leader. Setting unclean.leader.election.enable=true as
    the cluster default makes the controller elect broker 2 at once (Kafka's
    UncleanLeaderElectionEnable), an election it logs as unclean."""
    topic = "unclean"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[3, 2]])])[
        topic
    ].result(timeout=60)
    zk = KazooClient(hosts=cluster.zookeeper_connect)
    zk.start(timeout=15)
    path = f"/brokers/topics/{topic}/partitions/0/state"
    warning = "unclean leader election: 2 becomes leader though it was not in ISR [3]"
    try:
        state = wait_until(
            lambda: zk.exists(path) and json.loads(zk.get(path)[0]), 30, "the partition state"
        )
        assert state["leader"] == 3
        # The follower leaves the ISR, as a lagging one would.
        data, stat = zk.get(path)
        zk.set(path, json.dumps({**json.loads(data), "isr": [3]}).encode(), version=stat.version)
        cluster.kill(3)
        wait_until(lambda: not zk.exists("/brokers/ids/3"), 30, "broker 3's session to end")
        assert not any(warning in cluster.broker(b).log.read_text() for b in (1, 2))
        result = tool(
            capsys, *configs(cluster), "--broker-defaults", "--alter",
            "--add-config", "unclean.leader.election.enable=true",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        wait_until(lambda: json.loads(zk.get(path)[0])["leader"] == 2, 30, "broker 2 to be elected")
        assert json.loads(zk.get(path)[0])["isr"] == [2]
        assert any(warning in cluster.broker(b).log.read_text() for b in (1, 2))
    finally:
        tool(
            capsys, *configs(cluster), "--broker-defaults", "--alter",
            "--delete-config", "unclean.leader.election.enable",
        )  # fmt: skip
        zk.stop()
        zk.close()
        cluster.start_broker(3, timeout=60)


def _served_serial(cluster: LocalCluster, broker_id: int) -> int:
    """The serial number of the certificate the broker's SSL listener presents now."""
    broker = cluster.broker(broker_id)
    pem = ssl.get_server_certificate((broker.host, broker.listeners["SSL"]), timeout=10)
    return x509.load_pem_x509_certificate(pem.encode()).serial_number


def _serial(files: Any) -> int:
    return x509.load_pem_x509_certificates(files.certificate.read_bytes())[0].serial_number


def test_a_listener_keystore_is_reloaded_without_a_restart(
    cluster: LocalCluster, pki: LocalPki, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert _served_serial(cluster, 1) == _serial(pki.brokers[1])
    first = create_local_pki(tmp_path / "first", [1]).brokers[1]
    second = create_local_pki(tmp_path / "second", [1]).brokers[1]
    keystore = tmp_path / "rotating-keystore.pem"
    shutil.copy(first.keystore, keystore)
    setting = f"listener.name.ssl.ssl.keystore.location={keystore}"
    try:
        result = tool(
            capsys, *configs(cluster), "--broker", "1", "--alter", "--add-config", setting
        )
        assert result.returncode == 0, result.stderr
        wait_until(lambda: _served_serial(cluster, 1) == _serial(first), 30, "the new certificate")
        assert _served_serial(cluster, 2) == _serial(pki.brokers[2])
        # The file replaced in place is read again when the same location is sent again.
        shutil.copy(second.keystore, keystore)
        result = tool(
            capsys, *configs(cluster), "--broker", "1", "--alter", "--add-config", setting
        )
        assert result.returncode == 0, result.stderr
        wait_until(
            lambda: _served_serial(cluster, 1) == _serial(second), 30, "the replaced keystore"
        )
        # A keystore that does not load is refused; one for every broker makes no sense.
        missing = f"listener.name.ssl.ssl.keystore.location={tmp_path / 'missing.pem'}"
        result = tool(
            capsys, *configs(cluster), "--broker", "1", "--alter", "--add-config", missing
        )
        assert_one_line_error(result, "cannot read ssl.keystore.location")
        result = tool(
            capsys, *configs(cluster), "--broker-defaults", "--alter", "--add-config", setting
        )
        assert_one_line_error(result, "broker id must be specified")
        result = tool(
            capsys, *configs(cluster), "--broker", "1", "--alter",
            "--add-config", "listener.name.ssl.ssl.keystore.password=secret",
        )  # fmt: skip
        assert_one_line_error(result, "Password encoder secret not configured")
        assert _served_serial(cluster, 1) == _serial(second)
        # Stored in ZooKeeper: a restarted broker listens with it from the start.
        cluster.restart(1, timeout=60)
        assert _served_serial(cluster, 1) == _serial(second)
    finally:
        tool(
            capsys, *configs(cluster), "--broker", "1", "--alter",
            "--delete-config", "listener.name.ssl.ssl.keystore.location",
        )  # fmt: skip
    wait_until(
        lambda: _served_serial(cluster, 1) == _serial(pki.brokers[1]), 30, "the static keystore"
    )


def _second_connection_refused(cluster: LocalCluster, broker_id: int) -> bool:
    """With one connection to the broker's SSL listener open, is a second one closed at once?"""
    broker = cluster.broker(broker_id)
    address = (broker.host, broker.listeners["SSL"])
    with (
        socket.create_connection(address, timeout=5),
        socket.create_connection(address, timeout=5) as second,
    ):
        second.settimeout(3)
        try:
            return second.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def test_a_listener_connection_limit_applies_without_a_restart(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not _second_connection_refused(cluster, 2)
    limit = "listener.name.ssl.max.connections=1"
    result = tool(capsys, *configs(cluster), "--broker", "2", "--alter", "--add-config", limit)
    assert result.returncode == 0, result.stderr
    try:
        wait_until(lambda: _second_connection_refused(cluster, 2), 30, "the limit")
        assert not _second_connection_refused(cluster, 1)
    finally:
        tool(
            capsys, *configs(cluster), "--broker", "2", "--alter",
            "--delete-config", "listener.name.ssl.max.connections",
        )  # fmt: skip
    wait_until(lambda: not _second_connection_refused(cluster, 2), 30, "the limit to go")


def test_a_broker_whose_session_expired_catches_up_and_follows_again(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Broker 2 is frozen past its ZooKeeper session (its watches die with it) while the cluster
    default changes; resumed, in a new session, it applies the change it missed and follows the
    next one."""
    cluster.stop(2)
    try:
        wait_until(lambda: 2 not in cluster.registered_brokers(), 30, "the session to expire")
        result = tool(
            capsys, *configs(cluster), "--broker-defaults", "--alter",
            "--add-config", f"message.max.bytes={LIMIT}",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    finally:
        cluster.cont(2)
    try:
        wait_until(lambda: accepts(cluster, {1: False}), 60, "broker 2 to apply what it missed")
    finally:
        result = tool(
            capsys, *configs(cluster), "--broker-defaults", "--alter",
            "--delete-config", "message.max.bytes",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    wait_until(lambda: accepts(cluster, {1: True}), 30, "broker 2 to follow the next change")


# -- against a real Kafka 3.9.1 broker ------------------------------------------------------------

BROKER, BROKER_LOGGER = 4, 8
SET, DELETE, APPEND = 0, 1, 2

# (what, incremental?, resource type, resource name, configs): each answered with the same error
# code by Odradek's broker 1 and Kafka's broker 1 (validate_only, so neither stores anything).
REFUSALS = [
    ("a static config", True, BROKER, "1", [("broker.id", SET, "5")]),
    ("a synonym that is not the first", True, BROKER, "", [("log.retention.hours", SET, "5")]),
    ("a bad value", True, BROKER, "1", [("message.max.bytes", SET, "lots")]),
    ("a thread count more than doubled", True, BROKER, "", [("log.cleaner.threads", SET, "5")]),
    ("another broker's id", True, BROKER, "2", [("message.max.bytes", SET, "2000")]),
    ("a broker id that is no number", True, BROKER, "one", [("message.max.bytes", SET, "2000")]),
    ("APPEND to a config that is no list", True, BROKER, "1", [("message.max.bytes", APPEND, "1")]),
    ("duplicate keys", True, BROKER, "1", [("num.replica.fetchers", SET, "2")] * 2),
    ("a TLS file without the listener prefix", True, BROKER, "1",
     [("ssl.keystore.location", SET, "/k.pem")]),
    ("a valid change", True, BROKER, "", [("message.max.bytes", SET, "2000")]),
    ("a valid legacy change", False, BROKER, "1", [("num.replica.fetchers", SET, "2")]),
    ("a legacy static config", False, BROKER, "1", [("zookeeper.connect", SET, "x:1")]),
    ("a null value", False, BROKER, "1", [("num.replica.fetchers", SET, None)]),
    ("loggers through legacy AlterConfigs", False, BROKER_LOGGER, "1", [("root", SET, "INFO")]),
    ("an unknown logger", True, BROKER_LOGGER, "1", [("no.such.logger", SET, "INFO")]),
    ("an unknown level", True, BROKER_LOGGER, "1", [("root", SET, "LOUD")]),
    ("unsetting the root logger", True, BROKER_LOGGER, "1", [("root", DELETE, "")]),
    ("APPEND to a logger", True, BROKER_LOGGER, "1", [("root", APPEND, "INFO")]),
    ("another broker's loggers", True, BROKER_LOGGER, "2", [("root", SET, "INFO")]),
    ("a valid logger change", True, BROKER_LOGGER, "1", [("root", SET, "INFO")]),
]  # fmt: skip


@pytest.fixture(scope="module")
def kafka(zookeeper: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_kafka()
    zookeeper.ensure_running()
    broker = KafkaBroker(
        tmp_path_factory.mktemp("kafka-dynconfig"),
        f"{zookeeper.connect_string}/kafka-{uuid.uuid4().hex}",
    )
    try:
        broker.start()
        yield broker.bootstrap
    finally:
        broker.stop()


def _alter(bootstrap: str, incremental: bool, resource_type: int, name: str, entries: Any) -> str:
    if incremental:
        api, version = ApiKey.INCREMENTAL_ALTER_CONFIGS, 1
        configs = [{"name": n, "config_operation": op, "value": v} for n, op, v in entries]
    else:
        api, version = ApiKey.ALTER_CONFIGS, 1
        configs = [{"name": n, "value": v} for n, _, v in entries]
    body = {
        "resources": [{"resource_type": resource_type, "resource_name": name, "configs": configs}],
        "validate_only": True,
    }
    with _wire.WireConnection.to(bootstrap, timeout=10) as connection:
        response = connection.request(api, version, body)
    return response.responses[0].error_code.name


def _describe(bootstrap: str, names: list[str]) -> dict[str, Any]:
    body = {
        "resources": [{"resource_type": BROKER, "resource_name": "1", "configuration_keys": names}],
        "include_synonyms": True,
        "include_documentation": False,
    }
    with _wire.WireConnection.to(bootstrap, timeout=10) as connection:
        response = connection.request(ApiKey.DESCRIBE_CONFIGS, 4, body)
    return {
        c.name: (
            c.value,
            c.read_only,
            int(c.config_source),
            [(s.name, s.value, int(s.source)) for s in c.synonyms],
        )
        for c in response.results[0].configs
    }


def test_answers_match_a_real_kafka_broker(
    cluster: LocalCluster, kafka: str, capsys: pytest.CaptureFixture[str]
) -> None:
    odradek = f"{cluster.broker(1).host}:{cluster.broker(1).port}"
    differences = []
    for what, incremental, resource_type, name, entries in REFUSALS:
        ours = _alter(odradek, incremental, resource_type, name, entries)
        theirs = _alter(kafka, incremental, resource_type, name, entries)
        if ours != theirs:
            differences.append(f"{what}: Odradek {ours}, Kafka {theirs}")
    assert not differences, differences
    # The same dynamic default on both: the same values, sources and synonyms described.
    change = [("message.max.bytes", SET, "2000000"), ("log.retention.ms", SET, "172800000")]
    names = ["message.max.bytes", "log.retention.hours", "log.retention.ms", "broker.id"]
    names += ["log.cleaner.threads", "num.replica.fetchers", "unclean.leader.election.enable"]
    for bootstrap in (odradek, kafka):
        body = {
            "resources": [{"resource_type": BROKER, "resource_name": "", "configs": [
                {"name": n, "config_operation": op, "value": v} for n, op, v in change
            ]}],
            "validate_only": False,
        }  # fmt: skip
        with _wire.WireConnection.to(bootstrap, timeout=10) as connection:
            response = connection.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, body)
        answer = response.responses[0]
        assert answer.error_code.name == "none", (bootstrap, answer.error_message)
    try:
        for bootstrap in (odradek, kafka):
            wait_until(
                lambda b=bootstrap: (
                    _describe(b, ["log.retention.ms"])["log.retention.ms"][0] == "172800000"
                ),
                30,
                f"the default on {bootstrap}",
            )
        assert _describe(odradek, names) == _describe(kafka, names)
    finally:
        for bootstrap in (odradek, kafka):
            body = {
                "resources": [{"resource_type": BROKER, "resource_name": "", "configs": [
                    {"name": n, "config_operation": DELETE, "value": None} for n, _, _ in change
                ]}],
                "validate_only": False,
            }  # fmt: skip
            with _wire.WireConnection.to(bootstrap, timeout=10) as connection:
                connection.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, body)
