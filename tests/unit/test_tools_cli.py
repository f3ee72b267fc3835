"""The pure parts of the client-side tools: Kafka's LineMessageReader and DefaultMessageFormatter
rules, GetOffsetShell's filters, time specs and order, the perf tests' statistics and dates, the
Java-to-librdkafka property translation, and `configs`' entity arguments."""

from __future__ import annotations

import argparse
import io

import pytest

from odradek.cli import configs
from odradek.cli.client_tools import java_to_librdkafka, parse_property_list
from odradek.cli.console_consumer import DefaultMessageFormatter
from odradek.cli.console_producer import LineReader, LineRecord
from odradek.cli.get_offsets import kafka_order, parse_time, parse_topic_partitions
from odradek.cli.perf_test import Stats, java_date_format
from odradek.errors import OperatorError


def test_line_reader_keys_headers_and_null_marker() -> None:
    reader = LineReader({"parse.key": "true", "parse.headers": "true", "null.marker": "NULL"})
    assert reader.parse("h1:a,h2:b\tk\tv\tw") == LineRecord(
        b"k", b"v\tw", [("h1", b"a"), ("h2", b"b")]
    )
    assert reader.parse("h:NULL\tNULL\tNULL") == LineRecord(None, None, [("h", None)])
    assert reader.parse("NULL\tk\tv") == LineRecord(b"k", b"v", [])
    with pytest.raises(OperatorError, match="No key separator found on line number 4: 'h:1\tv'"):
        reader.parse("h:1\tv")
    with pytest.raises(OperatorError, match="No header key separator found in pair 'x'"):
        reader.parse("x\tk\tv")
    plain = LineReader({})
    assert plain.parse("a\tb") == LineRecord(None, b"a\tb", [])
    lenient = LineReader({"parse.key": "true", "ignore.error": "true", "key.separator": ":"})
    assert lenient.parse("no separator") == LineRecord(None, b"no separator", [])
    assert lenient.parse("k::v") == LineRecord(b"k", b":v", [])
    records = list(plain.records(io.BytesIO(b"one\r\ntwo\nthree")))
    assert [r.value for r in records] == [b"one", b"two", b"three"]
    for properties, problem in (
        ({"null.marker": "\t"}, "null.marker and key.separator"),
        ({"headers.separator": ":"}, "headers.separator and headers.key.separator"),
    ):
        with pytest.raises(OperatorError, match=problem):
            LineReader(properties)


def test_default_message_formatter_columns() -> None:
    everything = DefaultMessageFormatter(
        {
            "print.timestamp": "true",
            "print.partition": "true",
            "print.offset": "true",
            "print.headers": "true",
            "print.key": "true",
        }
    )
    assert (
        everything.format((1, 17), 2, 9, [("a", b"1"), ("b", None)], None, b"v")
        == b"CreateTime:17\tPartition:2\tOffset:9\ta:1,b:null\tnull\tv\n"
    )
    assert everything.format((0, -1), 0, 0, None, b"k", b"v").startswith(
        b"NO_TIMESTAMP\tPartition:0\tOffset:0\tNO_HEADERS\tk\t"
    )
    assert DefaultMessageFormatter({}).format((1, 1), 0, 0, None, b"k", None) == b"null\n"
    key_only = DefaultMessageFormatter(
        {"print.key": "true", "print.value": "false", "key.separator": "|"}
    )
    assert key_only.format((2, 5), 0, 0, None, b"k", b"v") == b"k\n"
    stamped = DefaultMessageFormatter(
        {"print.timestamp": "true", "key.separator": " | ", "line.separator": ";"}
    )
    assert stamped.format((2, 5), 0, 0, None, None, b"v") == b"LogAppendTime:5 | v;"


def test_get_offsets_arguments() -> None:
    assert parse_time("-1") == parse_time("latest") == ("latest", 0)
    assert parse_time("earliest-local") == ("earliest", 0)
    assert parse_time("-3") == ("max_timestamp", 0)
    assert parse_time("1700000000000") == ("timestamp", 1700000000000)
    for bad in ("-5", "yesterday", "-7"):
        with pytest.raises(OperatorError, match="Malformed time argument"):
            parse_time(bad)
    filters = parse_topic_partitions("t1:0,t2:1-3,t3,t4:5-,:-2,t.*x:7")
    matches = {
        (topic, p)
        for topic in ("t1", "t2", "t3", "t4", "other", "tabx")
        for p in range(8)
        if any(pattern.fullmatch(topic) and accepts(p) for pattern, accepts in filters)
    }
    # ":-2" (every topic, partitions below 2) adds 0 and 1 everywhere.
    assert {p for t, p in matches if t == "t1"} == {0, 1}
    assert {p for t, p in matches if t == "t2"} == {0, 1, 2}  # 1-3: end exclusive
    assert {p for t, p in matches if t == "t3"} == set(range(8))
    assert {p for t, p in matches if t == "t4"} == {0, 1, 5, 6, 7}
    assert {p for t, p in matches if t == "other"} == {0, 1}
    assert ("tabx", 7) in matches
    with pytest.raises(OperatorError, match="Invalid topic-partition pattern"):
        parse_topic_partitions("t:x")
    # Kafka's order: by the string "topic-partition".
    assert kafka_order({("t", 2): 5, ("t", 10): 1, ("a", 0): 0}) == [
        ("a", 0, 0),
        ("t", 10, 1),
        ("t", 2, 5),
    ]


def test_perf_stats_and_dates(capsys: pytest.CaptureFixture[str]) -> None:
    stats = Stats(interval_s=1000)
    for latency in range(1, 1001):
        stats.record(latency, 100, stats.start + latency / 1000)
    line = stats.total_line(stats.start + 2.0)
    assert line == (
        "1000 records sent, 500.000000 records/sec (0.05 MB/sec), 500.50 ms avg latency, "
        "1000.00 ms max latency, 501 ms 50th, 951 ms 95th, 991 ms 99th, 1000 ms 99.9th."
    )
    windowed = Stats(interval_s=1)
    windowed.record(4, 1024 * 1024, windowed.start + 0.5)
    windowed.record(6, 1024 * 1024, windowed.start + 1.0)
    assert capsys.readouterr().out == (
        "2 records sent, 2.0 records/sec (2.00 MB/sec), 5.0 ms avg latency, 6.0 ms max latency.\n"
    )
    assert java_date_format("yyyy-MM-dd HH:mm:ss:SSS", 0).endswith(":000")
    assert len(java_date_format("yyyy-MM-dd HH:mm:ss:SSS", 1_700_000_000_123)) == 23


def test_java_properties_for_librdkafka() -> None:
    translated = java_to_librdkafka(
        {
            "bootstrap.servers": "h:1",
            "key.serializer": "org.apache.kafka.common.serialization.StringSerializer",
            "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
            'required username="alice" password="s3cret";',
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": "/ca.pem",
            "ssl.endpoint.identification.algorithm": "",
        }
    )
    assert translated == {
        "bootstrap.servers": "h:1",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
        "sasl.password": "s3cret",
        "ssl.ca.location": "/ca.pem",
        "ssl.endpoint.identification.algorithm": "none",
    }
    with pytest.raises(OperatorError, match="PEM"):
        java_to_librdkafka({"ssl.truststore.location": "/x.jks"})
    assert parse_property_list(["a=1", "b = x=y"], "--p") == {"a": "1", "b": " x=y"}
    with pytest.raises(OperatorError, match="--p expects key=value"):
        parse_property_list(["novalue"], "--p")


def _configs(*argv: str) -> configs.ConfigsCommand:
    parser = argparse.ArgumentParser()
    configs.add_parser(parser.add_subparsers())
    return configs.validate(parser.parse_args(["configs", "--bootstrap-server", "h:1", *argv]))


def test_configs_entities() -> None:
    command = _configs(
        "--entity-type", "topics", "--entity-name", "t", "--alter",
        "--add-config", "retention.ms=5,cleanup.policy=[compact,delete]", "--delete-config", "a,b",
    )  # fmt: skip
    assert command.entities == (("topics", "t"),)
    assert command.add_config == {"retention.ms": "5", "cleanup.policy": "compact,delete"}
    assert command.delete_config == ["a", "b"]
    assert _configs("--broker-defaults", "--describe").entities == (("brokers", ""),)
    assert _configs("--broker", "2", "--describe", "--all").describe_all
    assert _configs("--entity-type", "brokers", "--describe").entity_name is None
    assert _configs("--broker-logger", "3", "--describe").entities == (("broker-loggers", "3"),)
    pair = _configs(
        "--entity-type", "clients", "--entity-default", "--entity-type", "users",
        "--entity-name", "alice", "--alter", "--add-config", "producer_byte_rate=1024",
    )  # fmt: skip
    assert pair.entities == (("users", "alice"), ("clients", ""))
    assert _configs("--user", "u", "--client", "c", "--describe").entities == (
        ("users", "u"),
        ("clients", "c"),
    )
    for argv, problem in (
        (("--entity-type", "brokers", "--entity-name", "x", "--describe"), "valid integer"),
        (("--topic", "t", "--alter", "--add-config", "a=1", "--delete-config", "a"), "both"),
        (("--topic", "t", "--broker", "1", "--describe"), "only one entity"),
        (("--client", "c", "--alter", "--add-config", "retention.ms=1"), "Only quota configs"),
        (("--client", "c", "--alter", "--add-config", "producer_byte_rate=x"), "Cannot parse"),
        (("--user", "u", "--alter", "--add-config", "producer_byte_rate=1,SCRAM-SHA-256=[password=p]"), "simultaneously"),
        (("--entity-type", "topics", "--alter", "--add-config", "a=1"), "--alter needs --entity-name"),
        (("--entity-name", "x", "--describe"), "without an --entity-type"),
        (("--entity-type", "broker-loggers", "--describe"), "need --entity-name"),
        (("--broker-logger", "one", "--describe"), "valid integer"),
        (("--topic", "t", "--alter"), "--alter needs --add-config"),
    ):  # fmt: skip
        with pytest.raises(OperatorError, match=problem):
            _configs(*argv)
