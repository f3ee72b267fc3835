"""`server.properties` parsing: Java's `Properties.load` rules, on the cases Kafka's own config
files and tools produce, and how a parsed file becomes a broker config."""

from __future__ import annotations

from pathlib import Path

import pytest

from odradek.errors import ConfigError
from odradek.server.config import load_config, parse_properties


def test_separators_equals_colon_and_whitespace() -> None:
    text = "a=1\nb:2\nc 3\nd   =   4\ne\t:\t5\n"
    assert parse_properties(text) == {"a": "1", "b": "2", "c": "3", "d": "4", "e": "5"}


def test_only_the_first_separator_splits() -> None:
    assert parse_properties("listeners=PLAINTEXT://h:9092\n") == {"listeners": "PLAINTEXT://h:9092"}
    assert parse_properties("a=b=c\n") == {"a": "b=c"}


def test_escaped_separators_belong_to_the_key() -> None:
    assert parse_properties("a\\=b=c\n") == {"a=b": "c"}
    assert parse_properties("a\\:b:c\n") == {"a:b": "c"}
    assert parse_properties("a\\ b value\n") == {"a b": "value"}


def test_unicode_escapes() -> None:
    assert parse_properties("name=caf\\u00e9 \\u0041\n") == {"name": "café A"}
    assert parse_properties("\\u0074opic=x\n") == {"topic": "x"}


def test_malformed_unicode_escape_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        parse_properties("name=\\u00zz\n")


def test_comments_with_hash_and_bang() -> None:
    text = "# a comment\n! another comment\n  # indented comment\na=1\n"
    assert parse_properties(text) == {"a": "1"}


def test_a_hash_inside_a_value_is_not_a_comment() -> None:
    assert parse_properties("a=x#y\n") == {"a": "x#y"}


def test_line_continuations() -> None:
    text = "log.dirs=/data/a,\\\n    /data/b,\\\n\t/data/c\nnext=1\n"
    assert parse_properties(text) == {"log.dirs": "/data/a,/data/b,/data/c", "next": "1"}


def test_an_escaped_backslash_at_the_end_does_not_continue() -> None:
    assert parse_properties("path=c:\\\\\nnext=1\n") == {"path": "c:\\", "next": "1"}


def test_duplicate_keys_the_last_wins() -> None:
    assert parse_properties("num.partitions=1\nnum.partitions=3\n") == {"num.partitions": "3"}


def test_a_key_without_a_value_is_empty() -> None:
    assert parse_properties("bare\nother=\n") == {"bare": "", "other": ""}


def test_control_character_escapes() -> None:
    assert parse_properties("a=x\\ty\\nz\n") == {"a": "x\ty\nz"}


def test_windows_line_endings() -> None:
    assert parse_properties("a=1\r\nb=2\r\n") == {"a": "1", "b": "2"}


def test_load_config_reads_the_file_and_overrides_win(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text(
        "broker.id=7\n"
        "zookeeper.connect=127.0.0.1:2181\n"
        "log.dirs=/tmp/a,\\\n  /tmp/b\n"
        "num.partitions = 2   \n"
        "num.partitions=4\n",
        encoding="utf-8",
    )
    config = load_config(path, ["num.partitions=5"])
    assert config.broker_id == 7
    assert config["num.partitions"] == 5
    assert [str(d) for d in config.log_dirs] == ["/tmp/a", "/tmp/b"]


def test_load_config_trims_values_as_kafka_does(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("broker.id = 3   \nzookeeper.connect=z:2181\n", encoding="utf-8")
    assert load_config(path, []).broker_id == 3


@pytest.mark.parametrize("value", ["-1", "20", "low"])
def test_a_cleaner_priority_outside_nice_range_is_refused(tmp_path: Path, value: str) -> None:
    path = tmp_path / "server.properties"
    path.write_text("broker.id=1\nzookeeper.connect=z:2181\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"log\.cleaner\.nice"):
        load_config(path, [f"log.cleaner.nice={value}"])
    assert load_config(path, ["log.cleaner.nice=19"])["log.cleaner.nice"] == 19
