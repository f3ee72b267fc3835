"""Dynamic broker configs (KIP-226) without a cluster: Kafka's precedence and synonym removal, the
synonyms DescribeConfigs lists, the validation that refuses static configs and bad values, the
incremental operations on one level, and BROKER_LOGGER levels."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from odradek.errors import InvalidConfigurationError, InvalidRequestError
from odradek.server import broker_loggers
from odradek.server.broker_configs import apply_operations, describe_broker, describe_loggers
from odradek.server.config import KafkaConfig
from odradek.server.dynamic_config import (
    DEFAULT_CONFIG,
    DYNAMIC_BROKER_CONFIG,
    DYNAMIC_DEFAULT_BROKER_CONFIG,
    DYNAMIC_TOPIC_CONFIG,
    STATIC_BROKER_CONFIG,
    DynamicBrokerConfig,
    Synonym,
    java_double_text,
    topic_synonyms,
)

BASE = {"broker.id": "1", "zookeeper.connect": "127.0.0.1:2181", "log.dirs": "/tmp/odradek-x"}


def dynamic(**static: str) -> DynamicBrokerConfig:
    properties = dict(BASE)
    properties.update({k.replace("_", "."): v for k, v in static.items()})
    return DynamicBrokerConfig(KafkaConfig(properties))


def test_per_broker_beats_the_cluster_default_beats_static_beats_kafka_default() -> None:
    d = dynamic(message_max_bytes="5000")
    assert d.config["message.max.bytes"] == 5000
    d.load(cluster_default={"message.max.bytes": "6000"})
    assert d.config["message.max.bytes"] == 6000
    d.load(per_broker={"message.max.bytes": "7000"})
    assert d.config["message.max.bytes"] == 7000
    assert d.synonyms("message.max.bytes") == [
        Synonym("message.max.bytes", "7000", DYNAMIC_BROKER_CONFIG),
        Synonym("message.max.bytes", "6000", DYNAMIC_DEFAULT_BROKER_CONFIG),
        Synonym("message.max.bytes", "5000", STATIC_BROKER_CONFIG),
        Synonym("message.max.bytes", "1048588", DEFAULT_CONFIG),
    ]
    # Deleting a level falls back to the next one.
    assert d.load(per_broker={}) == {"message.max.bytes": (7000, 6000)}
    assert d.load(cluster_default={}) == {"message.max.bytes": (6000, 5000)}


def test_a_dynamic_synonym_removes_the_static_ones_below_it() -> None:
    d = dynamic(log_retention_hours="2")
    assert d.config.log_retention_ms == 2 * 3600 * 1000
    changed = d.load(cluster_default={"log.retention.ms": "5000"})
    assert d.config.log_retention_ms == 5000
    assert changed == {"log.retention.ms": (None, 5000), "log.retention.hours": (2, 168)}
    # The synonyms start at the config's own name (Kafka's dropWhile).
    assert [(s.name, s.value, s.source) for s in d.synonyms("log.retention.ms")] == [
        ("log.retention.ms", "5000", DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("log.retention.hours", "2", STATIC_BROKER_CONFIG),
        ("log.retention.hours", "168", DEFAULT_CONFIG),
    ]
    assert [(s.name, s.source) for s in d.synonyms("log.retention.hours")] == [
        ("log.retention.hours", STATIC_BROKER_CONFIG),
        ("log.retention.hours", DEFAULT_CONFIG),
    ]
    # As in Kafka, only the first of the synonyms is dynamic.
    with pytest.raises(InvalidRequestError, match=r"Set\(log.retention.hours\)"):
        d.validate({"log.retention.hours": "1"}, per_broker=False)


LEVELS = st.sampled_from([None, "2000", "3000", "4000"])


@given(static=LEVELS, default=LEVELS, broker=LEVELS)
def test_the_highest_level_given_decides(
    static: str | None, default: str | None, broker: str | None
) -> None:
    d = dynamic(**({"message_max_bytes": static} if static else {}))
    d.load(
        cluster_default={"message.max.bytes": default} if default else {},
        per_broker={"message.max.bytes": broker} if broker else {},
    )
    expected = next((v for v in (broker, default, static) if v is not None), "1048588")
    assert d.config["message.max.bytes"] == int(expected)
    assert d.synonyms("message.max.bytes")[0].value == expected


@pytest.mark.parametrize(
    ("proposed", "message"),
    [
        ({"broker.id": "2"}, "Cannot update these configs dynamically: Set(broker.id)"),
        (
            {"zookeeper.connect": "x", "listeners": "PLAINTEXT://:1"},
            "Cannot update these configs dynamically: Set(listeners, zookeeper.connect)",
        ),
        ({"num.io.threads": "8"}, "Odradek does not implement them): Set(num.io.threads)"),
        ({"message.max.bytes": "big"}, "message.max.bytes: not an integer"),
        ({"unclean.leader.election.enable": "maybe"}, "expected true or false"),
        ({"log.cleaner.threads": "3"}, "more than double the current value 1"),
        ({"log.cleaner.threads": "0"}, "log.cleaner.threads should be at least 1"),
        ({"num.replica.fetchers": "0"}, "num.replica.fetchers: must be at least 1"),
        ({"message.max.bytes": "200000000"}, "must not exceed socket.request.max.bytes"),
        ({"log.retention.ms": "-7"}, "retention.ms must be an integer between -1"),
        ({"max.connections.per.ip.overrides": "nonsense"}, "expected host:count"),
    ],
)
def test_what_cannot_be_changed_is_refused_with_invalid_request(
    proposed: dict[str, str], message: str
) -> None:
    d = dynamic()
    with pytest.raises(InvalidRequestError) as refused:
        d.validate(proposed, per_broker=True)
    assert message in str(refused.value)
    assert d.config["message.max.bytes"] == 1048588  # nothing changed


def test_valid_changes_pass_and_validation_changes_nothing() -> None:
    d = dynamic()
    d.validate(
        {
            "message.max.bytes": "2000",
            "log.cleaner.threads": "2",
            "max.connections": "10",
            "listener.name.plaintext.max.connections": "5",
            "unclean.leader.election.enable": "true",
        },
        per_broker=False,
    )
    assert d.config["message.max.bytes"] == 1048588
    assert d.cluster_default == {}


def test_stored_entries_that_cannot_apply_are_ignored() -> None:
    d = dynamic()
    d.load(cluster_default={"broker.id": "9", "message.max.bytes": "x", "max.connections": "7"})
    assert d.cluster_default == {"max.connections": "7"}
    assert d.config["broker.id"] == 1
    assert d.config["max.connections"] == 7


def test_listener_connection_limits_follow_the_levels() -> None:
    d = dynamic(listener_name_plaintext_max_connections="3")
    assert d.listener_limits(["PLAINTEXT"]) == {"PLAINTEXT": 3}
    d.load(cluster_default={"listener.name.plaintext.max.connections": "9"})
    assert d.listener_limits(["PLAINTEXT"]) == {"PLAINTEXT": 9}


def test_incremental_operations_on_one_level() -> None:
    ops = [
        SimpleNamespace(name="message.max.bytes", value="9", config_operation=0),
        SimpleNamespace(name="max.connections", value=None, config_operation=1),
        SimpleNamespace(name="log.cleanup.policy", value="compact", config_operation=2),
    ]
    result = apply_operations({"max.connections": "4"}, ops)
    # APPEND starts from Kafka's default of the list when the level does not set it.
    assert result == {"message.max.bytes": "9", "log.cleanup.policy": "delete,compact"}
    subtract = [SimpleNamespace(name="log.cleanup.policy", value="delete", config_operation=3)]
    assert apply_operations(result, subtract)["log.cleanup.policy"] == "compact"
    with pytest.raises(InvalidConfigurationError, match="append is not allowed"):
        apply_operations(
            {}, [SimpleNamespace(name="max.connections", value="1", config_operation=2)]
        )


def test_describe_a_broker_with_sources_read_only_and_sensitive_values() -> None:
    d = dynamic(message_max_bytes="5000", ssl_keystore_password="secret")
    d.load(cluster_default={"log.cleaner.threads": "2"})
    entries = {e["name"]: e for e in describe_broker(d, 1, "1", None, True)}
    assert entries["message.max.bytes"]["value"] == "5000"
    assert entries["message.max.bytes"]["config_source"] == STATIC_BROKER_CONFIG
    assert entries["message.max.bytes"]["read_only"] is False
    assert entries["broker.id"]["read_only"] is True
    assert entries["log.cleaner.threads"]["config_source"] == DYNAMIC_DEFAULT_BROKER_CONFIG
    assert entries["num.partitions"]["config_source"] == DEFAULT_CONFIG
    assert entries["log.cleaner.io.buffer.load.factor"]["value"] == "0.9"
    assert entries["log.cleaner.io.max.bytes.per.second"]["value"] == "1.7976931348623157E308"
    password = entries["ssl.keystore.password"]
    assert password["value"] is None and password["is_sensitive"] is True
    assert password["synonyms"] == [
        {"name": "ssl.keystore.password", "value": None, "source": STATIC_BROKER_CONFIG}
    ]
    # The default resource lists only what is set there.
    default = describe_broker(d, 1, "", None, True)
    assert [e["name"] for e in default] == ["log.cleaner.threads"]
    assert default[0]["synonyms"] == [
        {"name": "log.cleaner.threads", "value": "2", "source": DYNAMIC_DEFAULT_BROKER_CONFIG}
    ]
    with pytest.raises(InvalidRequestError, match="expected 1 or empty string, but received 2"):
        describe_broker(d, 1, "2", None, True)


def test_topic_synonyms_start_with_the_override() -> None:
    d = dynamic()
    d.load(cluster_default={"message.max.bytes": "2000"})
    assert topic_synonyms(d, "max.message.bytes", {"max.message.bytes": "100"}) == [
        Synonym("max.message.bytes", "100", DYNAMIC_TOPIC_CONFIG),
        Synonym("message.max.bytes", "2000", DYNAMIC_DEFAULT_BROKER_CONFIG),
        Synonym("message.max.bytes", "1048588", DEFAULT_CONFIG),
    ]


def test_java_double_text() -> None:
    assert java_double_text(0.5) == "0.5"
    assert java_double_text(1.7976931348623157e308) == "1.7976931348623157E308"
    assert java_double_text(1e7) == "1.0E7"
    assert java_double_text(15000.0) == "15000.0"


def test_broker_logger_levels() -> None:
    name = "odradek.test_dynamic_config.logger"
    logger = logging.getLogger(name)
    try:
        entries = {e["name"]: e["value"] for e in describe_loggers(1, "1", None)}
        assert entries["root"] in broker_loggers.LEVELS
        assert name in entries
        set_debug = [SimpleNamespace(name=name, value="DEBUG", config_operation=0)]
        broker_loggers.validate(set_debug)
        broker_loggers.apply(set_debug)
        assert logger.level == logging.DEBUG
        assert {e["name"]: e["value"] for e in describe_loggers(1, "1", [name])} == {name: "DEBUG"}
        unset = [SimpleNamespace(name=name, value="", config_operation=1)]
        broker_loggers.apply(unset)
        assert logger.level == logging.NOTSET
    finally:
        logger.setLevel(logging.NOTSET)
    with pytest.raises(InvalidConfigurationError, match=r"Logger no\.such does not exist!"):
        broker_loggers.validate([SimpleNamespace(name="no.such", value="INFO", config_operation=0)])
    with pytest.raises(InvalidConfigurationError, match="Valid log levels are DEBUG, ERROR"):
        broker_loggers.validate([SimpleNamespace(name=name, value="LOUD", config_operation=0)])
    with pytest.raises(InvalidRequestError, match="root logger is not allowed"):
        broker_loggers.validate([SimpleNamespace(name="root", value="", config_operation=1)])
    with pytest.raises(InvalidRequestError, match="APPEND operation is not allowed"):
        broker_loggers.validate([SimpleNamespace(name=name, value="x", config_operation=2)])
    with pytest.raises(InvalidRequestError, match="Unexpected broker id"):
        describe_loggers(1, "2", None)


def test_replication_throttles_are_broker_configs_for_the_quota_component() -> None:
    d = dynamic()
    d.validate({"leader.replication.throttled.rate": "1048576"}, per_broker=True)
    with pytest.raises(InvalidRequestError, match="not a non-negative long"):
        d.validate({"follower.replication.throttled.rate": "-1"}, per_broker=False)
    d.load(per_broker={"leader.replication.throttled.rate": "1048576"})
    entries = {e["name"]: e for e in describe_broker(d, 1, "1", None, True)}
    throttle = entries["leader.replication.throttled.rate"]
    assert (throttle["value"], throttle["config_source"], throttle["read_only"]) == (
        "1048576",
        DYNAMIC_BROKER_CONFIG,
        False,
    )
    assert throttle["is_sensitive"] is False
