"""`odradek configs` (topics, brokers, the broker default, client quotas) and `odradek dump-log`
on the shared cluster: a config the tool sets is what confluent-kafka's admin client describes, a
config the admin client sets is what the tool prints, a change the brokers refuse is one line and
exit status 1, and dump-log, reading a live broker's partition directory, prints exactly the
offsets, keys and values a producer wrote."""

from __future__ import annotations

import re
import subprocess

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._clients import create_topic, unique_topic
from tests.integration._kafka import kafka_available, kafka_libs
from tests.integration._tools import (
    assert_one_line_error,
    end_offsets,
    odradek,
    odradek_in_process,
)


def _described(bootstrap: str, topic: str) -> dict[str, tuple[str, bool]]:
    """name -> (value, is_default) through confluent-kafka's DescribeConfigs."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result()
    return {name: (entry.value, entry.is_default) for name, entry in entries.items()}


def test_configs_topics_match_the_admin_client(
    cluster3: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap = cluster3.bootstrap_servers

    def tool(*args: str) -> subprocess.CompletedProcess[str]:
        return odradek_in_process(capsys, *args)

    topic = unique_topic("configs")
    create_topic(bootstrap, topic, partitions=1, replication_factor=3)
    cli = ("configs", "--bootstrap-server", bootstrap)
    result = odradek(
        *cli, "--entity-type", "topics", "--entity-name", topic, "--alter",
        "--add-config", "retention.ms=3600000,cleanup.policy=[compact,delete]",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"Completed updating config for topic {topic}.\n"
    described = _described(bootstrap, topic)
    assert described["retention.ms"] == ("3600000", False)
    assert described["cleanup.policy"] == ("compact,delete", False)

    # Set by the admin client, shown by the tool; only the topic's own configs without --all.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("segment.ms", "600000", incremental_operation=AlterConfigOpType.SET)],
    )  # fmt: skip
    admin.incremental_alter_configs([resource])[resource].result()
    result = tool(*cli, "--topic", topic, "--describe")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"Dynamic configs for topic {topic} are:"
    assert [line.split(" sensitive=")[0] for line in lines[1:]] == [
        "  cleanup.policy=compact,delete",
        "  retention.ms=3600000",
        "  segment.ms=600000",
    ]
    assert all(re.search(r" sensitive=false synonyms=\{.*\}$", line) for line in lines[1:])
    everything = tool(*cli, "--topic", topic, "--describe", "--all")
    assert everything.stdout.startswith(f"All configs for topic {topic} are:\n")
    shown = {
        line.split("=", 1)[0].strip(): line.split("=", 1)[1].split(" sensitive=")[0]
        for line in everything.stdout.splitlines()[1:]
    }
    assert shown == {name: value for name, (value, _) in _described(bootstrap, topic).items()}

    result = tool(*cli, "--topic", topic, "--alter", "--delete-config", "retention.ms,segment.ms")
    assert result.returncode == 0, result.stderr
    described = _described(bootstrap, topic)
    assert described["retention.ms"][1] and described["segment.ms"][1]  # back to defaults
    result = tool(*cli, "--topic", topic, "--alter", "--delete-config", "retention.ms")
    assert_one_line_error(result, "Invalid config(s): retention.ms")
    result = tool(*cli, "--topic", topic, "--alter", "--add-config", "no.such.config=1")
    assert_one_line_error(result, "INVALID_CONFIG")
    assert _described(bootstrap, topic)["cleanup.policy"] == ("compact,delete", False)


def test_configs_brokers_and_quotas(
    cluster3: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap = cluster3.bootstrap_servers

    def tool(*args: str) -> subprocess.CompletedProcess[str]:
        return odradek_in_process(capsys, *args)

    cli = ("configs", "--bootstrap-server", bootstrap)
    # Every broker answers for itself, then the cluster-wide default.
    result = tool(*cli, "--entity-type", "brokers", "--describe")
    assert result.returncode == 0, result.stderr
    headers = [line for line in result.stdout.splitlines() if not line.startswith("  ")]
    assert headers == [f"Dynamic configs for broker {b.id} are:" for b in cluster3.brokers] + [
        "Default configs for brokers in the cluster are:"
    ]
    result = tool(*cli, "--broker", "2", "--describe", "--all")
    assert result.returncode == 0, result.stderr
    configs = dict(
        line.strip().split(" sensitive=")[0].split("=", 1)
        for line in result.stdout.splitlines()[1:]
    )
    assert configs["broker.id"] == "2"
    assert configs["zookeeper.connect"]

    # A broker config change the brokers refuse (a static config, a thread count more than
    # doubled): Kafka's error, one line, exit status 1. Accepted changes are in
    # test_dynamic_broker_configs, on a cluster of their own.
    result = tool(*cli, "--broker", "1", "--alter", "--add-config", "broker.id=5")
    assert_one_line_error(result, "INVALID_REQUEST")
    result = tool(*cli, "--broker-defaults", "--alter", "--add-config", "log.cleaner.threads=5")
    assert_one_line_error(result, "INVALID_REQUEST")
    result = tool(*cli, "--broker", "9", "--describe")
    assert_one_line_error(result, "broker 9 is not in the cluster")
    # SCRAM credentials of a user, as confluent-kafka's admin client describes them.
    user = unique_topic("user")
    result = tool(
        *cli, "--user", user, "--alter", "--add-config", "SCRAM-SHA-512=[iterations=8192,password=pw]"
    )  # fmt: skip
    assert (
        result.returncode == 0 and result.stdout == f"Completed updating config for user {user}.\n"
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_user_scram_credentials([user])[user].result()
    assert [(i.mechanism.name, i.iterations) for i in described.scram_credential_infos] == [
        ("SCRAM_SHA_512", 8192)
    ]
    # A quota beside the credentials: the same znode, neither clobbers the other.
    result = tool(*cli, "--user", user, "--alter", "--add-config", "producer_byte_rate=4096")
    assert result.returncode == 0, result.stderr
    result = tool(*cli, "--user", user, "--describe")
    assert result.stdout == (
        f"Quota configs for user-principal '{user}' are producer_byte_rate=4096.0\n"
        f"SCRAM credential configs for user-principal '{user}' are SCRAM-SHA-512=iterations=8192\n"
    ), result.stderr
    result = tool(*cli, "--user", user, "--alter", "--delete-config", "SCRAM-SHA-512")
    assert result.returncode == 0, result.stderr
    result = tool(*cli, "--user", user, "--describe")
    assert (
        result.stdout
        == f"Quota configs for user-principal '{user}' are producer_byte_rate=4096.0\n"
    )
    result = tool(*cli, "--user", user, "--alter", "--delete-config", "producer_byte_rate")
    assert result.returncode == 0, result.stderr
    assert tool(*cli, "--user", user, "--describe").stdout == ""
    # Client quotas: a user+client entity and a client default, described back; bad values are
    # Kafka's INVALID_REQUEST, one line.
    client = unique_topic("client")
    result = tool(
        *cli, "--user-defaults", "--client", client, "--alter",
        "--add-config", "consumer_byte_rate=2048,request_percentage=12.5",
    )  # fmt: skip
    assert result.stdout == "Completed updating default config for users in the cluster.\n"
    result = tool(*cli, "--user-defaults", "--client", client, "--describe")
    assert result.stdout == (
        f"Quota configs for the default user-principal, client-id '{client}' are "
        "consumer_byte_rate=2048.0, request_percentage=12.5\n"
    ), result.stderr
    result = tool(*cli, "--client", client, "--alter", "--add-config", "producer_byte_rate=10.5")
    assert_one_line_error(result, "INVALID_REQUEST")
    result = tool(
        *cli, "--user-defaults", "--client", client, "--alter",
        "--delete-config", "consumer_byte_rate,request_percentage",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert tool(*cli, "--user-defaults", "--client", client, "--describe").stdout == ""


def test_dump_log_prints_what_was_produced(
    cluster3: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("dump-log")
    # An index entry after every batch or so (index files exist only once they have an entry).
    create_topic(
        bootstrap, topic, partitions=1, replication_factor=1, configs={"index.interval.bytes": "64"}
    )
    # Values that compress well: librdkafka sends a batch uncompressed when compressing makes it no
    # smaller, and five records of a dozen bytes were at the edge for lz4 (its frame header is ~15
    # bytes; a loaded machine's larger timestamp deltas tipped it over once in CI).
    produced = [(f"key-{i}".encode(), f"value {i} {'odradek ' * 8}".encode()) for i in range(25)]
    codecs = ("none", "lz4", "zstd", "gzip", "snappy")
    for c, codec in enumerate(codecs):  # a batch of 5 records with each codec
        # One batch per codec: with librdkafka's 5 ms linger a loaded machine could split the five
        # records, and a batch of one tiny record compresses larger than it is, which librdkafka
        # then sends uncompressed (that codec would be missing from the dump).
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "compression.type": codec,
                "linger.ms": 10_000,
            }
        )
        for n in range(5 * c, 5 * c + 5):
            key, value = produced[n]
            producer.produce(topic, value=value, key=key, headers=[("i", str(n).encode())])
        assert producer.flush(30) == 0
    assert end_offsets(bootstrap, topic, 1) == {0: 25}
    directory = wait_until(
        lambda: next(
            (b.data_dir / f"{topic}-0" for b in cluster3.brokers if (b.data_dir / f"{topic}-0").is_dir()),
            None,
        ),
        30,
        "the partition's directory",
    )  # fmt: skip
    segment = directory / "00000000000000000000.log"
    result = odradek("dump-log", "--files", str(segment), "--print-data-log")
    assert result.returncode == 0, result.stderr
    segment_dump = result.stdout
    records = re.findall(
        r"^\| offset: (\d+) CreateTime: \d+ keySize: (\d+) valueSize: (\d+) sequence: -?\d+ "
        r"headerKeys: \[i\] key: (.*) payload: (.*)$",
        result.stdout,
        re.MULTILINE,
    )
    assert [int(offset) for offset, *_ in records] == list(range(25))
    assert [(k.encode(), v.encode()) for *_, k, v in records] == produced
    assert all(int(ks) == len(k) and int(vs) == len(v) for _, ks, vs, k, v in records)
    batches = re.findall(r"^baseOffset: (\d+) lastOffset: (\d+) ", result.stdout, re.MULTILINE)
    assert len(batches) >= 5 and int(batches[-1][1]) == 24
    assert "isvalid: true" in result.stdout and "isvalid: false" not in result.stdout
    missing = [codec for codec in codecs if f"compresscodec: {codec} " not in result.stdout]
    assert not missing, "\n".join(re.findall(r"^baseOffset: .*$", result.stdout, re.MULTILINE))

    files = ",".join(
        str(directory / name)
        for name in ("00000000000000000000.index", "00000000000000000000.timeindex")
    )  # fmt: skip
    result = odradek_in_process(capsys, "dump-log", "--files", files, "--verify-index-only")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    result = odradek_in_process(capsys, "dump-log", "--files", files.split(",")[0])
    indexed = re.findall(r"^offset: (\d+) position: (\d+)$", result.stdout, re.MULTILINE)
    batch_ends = {(int(last), int(p)) for _, last, p in re.findall(
        r"^baseOffset: (\d+) lastOffset: (\d+) .* position: (\d+) ", segment_dump, re.MULTILINE
    )}  # fmt: skip
    assert indexed and {(int(o), int(p)) for o, p in indexed} <= batch_ends

    # Kafka 3.9.1's DumpLogSegments prints the same bytes for the same files.
    if kafka_available():
        for name, flags in (
            ("00000000000000000000.log", ("--deep-iteration", "--print-data-log")),
            ("00000000000000000000.index", ()),
            ("00000000000000000000.timeindex", ()),
        ):
            args = ("--files", str(directory / name), *flags)
            theirs = subprocess.run(
                ["java", "-cp", f"{kafka_libs()}/*", "kafka.tools.DumpLogSegments", *args],
                capture_output=True,
                text=True,
                timeout=120,
            )
            ours = odradek_in_process(capsys, "dump-log", *args)
            assert theirs.returncode == ours.returncode == 0, theirs.stderr
            assert ours.stdout == theirs.stdout, name
