"""Named listeners as Kafka configures them (`odradek.server.listener_config`, `KafkaConfig`)."""

from __future__ import annotations

import pytest

from odradek.errors import ConfigError
from odradek.server.config import KafkaConfig
from odradek.server.listener_config import listener_config

BASE = {"broker.id": "1", "zookeeper.connect": "127.0.0.1:2181", "log.dirs": "/tmp/x"}


def _config(**properties: str) -> KafkaConfig:
    return KafkaConfig({**BASE, **{k.replace("_", "."): v for k, v in properties.items()}})


def test_protocol_names_need_no_map_and_plaintext_is_the_default_inter_broker_listener() -> None:
    config = _config(listeners="PLAINTEXT://:9092,SSL://:9093,SASL_SSL://h:9094")
    listeners = config.listener_config
    assert [(e.listener, e.security_protocol) for e in listeners.listeners] == [
        ("PLAINTEXT", "PLAINTEXT"),
        ("SSL", "SSL"),
        ("SASL_SSL", "SASL_SSL"),
    ]
    assert listeners.inter_broker_listener == "PLAINTEXT"
    assert listeners.advertised[2].host == "h"
    assert listeners.advertised[0].host  # an empty host is advertised as this machine's name


def test_named_listeners_with_a_map_inter_broker_and_control_plane() -> None:
    listeners = listener_config(
        "CLIENT://:9092,INTERNAL://:9093,CONTROL://:9094",
        "CLIENT://a.example:9092,INTERNAL://b:9093,CONTROL://c:9094",
        "CLIENT:SASL_SSL,INTERNAL:SSL,CONTROL:SSL",
        "INTERNAL",
        None,
        "CONTROL",
        "host",
    )
    assert listeners.inter_broker_listener == "INTERNAL"
    assert listeners.controller_listener == "CONTROL"
    assert listeners.advertised_endpoint("CLIENT").host == "a.example"
    assert listeners.listener("CLIENT").uses_sasl and listeners.listener("CLIENT").uses_tls


def test_security_inter_broker_protocol_picks_the_listener_of_that_name() -> None:
    config = _config(listeners="SSL://:9093", security_inter_broker_protocol="SSL")
    assert config.listener_config.inter_broker_listener == "SSL"


@pytest.mark.parametrize(
    "properties, problem",
    [
        ({"listeners": "CLIENT://:9092"}, "not in listener.security.protocol.map"),
        ({"listeners": "SSL://:9093,SSL://:9094"}, "twice"),
        ({"listeners": "PLAINTEXT://:9092,SSL://:9092"}, "more than once"),
        ({"listeners": "SSL://:9093"}, "inter-broker listener PLAINTEXT"),
        (
            {
                "listeners": "SSL://:9093",
                "inter.broker.listener.name": "SSL",
                "security.inter.broker.protocol": "SSL",
            },
            "only one of",
        ),
        ({"listeners": "PLAINTEXT://0.0.0.0:9092"}, "nonroutable"),
        (
            {"listeners": "PLAINTEXT://:9092", "control.plane.listener.name": "PLAINTEXT"},
            "must not be the inter-broker",
        ),
        (
            {"listeners": "PLAINTEXT://:9092", "listener.security.protocol.map": "PLAINTEXT:TLS"},
            "invalid security protocol",
        ),
        (
            {"listeners": "PLAINTEXT://:9092", "authorizer.class.name": "my.Authorizer"},
            "not supported",
        ),
    ],
)
def test_kafka_listener_rules(properties: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        KafkaConfig({**BASE, **properties})


def test_security_properties_are_known_and_a_kafka_secure_config_loads() -> None:
    config = KafkaConfig(
        {
            **BASE,
            "listeners": "SASL_SSL://:9094,SSL://:9093",
            "security.inter.broker.protocol": "SASL_SSL",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": "x",
            "ssl.keystore.location": "/k",
            "ssl.client.auth": "required",
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": "User:admin",
            "max.connections.per.ip": "100",
        }
    )
    assert config.unknown == []
    assert config.authorizer_enabled
    assert config["max.connections.per.ip"] == 100
