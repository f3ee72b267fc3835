"""The client-side tools (`console-producer`, `console-consumer`, `get-offsets`,
`producer-perf-test`, `consumer-perf-test`, `verifiable-producer`, `verifiable-consumer`) on the
shared cluster, each checked against what confluent-kafka sees: what the console producer wrote is
what a consumer reads, what the console consumer prints is what a producer wrote, get-offsets
equals ListOffsets through the admin client, the perf tests moved as many records as they say, the
verifiable clients' events name the offsets a consumer finds and the group really committed. Where
Kafka 3.9.1's own tool is cached (`./dev kafka`), its output is compared with ours byte for byte.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, OffsetSpec

from odradek.testing import LocalCluster
from tests.integration._clients import create_topic, unique_topic
from tests.integration._groups import committed, unique_group
from tests.integration._kafka import kafka_available, kafka_libs
from tests.integration._tools import (
    assert_one_line_error,
    end_offsets,
    list_offsets,
    odradek,
    odradek_in_process,
    read_partition,
)

BASE_TS = 1_600_000_000_000


def _produce(
    bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes, list]]
) -> None:
    """(partition, key, value, headers) records, timestamps BASE_TS + index, acks=all."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    errors: list[object] = []
    for i, (partition, key, value, headers) in enumerate(records):
        producer.produce(
            topic,
            value=value,
            key=key,
            headers=headers or None,
            partition=partition,
            timestamp=BASE_TS + i,
            on_delivery=lambda e, m: e and errors.append(e),
        )
    assert producer.flush(60) == 0 and not errors, errors


def test_console_producer_writes_what_consumers_read(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("console-producer")
    create_topic(bootstrap, topic, partitions=2, replication_factor=3)
    lines = "h1:a,h2:b|k1|v1\nNULL|k2|NULL\nh3:|NULL|v3\n|k4|value with | bars\n"
    result = odradek(
        "console-producer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--partition", "1", "--property", "parse.key=true", "--property", "key.separator=|",
        "--property", "parse.headers=true", "--property", "headers.delimiter=|",
        "--property", "null.marker=NULL", "--property", "ignore.error=true", "--sync",
        stdin=lines,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = [(m.key(), m.value(), m.headers() or []) for m in read_partition(bootstrap, topic, 1, 4)]
    assert seen == [
        (b"k1", b"v1", [("h1", b"a"), ("h2", b"b")]),
        (b"k2", None, []),
        (None, b"v3", [("h3", b"")]),
        (b"k4", b"value with | bars", [("", None)]),  # an empty header list: one keyless pair
    ]
    assert end_offsets(bootstrap, topic, 2) == {0: 0, 1: 4}

    # A line without its key separator: Kafka's message, exit status 1, nothing more sent.
    result = odradek(
        "console-producer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--partition", "0", "--property", "parse.key=true", stdin="k\tv\nno separator\nx\ty\n",
    )  # fmt: skip
    assert_one_line_error(result, "No key separator found on line number 2: 'no separator'")
    assert end_offsets(bootstrap, topic, 2) == {0: 1, 1: 4}


def test_console_consumer_prints_what_was_produced(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("console-consumer")
    create_topic(bootstrap, topic, partitions=2, replication_factor=3)
    records = [
        (i % 2, f"k{i}".encode() if i % 3 else None, f"v{i}".encode(), [("n", str(i).encode())])
        for i in range(10)
    ]
    _produce(bootstrap, topic, records)
    printing = (
        "--property", "print.timestamp=true", "--property", "print.partition=true",
        "--property", "print.offset=true", "--property", "print.headers=true",
        "--property", "print.key=true",
    )  # fmt: skip
    group = unique_group("console")
    result = odradek(
        "console-consumer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--from-beginning", "--max-messages", "10", "--group", group, *printing,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "Processed a total of 10 messages"
    printed = sorted(result.stdout.splitlines())
    expected = []
    offsets = {0: 0, 1: 0}
    for i, (partition, key, value, headers) in enumerate(records):
        name, data = headers[0]
        expected.append(
            f"CreateTime:{BASE_TS + i}\tPartition:{partition}\tOffset:{offsets[partition]}\t"
            f"{name}:{data.decode()}\t{'null' if key is None else key.decode()}\t{value.decode()}"
        )
        offsets[partition] += 1
    assert printed == sorted(expected)
    # --group commits: the group's offsets are the partitions' ends.
    assert committed(bootstrap, group, topic, 2) == {0: 5, 1: 5}

    # One partition from an offset, without a group: exactly the records after it.
    result = odradek(
        "console-consumer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--partition", "1", "--offset", "3", "--timeout-ms", "3000", "--property", "print.key=true",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["k7\tv7", "null\tv9"]
    assert "Processed a total of 2 messages" in result.stderr

    result = odradek("console-consumer", "--bootstrap-server", bootstrap, "--partition", "0")
    assert_one_line_error(result, "exactly one of --topic and --include")


def test_get_offsets_equals_list_offsets(
    cluster3: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("get-offsets")
    create_topic(bootstrap, topic, partitions=3, replication_factor=3)
    _produce(bootstrap, topic, [(i % 3, None, b"x", []) for i in range(30)])
    # Move partition 2's start, so earliest is not 0 everywhere.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    from confluent_kafka import TopicPartition

    for future in admin.delete_records([TopicPartition(topic, 2, 4)]).values():
        future.result()

    def tool(*extra: str) -> dict[int, int]:
        result = odradek_in_process(
            capsys, "get-offsets", "--bootstrap-server", bootstrap, "--topic", topic, *extra
        )
        assert result.returncode == 0, result.stderr
        rows = [line.rsplit(":", 2) for line in result.stdout.splitlines()]
        assert all(name == topic for name, _, _ in rows)
        return {int(p): int(o) for _, p, o in rows}

    assert tool() == tool("--time", "latest") == end_offsets(bootstrap, topic, 3)
    assert tool() == {0: 10, 1: 10, 2: 10}
    assert tool("--time", "-2") == list_offsets(bootstrap, topic, 3, OffsetSpec.earliest())
    assert tool("--time", "-2")[2] == 4
    # The record produced at BASE_TS + 13 is partition 1's offset 4.
    at = tool("--time", str(BASE_TS + 13))
    assert at == list_offsets(bootstrap, topic, 3, OffsetSpec.for_timestamp(BASE_TS + 13))
    assert at[1] == 4
    assert tool("--time", "-3") == list_offsets(bootstrap, topic, 3, OffsetSpec.max_timestamp())
    assert tool("--partitions", "0,2") == {0: 10, 2: 10}
    # A timestamp after every record: no offset, so the partitions are left out, as in Kafka.
    assert tool("--time", str(BASE_TS + 10**9)) == {}

    result = odradek("get-offsets", "--bootstrap-server", bootstrap, "--topic", f"{topic}-none")
    assert_one_line_error(result, "Could not match any topic-partitions with the specified filters")
    result = odradek("get-offsets", "--bootstrap-server", bootstrap, "--time", "soon")
    assert_one_line_error(result, "Malformed time argument soon")


_PRODUCER_TOTAL = re.compile(
    r"^(\d+) records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, "
    r"[\d.]+ ms max latency, \d+ ms 50th, \d+ ms 95th, \d+ ms 99th, \d+ ms 99\.9th\.$"
)


def test_perf_tests_move_what_they_report(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("perf")
    create_topic(bootstrap, topic, partitions=3, replication_factor=3)
    started = time.monotonic()
    result = odradek(
        "producer-perf-test", "--topic", topic, "--num-records", "1500", "--record-size", "100",
        "--throughput", "1000", "--producer-props", f"bootstrap.servers={bootstrap}", "acks=all",
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    total = _PRODUCER_TOTAL.match(result.stdout.splitlines()[-1])
    assert total is not None, result.stdout
    assert int(total.group(1)) == 1500
    assert sum(end_offsets(bootstrap, topic, 3).values()) == 1500
    assert elapsed >= 1.4  # 1,500 records at 1,000 records/s cannot take less than 1.5 s

    result = odradek(
        "consumer-perf-test", "--bootstrap-server", bootstrap, "--topic", topic,
        "--messages", "1500", "--timeout", "30000",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    header, line = result.stdout.splitlines()
    assert header == (
        "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
        "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
    )
    fields = line.split(", ")
    assert len(fields) == 10
    assert fields[2] == f"{1500 * 100 / 1024 / 1024:.4f}" and fields[4] == "1500"

    result = odradek(
        "producer-perf-test",
        "--topic",
        topic,
        "--num-records",
        "5",
        "--throughput",
        "-1",
        "--record-size",
        "1",
    )
    assert_one_line_error(result, "Either --producer-props or --producer.config must be specified")


def _events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_verifiable_clients_events_match_the_log(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("verifiable")
    create_topic(bootstrap, topic, partitions=3, replication_factor=3)
    result = odradek(
        "verifiable-producer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--max-messages", "60", "--repeating-keys", "6", "--value-prefix", "9",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    assert [e["name"] for e in events[:1] + events[-2:]] == [
        "startup_complete",
        "shutdown_complete",
        "tool_data",
    ]
    assert all(list(e)[:2] == ["timestamp", "name"] for e in events)
    sent = [e for e in events if e["name"] == "producer_send_success"]
    assert len(sent) == 60 and events[-1]["sent"] == events[-1]["acked"] == 60
    assert sorted(e["value"] for e in sent) == sorted(f"9.{i}" for i in range(60))
    # Every key lands on one partition (Kafka's murmur2 placement, like a Java producer's).
    assert all(len({e["partition"] for e in sent if e["key"] == str(k)}) == 1 for k in range(6))
    ends = end_offsets(bootstrap, topic, 3)
    for partition in range(3):
        mine = sorted((e for e in sent if e["partition"] == partition), key=lambda e: e["offset"])
        assert [e["offset"] for e in mine] == list(range(ends[partition]))
        read = read_partition(bootstrap, topic, partition, ends[partition])
        assert [(m.key().decode(), m.value().decode()) for m in read] == [
            (e["key"], e["value"]) for e in mine
        ]

    group = unique_group("verifiable")
    result = odradek(
        "verifiable-consumer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--group-id", group, "--max-messages", "60", "--verbose",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    names = [e["name"] for e in events]
    assert names[0] == "startup_complete" and names[-1] == "shutdown_complete"
    assert "partitions_assigned" in names
    consumed = [e for e in events if e["name"] == "records_consumed"]
    assert sum(p["count"] for e in consumed for p in e["partitions"]) == 60
    data = [e for e in events if e["name"] == "record_data"]
    assert sorted(e["value"] for e in data) == sorted(f"9.{i}" for i in range(60))
    commits = [e for e in events if e["name"] == "offsets_committed"]
    assert commits and all(e["success"] for e in commits)
    last_commit = {o["partition"]: o["offset"] for e in commits for o in e["offsets"]}
    assert last_commit == {p: end for p, end in ends.items() if end}
    assert committed(bootstrap, group, topic, 3) == {
        p: (end if end else -1001) for p, end in ends.items()
    }


# -- differential: Kafka 3.9.1's own tools against the same cluster -------------------------


def _kafka_tool(main_class: str, *args: str) -> subprocess.CompletedProcess[str]:
    tools = kafka_libs().parent / "tools"
    return subprocess.run(
        ["java", "-cp", f"{kafka_libs()}/*:{tools}/*", main_class, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_output_equals_kafkas_tools(cluster3: LocalCluster) -> None:
    if not (kafka_available() and any((kafka_libs().parent / "tools").glob("kafka-tools-*.jar"))):
        message = f"Kafka's tools are not beside {kafka_libs()}: run ./dev kafka"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("differential")
    create_topic(bootstrap, topic, partitions=12, replication_factor=3)
    _produce(
        bootstrap,
        topic,
        [(i % 12, b"k" if i % 2 else None, f"v{i}".encode(), [("a", b"1")] if i % 3 else [])
         for i in range(40)],
    )  # fmt: skip
    consumer_args = (
        "--bootstrap-server", bootstrap, "--topic", topic, "--partition", "3",
        "--offset", "earliest", "--max-messages", "4",
        "--property", "print.timestamp=true", "--property", "print.offset=true",
        "--property", "print.partition=true", "--property", "print.headers=true",
        "--property", "print.key=true", "--property", "key.separator= | ",
    )  # fmt: skip
    theirs = _kafka_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", *consumer_args)
    ours = odradek("console-consumer", *consumer_args)
    assert theirs.returncode == ours.returncode == 0, (theirs.stderr, ours.stderr)
    assert ours.stdout == theirs.stdout and ours.stdout.count("\n") == 4
    assert "Processed a total of 4 messages" in theirs.stderr and ours.stderr.endswith(
        "Processed a total of 4 messages\n"
    )
    # Kafka's ConsoleProducer and ours, given the same lines, write the same records to the
    # same partitions (its line reader's rules, its murmur2 partitioner for keys).
    lines = "".join(f"h:{i},g:x\tkey-{i % 7}\tvalue {i}\n" for i in range(30)) + "NULL\tk\tNULL\n"
    reader = (
        "--property", "parse.key=true", "--property", "parse.headers=true",
        "--property", "null.marker=NULL",
    )  # fmt: skip
    written = {}
    for who in ("kafka", "odradek"):
        target = unique_topic(f"console-{who}")
        create_topic(bootstrap, target, partitions=4, replication_factor=3)
        args = ("--bootstrap-server", bootstrap, "--topic", target, *reader)
        if who == "kafka":
            produced = subprocess.run(
                ["java", "-cp", f"{kafka_libs()}/*", "kafka.tools.ConsoleProducer", *args],
                input=lines,
                capture_output=True,
                text=True,
                timeout=120,
            )
        else:
            produced = odradek("console-producer", *args, stdin=lines)
        assert produced.returncode == 0, produced.stderr
        ends = end_offsets(bootstrap, target, 4)
        assert sum(ends.values()) == 31
        written[who] = {
            p: [(m.key(), m.value(), m.headers()) for m in read_partition(bootstrap, target, p, n)]
            for p, n in ends.items()
        }
    assert written["odradek"] == written["kafka"]

    for time_spec in ("-1", "-2", str(BASE_TS + 20)):
        offsets_args = ("--bootstrap-server", bootstrap, "--topic", topic, "--time", time_spec)
        theirs = _kafka_tool("org.apache.kafka.tools.GetOffsetShell", *offsets_args)
        ours = odradek("get-offsets", *offsets_args)
        assert theirs.returncode == ours.returncode == 0, (theirs.stderr, ours.stderr)
        assert ours.stdout == theirs.stdout and ours.stdout.count("\n") >= 8


def test_tools_help_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from odradek.cli.main import build_parser

    parser = build_parser()
    for tool in (
        "console-producer", "console-consumer", "get-offsets", "producer-perf-test",
        "consumer-perf-test", "verifiable-producer", "verifiable-consumer", "dump-log", "configs",
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([tool, "--help"])
        assert exit_info.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: odradek {tool}")
    # As separate processes: a usage mistake and an unreachable cluster are exit status 1.
    result = odradek("get-offsets", "--no-such-flag")
    assert result.returncode == 1 and "unrecognized arguments: --no-such-flag" in result.stderr
    result = odradek("get-offsets", "--bootstrap-server", "127.0.0.1:1", "--timeout", "2")
    assert_one_line_error(result, "_TRANSPORT")
